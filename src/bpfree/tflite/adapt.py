"""``bpfree adapt MODEL.tflite --data DATA.npz --out ADAPTED.tflite``: adapt a deployed model.

The model is loaded (:func:`bpfree.tflite.load`; a file with an unsupported operator is refused
before any training), a validation part is split off the data, the integer weights are trained
with PMT (:class:`bpfree.pmt.PMTTrainer`, forward passes only), with PMT's sparse variant
(one block chosen by 1-epoch trials, :func:`bpfree.pmt.sparse.select_block`) or with QZO-FF
(:class:`bpfree.qzoff.IntegerQZOFF`: Eqs. 6-8 on the file's own int8 codes and scales), and the
adapted model is written atomically as a ``.tflite`` with the same scales and zero points.

Exit status: 0 done, 1 the model cannot be adapted (unsupported or corrupt file, training
failed, the output cannot be written), 2 usage errors (options, missing files, data that does
not fit the model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..progress import show_progress
from ..classify import load_image
from ..harness import accuracy, fit, holdout_split
from ..data.npz import load_npz
from ..io import atomic_write_bytes, check_input_file, refuse_output_over_input
from ..memory.rules import analytic
from ..pmt import PMTConfig, PMTTrainer
from ..pmt.sparse import select_block, split_blocks
from ..quant.stages import QuantizedModel
from ..quant.twin import float_twin
from ..qzoff import IntegerQZOFF
from .reader import load
from .schema import TFLiteFormatError
from .softmax import QSoftmax
from .writer import file_bytes

METHODS = ("pmt", "pmt-sparse", "qzo-ff")
#: --queries above this are refused: each query is a forward pass per layer and step, and the
#: paper's largest Q is 100 (PMT §4); a typo like 100000000 would run for days
MAX_QUERIES = 10_000
#: --batch-size above this is refused: a step holds Q perturbed activations of the batch
MAX_BATCH = 65_536

#: --queries when not given: PMT's Q per layer, QZO-FF's m (the paper's 3, Appendix B)
DEFAULT_QUERIES = {"pmt": 10, "pmt-sparse": 10, "qzo-ff": 3}
#: the analytic memory rule (bpfree.memory) and its bytes per value for each method
MEMORY_RULES = {"pmt": ("pmt", None), "pmt-sparse": ("pmt-sparse", None),
                "qzo-ff": ("ff", 1)}

DESCRIPTION = """\
Adapt a full-integer .tflite model to new data without back-propagation.

