"""BP-free transfer learning of the real INT8 MCUNet-in1 to a new 10-class task (PMT §4.3).

The ImageNet-pretrained int8 model (:func:`bpfree.models.mcunet.mcunet_in1`) gets a new
10-class int8 head in place of its 160 -> 1000 classifier, initialised from the frozen
backbone's pooled features (:func:`init_head`: least squares or class means, then a
temperature fitted on the training features, quantized per output channel with the output
range calibrated on the training logits). From there every method of ``bpfree bench mcunet``
trains a copy (:func:`transfer_task`):

* ``head-init`` — no training beyond the closed-form head;
* ``classifier-only`` — PMT on the head alone, on cached int8 features (the backbone runs
  once per image);
* ``pmt-sparse`` — BP-free block selection (§3.3.1) among four contiguous backbone blocks
  (:func:`bpfree.pmt.sparse.split_blocks`), each trial training that block *and* the head,
  then PMT on the chosen block + head. The trials (and the BP learning-rate picks) are scored
  on a held-out fifth of the training images and start from a head initialised on the other
  four fifths, so the held-out images are unseen;
* ``pmt-dense`` — PMT on every layer (only where the budget allows: ``dense=True``);
* ``int8-sparse-bp`` — MCUTrain-style sparse BP (STE + QAS) on the same block + head, with
  MCUTrain's unrounded copy of the trained weights (``SparseBP(latent_weights=True)``);
* ``fp32-bp`` — plain SGD with BP on the float graph of the same model
  (:func:`bpfree.quant.twin.float_twin` with ``fake_quant=False``), all layers (dense).

Images: MNIST / Fashion-MNIST digits (28x28 uint8) upsampled bilinearly to 128x128 and
replicated to 3 channels, pixel ``p -> p - 128`` (the model's int8 input, as
:func:`bpfree.models.mcunet.preprocess_image`).

Forward passes count per sample (PMT Table 5's unit); a pass of the head alone on a cached
feature counts as one, as PMT's partial forwards do. :func:`transfer_task` is a picklable
process-pool entry point returning plain dicts.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.bench.outcomes import pack_outcomes
from bpfree.harness import correct, fit, holdout_split, mean_loss, percent_correct, pick_lr
from bpfree.baselines import FullTrainFP32, SparseBP
from bpfree.pmt.sparse import select_block, split_blocks
from bpfree.pmt.trainer import PMTConfig, PMTTrainer

__all__ = ["TransferSetup", "prepare_images", "load_digits", "backbone_features", "init_head",
           "with_head", "head_model", "float_graph", "float_names", "transfer_task",
           "memory_task", "run_task", "METHODS", "HEAD"]

METHODS = ("head-init", "classifier-only", "pmt-sparse", "pmt-dense", "int8-sparse-bp",
           "fp32-bp")
HEAD = "body.16"
#: Held-out fraction of the training images for block selection and learning-rate picks.
HOLDOUT = 0.2


@dataclass(frozen=True)
class TransferSetup:
    """Budgets of one transfer run (quick: a pipeline check, not an accuracy claim).

    ``lr``: PMT rate of the head (classifier-only, and the head's own rate when it trains with
    backbone layers, through ``PMTTrainer(lr_scale=...)``); ``block_lr``: PMT rate of the
    backbone layers (selection trials, sparse, dense) -- with GNS + QAS a rate of 0.1
    diverges on the backbone blocks of MCUNet in one epoch, 1e-3 does not."""

    train_images: int = 300
    test_images: int = 500
    queries: int = 2
    epochs: int = 1
    head_epochs: int = 20
    batch_size: int = 50
    lr: float = 0.1
    block_lr: float = 1e-3
    bp_lrs: tuple[float, ...] = (1e-3, 1e-2)
    fp32_lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4)
    head_init: str = "means"
    dense: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.head_init not in ("lsq", "means"):
            raise ValueError(f"head_init must be 'lsq' or 'means', got {self.head_init!r}")
        if min(self.train_images, self.test_images, self.queries, self.epochs,
               self.head_epochs, self.batch_size) < 1:
            raise ValueError("image counts, queries, epochs and batch_size must be >= 1")
        if not self.bp_lrs or not self.fp32_lrs:
            raise ValueError("bp_lrs and fp32_lrs must be non-empty")
        for name in ("lr", "block_lr"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def prepare_images(images: np.ndarray, size: int = 128) -> torch.Tensor:
    """uint8 (N, H, W) grayscale -> int8 (N, 3, size, size): bilinear upsampling, 3 channels,
    ``p -> p - 128``."""
    a = np.asarray(images)
    if a.ndim != 3:
        raise ValueError(f"images must be (N, H, W) grayscale, got shape {a.shape}")
    t = torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32).unsqueeze(1)
    if t.shape[-2:] != (size, size):
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    t = t.round().clamp(0, 255).to(torch.int16) - 128
    return t.to(torch.int8).expand(-1, 3, -1, -1).contiguous()


def load_digits(kind: str, train_images: int, test_images: int, seed: int = 0,
                root=None) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor,
                                                                               torch.Tensor]]:
    """Seeded random subsets of the train and test splits of MNIST / Fashion-MNIST as the
    model's int8 128x128x3 input: ``((x_train, y_train), (x_test, y_test))``."""
    from bpfree.data import load_mnist

    out = []
    for split, n, s in (("train", train_images, seed), ("test", test_images, seed + 1)):
        images, labels = load_mnist(root, split=split, kind=kind)
        g = torch.Generator().manual_seed(s)
        idx = torch.randperm(len(labels), generator=g)[:n].numpy()
        out.append((prepare_images(images[idx]), torch.from_numpy(labels[idx]).long()))
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# Head
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def backbone_features(qmodel: nn.Module, xq: torch.Tensor, batch_size: int = 100
                      ) -> torch.Tensor:
    """int8 pooled features (N, 160): every stage but the classifier."""
    prefix = qmodel.body[:-1]
    return torch.cat([prefix(xq[lo:lo + batch_size]) for lo in range(0, xq.shape[0], batch_size)])


