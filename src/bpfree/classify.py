"""``bpfree classify``: run the imported INT8 MCUNet-in1 on an image and name the top-5 classes.

The check that the imported model is the real, pre-trained one (PMT's model; see
:mod:`bpfree.models.mcunet`): an RGB image is center-cropped to a square, resized to 128x128
(an image already 128x128 is used as it is) and fed as int8 ``p - 128``; the 1000 int8 logits
name the ImageNet classes. ``--sample NAME`` uses one of scikit-image's bundled photos
(``chelsea`` is a cat, ``coffee`` a cup of espresso), so no image file is needed.

``--json PATH`` writes ``{"image", "model", "requant", "top5": [class indices],
"top5_names", "logits": [the 1000 int8 outputs]}``.

``--compare-requant`` also runs the other requantization rule (TFLite fixed point vs the
model's own float scale with round half to even) on the same image and reports how many
output values differ, stage by stage (:func:`bpfree.models.mcunet.compare_requant`); with
``--json`` the report is stored under ``"requant_comparison"``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import torch

from .data.imagenet_classes import IMAGENET_CLASSES
from .models.mcunet import compare_requant, mcunet_in1, preprocess_image

from .io import write_json

#: scikit-image's bundled colour photos usable with ``--sample``.
SAMPLES = ("chelsea", "coffee", "astronaut", "rocket", "cat")


def load_image(path) -> np.ndarray:
    """An image file as an (H, W, 3) uint8 RGB array (Pillow); clear errors for missing or
    unreadable files."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"image not found: {p}")
    try:
        from PIL import Image, UnidentifiedImageError  # lazy: optional image reader
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        raise ValueError("reading image files needs Pillow (pip install pillow)") from None
    try:
        with warnings.catch_warnings():
            # Pillow only warns between MAX_IMAGE_PIXELS and twice that: refuse both.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as im:
                return np.asarray(im.convert("RGB"))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ValueError(f"{p} is too large to classify (a decompression bomb? limit "
                         f"{Image.MAX_IMAGE_PIXELS:,} pixels): {err}") from None
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read {p} as an image: {err}") from None


def sample_image(name: str) -> np.ndarray:
    """One of scikit-image's bundled photos (:data:`SAMPLES`)."""
    if name not in SAMPLES:
        raise ValueError(f"unknown sample {name!r}; choose one of {', '.join(SAMPLES)}")
    try:
        from skimage import data  # lazy: heavy optional dependency (sample photos)
    except ImportError:
        raise ValueError("--sample needs scikit-image (pip install 'bpfree[dev]')") from None
    return np.asarray(getattr(data, name)())


def classify(image, model=None, *, k: int = 5) -> dict:
    """Top-``k`` ImageNet classes of ``image`` ((H, W, 3) uint8) under ``model`` (default: the
    TFLite-rule MCUNet-in1 from the default folder). Returns ``{"topk", "names", "logits"}``."""
    model = mcunet_in1() if model is None else model
    x = preprocess_image(image)
    with torch.no_grad():
        logits = model.forward_int(x)[0]
    # Ties (int8 logits) broken by the lower class index, deterministically.
    order = sorted(range(logits.numel()), key=lambda i: (-int(logits[i]), i))[:k]
    return {"topk": order, "names": [IMAGENET_CLASSES[i] for i in order],
            "logits": [int(v) for v in logits.tolist()]}


EPILOG = """\
examples:
  bpfree classify --sample chelsea
  bpfree classify --sample coffee --compare-requant --json coffee.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Classify an image with the imported INT8 MCUNet-in1 (ImageNet-1k, "
                          "128x128) and print the top-5 classes.")
    parser.add_argument("image", nargs="?", help="image file (any format Pillow reads)")
    parser.add_argument("--sample", choices=SAMPLES,
                        help="use one of scikit-image's bundled photos instead of a file")
    parser.add_argument("--model-dir", metavar="DIR",
                        help="folder with graph.json + weights.npz (default: $BPFREE_MODELS/"
                             "mcunet-in1-int8, else the copy bundled with bpfree)")
    parser.add_argument("--requant", choices=("tflite", "float"), default="tflite",
                        help="requantization rule: TFLite fixed point, or the model's own float "
                             "scale with round half to even")
    parser.add_argument("--json", metavar="PATH", help="also write top5 and the 1000 logits as JSON")
    parser.add_argument("--compare-requant", action="store_true",
                        help="also run the other requantization rule on the same image and "
                             "report how many output values differ, per stage and in the logits")


def main(args: argparse.Namespace) -> int:
    if bool(args.image) == bool(args.sample):
        raise ValueError("give an image file or --sample NAME (exactly one)")
    image = sample_image(args.sample) if args.sample else load_image(args.image)
    model = mcunet_in1(args.model_dir, requant=args.requant)
    result = classify(image, model)
    source = f"skimage.data.{args.sample}()" if args.sample else str(args.image)
    print(f"{source} ({image.shape[1]}x{image.shape[0]}) -> MCUNet-in1 INT8, {args.requant} "
          f"requantization; top-5 ImageNet classes:")
    for rank, (i, name) in enumerate(zip(result["topk"], result["names"]), 1):
        print(f"  {rank}. {i:>3}  {name:<28} logit {result['logits'][i]:>4}")
    comparison = None
    if args.compare_requant:
        comparison = _print_requant_comparison(image, model, args)
    if args.json is not None:
        doc = {"image": source, "model": model.source, "requant": args.requant,
               "top5": result["topk"], "top5_names": result["names"],
               "logits": result["logits"]}
        if comparison is not None:
            doc["requant_comparison"] = comparison
        print(f"wrote {write_json(doc, args.json, indent=None)}")
    return 0


def _print_requant_comparison(image, model, args) -> dict:
    """Run the other rule on the same input and print where the two disagree."""
    other_rule = "float" if args.requant == "tflite" else "tflite"
    other = mcunet_in1(args.model_dir, requant=other_rule)
    report = compare_requant(model, other, preprocess_image(image))
    report["rules"] = [args.requant, other_rule]
    print(f"requantization {args.requant} vs {other_rule} on this image:")
    print("  stage  values  differ alone  differ propagated  max |diff|")
    for row in report["stages"]:
        print(f"  {row['stage']:>5}  {row['values']:>6}  {row['isolated']:>12}  "
              f"{row['differ']:>17}  {row['max_abs']:>10}")
    print(f"  all stages: {report['isolated_differ']:,} of {report['values']:,} values differ "
          f"when each stage sees the same input, {report['values_differ']:,} end to end; "
          f"logits: {report['logits_differ']} of {report['logits_values']} differ; "
          f"top-1 {'equal' if report['top1_equal'] else 'differs'}, "
          f"top-5 {'equal' if report['top5_equal'] else 'differs'}")
    return report