The model's int8 weights and int32 biases are trained from forward passes only, with
integer updates and no float copy: PMT (Poor Man's Training, layer-wise zeroth-order
estimates) or QZO-FF (sign-m-SPSA forward gradients with fixed-point perturbation and update,
Feng et al. 2024). The adapted model keeps the file's scales and zero points and is written as
a new .tflite that LiteRT runs (identical outputs with LiteRT's reference kernels).

DATA is an .npz with `x` (samples) and `y` (integer class labels), or a folder with one
sub-folder of images per class (sorted names are labels 0, 1, ...; images are converted to
the model's channels, resized to its input size and scaled to [0, 1]). In an .npz, `x` is
one sample per row in the model's input shape: NCHW (N, C, H, W), NHWC (N, H, W, C) as LiteRT
takes it, (N, H, W) for one channel, or (N, features). int8 arrays are taken as already
quantized; uint8 arrays are images scaled to [0, 1]; float arrays are real values, quantized
with the file's input scale and zero point.
"""

EPILOG = """\
examples:
  bpfree adapt model.tflite --data new_site.npz --out adapted.tflite
  bpfree adapt model.tflite --data new_site.npz --out adapted.tflite --method pmt-sparse \\
      --epochs 5 --queries 20 --json adapt.json
  bpfree adapt model.tflite --data images/ --out adapted.tflite --method qzo-ff

exit status: 0 adapted, 1 the model cannot be adapted (unsupported operator, corrupt file,
training failure, output not written), 2 usage error.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.add_argument("model", metavar="MODEL.tflite",
                        help="full-integer .tflite model to adapt (int8 activations)")
    parser.add_argument("--data", metavar="DATA", required=True,
                        help="training data: an .npz with arrays x (samples) and y (labels), "
                             "or a folder with one sub-folder of images per class")
    parser.add_argument("--out", metavar="ADAPTED.tflite", required=True,
                        help="where to write the adapted model (atomically: the path holds "
                             "either its old contents or the whole new file)")
    parser.add_argument("--method", choices=METHODS, default="pmt",
                        help="pmt: train every integer layer with PMT; pmt-sparse: train only "
                             "the one of four blocks whose 1-epoch trial gains the most (PMT "
                             "§3.3.1); qzo-ff: QZO-FF on every integer layer, all perturbed "
                             "together (2m forward passes per step; docs/TFLITE.md)")
    # (flag, type, default, metavar, help)
    options = [
        ("--epochs", int, 3, "N", "passes over the training part"),
        ("--queries", int, None, "Q", "pmt: perturbed forward passes per layer and step "
                                      "(default 10; the paper uses 100); qzo-ff: directions m "
                                      "per step (default 3, the paper's); more is slower and "
                                      "less noisy"),
        ("--lr", float, 0.01, "LR", "learning rate in float units, cosine-decayed to 0 (pmt: "
                                    "QAS scales it per layer; qzo-ff: η of Eq. 8, refused "
                                    "before training if no int8 weight could move or one step "
                                    "could cross the whole int8 range)"),
        ("--eps-codes", int, None, "K", "qzo-ff only: the perturbation ε of Eq. 6 in codes of "
                                        "each weight channel's own scale (default 1, the "
                                        "smallest the int8 grid represents)"),
        ("--batch-size", int, 64, "N", "samples per training step (pmt and qzo-ff)"),
        ("--validation", float, 0.2, "FRACTION", "fraction of DATA held out to report "
                                                 "accuracy before and after (never trained on)"),
        ("--seed", int, 0, "SEED", "seed of the split and of the perturbations (the run is "
                                   "bit-reproducible)"),
    ]
    for flag, kind, default, metavar, help_text in options:
        parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=help_text)
    parser.add_argument("--json", metavar="REPORT",
                        help="also write the report (accuracies, forward passes, settings) as "
                             "JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_args(args: argparse.Namespace) -> None:
    for name in ("epochs", "queries", "batch_size", "eps_codes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.eps_codes is not None and args.method != "qzo-ff":
        raise ValueError(f"--eps-codes applies to --method qzo-ff only, not {args.method}")
    if not 0.0 < args.validation < 1.0:
        raise ValueError(f"--validation must lie in (0, 1), got {args.validation}")
    if not (np.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {args.lr}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.batch_size > MAX_BATCH:
        raise ValueError(f"--batch-size must be at most {MAX_BATCH}, got {args.batch_size}")
    if args.queries is not None and args.queries > MAX_QUERIES:
        raise ValueError(f"--queries must be at most {MAX_QUERIES} (the paper uses 100), got "
                         f"{args.queries}")
    if not Path(args.model).exists():
        raise FileNotFoundError(f"no such file: {args.model}")
    check_input_file(args.model, "MODEL")
    if not Path(args.data).exists():
        raise FileNotFoundError(f"no such file or folder: {args.data}")
    if not Path(args.data).is_dir():
        check_input_file(args.data, "--data")
    refuse_output_over_input({"--out": args.out, "--json": args.json},
                             {"MODEL": args.model, "--data": args.data})


def load_data(path, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of an .npz for a model taking one sample of NCHW ``input_shape``.

    ``x`` may be NCHW, NHWC, (N, H, W) for one channel, or (N, features); int8 stays int8,
    uint8 becomes float in [0, 1], other numbers float32. Raises ValueError for a file that does
    not hold them or does not fit the model.
    """
    shape = tuple(input_shape)

    def layout(x_shape: tuple[int, ...]) -> str | None:
        if x_shape[1:] == shape:
            return "nchw"
        if len(shape) == 3 and x_shape[1:] == (shape[1], shape[2], shape[0]):
            return "nhwc"
        if len(shape) == 3 and shape[0] == 1 and x_shape[1:] == shape[1:]:
            return "hw"
        return None

    def check(headers: dict) -> None:  # from the headers, before any array is unpacked
        (x_shape, _), (y_shape, y_dtype) = headers["x"], headers["y"]
        if not x_shape:
            raise ValueError(f"{path}: x must hold one sample per row, got a scalar")
        if len(y_shape) != 1 or y_shape[0] != x_shape[0] or not y_shape[0] \
                or y_dtype.kind not in "iu":
            raise ValueError(f"{path}: y must be a 1-D array of integer labels, one per sample "
                             f"of x ({x_shape[0]}), got shape {y_shape} and dtype {y_dtype}")
        if layout(x_shape) is None:
            raise ValueError(f"{path}: x has samples of shape {x_shape[1:]}, the model takes "
                             f"{shape} (NCHW), or NHWC / (H, W) for one channel")

    # x is converted to float32 (4 bytes a value) unless it is int8; y to int64
    x, y = load_npz(path, ("x", "y"), what="--data", check=check,
                    bytes_per_element={"x": 4, "y": 8})
    kind = layout(x.shape)
    if kind == "nhwc":
        x = x.transpose(0, 3, 1, 2)
    elif kind == "hw":
        x = x[:, None]
    if x.dtype == np.int8:
        xt = torch.from_numpy(np.ascontiguousarray(x))
    elif x.dtype == np.uint8:
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
    else:
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if xt.is_floating_point() and not torch.isfinite(xt).all():
        raise ValueError(f"{path}: x holds NaN or infinite values")
    return xt, torch.from_numpy(y.astype(np.int64))


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm",
                  ".ppm")


def load_image_folder(path, input_shape: tuple[int, ...]
                      ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(x, y, class names)`` of a folder with one sub-folder of images per class.

    Classes are the sub-folders in sorted order (label 0 first). Each image is converted to
    grey or RGB as the model's input channels ask, resized (bilinear) to its H x W, and scaled
    to [0, 1] floats, NCHW.
    """
    from PIL import Image  # lazy: Pillow only for image-folder data

    if len(input_shape) != 3 or input_shape[0] not in (1, 3):
        raise ValueError(f"an image folder needs a model taking images (1 or 3 channels, NCHW), "
                         f"this one takes {input_shape}")
    channels, height, width = input_shape
    classes = sorted(d for d in Path(path).iterdir() if d.is_dir())
    images, labels = [], []
    for label, folder in enumerate(classes):
        for file in sorted(folder.iterdir()):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            image = Image.fromarray(load_image(file)).convert("L" if channels == 1 else "RGB")
            array = np.asarray(image.resize((width, height), Image.BILINEAR), dtype=np.float32)
            images.append(array.reshape(height, width, channels).transpose(2, 0, 1) / 255.0)
            labels.append(label)
    if not images:
        raise ValueError(f"{path}: no images found (one sub-folder per class, files ending in "
                         f"{', '.join(IMAGE_SUFFIXES)})")
    return (torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64),
            [d.name for d in classes])


def check_classifier(model, example: torch.Tensor | None = None) -> int:
    """The number of classes of ``model`` (its output is ``(N, classes)``, logits or a trailing
    SOFTMAX), run on one sample of ``example`` (default: zeros of ``model.input_shape``); else
    a ValueError naming the output shape, raised before anything is trained (``adapt`` trains
    with cross-entropy on integer labels)."""
    if example is None:
        example = torch.zeros((1, *model.input_shape), dtype=torch.int8)
    with torch.no_grad():
        out = model(example[:1]).shape
    if len(out) != 2 or out[1] < 2:
        raise ValueError(
            f"adapt trains classifiers (cross-entropy on integer labels), but this model's "
            f"output has shape {tuple(out)} for one sample (expected (1, classes)): a feature "
            f"map or regression output has no class to train toward; cut the file at its "
            f"logits, or train it in Python with a loss of your own (bpfree.Objective, "
            f"loss_fn=...)")
    return int(out[1])


def adapt(model, x: torch.Tensor, y: torch.Tensor, *, method: str = "pmt", epochs: int = 3,
          queries: int | None = None, lr: float = 0.01, batch_size: int = 64,
          validation: float = 0.2, seed: int = 0, eps_codes: int = 1,
          progress: bool = False) -> dict:
    """Adapt ``model`` (a loaded :class:`~bpfree.quant.ptq.QuantizedModel`) in place; returns
    the report: validation accuracy before and after, forward passes, the chosen block.

    ``queries`` is PMT's Q or QZO-FF's m (default :data:`DEFAULT_QUERIES`); ``eps_codes`` is
    QZO-FF's ``ε_q`` in weight codes. QZO-FF's hyper-parameters are checked
    (:meth:`~bpfree.qzoff.IntegerQZOFF.check_lr`) before anything is trained.

    A trailing SOFTMAX (:class:`~bpfree.tflite.softmax.QSoftmax`) is inference only: training
    and the accuracies use the logits before it, and it stays in the model."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    x = model.as_nchw(x) if x.dim() == 4 else x
    check_classifier(model, x)
    if queries is None:
        queries = DEFAULT_QUERIES[method]
    if isinstance(model.body[-1], QSoftmax):  # inference only: train on the logits before it
        if len(model.body) == 1:
            raise ValueError("the model is a lone SOFTMAX: nothing to train")
        model = QuantizedModel(nn.Sequential(*model.body[:-1]), model.input_quant,
                               model.stage_quants[:-1])
    train_idx, val_idx = holdout_split(x.shape[0], validation, seed)
    xt, yt, xv, yv = x[train_idx], y[train_idx], x[val_idx], y[val_idx]
    with torch.no_grad():
        outputs = model(x[:1]).shape[-1]
    if int(y.max()) >= outputs or int(y.min()) < 0:
        raise ValueError(f"labels must lie in [0, {outputs}) for a model with {outputs} outputs, "
                         f"got [{int(y.min())}, {int(y.max())}]")
    t0 = time.perf_counter()
    example = xt[:2]
    report: dict = {"method": method, "train": int(xt.shape[0]), "validation": int(xv.shape[0]),
                    "epochs": epochs, "queries": queries, "lr": lr, "batch_size": batch_size,
                    "seed": seed}
    if method == "qzo-ff":  # built and checked before anything is evaluated or trained
        trainer = IntegerQZOFF(model, example=example, m=queries, eps_codes=eps_codes,
                               seed=seed)
        report.update(eps_codes=eps_codes, **trainer.check_lr(lr),
                      frozen_biases=trainer.frozen_biases)
    report["val_accuracy_before"] = accuracy(model, xv, yv)
    config = PMTConfig(queries=queries, seed=seed)
    forwards = 0
    trainable = None
    if method == "pmt-sparse":
        layers = PMTTrainer(model, config, example=example).layers
        # Four blocks as in the paper (Table 4); fewer when the model has fewer stages.
        blocks = split_blocks(layers, min(4, len({layer.stage for layer in layers})))
        selection = select_block(
            model, xt, yt, blocks=blocks, lr=lr, batch_size=batch_size, seed=seed,
            make_method=lambda m, names: PMTTrainer(m, config, example=example,
                                                    trainable=names),
            progress=progress)
        trainable = blocks[selection.chosen - 1]
        forwards += selection.forwards
        report["selection"] = selection.as_dict()
    if method != "qzo-ff":
        trainer = PMTTrainer(model, config, example=example, trainable=trainable)
    history = fit(trainer, xt, yt, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
                  progress="adapt" if progress else False)
    forwards += trainer.forwards
    report["device_memory_bytes"] = device_memory(model, method, tuple(x.shape[1:]),
                                                  batch_size, queries, trainable)
    report.update(val_accuracy_after=accuracy(model, xv, yv), forwards=forwards,
                  trained_layers=[layer.name for layer in trainer.trainable],
                  loss_first=history.loss[0], loss_last=history.loss[-1],
                  seconds=time.perf_counter() - t0)
    return report


def device_memory(model, method: str, input_shape: tuple[int, ...], batch_size: int,
                  queries: int, trainable) -> dict:
    """Analytic training memory on the device (:func:`bpfree.memory.rules.analytic`, the
    method's rule (:data:`MEMORY_RULES`: PMT's, or QZO-FF's ``ff`` with 1-byte weights,
    activations, perturbations and gradients) at one sample and at ``batch_size``, in bytes;
    or ``{"unavailable": reason}`` for a graph the float twin does not cover."""
    rule, dtype_bytes = MEMORY_RULES[method]
    try:
        twin = float_twin(model, fake_quant=False)
        return {f"batch_{n}": int(analytic(twin, rule, num_queries=queries,
                                           example_input=torch.zeros((n, *input_shape)),
                                           trainable=trainable, dtype_bytes=dtype_bytes).total)
                for n in sorted({1, batch_size})}
    except (ValueError, TypeError, KeyError) as err:
        return {"unavailable": str(err)}


def main(args: argparse.Namespace) -> int:
    _check_args(args)
    try:
        model = load(args.model)
    except TFLiteFormatError as err:
        return _failed(f"cannot adapt {args.model}: {err}")
    check_classifier(model)  # before the data is read: its labels need classes
    if Path(args.data).is_dir():
        x, y, classes = load_image_folder(args.data, model.input_shape)
        print(f"{args.data}: classes {', '.join(f'{i}={c}' for i, c in enumerate(classes))}")
    else:
        x, y = load_data(args.data, model.input_shape)
    queries = args.queries or DEFAULT_QUERIES[args.method]
    print(f"{args.model}: {len(model.body)} stages, input {model.input_shape}; {args.data}: "
          f"{x.shape[0]} samples; {args.method}, {args.epochs} epoch(s), "
          f"{'m' if args.method == 'qzo-ff' else 'Q'}={queries}")
    try:
        report = adapt(model, x, y, method=args.method, epochs=args.epochs, queries=queries,
                       lr=args.lr, batch_size=args.batch_size, validation=args.validation,
                       seed=args.seed, eps_codes=args.eps_codes or 1,
                       progress=show_progress(quiet=args.quiet))  # a bar on a terminal only
    except (FloatingPointError, RuntimeError) as err:  # bad labels etc. stay usage errors
        return _failed(f"adaptation failed, {args.out} not written: {err}")
    try:
        atomic_write_bytes(args.out, file_bytes(model))  # the input file, new weights only
    except (ValueError, OSError) as err:
        return _failed(f"{args.out} not written: {err}")
    report.update(model=str(args.model), data=str(args.data), out=str(args.out))
    print(f"validation accuracy {report['val_accuracy_before']:.2f}% -> "
          f"{report['val_accuracy_after']:.2f}% on {report['validation']} held-out samples; "
          f"{report['forwards']:,} forward passes (per sample), {report['seconds']:.1f} s")
    memory = report["device_memory_bytes"]
    if "unavailable" in memory:
        print(f"analytic device memory: not available ({memory['unavailable']})")
    else:
        print(f"analytic device memory ({args.method} rule, int8 weights): "
              + ", ".join(f"{v / 1024:,.1f} KiB at {k.replace('_', ' ')}"
                          for k, v in memory.items()))
    if "selection" in report:
        print(f"trained block {report['selection']['chosen']} of "
              f"{len(report['selection']['blocks'])}: {', '.join(report['trained_layers'])}")
    print(f"wrote {args.out}")
    if args.json:
        try:
            atomic_write_bytes(args.json, (json.dumps(report, indent=1) + "\n").encode())
        except OSError as err:
            return _failed(f"{args.json} not written: {err}")
        print(f"wrote {args.json}")
    return 0


def _failed(message: str) -> int:
    print(f"bpfree: error: {message}", file=sys.stderr)
    return 1