def _fit_temperature(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Scale T minimising the mean cross-entropy of ``T * logits`` (a 1-D grid search)."""
    grid = torch.logspace(-3, 3, 121, dtype=torch.float64)
    losses = torch.stack([F.cross_entropy(t * logits, y) for t in grid])
    return float(grid[int(losses.argmin())])


def init_head(feature_quant, features_q: torch.Tensor, y: torch.Tensor, num_classes: int, *,
              method: str = "lsq", ridge: float = 1e-2, margin: float = 1.5):
    """A new int8 ``QLinear`` head from int8 features of the training images.

    ``method="lsq"``: ridge least squares of the one-hot targets on the dequantized features
    (with a bias column); ``"means"``: nearest class mean as a linear map (``w_c = mu_c``,
    ``b_c = -|mu_c|^2 / 2``). Either is then scaled by the temperature minimising the training
    cross-entropy, quantized per output channel (:func:`bpfree.quant.quantize_weights`),
    and given an output range ``margin`` times that of the training logits.
    Returns ``(QLinear, info dict)``.
    """
    from bpfree.quant import quantize_weights, tensor_quant_from_range
    from bpfree.quant.layers import QLinear

    f = feature_quant.dequantize(features_q).to(torch.float64)
    y = y.long()
    onehot = F.one_hot(y, num_classes).to(torch.float64)
    if method == "lsq":
        a = torch.cat([f, torch.ones(f.shape[0], 1, dtype=torch.float64)], 1)
        reg = ridge * torch.eye(a.shape[1], dtype=torch.float64) * float((a * a).mean())
        reg[-1, -1] = 0.0
        sol = torch.linalg.solve(a.T @ a + a.shape[0] * reg, a.T @ onehot)
        w, b = sol[:-1].T, sol[-1]
    elif method == "means":
        counts = onehot.sum(0).clamp_min(1.0)
        mu = (onehot.T @ f) / counts[:, None]
        w, b = mu, -0.5 * (mu * mu).sum(1)
    else:
        raise ValueError(f"method must be 'lsq' or 'means', got {method!r}")
    t = _fit_temperature(f @ w.T + b, y)
    w, b = w * t, b * t
    w_int, b_int, wq = quantize_weights(w, b, feature_quant.scale, "head")
    scales = torch.tensor(wq.scales, dtype=torch.float64)
    xz = features_q.to(torch.float64) - feature_quant.zero_point
    logits = (xz @ w_int.to(torch.float64).T + b_int.to(torch.float64)) * (
        feature_quant.scale * scales)
    lo, hi = float(logits.min()), float(logits.max())
    out_q = tensor_quant_from_range(margin * lo, margin * hi)
    head = QLinear(w_int, b_int, weight_scale=wq.scales, input_quant=feature_quant,
                   output_quant=out_q)
    return head, {"method": method, "temperature": t, "logit_range": [lo, hi],
                  "output_scale": out_q.scale, "output_zero_point": out_q.zero_point,
                  "train_accuracy_float": 100.0 * float(
                      ((f @ w.T + b).argmax(1) == y).double().mean())}


def with_head(qmodel: nn.Module, head: nn.Module) -> nn.Module:
    """A copy of ``qmodel`` whose classifier (last stage) is ``head`` (also copied)."""
    from bpfree.quant.stages import QuantizedModel

    body = copy.deepcopy(qmodel.body)
    body[len(body) - 1] = copy.deepcopy(head)
    model = QuantizedModel(body, qmodel.input_quant,
                           tuple(qmodel.stage_quants[:-1]) + (head.output_quant,))
    for attr in ("graph_names", "requant_rule", "source"):
        if hasattr(qmodel, attr):
            setattr(model, attr, getattr(qmodel, attr))
    return model


def head_model(head: nn.Module) -> nn.Module:
    """The head alone as a QuantizedModel on int8 features (shares ``head``'s buffers)."""
    from bpfree.quant.stages import QuantizedModel

    return QuantizedModel(nn.Sequential(head), head.input_quant, (head.output_quant,))


def float_names(qmodel: nn.Module, float_model: nn.Module, example: torch.Tensor
                ) -> dict[str, str]:
    """Integer layer name (``body.2.body.0``) -> module name of the same conv / linear in
    :func:`bpfree.models.mcunet.mcunet_in1_float` (both list the affine layers in order)."""
    from bpfree.quant.graph import find_layers

    qnames = [layer.name for layer in find_layers(qmodel, example)]
    fnames = [n for n, m in float_model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    if len(qnames) != len(fnames):
        raise ValueError(f"{len(qnames)} integer layers but {len(fnames)} float ones")
    return dict(zip(qnames, fnames))


# ---------------------------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------------------------


def float_graph(qmodel: nn.Module) -> nn.Module:
    """The FP32 graph of ``qmodel`` for FP32 BP: :func:`bpfree.quant.twin.float_twin` with
    ``fake_quant=False``, its Parameters in float units (:func:`bpfree.quant.twin.
    to_float_units`: on the twin's integer units SGD would step each weight by
    ``lr * s_w^2 * g``, so FP32 BP barely trained), plus, after every layer, a clamp to the
    real range of its int8 output quantization. The imported MCUNet fuses ReLU6 as that output
    range (no activation flag), so without the clamps the float graph would lose its
    nonlinearities. The classifier's logits are not clamped: their int8 range is the deployed
    model's saturation, not part of an FP32 model, and a clamp there is a trap (once every
    logit sits past the same bound the loss is log(classes) with a zero gradient)."""
    from bpfree.quant.twin import float_twin, to_float_units

    twin = to_float_units(float_twin(qmodel, fake_quant=False))
    classifier = twin.body[len(twin.body) - 1]

    def clamp_hook(lo: float, hi: float):
        def hook(module, args, out):
            return out.clamp(lo, hi)
        return hook

    for module in twin.modules():
        q = getattr(module, "output_quant", None)
        if q is None and hasattr(module, "kind"):
            q = getattr(module, "quant", None)
        if q is None or module is twin or module is classifier:
            continue
        lo, hi = q.scale * (-128 - q.zero_point), q.scale * (127 - q.zero_point)
        module.register_forward_hook(clamp_hook(lo, hi))
    return twin


@torch.no_grad()
def _train_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 250) -> float:
    """Mean cross-entropy over the whole training set: a deterministic "did it train" check."""
    return mean_loss(model, x, y, batch_size=batch)


def _result(hits: torch.Tensor, forwards: int, seconds: float, **extra) -> dict:
    """One method's result: its test accuracy from ``hits`` (:func:`bpfree.harness.correct`),
    which also travels as ``extra["outcomes"]`` for the ledger's paired comparisons."""
    return {"accuracy": percent_correct(hits), "forwards": int(forwards),
            "seconds": float(seconds), "extra": {**extra, "outcomes": pack_outcomes(hits)}}


def transfer_task(kind: str, setup: TransferSetup, *, model_path=None, data_root=None,
                  methods=METHODS) -> dict:
    """Every method of ``methods`` on one dataset; returns ``{method: result dict}`` plus
    ``"head"`` (initialisation details), ``"selection"`` and ``"blocks"``."""
    from bpfree.models.mcunet import mcunet_in1

    torch.manual_seed(setup.seed)
    t_task = time.perf_counter()
    (xtr, ytr), (xte, yte) = load_digits(kind, setup.train_images, setup.test_images,
                                         setup.seed, data_root)
    base = mcunet_in1(model_path)
    n = xtr.shape[0]
    t0 = time.perf_counter()
    ftr, fte = backbone_features(base, xtr), backbone_features(base, xte)
    feature_seconds = time.perf_counter() - t0
    feat_q = base.stage_quants[-2]
    head, head_info = init_head(feat_q, ftr, ytr, 10, method=setup.head_init)
    model0 = with_head(base, head)
    # Block selection and the BP learning-rate picks score on a held-out fifth of the training
    # images (the split of select_block / pick_lr). They start from a head fitted on the
    # other four fifths only: a head fitted on the held-out images too would score them far
    # above unseen data (92.5% held-out vs 74% test on the quick MNIST run), and every trial
    # would measure a gain of zero against that ceiling.
    fit_idx, _ = holdout_split(n, HOLDOUT, setup.seed)
    head_sel, head_sel_info = init_head(feat_q, ftr[fit_idx], ytr[fit_idx], 10,
                                        method=setup.head_init)
    model_sel = with_head(base, head_sel)
    out: dict = {"head": head_info, "selection_head": head_sel_info,
                 "feature_seconds": feature_seconds,
                 "train_images": n, "test_images": int(xte.shape[0])}
    cfg = PMTConfig(queries=setup.queries, seed=setup.seed)
    example = xtr[:2]

    def pmt(model, trainable=None):
        # The new head trains at the classifier-only rate, the pretrained block at block_lr:
        # at block_lr alone the head's updates round to zero (below half an int8 step).
        return PMTTrainer(model, cfg, example=example, trainable=trainable,
                          lr_scale={HEAD: setup.lr / setup.block_lr})

    if "head-init" in methods:
        out["head-init"] = _result(correct(head_model(copy.deepcopy(head)), fte, yte), n,
                                   feature_seconds)
    if "classifier-only" in methods:
        t0 = time.perf_counter()
        hm = head_model(copy.deepcopy(head))
        trainer = PMTTrainer(hm, cfg, example=ftr[:2])
        hist = fit(trainer, ftr, ytr, epochs=setup.head_epochs, batch_size=setup.batch_size,
                   lr=setup.lr, seed=setup.seed)
        out["classifier-only"] = _result(correct(hm, fte, yte), n + trainer.forwards,
                                         time.perf_counter() - t0 + feature_seconds,
                                         epochs=setup.head_epochs, loss=hist.loss[-5:])
    layers = PMTTrainer(model0, cfg, example=example).layers
    blocks = split_blocks([layer for layer in layers if layer.name != HEAD], 4)
    out["blocks"] = blocks
    chosen = None
    if any(m in methods for m in ("pmt-sparse", "int8-sparse-bp")):
        t0 = time.perf_counter()
        sel = select_block(model_sel, xtr, ytr, blocks=[b + [HEAD] for b in blocks],
                           make_method=pmt, lr=setup.block_lr, batch_size=setup.batch_size,
                           holdout=HOLDOUT, seed=setup.seed)
        out["selection"] = {**sel.as_dict(), "seconds": time.perf_counter() - t0}
        chosen = sel.blocks[sel.chosen - 1]
    if "pmt-sparse" in methods:
        t0 = time.perf_counter()
        q = copy.deepcopy(model0)
        trainer = pmt(q, chosen)
        hist = fit(trainer, xtr, ytr, epochs=setup.epochs, batch_size=setup.batch_size,
                   lr=setup.block_lr, seed=setup.seed)
        out["pmt-sparse"] = _result(
            correct(q, xte, yte), n + sel.forwards + trainer.forwards,
            time.perf_counter() - t0 + out["selection"]["seconds"] + feature_seconds,
            block=sel.chosen, selection_forwards=sel.forwards, loss=hist.loss[-5:])
    if "pmt-dense" in methods and setup.dense:
        t0 = time.perf_counter()
        q = copy.deepcopy(model0)
        trainer = pmt(q)
        hist = fit(trainer, xtr, ytr, epochs=setup.epochs, batch_size=setup.batch_size,
                   lr=setup.block_lr, seed=setup.seed)
        out["pmt-dense"] = _result(correct(q, xte, yte), n + trainer.forwards,
                                   time.perf_counter() - t0 + feature_seconds,
                                   loss=hist.loss[-5:])
    if "int8-sparse-bp" in methods:
        t0 = time.perf_counter()

        def make_bp(start=model_sel):
            # MCUTrain's unrounded copy: rounded every step, the new head's updates at these
            # rates are all below half an int8 step and vanish (test accuracy 78.7 -> 78.6 %
            # on MNIST at e945a7b; no head weight changed in a 200-image pilot).
            q = copy.deepcopy(start)
            return SparseBP(q, trainable=chosen, qas=True, latent_weights=True), q

        lr, scores = pick_lr(make_bp, xtr, ytr, setup.bp_lrs, epochs=setup.epochs,
                             batch_size=setup.batch_size, seed=setup.seed, holdout=HOLDOUT)
        method, q = make_bp(model0)
        loss_before = _train_loss(q, xtr, ytr)
        hist = fit(method, xtr, ytr, epochs=setup.epochs, batch_size=setup.batch_size, lr=lr,
                   seed=setup.seed)
        out["int8-sparse-bp"] = _result(correct(q, xte, yte), n + method.forwards,
                                        time.perf_counter() - t0 + feature_seconds, lr=lr,
                                        lr_holdout_accuracy=scores, block=sel.chosen,
                                        weights="latent copy (MCUTrain)",
                                        train_loss_before=loss_before,
                                        train_loss_after=_train_loss(q, xtr, ytr),
                                        loss=hist.loss[-5:])
    if "fp32-bp" in methods:
        t0 = time.perf_counter()
        xtr_f, xte_f = model0.input_quant.dequantize(xtr), model0.input_quant.dequantize(xte)

        def make_fp32(start=model_sel):
            twin = float_graph(copy.deepcopy(start))
            # Plain SGD at one rate for every layer (PMT §4.1). In float units the head needs
            # no rate of its own: the x100 it had made up for the integer-unit steps.
            return FullTrainFP32(twin), twin

        lr, scores = pick_lr(make_fp32, xtr_f, ytr, setup.fp32_lrs, epochs=setup.epochs,
                             batch_size=setup.batch_size, seed=setup.seed, holdout=HOLDOUT)
        method, twin = make_fp32(model0)
        start = correct(float_graph(model0), xte_f, yte)
        loss_before = _train_loss(twin, xtr_f, ytr)
        hist = fit(method, xtr_f, ytr, epochs=setup.epochs, batch_size=setup.batch_size, lr=lr,
                   seed=setup.seed)
        out["fp32-bp"] = _result(correct(twin, xte_f, yte), n + method.forwards,
                                 time.perf_counter() - t0 + feature_seconds, lr=lr,
                                 lr_holdout_accuracy=scores, trained="all layers (dense)",
                                 parameters="float units",
                                 start_accuracy=percent_correct(start),
                                 start_outcomes=pack_outcomes(start),
                                 train_loss_before=loss_before,
                                 train_loss_after=_train_loss(twin, xtr_f, ytr),
                                 loss=hist.loss[-5:])
    out["seconds"] = time.perf_counter() - t_task
    return out


def memory_task(trainable: list[str], *, batch_size: int, queries: int, model_path=None,
                seed: int = 0) -> dict:
    """Measured peak tensor memory of one step of each method at ``batch_size`` (random int8
    images: memory does not depend on the values) and the analytic rules on the float mirror
    (1 byte per int8 value; 4 for FP32 BP) at ``batch_size`` and at N = 1 (``analytic_n1``,
    the paper's single-batch setting). ``trainable``: the sparse block + head."""
    from bpfree.memory import analytic
    from bpfree.pmt.mcunet_tables import measure_pmt_step
    from bpfree.memory.measure import measure_peak
    from bpfree.models.mcunet import mcunet_in1, mcunet_in1_float
    from bpfree.quant import tensor_quant_from_range
    from bpfree.quant.layers import QLinear

    g = torch.Generator().manual_seed(seed)
    base = mcunet_in1(model_path)
    feat_q = base.stage_quants[-2]
    w = torch.randint(-127, 128, (10, 160), generator=g, dtype=torch.int32).to(torch.int8)
    head = QLinear(w, torch.zeros(10, dtype=torch.int32), weight_scale=[1e-3] * 10,
                   input_quant=feat_q, output_quant=tensor_quant_from_range(-10.0, 10.0))
    model = with_head(base, head)
    x = torch.randint(-128, 128, (batch_size, 3, 128, 128), generator=g,
                      dtype=torch.int32).to(torch.int8)
    y = torch.randint(0, 10, (batch_size,), generator=g)
    fmodel = mcunet_in1_float(model_path, num_classes=10)
    names = float_names(model, fmodel, x[:1])
    sparse_f = [names[n] for n in trainable]

    def analytic_bytes_at(batch: int) -> dict[str, int]:
        kw = dict(input_shape=(3, 128, 128), batch_size=batch, num_queries=queries)
        return {
            "head-init": analytic(fmodel, "inference", dtype_bytes=1, **kw).total,
            "classifier-only": analytic(fmodel, "pmt-sparse", trainable=[names[HEAD]],
                                        **kw).total,
            "pmt-sparse": analytic(fmodel, "pmt-sparse", trainable=sparse_f, **kw).total,
            "pmt-dense": analytic(fmodel, "pmt", **kw).total,
            "int8-sparse-bp": analytic(fmodel, "sparse-bp", trainable=sparse_f, **kw).total,
            "fp32-bp": analytic(fmodel, "bp", **kw).total,
        }

    analytic_bytes, analytic_n1 = analytic_bytes_at(batch_size), analytic_bytes_at(1)
    measured = {}
    m = measure_pmt_step(copy.deepcopy(model), x, y, queries=queries, synchronized=True,
                         trainable=trainable)
    measured["head-init"] = m["inference_peak"]
    measured["pmt-sparse"] = m["step_peak"]
    measured["pmt-dense"] = measure_pmt_step(copy.deepcopy(model), x, y, queries=queries,
                                             synchronized=True)["step_peak"]
    # Classifier-only runs on cached features: its step sees the features, not the images.
    feats = backbone_features(model, x)
    hm = head_model(copy.deepcopy(head))
    measured["classifier-only"] = measure_pmt_step(hm, feats, y, queries=queries,
                                                   synchronized=True)["step_peak"]
    bp = SparseBP(copy.deepcopy(model), trainable=trainable, qas=True, latent_weights=True)
    bp.step(x, y, 0.0)
    measured["int8-sparse-bp"] = measure_peak(lambda: bp.step(x, y, 0.0))[1].peak_bytes
    fp = FullTrainFP32(float_graph(copy.deepcopy(model)))
    xf = model.input_quant.dequantize(x)
    fp.step(xf, y, 0.0)
    measured["fp32-bp"] = measure_peak(lambda: fp.step(xf, y, 0.0))[1].peak_bytes
    return {"analytic": analytic_bytes, "analytic_n1": analytic_n1, "measured": measured,
            "batch_size": batch_size,
            "queries": queries, "trainable_float": sparse_f}


def run_task(task: tuple[str, dict]) -> dict:
    """Process-pool entry point: ``("transfer" | "memory", kwargs)``, one CPU thread."""
    torch.set_num_threads(1)
    kind, kwargs = task
    if kind == "transfer":
        return transfer_task(**kwargs)
    if kind == "memory":
        return memory_task(**kwargs)
    raise ValueError(f"unknown task kind {kind!r}; expected 'transfer' or 'memory'")

