"""MCUNet-in1 (INT8) import, classification check, hardware-cost tables and a PMT step."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pytest
import torch

from bpfree.models.mcunet import (
    BUNDLED_MODEL_DIR,
    CHECKSUMS_FILE,
    ModelFormatError,
    compare_requant,
    default_model_dir,
    load_graph,
    mcunet_in1,
    preprocess_image,
)

MODEL_DIR = default_model_dir()


@pytest.fixture(scope="module")
def model():
    return mcunet_in1()


@pytest.fixture(scope="module")
def photos():
    data = pytest.importorskip("skimage.data", reason="scikit-image provides the sample photos")
    return {name: preprocess_image(getattr(data, name)()) for name in ("chelsea", "coffee")}


# ------------------------------------------------------------------------------ loader errors


def _copy(tmp_path, *, checksums=False):
    """A writable copy of the model folder; without its SHA256SUMS unless ``checksums`` (an
    edited copy is a new model, which the checksums would refuse first)."""
    folder = tmp_path / "m"
    shutil.copytree(MODEL_DIR, folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    if not checksums:
        (folder / CHECKSUMS_FILE).unlink(missing_ok=True)
    return folder


def test_bundled_model_carries_license_citation_and_checksums():
    """The package data: MIT notice, the MANIFEST's source and citation, and SHA256SUMS that
    agree with the MANIFEST's md5 sums of the same files."""
    folder = BUNDLED_MODEL_DIR
    assert "MIT License" in (folder / "LICENSE").read_text()
    assert "Copyright (c) 2022 MIT HAN Lab" in (folder / "LICENSE").read_text()
    manifest = (folder / "MANIFEST.txt").read_text()
    assert "MCUNet: Tiny Deep Learning on IoT Devices" in manifest
    md5 = dict(re.findall(r"(graph\.json|weights\.npz) ([0-9a-f]{32})", manifest))
    assert set(md5) == {"graph.json", "weights.npz"}
    for name, digest in md5.items():
        assert hashlib.md5((folder / name).read_bytes()).hexdigest() == digest
    listed = (folder / CHECKSUMS_FILE).read_text().split()
    assert listed[1::2] == ["graph.json", "weights.npz"]
    for digest, name in zip(listed[::2], listed[1::2]):
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest


def test_damaged_file_fails_its_checksum_naming_it(tmp_path):
    folder = _copy(tmp_path, checksums=True)
    load_graph(folder)  # intact copy: the checksums pass
    data = bytearray((folder / "weights.npz").read_bytes())
    data[-100] ^= 1  # one bit, in the zip's central directory
    (folder / "weights.npz").write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=r"weights\.npz does not match its checksum"):
        mcunet_in1(folder)
    (folder / CHECKSUMS_FILE).write_text("abc  graph.json\n")
    with pytest.raises(ModelFormatError, match=r"SHA256SUMS:1: expected"):
        load_graph(folder)
    (folder / CHECKSUMS_FILE).write_text("0" * 64 + "  ../graph.json\n")
    with pytest.raises(ModelFormatError, match=r"SHA256SUMS:1: expected"):
        load_graph(folder)


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        mcunet_in1(tmp_path / "nowhere")
    folder = _copy(tmp_path)
    (folder / "weights.npz").unlink()
    with pytest.raises(FileNotFoundError, match="weights.npz is missing"):
        mcunet_in1(folder)


