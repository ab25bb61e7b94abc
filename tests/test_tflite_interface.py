"""`bpfree adapt` / `tflite.save` keep a loaded file's interface (issue 35): the operator
sequence (the converter's PAD and padding forms, QUANTIZE / DEQUANTIZE edges), the
`serving_default` signature, tensor names and metadata; only weight and bias bytes change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bpfree import tflite as bt
from bpfree.cli import main
from bpfree.tflite.oracle import REASON, litert_available
from bpfree.tflite.schema import op_name, tflite
from test_tflite import SIGNED_INPUT, SIGNED_OUTPUT, converter_style_file


def structure(data: bytes) -> dict:
    """Everything of a file but its constant bytes: operators (code, inputs, outputs, options
    bytes), tensors (name, shape, type, buffer, quantization), graph inputs / outputs,
    signatures, metadata (with its bytes) and the list of buffer sizes."""
    m = tflite.Model.GetRootAsModel(data, 0)
    g = m.Subgraphs(0)

    def options(op):
        table = op.BuiltinOptions()
        return None if table is None else bytes(table.Bytes[table.Pos:table.Pos + 32])

    def quant(t):
        q = t.Quantization()
        if q is None or q.ScaleLength() == 0:
            return None
        return (q.ScaleAsNumpy().tolist(), q.ZeroPointAsNumpy().tolist(), q.QuantizedDimension())

    codes = [max(m.OperatorCodes(i).BuiltinCode(), m.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(m.OperatorCodesLength())]
    ops = [(op_name(codes[op.OpcodeIndex()]), op.InputsAsNumpy().tolist(),
            op.OutputsAsNumpy().tolist(), op.BuiltinOptionsType(), options(op))
           for op in (g.Operators(i) for i in range(g.OperatorsLength()))]
    tensors = [(t.Name(), t.ShapeAsNumpy().tolist(), t.Type(), t.Buffer(), quant(t))
               for t in (g.Tensors(i) for i in range(g.TensorsLength()))]
    sigs = []
    for i in range(m.SignatureDefsLength()):
        s = m.SignatureDefs(i)
        sigs.append((s.SignatureKey(),
                     [(s.Inputs(j).Name(), s.Inputs(j).TensorIndex()) for j in range(s.InputsLength())],
                     [(s.Outputs(j).Name(), s.Outputs(j).TensorIndex())
                      for j in range(s.OutputsLength())]))
    meta = [(m.Metadata(i).Name(), m.Buffers(m.Metadata(i).Buffer()).DataAsNumpy().tobytes())
            for i in range(m.MetadataLength())]
    return {"ops": ops, "tensors": tensors, "inputs": g.InputsAsNumpy().tolist(),
            "outputs": g.OutputsAsNumpy().tolist(), "signatures": sigs, "metadata": meta,
            "buffers": [m.Buffers(i).DataLength() for i in range(m.BuffersLength())],
            "description": m.Description(), "version": m.Version()}


def _task(seed=0, n=96):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 8, 8, generator=g) * 6 - 3
    y = torch.randint(0, 5, (n,), generator=g)
    return x, y


def test_the_fixture_has_the_converters_interface():
    s = structure(converter_style_file(0, signed=True))
    assert s["signatures"] == [(b"serving_default", [(b"x", 0)],
                                [(b"output_0", len(s["tensors"]) - 1)])]
    assert s["tensors"][0][0] == SIGNED_INPUT.encode()
    assert s["tensors"][-1][0] == SIGNED_OUTPUT.encode()
    assert [op[0] for op in s["ops"]].count("PAD") == 1
    assert s["metadata"][0][0] == b"min_runtime_version"


def test_adapt_keeps_operators_signature_names_and_metadata(tmp_path):
    """The adapted file differs from the input in weight and bias bytes only; its structure
    (operators with their options, tensors with names and quantization, signature, metadata) is
    the input's, field for field, and no PAD is inserted."""
    data = converter_style_file(0, signed=True)
    (tmp_path / "model.tflite").write_bytes(data)
    x, y = _task()
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    out = tmp_path / "adapted.tflite"
    assert main(["adapt", str(tmp_path / "model.tflite"), "--data", str(tmp_path / "d.npz"),
                 "--out", str(out), "--epochs", "2", "--lr", "0.5", "--quiet"]) == 0
    adapted = out.read_bytes()
    assert structure(adapted) == structure(data)
    assert len(adapted) == len(data) and adapted != data   # same layout, trained values
    before, after = bt.from_bytes(data), bt.from_bytes(adapted)
    changed = [k for k, v in before.state_dict().items()
               if not torch.equal(v, after.state_dict()[k])]
    assert changed and all(k.endswith(("weight", "bias")) for k in changed)
    # every differing byte lies inside a weight or bias buffer
    m = tflite.Model.GetRootAsModel(data, 0)
    allowed = np.zeros(len(data), bool)
    for layer in before.modules():
        source = getattr(layer, "tflite_source", None)
        for t in () if source is None else (source.weight, source.bias):
            buf = m.Buffers(m.Subgraphs(0).Tensors(t).Buffer())
            start = buf._tab.Vector(buf._tab.Offset(4))
            allowed[start:start + buf.DataLength()] = True
    differ = np.frombuffer(adapted, np.uint8) != np.frombuffer(data, np.uint8)
    assert differ.any() and not (differ & ~allowed).any()


