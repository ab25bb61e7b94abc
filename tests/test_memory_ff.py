"""QZO-FF Figures 3 / 4: the ``ff`` and ``bp-ff-compare`` rules and scratch_vs_weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bpfree.memory import analytic, macs_per_iteration, profile_model, registered_rules
from bpfree.qzoff import FF_PRECISIONS, plot_scratch_vs_weights, scratch_vs_weights

# Hand-counted model: Linear(64,32) -> ReLU -> Linear(32,10), batch N = 8.
N = 8
PARAMS = 64 * 32 + 32 + 32 * 10 + 10  # 2410
L1 = 64 * 32 + 32  # 2080, the largest layer
HEAD = 32 * 10 + 10  # 330
# Live elements per layer (input + output) for N samples: 768, 512, 336.
PEAK = N * (64 + 32)  # 768


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def mlp_profile():
    return profile_model(_mlp(), torch.zeros(N, 64))


def _rows(model=None, **kw):
    model = _mlp() if model is None else model
    return {(r["method"], r["precision"], r["mode"]): r
            for r in scratch_vs_weights(model, torch.zeros(N, 64), head="2", **kw)}


def test_rules_registered_with_fp16_defaults():
    assert {"ff", "bp-ff-compare"} <= set(registered_rules())
    assert FF_PRECISIONS == {"fp16": (2, 2, 2), "16w8a": (2, 1, 1)}


@pytest.mark.parametrize("precision, w, a, g", [("fp16", 2, 2, 2), ("16w8a", 2, 1, 1)])
def test_ff_hand_counted(mlp_profile, precision, w, a, g):
    seeds_losses = 4 + 1 + 2 * 4  # m=1: a uint32 seed, an int8 sign, l+ and l- in fp32
    ft = analytic(mlp_profile, "ff", precision=precision).parts
    assert ft["parameters"] == PARAMS * w
    assert ft["activations"] == PEAK * a
    assert ft["perturbation"] == L1 * g  # one layer's z at a time
    assert ft["gradient_buffers"] == PARAMS * g
    assert ft["seeds_losses"] == seeds_losses
    assert ft["sparse_mask"] == 0
    lp = analytic(mlp_profile, "ff", precision=precision, trainable="2").parts
    assert lp["parameters"] == PARAMS * w
    assert lp["activations"] == PEAK * a
    assert lp["perturbation"] == lp["gradient_buffers"] == HEAD * g
    m4 = analytic(mlp_profile, "ff", precision=precision, num_queries=4).parts
    assert m4["seeds_losses"] == 4 * (4 + 1) + 8


def test_bp_hand_counted_fp16(mlp_profile):
    # FT: stored = x (8x64) + the ReLU output (8x32, also Linear 2's input: stored once).
    ft = analytic(mlp_profile, "bp-ff-compare", precision="fp16").parts
    assert ft["parameters"] == PARAMS * 2
    assert ft["activations"] == (N * 64 + N * 32) * 2
    # Backward peak: at the ReLU, stored up to it (768) + its live 512 as gradients; at
    # Linear 0, x (512) + its live 768 — both 1280 elements (later stores are freed).
    assert ft["activations"] + ft["activation_buffers"] == 1280 * 2
    assert ft["gradient_buffers"] == PARAMS * 2
    # LP: only the head's input is stored; the frozen forward peak (768 el) dominates.
    lp = analytic(mlp_profile, "bp-ff-compare", precision="fp16", trainable="2").parts
    assert lp["activations"] == N * 32 * 2
    assert lp["activations"] + lp["activation_buffers"] == PEAK * 2
    assert lp["gradient_buffers"] == HEAD * 2


def test_bp_hand_counted_16w8a(mlp_profile):
    ft = analytic(mlp_profile, "bp-ff-compare", precision="16w8a").parts
    assert ft["parameters"] == PARAMS * 2
    assert ft["activations"] == N * 96
    assert ft["activations"] + ft["activation_buffers"] == 1280
    assert ft["gradient_buffers"] == PARAMS
    lp = analytic(mlp_profile, "bp-ff-compare", precision="16w8a", trainable="2").parts
    assert lp["activations"] == N * 32
    assert lp["activations"] + lp["activation_buffers"] == PEAK
    assert lp["gradient_buffers"] == HEAD


def test_scratch_vs_weights_rows_match_rules():
    rows = _rows()
    assert len(rows) == 2 * 2 * 3
    r = rows["ff", "fp16", "FT"]
    assert r["weight_bytes"] == PARAMS * 2
    assert r["scratch_bytes"] == PEAK * 2 + L1 * 2 + PARAMS * 2 + 13
    assert r["total_bytes"] == r["scratch_bytes"] + r["weight_bytes"]
    r = rows["bp", "16w8a", "LP"]
    assert r["scratch_bytes"] == PEAK + HEAD
    assert r["weight_bytes"] == PARAMS * 2
    r = rows["bp", "fp16", "FT"]
    assert r["scratch_bytes"] == 1280 * 2 + PARAMS * 2


def test_sparse_keeps_fraction_plus_bitmap():
    rows = _rows(sparsity=0.9)
    for method in ("bp", "ff"):
        for precision, (_, _, g) in FF_PRECISIONS.items():
            ft = rows[method, precision, "FT"]["parts"]
            sp = rows[method, precision, "sparse"]["parts"]
            assert sp["gradient_buffers"] == -(-PARAMS // 10) * g  # 241 kept weights
            assert sp["sparse_mask"] == -(-PARAMS // 8)  # 1 bit per trainable weight
            assert sp["activations"] == ft["activations"]
            delta = rows[method, precision, "FT"]["scratch_bytes"] \
                - rows[method, precision, "sparse"]["scratch_bytes"]
            expected = ft["gradient_buffers"] - sp["gradient_buffers"] - sp["sparse_mask"]
            if method == "ff":
                assert sp["perturbation"] == -(-L1 // 10) * g
                expected += ft["perturbation"] - sp["perturbation"]
            assert delta == expected
    seed = _rows(sparsity=0.9, mask="seed", methods=("ff",), precisions=("16w8a",),
                 modes=("sparse",))
    assert seed["ff", "16w8a", "sparse"]["parts"]["sparse_mask"] == 0
    index = _rows(sparsity=0.5, mask="index", methods=("ff",), precisions=("16w8a",),
                  modes=("sparse",))
    assert index["ff", "16w8a", "sparse"]["parts"]["sparse_mask"] == 1205 * 4


@pytest.mark.parametrize("name", ["mnist-cnn", "mnist-mobilenet"])
def test_benchmark_models_ff_below_bp_and_lp_below_ft(name):
    rows = {(r["method"], r["precision"], r["mode"]): r
            for r in scratch_vs_weights(name, batch_size=32)}
    for precision in FF_PRECISIONS:
        assert rows["ff", precision, "FT"]["scratch_bytes"] \
            < rows["bp", precision, "FT"]["scratch_bytes"]
        assert rows["bp", precision, "LP"]["scratch_bytes"] \
            < rows["bp", precision, "FT"]["scratch_bytes"]
        assert rows["ff", precision, "sparse"]["scratch_bytes"] \
            < rows["ff", precision, "FT"]["scratch_bytes"]
        # Weights do not depend on the method or mode.
        assert len({r["weight_bytes"] for k, r in rows.items() if k[1] == precision}) == 1
    assert rows["ff", "16w8a", "FT"]["scratch_bytes"] < rows["ff", "fp16", "FT"]["scratch_bytes"]


def test_bp_stored_activations_match_autograd_saved_tensors():
    # The BP rule's stored activations equal the float tensors autograd keeps (storages
    # other than parameters; max-pool's int64 indices are not modelled).
    from bpfree.models import get_model

    model = get_model("mnist-cnn").build()
    x = torch.zeros(4, 1, 28, 28)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.is_floating_point():
            seen[ptr] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    report = analytic(model, "bp-ff-compare", example_input=x, dtype_bytes=1)
    assert report.parts["activations"] == sum(seen.values())


class _MHANet(nn.Module):
    def __init__(self, mha: bool) -> None:
        super().__init__()
        self.mha = mha
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True) if mha else None
        if not mha:
            self.qkv = nn.Linear(16, 48)
            self.out = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        if self.mha:
            y = self.attn(x, x, x, need_weights=False)[0]
        else:
            b, t, d = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-2, -1) * 8 ** -0.5, dim=-1)
            y = self.out((a @ v).transpose(1, 2).reshape(b, t, d))
        return self.head(y.mean(1))


def test_attention_module_is_accounted():
    # nn.MultiheadAttention is one opaque op: its internals are added from shapes and
    # heads, giving the same stored activations as the written-out attention.
    x = torch.zeros(2, 5, 16)
    torch.manual_seed(0)
    explicit = {(r["method"], r["precision"], r["mode"]): r
                for r in scratch_vs_weights(_MHANet(False), x, precisions=("fp16",))}
    opaque = {(r["method"], r["precision"], r["mode"]): r
              for r in scratch_vs_weights(_MHANet(True), x, precisions=("fp16",))}
    assert explicit["bp", "fp16", "FT"]["parts"]["activations"] \
        == opaque["bp", "fp16", "FT"]["parts"]["activations"]
    assert explicit["ff", "fp16", "FT"]["weight_bytes"] \
        == opaque["ff", "fp16", "FT"]["weight_bytes"]
    # in_proj_weight (owned by the non-leaf MHA) is trainable and its z is one unit.
    assert opaque["ff", "fp16", "FT"]["parts"]["perturbation"] \
        == (48 * 16 + 48 + 16 * 16 + 16) * 2


def test_plot_writes_png(tmp_path):
    rows = [dict(r, model="mlp") for r in _rows().values()]
    path = plot_scratch_vs_weights(rows, tmp_path / "fig" / "scratch.png", "MLP")
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="empty"):
        plot_scratch_vs_weights([], tmp_path / "x.png")


def test_ff_macs_two_forwards_per_query(mlp_profile):
    assert macs_per_iteration(mlp_profile, "ff", 8, 3) == 2 * 3 * 8 * (64 * 32 + 32 * 10)


@pytest.mark.parametrize("kwargs, match", [
    ({"precisions": ("fp32",)}, "fp16, 16w8a"),
    ({"modes": ("full",)}, "FT, LP, sparse"),
    ({"methods": ("zo",)}, "bp, ff"),
    ({"sparsity": 1.0}, r"\[0, 1\)"),
    ({"sparsity": -0.1}, r"\[0, 1\)"),
    ({"mask": "rle"}, "bitmap, index, seed"),
])
def test_bad_input_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scratch_vs_weights(_mlp(), torch.zeros(N, 64), **kwargs)


def test_rule_options_validated(mlp_profile):
    with pytest.raises(ValueError, match="fp16, 16w8a"):
        analytic(mlp_profile, "ff", precision="int4")
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        analytic(mlp_profile, "bp-ff-compare", sparsity=1.5)
    # precision=None: dtype_bytes (default 2) for weights, activations and gradients.
    assert analytic(mlp_profile, "ff").parts == analytic(mlp_profile, "ff",
                                                         precision="fp16").parts