def test_unknown_op_names_layer(tmp_path):
    folder = _copy(tmp_path)
    doc = json.loads((folder / "graph.json").read_text())
    doc["layers"][5]["op"] = "softmax"
    (folder / "graph.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"blocks\.1\.pointwise2.*unknown op 'softmax'"):
        load_graph(folder)


def test_shape_mismatch_names_layer(tmp_path):
    folder = _copy(tmp_path)
    arrays = dict(np.load(folder / "weights.npz"))
    arrays["blocks.3.depthwise.weight"] = arrays["blocks.3.depthwise.weight"][:, :, :2]
    np.savez(folder / "weights.npz", **arrays)
    with pytest.raises(ModelFormatError, match=r"blocks\.3\.depthwise.*weight has shape"):
        mcunet_in1(folder)


def test_broken_chain_names_layer(tmp_path):
    folder = _copy(tmp_path)
    doc = json.loads((folder / "graph.json").read_text())
    doc["layers"][3]["x_zero"] = 7  # blocks.1.pointwise1 no longer reads blocks.0's output
    (folder / "graph.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"blocks\.1\.pointwise1.*input quantization"):
        mcunet_in1(folder)


def _edit_graph(folder, edit):
    doc = json.loads((folder / "graph.json").read_text())
    edit(doc["layers"])
    (folder / "graph.json").write_text(json.dumps(doc))


def _layer(layers, name):
    return next(layer for layer in layers if layer["name"] == name)


@pytest.mark.parametrize("edit, pattern", [
    (lambda ls: _layer(ls, "blocks.2.depthwise").update(kernel_size=3),
     r"blocks\.2\.depthwise.*kernel_size must be \[kh, kw\]"),
    (lambda ls: _layer(ls, "blocks.2.depthwise").update(groups=None),
     r"blocks\.2\.depthwise.*groups must be an int >= 1, got None"),
    (lambda ls: _layer(ls, "blocks.2.depthwise").update(out_channels="48"),
     r"blocks\.2\.depthwise.*out_channels must be an int >= 1"),
    (lambda ls: _layer(ls, "blocks.2.depthwise").update(y_zero=1.5),
     r"blocks\.2\.depthwise.*y_zero must be an int in \[-128, 127\], got 1\.5"),
    (lambda ls: _layer(ls, "blocks.2.depthwise").update(y_zero=300),
     r"blocks\.2\.depthwise.*zero_point must be an int in \[-128, 127\]"),
    # a stride that disagrees with the spatial sizes of the graph
    (lambda ls: _layer(ls, "blocks.1.depthwise").update(stride=1),
     r"blocks\.1\.depthwise.*out_hw=32, but a 3x3 conv with stride 1 .* maps 64x64 to 64x64"),
    (lambda ls: ls.insert(4, dict(_layer(ls, "blocks.1.pointwise1"))),
     r"blocks\.1\.pointwise1.*used twice"),
    # the classifier (in_hw null) with no global pooling before it
    (lambda ls: ls.remove(_layer(ls, "global_avg_pool")),
     r"classifier.*in_hw is null.*no mean_hw"),
])
def test_malformed_graph_names_layer(tmp_path, edit, pattern):
    folder = _copy(tmp_path)
    _edit_graph(folder, edit)
    with pytest.raises(ModelFormatError, match=pattern):
        mcunet_in1(folder)


def test_broken_files(tmp_path):
    folder = _copy(tmp_path)
    (folder / "graph.json").write_text('{"layers": [')
    with pytest.raises(ModelFormatError, match="graph.json is not valid JSON"):
        mcunet_in1(folder)
    folder = _copy(tmp_path / "b")
    data = (folder / "weights.npz").read_bytes()
    (folder / "weights.npz").write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelFormatError, match=r"weights\.npz is not an npz \(zip\) archive"):
        mcunet_in1(folder)
    folder = _copy(tmp_path / "c")
    arrays = dict(np.load(folder / "weights.npz"))
    arrays["blocks.5.depthwise.bias"] = arrays["blocks.5.depthwise.bias"].astype(np.int64)
    np.savez(folder / "weights.npz", **arrays)
    with pytest.raises(ModelFormatError, match=r"blocks\.5\.depthwise.*bias has dtype int64, "
                                               r"expected int32"):
        mcunet_in1(folder)


# ------------------------------------------------------------------------------ the real model


def test_structure(model):
    from bpfree.quant import QInvertedResidual

    blocks = [s for s in model.body if isinstance(s, QInvertedResidual)]
    assert len(model.body) == 17 and len(blocks) == 14
    # graph.json has 7 residual adds (blocks 2, 4, 6, 8, 9, 11, 12; the MANIFEST says 6)
    assert sum(b.add is not None for b in blocks) == 7
    assert model.graph_names["blocks.3.depthwise"] == "body.4.body.1"


def test_cat_and_coffee(model, photos):
    from bpfree.data.imagenet_classes import CAT_CLASSES, IMAGENET_CLASSES

    cat = model.forward_int(photos["chelsea"])[0]
    assert int(cat.argmax()) in CAT_CLASSES
    assert IMAGENET_CLASSES[int(cat.argmax())].endswith("cat") or int(cat.argmax()) == 281
    top5 = model.forward_int(photos["coffee"])[0].topk(5).indices.tolist()
    assert 967 in top5 or 968 in top5


def test_float_rule_differs_in_few_values(model, photos):
    model_f = mcunet_in1(requant="float")
    x = torch.cat([photos["chelsea"], photos["coffee"]])
    report = compare_requant(model, model_f, x)
    # Measured: 5,992 of 332,048 stage outputs (1.8%) differ when each stage sees the same
    # input, by 1 for single-conv stages (up to 3 inside a 3-conv block); propagated, 64,788
    # activations (20%) and 1,436 of the 2,000 logits differ, yet top-1 and top-5 agree.
    assert report["values"] == 332_048 and report["logits_values"] == 2000
    assert 0 < report["isolated_differ"] < 0.05 * report["values"]
    assert report["isolated_differ"] <= report["values_differ"]
    assert report["top1_equal"]
    first, pool, head = report["stages"][0], report["stages"][15], report["stages"][16]
    assert max(first["isolated_max_abs"], pool["isolated_max_abs"], head["isolated_max_abs"]) <= 1


def test_parameter_bytes_and_macs_within_1_percent_of_paper():
    from bpfree.pmt.mcunet_tables import PAPER, mcunet_tables

    rows = {r.quantity: r for r in mcunet_tables()}
    assert abs(rows["parameter bytes, backbone (0.46M params)"].ratio) < 0.01
    assert abs(rows["parameter bytes, backbone + 10-class head"].ratio) < 0.01
    assert abs(rows["MACs per forward F, backbone"].ratio) < 0.01
    assert abs(rows["MACs per forward, ImageNet head"].ratio) < 0.01
    full = rows["BP-free memory = parameters + inference peak"]
    params = rows["parameter bytes, backbone + 10-class head"].ours
    peak = rows["inference activation peak"].ours
    assert full.ours == pytest.approx(params + peak)
    assert peak == pytest.approx(160.0)  # 32,768 + 131,072 B at blocks.1.pointwise1
    assert abs(rows["BP-free compute, block-wise (14 blocks)"].ours / PAPER["bpfree_full_mmacs"]
               - 1) < 0.02
    # 7,857.5 MMACs = 7 x Q x F: MCUNet-in1's 7 width stages, Q full forwards each.
    stage_wise = rows["BP-free compute, stage-wise (7 stages x Q full forwards)"]
    assert abs(stage_wise.ratio) < 0.001


def test_width_stages_and_sparse_block():
    from bpfree.pmt.mcunet_tables import mcunet_profile, sparse_block, width_stages

    stages = width_stages()
    assert [len(s) for s in stages] == [1, 2, 2, 2, 3, 3, 1]
    assert stages[4] == ["blocks.7", "blocks.8", "blocks.9"]
    profile = mcunet_profile()
    block3 = sparse_block(profile)
    # Block 3 of the 42 backbone convs, as bench mcunet splits them (the classifier, module
    # "17", is in no block): graph blocks 7-9.
    assert block3 == [f"{k}.conv.{j}" for k in (8, 9, 10) for j in range(3)]
    assert "17" not in sparse_block(profile, index=4)
    with pytest.raises(ValueError, match=r"block index must be an int in \[1, 4\]"):
        sparse_block(profile, index=5)


def test_pmt_step_runs(model, photos):
    from bpfree.pmt import PMTConfig, PMTTrainer

    x = torch.cat([photos["chelsea"], photos["coffee"]])
    y = torch.tensor([285, 967])
    trainer = PMTTrainer(model, PMTConfig(queries=2), example=x)
    assert len(trainer.layers) == 43
    before = model.body[16].weight.clone()
    out = trainer.step(x, y, lr=0.0)  # lr 0: the shared module-scoped model stays unchanged
    assert out["forwards"] == 2 + 43 * 2 * 2 and np.isfinite(out["loss"])
    assert torch.equal(before, model.body[16].weight)


def test_classify_cli_writes_json(tmp_path, photos):
    from bpfree.cli import main

    path = tmp_path / "c.json"
    assert main(["classify", "--sample", "chelsea", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["top5"][0] in range(281, 286) and len(doc["logits"]) == 1000
    assert all(-128 <= v <= 127 for v in doc["logits"])
    # An image file already 128x128 is used as it is.
    from PIL import Image

    img = (photos["chelsea"][0].permute(1, 2, 0).to(torch.int16) + 128).to(torch.uint8).numpy()
    Image.fromarray(img).save(tmp_path / "cat.png")
    assert main(["classify", str(tmp_path / "cat.png"), "--json", str(path)]) == 0
    assert json.loads(path.read_text())["top5"] == doc["top5"]
    assert main(["classify", str(tmp_path / "nothing.png")]) == 2


@pytest.mark.slow
def test_pmt_step_overhead_is_one_gradient_buffer(model):
    """Item 4: a synchronized PMT step on the real model costs, beyond inference, at most the
    largest trainable layer's gradient buffer (float64 in this simulator) plus small change
    (one stage input, O(Q) scalars) -- not BP's saved activations."""
    from bpfree.pmt.mcunet_tables import measure_pmt_step

    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (2, 3, 128, 128), dtype=torch.int8, generator=g)
    r = measure_pmt_step(model, x, torch.tensor([1, 2]), queries=2, synchronized=True)
    buffer = 8 * r["largest_layer_params"]
    assert r["overhead"] <= buffer + 256 * 1024, r


@pytest.mark.slow
def test_pmt_step_overhead_single_sample(model):
    """At N=1 the inference peak is smallest, so any layer-sized temporary of the update
    (a bool mask of the finiteness check, say) shows: the overhead must still fit one
    gradient buffer."""
    from bpfree.pmt.mcunet_tables import measure_pmt_step

    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (1, 3, 128, 128), dtype=torch.int8, generator=g)
    r = measure_pmt_step(model, x, torch.tensor([1]), queries=2, synchronized=True)
    assert r["overhead"] <= 8 * r["largest_layer_params"] + 256 * 1024, r


def test_classify_compare_requant_report(tmp_path, capsys):
    """--compare-requant reports the other rule's disagreement; the counts must be the
    library's own comparison of the two imported models on the same input."""
    from bpfree.classify import sample_image
    from bpfree.cli import main
    from bpfree.models.mcunet import compare_requant, mcunet_in1, preprocess_image

    path = tmp_path / "c.json"
    assert main(["classify", "--sample", "coffee", "--compare-requant", "--json", str(path)]) == 0
    report = json.loads(path.read_text())["requant_comparison"]
    assert report["rules"] == ["tflite", "float"]
    x = preprocess_image(sample_image("coffee"))
    expected = compare_requant(mcunet_in1(), mcunet_in1(requant="float"), x)
    assert report["logits_differ"] == expected["logits_differ"] > 0
    assert report["isolated_differ"] == expected["isolated_differ"]
    assert f"{expected['logits_differ']} of 1000 differ" in capsys.readouterr().out


def test_memory_cli_defaults_to_the_papers_setting_for_mcunet(tmp_path, capsys):
    """`bpfree memory --model mcunet-in1` reports the generic rule at the tables' own N=1,
    Q=50 unless told otherwise, so the two parts of its output agree."""
    from bpfree.cli import main

    path = tmp_path / "m.json"
    assert main(["memory", "--model", "mcunet-in1", "--method", "pmt", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert (row["batch_size"], row["num_queries"]) == (1, 50)
    assert "N=1, Q=50" in capsys.readouterr().out
    assert main(["memory", "--model", "mcunet-in1", "--method", "pmt", "--batch-size", "4",
                 "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert (row["batch_size"], row["num_queries"]) == (4, 50)


def test_device_export_takes_a_model_folder(tmp_path, model):
    """`bpfree device export --model DIR`: a graph.json + weights.npz folder loads as the
    same integer model as the built-in name, with its input shape from graph.json."""
    from bpfree.device.cli import build_model

    folder = _copy(tmp_path)
    loaded, example = build_model(str(folder))
    assert example.shape == (1, 3, 128, 128) and example.dtype == torch.int8
    x = torch.randint(-128, 128, (2, 3, 128, 128), dtype=torch.int8)
    assert torch.equal(loaded.forward_int(x), model.forward_int(x))
    with pytest.raises(ValueError, match="a model folder"):
        build_model(str(tmp_path / "nowhere"))