@pytest.mark.skipif(not litert_available(), reason=REASON)
def test_get_signature_runner_works_on_the_adapted_file_and_computes_bpfree(tmp_path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    data = converter_style_file(1, signed=True)
    model = bt.from_bytes(data)
    x, y = _task(1)
    from bpfree.harness import fit
    from bpfree.pmt import PMTConfig, PMTTrainer

    fit(PMTTrainer(model, PMTConfig(queries=2), example=x[:2]), x, y, epochs=1, batch_size=32,
        lr=0.5)
    bt.save(model, tmp_path / "adapted.tflite")
    interp = Interpreter(model_path=str(tmp_path / "adapted.tflite"),
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["x"],
                                                               "outputs": ["output_0"]}}
    assert interp.get_input_details()[0]["name"] == SIGNED_INPUT
    assert interp.get_output_details()[0]["name"] == SIGNED_OUTPUT
    runner = interp.get_signature_runner("serving_default")
    for i in range(4):
        sample = x[i:i + 1]
        out = runner(x=np.ascontiguousarray(sample.permute(0, 2, 3, 1).numpy()))["output_0"]
        np.testing.assert_array_equal(out, model(sample).numpy())


def test_a_model_changed_after_loading_gets_a_new_graph_with_a_warning(caplog):
    data = converter_style_file(0, signed=True)
    model = bt.from_bytes(data)
    assert bt.file_bytes(model) == data                       # untrained: the same file
    model.body = model.body[:-2]                              # RESHAPE and FC removed
    with pytest.raises(bt.PatchError, match="no longer match"):
        bt.patched_bytes(model)
    with caplog.at_level("WARNING", logger="bpfree"):
        rebuilt = bt.file_bytes(model)
    assert "writing a new .tflite graph" in caplog.text
    assert structure(rebuilt)["signatures"] == []
    assert bt.file_bytes(bt.from_bytes(data), rebuild=True) == bt.to_bytes(bt.from_bytes(data))


def test_weights_out_of_the_int8_range_are_refused_naming_the_layer():
    model = bt.from_bytes(converter_style_file(0, signed=True))
    conv = next(m for m in model.modules() if getattr(m, "tflite_source", None) is not None)
    wide = conv.weight.to(torch.int16)  # a layer whose integers were widened by hand
    wide.view(-1)[0] = 200
    conv.weight = wide
    with pytest.raises(bt.PatchError, match=r"weight holds values in \[.*200\].*int8 range"):
        bt.patched_bytes(model)


# ------------------------------------------------- models that are not classifiers, NHWC data


def test_adapt_refuses_a_feature_map_output_before_training_naming_its_shape(tmp_path, capsys):
    """A converter-made DEPTHWISE_CONV_2D whose output is a feature map: refused (exit 2)
    before the data is read or anything is trained, naming the output shape."""
    from test_tflite import depthwise_file

    (tmp_path / "features.tflite").write_bytes(depthwise_file("SAME", 8))
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 4, 8, 8), np.float32), y=np.zeros(8, np.int64))
    out = tmp_path / "adapted.tflite"
    assert main(["adapt", str(tmp_path / "features.tflite"), "--data", str(tmp_path / "d.npz"),
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "output has shape (1, 4, 4, 4) for one sample" in err and "classifiers" in err
    assert not out.exists()


def test_a_loaded_model_takes_nhwc_batches_as_its_file_does():
    model = bt.from_bytes(converter_style_file(0, signed=True))
    assert model.input_shape == (3, 8, 8)
    x = torch.randint(-128, 128, (5, 3, 8, 8), dtype=torch.int8)
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    assert torch.equal(model.forward_int(nhwc), model.forward_int(x))
    xf = torch.rand(5, 3, 8, 8)
    assert torch.equal(model(xf.permute(0, 2, 3, 1)), model(xf))


def test_nhwc_into_an_nchw_layer_says_to_permute():
    from bpfree.quant.layers import QConv2d
    from bpfree.quant.params import TensorQuant, WeightQuant

    q = TensorQuant(0.1, 0)
    conv = QConv2d(torch.ones(2, 3, 1, 1, dtype=torch.int8), None,
                   weight_scale=WeightQuant([0.1, 0.1]), input_quant=q, output_quant=q)
    with pytest.raises(ValueError, match=r"looks like NHWC.*x\.permute\(0, 3, 1, 2\)"):
        conv(torch.zeros(1, 8, 8, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"got \(1, 5, 8, 8\)$"):
        conv(torch.zeros(1, 5, 8, 8, dtype=torch.int8))
