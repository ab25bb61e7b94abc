"""The generated C training engine (bpfree.device) against the device-exact simulator.

Host tests compile with the system C compiler and load the program through ctypes; the
cortex-m7 tests cross-compile and run under QEMU, and skip naming the missing tool elsewhere.
Parity is tensor-for-tensor equality of every integer weight and bias, and of every step's
integer loss sum, after K steps on the same batches, seed and rate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bpfree.data import load_digits_split
from bpfree.device import cyclic_batches, export_c, infer_c, run_c
from bpfree.device.mcu import missing_tools
from bpfree.models import digits_mlp, mnist_cnn, mnist_mobilenet
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.pmt.exact import LOSS_BITS, LossTables, fixed_loss, log2_fixed
from bpfree.quant import quantize_model

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) on PATH")
MISSING_M7 = missing_tools()
needs_m7 = pytest.mark.skipif(bool(MISSING_M7),
                              reason=f"cortex-m7 toolchain missing: {', '.join(MISSING_M7)}")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The simulator's small convolutions are slower with torch's thread pool on a busy CI box.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------ device-exact arithmetic

def test_log2_fixed_is_floor_of_log2_to_24_bits():
    s = np.array([1, 2, 3, 2**30, 2**30 + 1, 3 * 2**30, 1000 * 2**30, 2**40 - 1], dtype=np.int64)
    got = log2_fixed(s) / 2**LOSS_BITS
    want = np.log2(s.astype(np.float64))
    assert np.all(got <= want + 1e-12)
    assert np.all(want - got < 2 * 2.0**-LOSS_BITS)
    assert log2_fixed(np.array([2**30]))[0] == 30 << LOSS_BITS  # powers of two are exact


def test_fixed_loss_matches_float_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(-128, 128, (64, 10), generator=g, dtype=torch.int64).to(torch.int8)
    y = torch.randint(0, 10, (64,), generator=g)
    scale = 0.0731
    got = fixed_loss(logits, y, LossTables.for_scale(scale)) / 2**LOSS_BITS
    want = F.cross_entropy(logits.double() * scale, y, reduction="none").numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_device_exact_config_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="synchronized"):
        PMTConfig(device_exact=True, synchronized=False)
    with pytest.raises(ValueError, match="layerwise"):
        PMTConfig(device_exact=True, layerwise=False)
    with pytest.raises(ValueError, match="device_exact must be a bool"):
        PMTConfig(device_exact=1)


# ------------------------------------------------------------------------------- models

@pytest.fixture(scope="module")
def digits():
    xtr, ytr, _, _ = load_digits_split(0)
    return torch.tensor(xtr[:256]), torch.tensor(ytr[:256])


def _digits_trainer(digits, **cfg):
    x, _ = digits
    torch.manual_seed(0)
    qmodel = quantize_model(digits_mlp().eval(), x[:128], input_range=(0.0, 1.0))
    config = PMTConfig(**{"queries": 4, "seed": 3, "device_exact": True, **cfg})
    return PMTTrainer(qmodel, config, example=x[:2])


def _cnn_trainer(builder, **cfg):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    torch.manual_seed(0)
    qmodel = quantize_model(builder().eval(), x[:16])
    config = PMTConfig(**{"queries": 2, "seed": 5, "device_exact": True, **cfg})
    return PMTTrainer(qmodel, config, example=x[:2]), x, y


def simulate(trainer, x, y, steps, batch_size, lr):
    sums = []
    for idx in cyclic_batches(len(x), steps, batch_size):
        out = trainer.step(x[idx], y[idx], lr)
        sums.append(out["loss_fixed"])
    return sums


def assert_same_integers(a: torch.nn.Module, b: torch.nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


def check_parity(trainer, x, y, tmp_path, *, steps, batch_size, lr, target="host", **export):
    program = export_c(trainer, tmp_path / "prog", target=target,
                       **{"max_batch": batch_size, **export})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = run_c(program, x, y, steps=steps, batch_size=batch_size, lr=lr)
    sums = simulate(trainer, x, y, steps, batch_size, lr)
    assert result.loss_sums == sums
    assert_same_integers(result.model, trainer.model)
    changed = sum(int((before[k] != v).sum()) for k, v in trainer.model.state_dict().items())
    assert changed > 0, "training changed nothing: the parity check would be vacuous"
    return result


# ------------------------------------------------------------------------------- host parity

@needs_cc
def test_host_parity_demo_mlp_20_steps(digits, tmp_path):
    trainer = _digits_trainer(digits)
    x, y = digits
    result = check_parity(trainer, x, y, tmp_path, steps=20, batch_size=32, lr=0.3)
    assert all(math.isfinite(v) for v in result.losses)


@needs_cc
def test_host_parity_mlp_weight_perturbation_micro_batches_no_gns_qas(digits, tmp_path):
    trainer = _digits_trainer(digits, micro_batch=8, gns=False, qas=False, perturbation="wp")
    x, y = digits
    check_parity(trainer, x, y, tmp_path, steps=5, batch_size=24, lr=2000.0)


@needs_cc
def test_host_parity_mlp_node_perturbation_micro_batches(digits, tmp_path):
    # Micro-batches keep int64 sums until the update; NP adds Eq. 10's sums per micro-batch.
    trainer = _digits_trainer(digits, micro_batch=4, perturbation="np", queries=3)
    x, y = digits
    check_parity(trainer, x, y, tmp_path, steps=3, batch_size=10, lr=0.3)


@needs_cc
def test_host_parity_mnist_cnn_20_steps(tmp_path):
    trainer, x, y = _cnn_trainer(mnist_cnn)
    check_parity(trainer, x, y, tmp_path, steps=20, batch_size=8, lr=0.1)


@needs_cc
def test_host_parity_mnist_cnn_node_perturbation_of_convs(tmp_path):
    trainer, x, y = _cnn_trainer(mnist_cnn, perturbation="np")
    check_parity(trainer, x, y, tmp_path, steps=3, batch_size=4, lr=0.1)


@needs_cc
@pytest.mark.parametrize("micro_batch", [None, 2])
def test_host_parity_mobilenet_blocks_sparse(tmp_path, micro_batch):
    # The frozen prefix runs fused and in place (plan.prefix_schedule), and the step's buffers
    # share its bytes; with micro-batches, each micro-batch's clean forward runs over them.
    trainer, x, y = _cnn_trainer(mnist_mobilenet, micro_batch=micro_batch)
    names = [l.name for l in trainer.layers]
    block = [n for n in names if n.startswith("body.3.")]
    sparse = PMTTrainer(trainer.model, trainer.config, example=x[:2],
                        trainable=block + [names[-1]])
    check_parity(sparse, x, y, tmp_path, steps=3, batch_size=4, lr=0.1)


@needs_cc
def test_host_inference_matches_the_integer_model(tmp_path):
    trainer, x, _ = _cnn_trainer(mnist_mobilenet)
    program = export_c(trainer, tmp_path / "prog", max_batch=8)
    xq = trainer.model.input_quant.quantize(x[:20])
    assert torch.equal(infer_c(program, xq), trainer.model.forward_int(xq))


# ------------------------------------------------------------------------------- arena plan

def replay_schedule(graph, plan, specs):
    """The step of bpf_step as (time, kind, byte range, value) events, written independently
    of the planner: the clean forward, then per trainable stage the perturbed passes (Q = 1
    suffices: queries repeat the same accesses), the stage pass and the NP estimate's read of
    the layer input. The step's buffers are written after the clean forward and read at the
    end. In the clean forward, a fused pair (plan.op_exec) writes its expanded block and the
    depthwise's output at both of its times, while reading the pair's input (the blocks
    interleave); an in-place depthwise reads its input, then writes its staging block and its
    output."""
    from bpfree.device.plan import EXEC_FUSED, EXEC_INPLACE, STEP_BUFFERS

    n_ops = len(graph.ops)
    stage_of = [graph.ops[s.op].stage for s in specs]
    execs = plan.op_exec
    events, latest, time = [], {}, [0]

    def access(kind, key, offset, size):
        key = (key, offset)
        if kind == "w":
            latest[key] = len(events)
        elif key not in latest:
            raise AssertionError(f"{key[0]} read at {offset} before any write there")
        events.append((time[0], kind, offset, offset + size, latest[key]))

    def tensor(kind, t, place):
        access(kind, f"t{t}", place[t], plan_bytes[t])

    def run(first, end, place):
        for k in range(first, end):
            op = graph.ops[k]
            clean = place is off
            if clean and execs[k].mode == EXEC_FUSED or clean and k and \
                    execs[k - 1].mode == EXEC_FUSED:
                pw = graph.ops[k if execs[k].mode == EXEC_FUSED else k - 1]
                dw = graph.ops[graph.ops.index(pw) + 1]
                tensor("r", pw.inputs[0], place)
                tensor("w", pw.output, place)
                tensor("r", pw.output, place)
                tensor("w", dw.output, place)
            elif clean and execs[k].mode == EXEC_INPLACE:
                out = graph.tensors[op.output]
                staging = execs[k].channels * out.h * out.w
                tensor("r", op.inputs[0], place)
                access("w", f"staging{k}", execs[k].staging, staging)
                access("r", f"staging{k}", execs[k].staging, staging)
                tensor("w", op.output, place)
            else:
                for t in op.inputs:
                    tensor("r", t, place)
                tensor("w", op.output, place)
            time[0] += 1

    plan_bytes = [graph.tensors[t].numel * BATCH for t in range(len(graph.tensors))]
    for k, e in enumerate(execs):  # a fused pair's expanded tensor: one block of one sample
        if e.mode == EXEC_FUSED:
            x = graph.tensors[graph.ops[k].output]
            plan_bytes[graph.ops[k].output] = e.channels * x.h * x.w
    step = {b.name: (b.offset, b.size) for b in plan.buffers if b.name in STEP_BUFFERS}
    off = plan.tensor_off
    tensor("w", 0, off)
    run(0, n_ops, off)
    tensor("r", len(graph.tensors) - 1, off)
    for name, (offset, size) in step.items():
        access("w", name, offset, size)
    tables = dict(plan.perturbed)
    cursor = graph.stage_first_op[stage_of[0]]
    for stage in sorted(set(stage_of)):
        first = graph.stage_first_op[stage]
        run(cursor, first, off)
        for _ in (s for s, k in zip(specs, stage_of) if k == stage):
            run(first, n_ops, tables[stage])
            tensor("r", len(graph.tensors) - 1, tables[stage])
        ops = [s.op for s, k in zip(specs, stage_of) if k == stage]
        end = ops[-1] + 1 if stage == max(stage_of) else graph.stage_first_op[stage + 1]
        for k in range(first, end):
            run(k, k + 1, off)
            if k in ops:
                tensor("r", graph.ops[k].inputs[0], off)
        cursor = end
    for name, (offset, size) in step.items():
        access("r", name, offset, size)
    return events


BATCH = 3


def assert_no_live_value_overwritten(events):
    last_read = {}
    for time, kind, _, _, value in events:
        if kind == "r":
            last_read[value] = time
    writes = [(time, lo, hi, i) for i, (time, kind, lo, hi, _) in enumerate(events)
              if kind == "w"]
    for value, t_end in last_read.items():
        t_start, _, lo, hi, _ = events[value]
        for time, wlo, whi, i in writes:
            if i != value and t_start <= time < t_end and wlo < hi and lo < whi:
                raise AssertionError(f"write {events[i]} clobbers value {events[value]} "
                                     f"read until {t_end}")


@pytest.mark.parametrize("sparse", [False, True])
def test_arena_plan_never_overwrites_a_value_before_its_last_read(sparse):
    from bpfree.device.export import _trainable_rows
    from bpfree.device.lower import lower
    from bpfree.device.plan import TrainableSpec, plan_arena

    trainer, x, _ = _cnn_trainer(mnist_mobilenet)
    if sparse:  # a frozen prefix, a trainable block, frozen stages, the trainable head
        names = [l.name for l in trainer.layers]
        trainer = PMTTrainer(trainer.model, trainer.config, example=x[:2],
                             trainable=[n for n in names if n.startswith("body.3.")] + names[-1:])
    graph = lower(trainer.model, (1, 28, 28))
    specs = [TrainableSpec(r["op"], r["mode"], r["d_w"], r["d_a"], r["cout"])
             for r in _trainable_rows(trainer, graph)]
    plan = plan_arena(graph, specs, BATCH, queries=2, deferred=False)
    if sparse:  # the frozen prefix holds both of its schedules
        from bpfree.device.plan import EXEC_FUSED, EXEC_INPLACE

        assert {EXEC_FUSED, EXEC_INPLACE} <= {e.mode for e in plan.op_exec}
    events = replay_schedule(graph, plan, specs)
    assert_no_live_value_overwritten(events)
    # The replay is a real check: packing every activation at one offset fails it.
    one = (plan.tensor_off[0],) * len(graph.tensors)
    squashed = dataclasses.replace(plan, tensor_off=one,
                                   perturbed=tuple((k, one) for k, _ in plan.perturbed))
    with pytest.raises(AssertionError, match="clobbers"):
        assert_no_live_value_overwritten(replay_schedule(graph, squashed, specs))


def test_step_macs_counts_the_schedule(digits, tmp_path):
    from bpfree.device.report import step_macs

    trainer = _digits_trainer(digits)  # 64-64-10: two NP layers, Q = 4, one stage each
    program = export_c(trainer, tmp_path / "prog", max_batch=5)
    layers = [64 * 64, 64 * 10]
    from_layer = [sum(layers[i:]) for i in range(3)]
    # clean forward + stage passes + Eq. 10 sums + Q passes from each layer's stage
    per_sample = 3 * sum(layers) + 4 * sum(from_layer)
    assert step_macs(program) == 5 * per_sample
    assert step_macs(program, queries=1) == 5 * (3 * sum(layers) + sum(from_layer))


# ------------------------------------------------------------------------------- errors

def test_export_needs_device_exact_and_nonzero_seed(digits, tmp_path):
    x, _ = digits
    qmodel = quantize_model(digits_mlp().eval(), x[:64], input_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="device_exact=True"):
        export_c(PMTTrainer(qmodel, PMTConfig(seed=3), example=x[:2]), tmp_path / "a")
    with pytest.raises(ValueError, match="seed 0"):
        export_c(PMTTrainer(qmodel, PMTConfig(device_exact=True), example=x[:2]), tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_an_existing_directory_and_unsupported_layers(digits, tmp_path):
    trainer = _digits_trainer(digits)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        export_c(trainer, tmp_path / "taken")
    trainer.model.body.append(torch.nn.Sigmoid())
    with pytest.raises(ValueError, match="Sigmoid.*not supported"):
        export_c(trainer, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


# ------------------------------------------------------------------------------- cortex-m7

@needs_m7
def test_cortex_m7_parity_demo_mlp_20_steps(digits, tmp_path):
    trainer = _digits_trainer(digits)
    x, y = digits
    check_parity(trainer, x, y, tmp_path, steps=20, batch_size=32, lr=0.3, target="cortex-m7")


@needs_m7
def test_cortex_m7_parity_mnist_cnn_20_steps(tmp_path):
    trainer, x, y = _cnn_trainer(mnist_cnn, queries=1)
    check_parity(trainer, x, y, tmp_path, steps=20, batch_size=2, lr=0.1, target="cortex-m7")


@needs_m7
@pytest.mark.slow
def test_emulator_step_counter_agrees_with_a_per_instruction_trace(digits, tmp_path):
    from bpfree.device.mcu import INSNS_PER_TICK, traced_step_instructions
    from bpfree.device.run import _as_int8

    x, y = digits
    torch.manual_seed(0)
    float_model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(),
                                      torch.nn.Linear(8, 10))
    model = quantize_model(float_model.eval(), x[:64], input_range=(0.0, 1.0))
    trainer = PMTTrainer(model, PMTConfig(queries=1, seed=3, device_exact=True), example=x[:2])
    program = export_c(trainer, tmp_path / "prog", target="cortex-m7", max_batch=2)
    counted = run_c(program, x[:2], y[:2], steps=1, batch_size=2, lr=0.3,
                    count_instructions=True).instructions[0]
    traced = traced_step_instructions(program, _as_int8(program, x[:2]),
                                      y[:2].numpy().astype(np.int32), 2, 0.3)
    assert traced > 10_000
    # One timer tick, plus the few instructions of the call and the timer reads.
    assert abs(counted - traced) <= INSNS_PER_TICK + 32


# ------------------------------------------------------------------------------- CLI

@needs_cc
def test_cli_export_run_report(tmp_path, capsys):
    from bpfree.cli import main

    out = tmp_path / "prog"
    assert main(["device", "export", "--model", "digits-mlp", "--out", str(out), "--seed", "3",
                 "--batch-size", "16"]) == 0
    assert main(["device", "run", str(out), "--data", "digits", "--steps", "2",
                 "--batch-size", "16", "--json", str(tmp_path / "run.json")]) == 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert len(run["losses"]) == 2 and all(math.isfinite(v) for v in run["losses"])
    assert main(["device", "report", str(out), "--json", str(tmp_path / "rep.json")]) == 0
    rep = json.loads((tmp_path / "rep.json").read_text())
    for key in ("text", "data", "bss", "arena_bytes", "sram_kib", "flash_kib", "analytic_bytes"):
        assert key in rep
    assert rep["arena_bytes"] > 0
    assert rep["analytic_bytes"] > 0
    assert sum(rep["analytic_parts"].values()) == rep["analytic_bytes"]


def test_cli_errors_name_the_problem(tmp_path, capsys):
    from bpfree.cli import main

    assert main(["device", "export", "--model", "digits-mlp", "--out", str(tmp_path / "a"),
                 "--seed", "0"]) == 2
    assert "seed 0" in capsys.readouterr().err
    assert main(["device", "export", "--model", "nosuch", "--out", str(tmp_path / "b")]) == 2
    assert "--model must be one of" in capsys.readouterr().err
    assert main(["device", "report", str(tmp_path)]) == 2
    assert "not a device program" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- MCUNet-in1

def _mcunet():
    from bpfree.models import mcunet_in1

    return mcunet_in1()  # the copy bundled with bpfree: never skipped


@needs_m7
@pytest.mark.slow
def test_mcunet_in1_logits_on_emulated_cortex_m7_match_classify(tmp_path):
    from bpfree.classify import classify, sample_image
    from bpfree.models.mcunet import preprocess_image

    model = _mcunet()
    image = sample_image("chelsea")
    x = preprocess_image(image)
    first = PMTTrainer(model, PMTConfig(seed=1, device_exact=True), example=x).layers[0].name
    trainer = PMTTrainer(model, PMTConfig(queries=1, seed=1, device_exact=True), example=x,
                         trainable=[first])
    program = export_c(trainer, tmp_path / "prog", target="cortex-m7", max_batch=1,
                       max_samples=1)
    assert infer_c(program, x)[0].tolist() == classify(image, model)["logits"]


def _mcunet_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (2, 3, 128, 128), generator=g).to(torch.int8)
    return x, torch.tensor([281, 967])


@needs_cc
@pytest.mark.slow
def test_mcunet_in1_sparse_step_host_parity(tmp_path):
    x, y = _mcunet_batch()
    trainer = _mcunet_trainer(_mcunet(), queries=1, block_index=4)
    check_parity(trainer, x, y, tmp_path, steps=1, batch_size=1, lr=0.05)


@needs_m7
@pytest.mark.slow
def test_mcunet_in1_sparse_step_cortex_m7_parity_in_256_kib(tmp_path):
    # Block 3 in the abstract's 256 KB: one step, bit-exact, in the program that fits 256 KiB
    # (its frozen prefix fused and in place, plan.prefix_schedule).
    x, y = _mcunet_batch()
    trainer = _mcunet_trainer(_mcunet(), queries=1, block_index=3)
    check_parity(trainer, x, y, tmp_path, steps=1, batch_size=1, lr=0.05, target="cortex-m7",
                 sram_kib=256, max_samples=2)


def _mcunet_trainer(model, queries, block_index=None):
    from bpfree.pmt.sparse import block, split_blocks

    x = torch.zeros(1, 3, 128, 128, dtype=torch.int8)
    config = PMTConfig(queries=queries, seed=7, device_exact=True)
    trainable = None
    if block_index is not None:
        layers = PMTTrainer(model, config, example=x).layers
        trainable = block(split_blocks(layers, 4), block_index)
    return PMTTrainer(model, config, example=x, trainable=trainable)


@needs_m7
@pytest.mark.slow
def test_mcunet_in1_full_model_program_links_into_stm32h7b3_sram(tmp_path):
    from bpfree.device.mcu import build_elf, size_of

    trainer = _mcunet_trainer(_mcunet(), queries=50)  # Table 8: full model, Q = 50, batch 1
    program = export_c(trainer, tmp_path / "h7b3", target="cortex-m7", max_batch=1,
                       max_samples=1)
    assert (program.meta["sram_kib"], program.meta["flash_kib"]) == (1024, 2048)
    sizes = size_of(build_elf(program))
    assert sizes["data"] + sizes["bss"] <= 1024 * 1024
    # The check bites: with the SRAM the trainable weights alone take, linking fails.
    weights_kib = sum(row["d_w"] for row in program.meta["trainable"]) // 1024
    with pytest.raises(RuntimeError, match="does not link into the MCU"):  # at export
        export_c(trainer, tmp_path / "small", target="cortex-m7", sram_kib=weights_kib,
                 max_batch=1, max_samples=1)
    assert not (tmp_path / "small").exists()
    small = export_c(trainer, tmp_path / "small", target="cortex-m7", sram_kib=weights_kib,
                     max_batch=1, max_samples=1, require_fit=False)
    with pytest.raises(RuntimeError, match="does not fit"):
        build_elf(small)


@needs_m7
@pytest.mark.slow
def test_mcunet_in1_sparse_program_links_into_256_kib(tmp_path):
    from bpfree.device.mcu import build_elf, size_of

    # Block 3, the block PMT §4.4 trains sparsely on the STM32F746 (Table 9), in the
    # abstract's 256 KB.
    trainer = _mcunet_trainer(_mcunet(), queries=50, block_index=3)
    program = export_c(trainer, tmp_path / "f746", target="cortex-m7", sram_kib=256,
                       max_batch=1, max_samples=1)
    sizes = size_of(build_elf(program))
    assert sizes["data"] + sizes["bss"] <= 256 * 1024
