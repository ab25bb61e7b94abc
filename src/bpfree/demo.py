"""``bpfree demo``: adapt a deployed INT8 classifier to sensor drift with forward passes only.

The story of an inference-only device, at laptop scale, in seconds on one CPU core and with
no network — the Poor Man's Training (PMT) pipeline:

1. pretrain a 64-64-10 MLP on scikit-learn's bundled digits with ordinary back-propagation
   (this happens "in the factory");
2. post-training quantize it to a real INT8 model (:func:`bpfree.quant.quantize_model`,
   TFLite int8 scheme), calibrated on clean training digits with the sensor's physical input
   range [0, 1]; this integer graph is all the device has;
3. the deployed sensor drifts: inputs lose contrast, gain a brightness offset and Gaussian
   noise (clipped back to the sensor's [0, 1]), and accuracy drops;
4. adapt the INT8 weights and biases on the device, BP-free, with
   :class:`bpfree.pmt.PMTTrainer` (PMT Algorithm 1: layer-wise adaptive weight / node
   perturbation with integer ±1 directions, gradient-norm scaling, quantization-aware
   scaling, synchronized update, cosine learning-rate decay);
5. report float and INT8 clean accuracy, drifted accuracy before and after, the forward
   passes used (per sample: N·(1 + L·Q) per step), PMT's analytic training memory on the
   device (:func:`bpfree.memory.analytic`, rule ``"pmt"``) and the measured peak extra memory
   of one training step of this simulator over plain inference.

Quantization ranges stay those calibrated in the factory on clean data, as on a real device:
the drifted inputs lie inside the calibrated input range [0, 1] by construction, but hidden
activations may saturate their clean-data ranges; PMT adapts the integer weights around them.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from .baselines import BPTrainer
from .data import load_digits_split
from .harness import accuracy, fit
from .io import write_json
from .memory import analytic, measure_peak
from .models import digits_mlp
from .pmt import PMTConfig, PMTTrainer
from .progress import show_progress
from .quant.ptq import quantize_model

DEFAULTS = dict(seed=0, epochs=20, batch_size=64, queries=10, lr=0.3, schedule="cosine",
                perturbation="adaptive", layerwise=True, gns=True, qas=True, synchronized=True,
                micro_batch=None, noise=0.2, contrast=0.5, brightness=0.3)

#: Largest run seed: seeds up to ``seed + 3`` are drawn, and numpy takes seeds below 2**32.
MAX_SEED = 2**32 - 4

#: The sensor's physical input range: PTQ's input quantizer covers exactly [0, 1].
INPUT_RANGE = (0.0, 1.0)


EPILOG = """\
examples:
  bpfree demo
  bpfree demo --epochs 5 --perturbation np --json demo.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0].replace("``", "")
    d = DEFAULTS
    parser.set_defaults(seed_max=MAX_SEED)  # checked by bpfree.cli before any work
    parser.add_argument("--seed", type=int, default=d["seed"],
                        help="run seed (data split, pretraining, perturbations, batches)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--epochs", type=int, default=d["epochs"], help="BP-free adaptation epochs")
    parser.add_argument("--batch-size", type=int, default=d["batch_size"], help="mini-batch size N")
    parser.add_argument("--queries", type=int, default=d["queries"],
                        help="queries Q: perturbed forward passes per layer and step")
    parser.add_argument("--lr", type=float, default=d["lr"],
                        help="base learning rate η of the integer update (PMT Eq. 8; GNS and QAS "
                             "scale it per layer)")
    parser.add_argument("--schedule", default=d["schedule"], choices=["cosine", "constant"],
                        help="learning-rate schedule over the adaptation steps")
    parser.add_argument("--perturbation", default=d["perturbation"], choices=["adaptive", "wp", "np"],
                        help="adaptive: weight perturbation where d_w < d_a, else node "
                             "perturbation (PMT §3.2.2); wp / np: one kind everywhere")
    parser.add_argument("--model-wise", action="store_true",
                        help="perturb all layers together instead of one layer at a time")
    parser.add_argument("--no-gns", action="store_true", help="turn off gradient-norm scaling (Eq. 8)")
    parser.add_argument("--no-qas", action="store_true",
                        help="turn off quantization-aware scaling (Appendix B)")
    parser.add_argument("--local", action="store_true",
                        help="local (block-coordinate) update instead of the synchronized one")
    parser.add_argument("--micro-batch", type=int, default=d["micro_batch"], metavar="M",
                        help="accumulate estimates over micro-batches of M samples (default: "
                             "the whole batch)")
    parser.add_argument("--noise", type=float, default=d["noise"],
                        help="std of the Gaussian noise added to pixels in [0, 1]")
    parser.add_argument("--contrast", type=float, default=d["contrast"],
                        help="contrast factor of the sensor drift (1 = unchanged)")
    parser.add_argument("--brightness", type=float, default=d["brightness"],
                        help="brightness offset of the sensor drift (0 = unchanged)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def check_drift(*, noise: float, contrast: float, brightness: float) -> None:
    """Raise ValueError for a drift :func:`corrupt` does not accept."""
    if not (noise >= 0 and noise < float("inf")):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    if not 0 < contrast <= 1:
        raise ValueError(f"contrast must be in (0, 1], got {contrast}")
    if not -1 <= brightness <= 1:
        raise ValueError(f"brightness must be in [-1, 1], got {brightness}")


def corrupt(x: torch.Tensor, *, noise: float, contrast: float, brightness: float, seed: int) -> torch.Tensor:
    """Deterministic sensor drift: lower contrast, a brightness offset and Gaussian noise.

    ``x' = clip(contrast·x + brightness + noise·ε, 0, 1)`` with ``ε ~ N(0, 1)`` drawn from ``seed``.
    """
    check_drift(noise=noise, contrast=contrast, brightness=brightness)
    gen = torch.Generator().manual_seed(seed)
    y = contrast * x + brightness
    return (y + noise * torch.randn(x.shape, generator=gen)).clamp(0.0, 1.0)


def accuracy_fraction(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """:func:`bpfree.harness.accuracy` as a fraction in [0, 1] (float model or
    QuantizedModel), the demo's unit. Rounded to float32, as the demo has always reported it
    (it was a float32 mean), so its JSON for a given seed stays bit-identical."""
    return float(torch.tensor(accuracy(model, x, y, batch_size=x.shape[0]) / 100.0,
                              dtype=torch.float32))


def pretrain(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int = 60) -> None:
    """Ordinary BP training on clean data (Adam at 3e-3, batches of 64, the shared
    :class:`~bpfree.baselines.BPTrainer`): the factory model the device ships with."""
    fit(BPTrainer(model, "adam", loss_fn=nn.functional.cross_entropy), x, y, epochs=epochs,
        batch_size=64, lr=3e-3, schedule="constant", seed=seed)


class _MeasureFirstStep:
    """Wraps a PMT method for :func:`bpfree.pmt.fit`: the first step is measured.

    On the first batch it measures the peak tensor storage of plain inference and of the
    training step on that batch (:func:`bpfree.memory.measure_peak`); later steps run as is.
    """

    def __init__(self, method, model: nn.Module) -> None:
        self.method, self.model = method, model
        self.inference = self.step_memory = None

    @property
    def forwards(self) -> int:
        return self.method.forwards

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        if self.step_memory is not None:
            return self.method.step(x, y, lr)
        with torch.no_grad():
            _, self.inference = measure_peak(lambda: self.model(x))
        out, self.step_memory = measure_peak(self.method.step, x, y, lr)
        return out


def forwards_per_sample(layers: int, config) -> int:
    """Forward passes per training sample and epoch of :class:`~bpfree.pmt.PMTTrainer`.

    Layer-wise, synchronized (PMT's default): 1 clean + L·Q perturbed partial passes, so a
    step on N samples costs N·(1 + L·Q). The local update re-runs the suffix after each
    layer's update (+L); model-wise estimation perturbs all layers at once (1 + Q).
    """
    if not config.layerwise:
        return 1 + config.queries
    return 1 + layers * config.queries + (0 if config.synchronized else layers)


def drifted_digits(*, seed: int, noise: float, contrast: float, brightness: float) -> dict:
    """Steps 1-3 of the story: the factory's float and INT8 models and the drifted digits.

    Returns a dict with ``float_model``, ``qmodel`` (INT8), ``x_tr`` / ``y_tr`` (clean
    training digits), ``xc_tr`` / ``xc_te`` (drifted training / test digits), ``y_te`` and
    the clean test accuracies ``acc_float`` and ``acc_int8``.
    """

    torch.manual_seed(seed)
    x_tr, y_tr, x_te, y_te = (torch.as_tensor(a) for a in load_digits_split(seed=seed))
    # 1. Factory: BP pretraining of the float model, then PTQ to INT8 on clean digits.
    float_model = digits_mlp()
    pretrain(float_model, x_tr, y_tr, seed=seed)
    acc_float = accuracy_fraction(float_model, x_te, y_te)
    qmodel = quantize_model(float_model, x_tr, input_range=INPUT_RANGE)
    acc_int8 = accuracy_fraction(qmodel, x_te, y_te)
    # 2. The sensor drifts.
    xc_tr = corrupt(x_tr, noise=noise, contrast=contrast, brightness=brightness, seed=seed + 1)
    xc_te = corrupt(x_te, noise=noise, contrast=contrast, brightness=brightness, seed=seed + 2)
    return {"float_model": float_model, "qmodel": qmodel, "x_tr": x_tr, "y_tr": y_tr,
            "xc_tr": xc_tr, "xc_te": xc_te, "y_te": y_te, "acc_float": acc_float,
            "acc_int8": acc_int8}


def run(*, seed=0, epochs=20, batch_size=64, queries=10, lr=0.3, schedule="cosine",
        perturbation="adaptive", layerwise=True, gns=True, qas=True, synchronized=True,
        micro_batch=None, noise=0.2, contrast=0.5, brightness=0.3, progress=False) -> dict:
    """Run the whole demo and return its results (see module docstring).

    Accuracies are fractions in [0, 1]; ``progress`` is False, True or a bar title.
    """

    # seed .. seed + 3 seed the split, the two drifts and the batches (numpy: < 2**32).
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch-size must be >= 1, got {epochs} and {batch_size}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    check_drift(noise=noise, contrast=contrast, brightness=brightness)
    config = PMTConfig(queries=queries, perturbation=perturbation, layerwise=layerwise, gns=gns,
                       qas=qas, synchronized=synchronized, micro_batch=micro_batch, seed=seed)
    start = time.perf_counter()
    s = drifted_digits(seed=seed, noise=noise, contrast=contrast, brightness=brightness)
    float_model, qmodel, xc_tr, xc_te = s["float_model"], s["qmodel"], s["xc_tr"], s["xc_te"]
    y_tr, y_te = s["y_tr"], s["y_te"]
    acc_float, acc_int8 = s["acc_float"], s["acc_int8"]
    acc_before = accuracy_fraction(qmodel, xc_te, y_te)
    factory_seconds = time.perf_counter() - start

    # 3. On the device: PMT on the integer model, forward passes only.
    trainer = PMTTrainer(qmodel, config, example=xc_tr[:batch_size])
    method = _MeasureFirstStep(trainer, qmodel)
    history = fit(method, xc_tr, y_tr, epochs=epochs, batch_size=batch_size, lr=lr,
                  schedule=schedule, seed=seed + 3, progress=progress)
    acc_after = accuracy_fraction(qmodel, xc_te, y_te)

    # 4. PMT's training memory on the device, from the analytic rule (PMT Table 3, per layer):
    # the int8 inference graph (parameters, activations) plus what training adds on top.
    rule = analytic(float_model, "pmt", example_input=xc_tr[:batch_size], batch_size=batch_size,
                    num_queries=queries)
    inference_parts = ("parameters", "activations")
    analytic_extra = rule.total - sum(rule.parts.get(k, 0) for k in inference_parts)
    inf_peak, step_peak = int(method.inference.peak_bytes), int(method.step_memory.peak_bytes)
    return {
        "acc_float_clean": acc_float,
        "acc_clean": acc_int8,
        "acc_before": acc_before,
        "acc_after": acc_after,
        "forward_passes": trainer.forwards,
        "forwards_per_sample_epoch": forwards_per_sample(len(trainer.trainable), config),
        "layers": len(trainer.trainable),
        "modes": {name: mode.upper() for name, mode in trainer.modes.items()},
        "n_train": int(xc_tr.shape[0]),
        "steps": trainer.steps,
        "final_loss": history.loss[-1],
        "analytic_bytes": rule.total,
        "analytic_extra_bytes": analytic_extra,
        "analytic_parts": dict(rule.parts),
        "analytic_rule": rule.method,
        "peak_extra_bytes": max(0, step_peak - inf_peak),
        "train_step_peak_bytes": step_peak,
        "inference_peak_bytes": inf_peak,
        "factory_seconds": factory_seconds,
        "adapt_seconds": history.seconds,
        "seconds": time.perf_counter() - start,
        "seed": seed,
        "config": {**{k: v for k, v in config.as_dict().items() if k != "seed"}, "epochs": epochs, "batch_size": batch_size, "lr": lr,
                   "schedule": schedule, "noise": noise, "contrast": contrast,
                   "brightness": brightness, "input_range": list(INPUT_RANGE),
                   "calibration": "clean training digits"},
    }


def format_table(r: dict) -> str:
    def kib(b):
        return f"{b / 1024:,.1f} KiB"

    c = r["config"]
    modes = ", ".join(f"{k} {v}" for k, v in r["modes"].items())
    rows = [
        ("accuracy on clean test digits, float (BP-pretrained)", f"{r['acc_float_clean']:.1%}"),
        ("accuracy on clean test digits, INT8 (PTQ)", f"{r['acc_clean']:.1%}"),
        ("accuracy on drifted test digits, INT8 before", f"{r['acc_before']:.1%}"),
        ("accuracy on drifted test digits, INT8 after BP-free", f"{r['acc_after']:.1%}"),
        ("gain", f"{(r['acc_after'] - r['acc_before']) * 100:+.1f} points"),
        ("forward passes used (per sample)",
         f"{r['forward_passes']:,} = {c['epochs']} epochs x {r['n_train']} samples x "
         f"{r['forwards_per_sample_epoch']}"),
        ("PMT training memory on the device, analytic", kib(r["analytic_bytes"])),
        ("  of which beyond INT8 inference (params + activations)",
         kib(r["analytic_extra_bytes"])),
        ("peak extra memory of one step over inference, measured*", kib(r["peak_extra_bytes"])),
        ("wall time", f"{r['seconds']:.1f} s (adaptation {r['adapt_seconds']:.1f} s)"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    rule = "-" * len(max(lines, key=len))
    switches = [name for name, on in (("layer-wise", c["layerwise"]), ("GNS", c["gns"]),
                                      ("QAS", c["qas"]), ("synchronized", c["synchronized"])) if on]
    head = (f"bpfree demo: PMT on the INT8 digits MLP (Q={c['queries']}, lr={c['lr']} "
            f"{c['schedule']}, {c['epochs']} epochs, batch {c['batch_size']}, "
            f"{c['perturbation']} perturbation: {modes}; {', '.join(switches) or 'no switches'}), "
            f"seed {r['seed']}")
    note = ("* torch tensors of this CPU simulator (int32 / float64 intermediates, NP queries "
            "batched),\n  not the device; the analytic figure is PMT's int8 schedule "
            "(bpfree.memory rule 'pmt').")
    return "\n".join([head, rule, *lines, rule, note])


def main(args: argparse.Namespace) -> int:
    progress = not args.no_progress and show_progress(quiet=getattr(args, "quiet", False))
    result = run(seed=args.seed, epochs=args.epochs, batch_size=args.batch_size,
                 queries=args.queries, lr=args.lr, schedule=args.schedule,
                 perturbation=args.perturbation, layerwise=not args.model_wise,
                 gns=not args.no_gns, qas=not args.no_qas, synchronized=not args.local,
                 micro_batch=args.micro_batch, noise=args.noise, contrast=args.contrast,
                 brightness=args.brightness,
                 progress="PMT adaptation (INT8, BP-free)" if progress else False)
    print(format_table(result))
    if args.json is not None:
        print(f"wrote {write_json(result, args.json)}")
    return 0
