"""TinyViT with deep VPT, training modes and episodic few-shot evaluation (QZO-FF §4.1–4.3)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jvp, vmap

from bpfree.fewshot import (Episode, base_feature_mean, bp_finetune, evaluate_episodes,
                            feature_function, mean_confidence_interval, protonet_logits,
                            protonet_predict, prototype_temperature, sample_episodes,
                            simpleshot_predict, with_episode_head)
from bpfree.models import get_model, mnist_cnn
from bpfree.models.vit import TinyViT
from bpfree.training_modes import MODES, apply_mode, trainable_numel, trainable_parameters


def _small_vit(**kw) -> TinyViT:
    torch.manual_seed(0)
    return TinyViT(**{"dim": 16, "depth": 3, "heads": 2, **kw})


# --------------------------------------------------------------------------- ViT

def test_vit_shapes_and_registry():
    spec = get_model("mnist-vit")
    assert spec.input_shape == (1, 28, 28)
    m = spec.build()
    assert isinstance(m, TinyViT) and m.num_patches == 16
    x = torch.randn(3, *spec.input_shape)
    assert m(x).shape == (3, 10)
    assert m.features(x).shape == (3, 64)
    assert m.tokens(x).shape == (3, 17, 64)
    assert m.prompts is None and "prompts" not in dict(m.named_parameters())
    with pytest.raises(ValueError, match="expected input"):
        m(torch.randn(3, 1, 27, 27))
    with pytest.raises(ValueError, match="divisible"):
        TinyViT(image_size=28, patch_size=5)
    with pytest.raises(ValueError, match="prompt_tokens"):
        TinyViT(prompt_tokens=-1)


def test_vit_is_deterministic_and_functional():
    m = _small_vit(prompt_tokens=2)
    x = torch.randn(4, 1, 28, 28)
    m.train()
    a = m(x)
    m.eval()
    assert torch.equal(a, m(x))
    # works under vmap(functional_call) (Objective.batched) and jvp (forward gradients)
    params = {n: p.detach() for n, p in m.named_parameters()}
    stacked = {"prompts": torch.stack([params["prompts"], params["prompts"] + 0.1])}
    out = vmap(lambda p: functional_call(m, p, (x,)))(stacked)
    assert out.shape == (2, 4, 10)
    torch.testing.assert_close(out[0], a, rtol=1e-5, atol=1e-5)
    tangent = torch.randn_like(params["prompts"])
    _, d = jvp(lambda p: functional_call(m, {"prompts": p}, (x,)).sum(), (params["prompts"],),
               (tangent,))
    assert d.ndim == 0 and torch.isfinite(d)


def test_deep_vpt_prompts_shape_and_effect():
    m = _small_vit(prompt_tokens=3)
    assert m.prompts.shape == (3, 3, 16)  # (depth, P, dim)
    x = torch.randn(5, 1, 28, 28)
    before, feats = m(x), m.features(x)
    with torch.no_grad():  # a middle layer's prompts alone change the output
        # (not a constant shift: prompts enter each block through LayerNorm, which removes it)
        m.prompts[1] += torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    assert (m(x) - before).abs().max() > 1e-4
    assert (m.features(x) - feats).abs().max() > 1e-3
    # zero prompt tokens at every layer: same parameters, different function than no prompts
    plain = _small_vit()
    state = {k: v for k, v in m.state_dict().items() if k != "prompts"}
    plain.load_state_dict(state)
    assert (plain.features(x) - m.features(x)).abs().max() > 1e-3


def test_deep_vpt_replaces_previous_prompt_outputs():
    """Sequence length stays 1 + P + N in every block (VPT-deep replaces, not appends)."""
    m = _small_vit(prompt_tokens=4)
    lengths = []
    for b in m.blocks:
        b.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[1]))
    m(torch.randn(2, 1, 28, 28))
    assert lengths == [1 + 4 + 16] * 3


def test_deep_vpt_gradients_reach_prompts_only():
    m = _small_vit(prompt_tokens=2)
    names = apply_mode(m, "deep-vpt")
    assert names == ["prompts", "head.weight", "head.bias"]
    loss = nn.functional.cross_entropy(m(torch.randn(6, 1, 28, 28)), torch.arange(6) % 3)
    loss.backward()
    for n, p in m.named_parameters():
        if n in names:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None and not p.requires_grad, n


# --------------------------------------------------------------------------- training modes

def test_training_mode_name_sets():
    m = _small_vit(prompt_tokens=2)
    all_names = [n for n, _ in m.named_parameters()]
    assert trainable_parameters(m, "full") == all_names
    assert trainable_parameters(m, "linear-probe") == ["head.weight", "head.bias"]
    for k in (1, 2, 3):
        names = trainable_parameters(m, "last-k", k=k)
        blocks = {n.split(".")[1] for n in names if n.startswith("blocks.")}
        assert blocks == {str(i) for i in range(3 - k, 3)}
        # every parameter of those blocks, plus the final norm and the head, nothing else
        expected = [n for n in all_names
                    if n.split(".")[0] in ("norm", "head")
                    or (n.startswith("blocks.") and n.split(".")[1] in blocks)]
        assert names == expected
    assert trainable_numel(m, trainable_parameters(m, "linear-probe")) == 16 * 10 + 10
    # generic nn.Sequential: last k parameterised top-level layers
    cnn = mnist_cnn()
    assert trainable_parameters(cnn, "linear-probe") == ["7.weight", "7.bias"]
    assert trainable_parameters(cnn, "last-k", k=2) == ["3.weight", "3.bias", "7.weight",
                                                         "7.bias"]


def test_training_mode_errors():
    m = _small_vit()
    with pytest.raises(ValueError, match="linear-probe, full, last-k, deep-vpt"):
        trainable_parameters(m, "lora")
    with pytest.raises(ValueError, match="needs k"):
        trainable_parameters(m, "last-k")
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match="k must"):
            trainable_parameters(m, "last-k", k=bad)
    with pytest.raises(ValueError, match="only used by mode 'last-k'"):
        trainable_parameters(m, "full", k=1)
    with pytest.raises(ValueError, match="prompt_tokens > 0"):
        apply_mode(m, "deep-vpt")
    with pytest.raises(ValueError, match="k must be in 1..3"):
        trainable_parameters(mnist_cnn(), "last-k", k=4)
    assert set(MODES) == {"linear-probe", "full", "last-k", "deep-vpt"}


def test_apply_mode_sets_requires_grad():
    m = _small_vit()
    names = apply_mode(m, "last-k", k=1)
    assert [n for n, p in m.named_parameters() if p.requires_grad] == names
    apply_mode(m, "full")
    assert all(p.requires_grad for p in m.parameters())


# --------------------------------------------------------------------------- episodes

def _toy_data(per_class: int = 30, n_classes: int = 10):
    y = np.repeat(np.arange(n_classes), per_class)
    x = torch.arange(len(y), dtype=torch.float32)[:, None]  # x holds its own index
    return x, y


def test_sample_episodes_sizes_classes_and_determinism():
    x, y = _toy_data()
    eps = sample_episodes(x, y, [5, 6, 7, 8, 9], n_way=3, k_shot=4, n_query=6, episodes=20,
                          seed=1)
    assert len(eps) == 20
    for ep in eps:
        assert isinstance(ep, Episode)
        assert ep.n_way == 3 and ep.k_shot == 4 and ep.n_query == 6
        assert ep.support_x.shape == (12, 1) and ep.query_x.shape == (18, 1)
        assert ep.support_y.tolist() == [0] * 4 + [1] * 4 + [2] * 4
        assert ep.query_y.tolist() == [0] * 6 + [1] * 6 + [2] * 6
        assert len(set(ep.classes)) == 3 and set(ep.classes) <= {5, 6, 7, 8, 9}
        s_idx, q_idx = ep.support_x[:, 0].long().numpy(), ep.query_x[:, 0].long().numpy()
        assert np.array_equal(s_idx, ep.support_idx) and np.array_equal(q_idx, ep.query_idx)
        assert not set(s_idx) & set(q_idx) and len(set(s_idx)) == 12 and len(set(q_idx)) == 18
        # labels map back to the episode's dataset classes
        assert np.array_equal(y[s_idx], np.array(ep.classes)[ep.support_y.numpy()])
        assert np.array_equal(y[q_idx], np.array(ep.classes)[ep.query_y.numpy()])
    again = sample_episodes(x, y, [9, 8, 7, 6, 5], n_way=3, k_shot=4, n_query=6, episodes=20,
                            seed=1)
    assert all(torch.equal(a.support_x, b.support_x) and torch.equal(a.query_x, b.query_x)
               and a.classes == b.classes for a, b in zip(eps, again))
    other = sample_episodes(x, y, range(5, 10), n_way=3, k_shot=4, n_query=6, episodes=20,
                            seed=2)
    assert any(not torch.equal(a.support_x, b.support_x) for a, b in zip(eps, other))
    # classes are drawn at random across episodes: all five used
    assert set().union(*(e.classes for e in eps)) == {5, 6, 7, 8, 9}


def test_sample_episodes_errors():
    x, y = _toy_data(per_class=10)
    with pytest.raises(ValueError, match="n_way=6 exceeds the 5 classes"):
        sample_episodes(x, y, range(5, 10), n_way=6, seed=0)
    with pytest.raises(ValueError, match="class 5 has 10 samples"):
        sample_episodes(x, y, range(5, 10), k_shot=5, n_query=6, seed=0)
    with pytest.raises(ValueError, match="class 11 has 0 samples"):
        sample_episodes(x, y, [5, 11], n_way=2, k_shot=1, n_query=1, seed=0)
    with pytest.raises(ValueError, match="k_shot must be a positive int"):
        sample_episodes(x, y, range(5, 10), k_shot=0, seed=0)
    with pytest.raises(ValueError, match="one label per sample"):
        sample_episodes(x[:5], y, range(5, 10), seed=0)


# --------------------------------------------------------------------------- classifiers

def test_protonet_hand_computed():
    s = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 10.0], [10.0, 12.0]])
    sy = torch.tensor([0, 0, 1, 1])  # prototypes (1, 0) and (10, 11)
    q = torch.tensor([[1.0, 1.0], [6.0, 5.0], [5.0, 6.0], [9.0, 9.0]])
    logits, labels = protonet_logits(s, sy, q)
    assert labels.tolist() == [0, 1]
    # squared distances by hand: (1,1): 1 | 81+100 ; (6,5): 25+25 | 16+36 ; (5,6): 16+36 | 25+25
    torch.testing.assert_close(-logits, torch.tensor([[1.0, 181.0], [50.0, 52.0], [52.0, 50.0],
                                                      [145.0, 5.0]]))
    assert protonet_predict(s, sy, q).tolist() == [0, 0, 1, 1]
    # arbitrary label values are returned as given
    assert protonet_predict(s, sy * 7 + 3, q).tolist() == [3, 3, 10, 10]


def test_simpleshot_hand_computed():
    s = torch.tensor([[3.0, 1.0], [5.0, 1.0], [1.0, 3.0], [1.0, 5.0]])
    sy = torch.tensor([0, 0, 1, 1])
    mu = torch.tensor([1.0, 1.0])
    # centred: (2,0),(4,0) -> (1,0),(1,0): centroid (1,0); (0,2),(0,4) -> centroid (0,1)
    q = torch.tensor([[3.0, 2.0], [2.0, 3.0], [1.5, 100.0]])
    # centred queries (2,1),(1,2),(0.5,99) -> directions favour class 0, 1, 1
    assert simpleshot_predict(s, sy, q, base_mean=mu).tolist() == [0, 1, 1]
    # without centring the (uncentred) query (3, 2.9) is closer in angle to class 0's centroid
    # ... but centring by mu=(3, 0) flips it: (0, 2.9) points at class 1
    q2 = torch.tensor([[3.0, 2.9]])
    assert simpleshot_predict(s, sy, q2).tolist() == [0]
    assert simpleshot_predict(s, sy, q2, base_mean=torch.tensor([3.0, 0.0])).tolist() == [1]
    # scale invariance (L2 normalisation): a far query along class 1's direction
    assert simpleshot_predict(s, sy, torch.tensor([[1.0, 1000.0]]), base_mean=mu).tolist() == [1]
    with pytest.raises(ValueError, match="base_mean must have shape"):
        simpleshot_predict(s, sy, q, base_mean=torch.zeros(3))


def test_classifiers_perfect_on_separable_features():
    g = torch.Generator().manual_seed(0)
    centers = torch.eye(5) * 10 + 3.0
    sy = torch.arange(5).repeat_interleave(5)
    qy = torch.arange(5).repeat_interleave(15)
    s = centers[sy] + 0.5 * torch.randn(25, 5, generator=g)
    q = centers[qy] + 0.5 * torch.randn(75, 5, generator=g)
    assert torch.equal(protonet_predict(s, sy, q), qy)
    assert torch.equal(simpleshot_predict(s, sy, q, base_mean=centers.mean(0)), qy)


def test_mean_confidence_interval_hand_calculation():
    accs = [0.6, 0.8, 0.7, 0.9]
    mean, hw = mean_confidence_interval(accs)
    # mean 0.75; sample variance ((.15²+.05²)*2)/3 = 0.05/3; std = 0.129099...
    std = math.sqrt(0.05 / 3)
    assert mean == pytest.approx(0.75)
    assert hw == pytest.approx(1.959964 * std / 2, rel=1e-6)
    assert hw == pytest.approx(1.96 * 0.1290994 / 2, rel=1e-4)
    _, hw_t = mean_confidence_interval(accs, method="t")
    assert hw_t == pytest.approx(3.182446 * std / 2, rel=1e-6)  # t_{0.975, 3}
    assert statistics.fmean(accs) == pytest.approx(mean)
    m1, h1 = mean_confidence_interval([0.5])
    assert m1 == 0.5 and math.isnan(h1)
    with pytest.raises(ValueError, match="empty"):
        mean_confidence_interval([])
    with pytest.raises(ValueError, match="method"):
        mean_confidence_interval(accs, method="boot")


# --------------------------------------------------------------------------- evaluation

def _blob_data(seed: int = 0):
    """10 Gaussian classes in 8-D, well separated."""
    g = torch.Generator().manual_seed(seed)
    centers = 6 * torch.randn(10, 8, generator=g)
    y = np.repeat(np.arange(10), 40)
    x = centers[torch.from_numpy(y)] + torch.randn(400, 8, generator=g)
    return x, y


def test_evaluate_episodes_identity_features():
    x, y = _blob_data()
    eps = sample_episodes(x, y, range(5, 10), episodes=8, seed=0)
    res = evaluate_episodes(lambda t: t, eps, "protonet")
    assert res.accuracies.shape == (8,) and res.mean == 1.0 and res.half_width == 0.0
    mu = base_feature_mean(lambda t: t, x[torch.from_numpy(y < 5)])
    res = evaluate_episodes(lambda t: t, eps, "simpleshot", base_mean=mu)
    assert res.mean > 0.95
    res2 = evaluate_episodes(lambda t: t, eps, "simpleshot", base_mean=lambda fn: mu)
    assert np.array_equal(res.accuracies, res2.accuracies)
    assert "over 8 episodes" in str(res)
    with pytest.raises(ValueError, match="unknown classifier"):
        evaluate_episodes(lambda t: t, eps, "knn")
    with pytest.raises(ValueError, match="needs base_mean"):
        evaluate_episodes(lambda t: t, eps, "simpleshot")
    with pytest.raises(ValueError, match="needs \\[Q, n_way=5\\] logits"):
        evaluate_episodes(lambda t: t, eps, "head")


def test_bp_finetune_vit_episode():
    torch.manual_seed(0)
    m = TinyViT(dim=16, depth=2, heads=2, prompt_tokens=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 1, 28, 28, generator=g)
    y = np.repeat(np.arange(6), 10)
    x += torch.from_numpy(y).float()[:, None, None, None]  # class-dependent brightness
    eps = sample_episodes(x, y, range(6), n_way=3, k_shot=2, n_query=3, episodes=2, seed=0)
    ep = eps[0]
    reference = {n: p.clone() for n, p in m.named_parameters()}
    # the temporary head with prototype init ranks classes like ProtoNet
    copy_ = with_episode_head(m, ep)
    assert copy_.head.out_features == 3 and m.head.out_features == 10
    f = feature_function(m)
    proto = protonet_predict(f(ep.support_x), ep.support_y, f(ep.query_x))
    assert torch.equal(feature_function(copy_, output="logits")(ep.query_x).argmax(1), proto)
    for mode, k in (("full", None), ("last-k", 1), ("deep-vpt", None), ("linear-probe", None)):
        out = "logits" if mode == "linear-probe" else "features"
        fn = bp_finetune(m, ep, mode, epochs=3, lr=1e-2, k=k, output=out)
        assert fn.model is not m
        adapted = dict(fn.model.named_parameters())
        trained = set(trainable_parameters(m, mode, k=k)) - {"head.weight", "head.bias"}
        for n, p in reference.items():
            if n.startswith("head."):
                continue
            assert torch.equal(adapted[n], p) != (n in trained), (mode, n)
        assert fn(ep.query_x).shape == ((9, 3) if out == "logits" else (9, 16))
    for n, p in m.named_parameters():  # the original is untouched
        assert torch.equal(p, reference[n])
    res = evaluate_episodes(None, eps, "protonet",
                            finetune=lambda e: bp_finetune(m, e, "full", epochs=2, lr=1e-3))
    assert res.accuracies.shape == (2,)
    tuned = []

    def probe(e):
        tuned.append(bp_finetune(m, e, "linear-probe", epochs=2, output="logits"))
        return tuned[-1]

    res = evaluate_episodes(None, eps, "head", finetune=probe)
    # Each episode's score is the fraction of its queries whose logits' argmax is the label,
    # counted here with the fine-tuned function evaluate_episodes was given.
    with torch.no_grad():
        hits = [float((fn(e.query_x).argmax(1) == e.query_y).double().mean())
                for fn, e in zip(tuned, eps)]
    assert res.accuracies.tolist() == pytest.approx(hits)
    assert res.mean == pytest.approx(sum(hits) / len(hits))


# --------------------------------------------------------------------------- head temperature

def _loo_reference(f: torch.Tensor, y: torch.Tensor, tau: float) -> float:
    """Leave-one-out ProtoNet cross-entropy at scale tau, written out sample by sample."""
    total = 0.0
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        protos = torch.stack([f[keep & (y == c)].mean(0) for c in range(int(y.max()) + 1)])
        logits = -tau * ((f[i] - protos) ** 2).sum(1)
        total += float(-torch.log_softmax(logits, 0)[y[i]])
    return total / len(y)


def test_prototype_temperature_minimises_leave_one_out_loss():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(4).repeat_interleave(3)
    f = (torch.randn(4, 6, generator=g) * 3)[y] + torch.randn(12, 6, generator=g)
    f = f.double()
    tau = prototype_temperature(f, y)
    # the grid is r / s, s the mean squared distance to the own leave-one-out prototype
    s = statistics.mean(
        float(((f[i] - f[(torch.arange(12) != i) & (y == y[i])].mean(0)) ** 2).sum())
        for i in range(12))
    grid = [float(v) / s for v in np.logspace(-2, 2, 41)]
    best = min(grid, key=lambda t: _loo_reference(f, y, t))
    assert math.isclose(tau, best, rel_tol=1e-9)
    # scale-equivariant: features x c -> τ / c²
    assert math.isclose(prototype_temperature(10 * f, y), tau / 100, rel_tol=1e-9)
    # one shot per class: 1 / mean squared distance between the prototypes
    y1 = torch.arange(4)
    f1 = f[::3]
    d2 = ((f1[:, None] - f1[None]) ** 2).sum(-1)
    assert math.isclose(prototype_temperature(f1, y1), 1 / float(d2[d2 > 0].mean()),
                        rel_tol=1e-9)
    with pytest.raises(ValueError, match="two classes"):
        prototype_temperature(f[:3], torch.zeros(3, dtype=torch.long))


def test_episode_head_temperature():
    torch.manual_seed(0)
    m = mnist_cnn().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 1, 28, 28, generator=g)
    y = np.repeat(np.arange(4), 10)
    x += torch.from_numpy(y).float()[:, None, None, None] * 0.3
    ep = sample_episodes(x, y, range(4), n_way=4, k_shot=3, n_query=2, episodes=1, seed=0)[0]
    plain = with_episode_head(m, ep)
    loo = with_episode_head(m, ep, temperature="loo")
    half = with_episode_head(m, ep, temperature=0.5)
    tau = prototype_temperature(feature_function(m)(ep.support_x), ep.support_y)
    torch.testing.assert_close(loo[-1].weight, tau * plain[-1].weight)
    torch.testing.assert_close(loo[-1].bias, tau * plain[-1].bias)
    torch.testing.assert_close(half[-1].weight, 0.5 * plain[-1].weight)
    logits = feature_function(plain, output="logits")
    assert torch.equal(feature_function(loo, output="logits")(ep.query_x).argmax(1),
                       logits(ep.query_x).argmax(1))
    for bad in (0, -1.0, "auto", float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            with_episode_head(m, ep, temperature=bad)
    fn = bp_finetune(m, ep, "linear-probe", epochs=2, lr=1e-2, temperature="loo",
                     output="logits")
    assert fn(ep.query_x).shape == (8, 4)
