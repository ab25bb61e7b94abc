"""Tests for bpfree.perturb: generators, distributions registry, seeds, in-place perturb/restore."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from bpfree.perturb import (
    Distribution,
    QuantizedGaussian,
    Repair,
    derive_seed,
    fill_rademacher_,
    gaussian,
    get_distribution,
    list_distributions,
    perturb_,
    quantization_scale,
    quantized_gaussian,
    quantized_one,
    quantized_second_moment,
    rademacher_fast,
    rademacher_torch,
    rademacher_xorshift,
    restore_,
    xorshift32,
)
from bpfree.perturb.counter import rademacher_fast_reference

DATA = Path(__file__).parent / "data"
REF_SEEDS = (1, 42, 2463534242, 4294967295)
ALL_NAMES = ("rademacher", "rademacher_xorshift", "rademacher_torch", "gaussian",
             "quantized_gaussian")


def _parse_reference(text: str) -> dict[tuple[str, int], list[int]]:
    ref = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        kind, seed, *values = line.split()
        ref[(kind, int(seed))] = [int(v) for v in values]
    return ref


@pytest.fixture(scope="module")
def reference():
    return _parse_reference((DATA / "xorshift_ref.txt").read_text())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


# --- XORShift32 (PMT Appendix F) -----------------------------------------------------------

@pytest.mark.parametrize("seed", REF_SEEDS)
def test_xorshift32_matches_pmt_c_reference(reference, seed):
    expected = np.array(reference[("xor_rand", seed)], dtype=np.uint32)
    assert len(expected) == 1000
    got = xorshift32(seed, 1000)
    assert got.dtype == np.uint32 and got.shape == (1000,)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("seed", REF_SEEDS)
def test_rademacher_xorshift_matches_pmt_c_reference(reference, seed):
    expected = torch.tensor(reference[("rademacher", seed)], dtype=torch.int8)
    got = rademacher_xorshift(seed, (10, 100))
    assert got.dtype == torch.int8 and got.shape == (10, 100)
    assert torch.equal(got.reshape(-1), expected)  # row-major: one call per element


def test_xorshift32_marsaglia_published_value():
    # Marsaglia (2003), "Xorshift RNGs": y=2463534242 with (13, 17, 5) first gives 723471715.
    assert int(xorshift32(2463534242, 1)[0]) == 723471715


def test_xorshift32_prefix_consistent_and_first_update():
    s = 1
    s ^= (s << 13) & 0xFFFFFFFF
    s ^= s >> 17
    s ^= (s << 5) & 0xFFFFFFFF
    long = xorshift32(1, 5000)
    assert int(long[0]) == s
    np.testing.assert_array_equal(xorshift32(1, 10), long[:10])
    # Restarting from a state continues the stream.
    np.testing.assert_array_equal(xorshift32(int(long[9]), 20), long[10:30])
    assert xorshift32(7, 0).shape == (0,) and xorshift32(7, 0).dtype == np.uint32


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler `cc` on PATH")
def test_xorshift_reference_recompiled_live(tmp_path, reference):
    exe = tmp_path / "xorshift_ref"
    subprocess.run(["cc", "-std=c11", "-O2", "-o", str(exe), str(DATA / "xorshift_ref.c")],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    live = _parse_reference(out)
    assert live == reference  # the committed file is what the C code produces
    for seed in REF_SEEDS:
        np.testing.assert_array_equal(xorshift32(seed, 1000),
                                      np.array(live[("xor_rand", seed)], dtype=np.uint32))


@pytest.mark.parametrize("bad", [0, -1, 2**32, 2**40, 1.0, 3.5, True, "1", None])
def test_xorshift_seed_validation(bad):
    with pytest.raises(ValueError, match=r"seed.*\[1, 4294967295\]"):
        xorshift32(bad, 3)
    with pytest.raises(ValueError, match=r"seed.*\[1, 4294967295\]"):
        rademacher_xorshift(bad, 3)


def test_xorshift_n_and_shape_validation():
    with pytest.raises(ValueError, match="n must be"):
        xorshift32(1, -1)
    with pytest.raises(ValueError, match="n must be"):
        xorshift32(1, 2.0)
    with pytest.raises(ValueError, match=r"shape\[1\]"):
        rademacher_xorshift(1, (2, -3))
    # numpy integer seeds are fine
    np.testing.assert_array_equal(xorshift32(np.uint32(42), 4), xorshift32(42, 4))


# --- Rademacher generators -----------------------------------------------------------------

def _rademacher_generators():
    return {
        "xorshift": lambda seed, n: rademacher_xorshift(seed, n).float(),
        "fast": lambda seed, n: rademacher_fast(seed, n),
        "fast_torch_path": lambda seed, n: rademacher_fast(seed, n, backend="torch"),
        "torch": lambda seed, n: rademacher_torch(seed, n),
    }


@pytest.mark.parametrize("name", list(_rademacher_generators()))
def test_rademacher_statistics_and_determinism(name):
    gen = _rademacher_generators()[name]
    n = 400_000
    x = gen(12345, n)
    assert x.shape == (n,)
    assert set(x.unique().tolist()) == {-1.0, 1.0}
    assert abs(x.double().mean().item()) < 5 / math.sqrt(n)
    # lag-1 correlation, catches e.g. alternating or repeated bits
    assert abs((x[1:] * x[:-1]).double().mean().item()) < 5 / math.sqrt(n)
    assert torch.equal(gen(12345, n), x)
    other = gen(12346, n)
    assert not torch.equal(other, x)
    assert abs((other * x).double().mean().item()) < 5 / math.sqrt(n)


def test_fast_rademacher_every_bit_position_balanced():
    x = rademacher_fast(3, 64 * 20_000).reshape(-1, 64).double()
    m = 20_000
    assert x.mean(0).abs().max().item() < 5 / math.sqrt(m)


def test_fast_rademacher_matches_pure_python_definition():
    for seed, offset, n in [(0, 0, 200), (12345, 100, 300), (2**64 - 1, 63, 130), (7, 2**40, 70)]:
        ref = torch.tensor(rademacher_fast_reference(seed, n, offset=offset), dtype=torch.float32)
        assert torch.equal(rademacher_fast(seed, n, offset=offset), ref)
        assert torch.equal(rademacher_fast(seed, n, offset=offset, backend="torch"), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int8, torch.int16, torch.int32, torch.int64])
def test_fast_rademacher_numba_and_torch_paths_identical(dtype):
    for seed, offset, shape in [(1, 0, (3, 7, 64)), (99, 5, (1001,)),
                                (2**63 + 11, 64 * 3 + 1, (0,)),
                                (4242, 17, (77, 131))]:
        a = rademacher_fast(seed, shape, dtype=dtype, offset=offset, backend="numba")
        b = rademacher_fast(seed, shape, dtype=dtype, offset=offset, backend="torch")
        assert a.dtype == dtype and a.shape == shape
        assert _bit_equal(a, b)


def test_fast_rademacher_large_paths_identical_across_torch_chunks():
    from bpfree.perturb import counter

    n = 64 * counter._TORCH_CHUNK_BLOCKS + 1000  # spans two torch chunks
    a = rademacher_fast(5, n, offset=33)
    b = rademacher_fast(5, n, offset=33, backend="torch")
    assert torch.equal(a, b)


def test_fast_rademacher_slices_regenerable():
    full = rademacher_fast(777, 10_000)
    for lo, hi in [(0, 1), (137, 555), (64, 128), (9_999, 10_000), (1, 9_990)]:
        assert torch.equal(rademacher_fast(777, hi - lo, offset=lo), full[lo:hi])
    buf = torch.empty(418)
    assert fill_rademacher_(buf, 777, offset=137) is buf
    assert torch.equal(buf, full[137:555])
    out = torch.empty(20, 5, dtype=torch.float64)
    assert rademacher_fast(777, (20, 5), offset=10, out=out) is out
    assert torch.equal(out.reshape(-1).float(), full[10:110])
    with pytest.raises(ValueError, match="out must be"):
        rademacher_fast(777, (5, 20), out=out)
    # shape does not matter, only the row-major flat index
    assert torch.equal(rademacher_fast(777, (100, 100)).reshape(-1), full)


def test_fill_rademacher_non_contiguous_and_grad():
    base = torch.zeros(40, 30)
    view = base.t()  # non-contiguous (30, 40)
    fill_rademacher_(view, 9)
    assert torch.equal(view, rademacher_fast(9, (30, 40)))
    p = torch.nn.Parameter(torch.zeros(100))
    fill_rademacher_(p, 9)
    assert torch.equal(p.detach(), rademacher_fast(9, 100))


def test_fast_rademacher_validation():
    with pytest.raises(ValueError, match="seed"):
        rademacher_fast(-1, 10)
    with pytest.raises(ValueError, match="seed"):
        rademacher_fast(2**64, 10)
    with pytest.raises(ValueError, match="offset"):
        rademacher_fast(1, 10, offset=-1)
    with pytest.raises(ValueError, match="backend"):
        rademacher_fast(1, 10, backend="cuda")
    with pytest.raises(ValueError, match="dtype"):
        rademacher_fast(1, 10, dtype=torch.bool)
    with pytest.raises(ValueError, match="dtype"):
        rademacher_fast(1, 10, dtype=torch.uint8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_rademacher_cuda_matches_cpu():
    for dtype in (torch.float32, torch.float16, torch.int8):
        a = rademacher_fast(31, (513, 129), dtype=dtype, offset=3)
        b = rademacher_fast(31, (513, 129), dtype=dtype, offset=3, device="cuda")
        assert _bit_equal(a, b.cpu())


# --- Gaussian and quantized Gaussian (QZO-FF §3.3) -----------------------------------------

def test_gaussian_regenerates():
    a = gaussian(5, (1000,))
    assert torch.equal(a, gaussian(5, (1000,)))
    assert not torch.equal(a, gaussian(6, (1000,)))
    assert gaussian(5, (3, 4), dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="dtype"):
        gaussian(5, 3, dtype=torch.int32)


def test_quantized_gaussian_paper_constants():
    # QZO-FF §3.3: z_max = 3.5, 8 bits -> dz = 0.0276, 1_q = 36.
    q = quantized_gaussian(1, (50_000,), bits=8, z_max=3.5)
    assert round(q.scale, 4) == 0.0276
    assert q.one_q == 36
    assert round(quantization_scale(8, 3.5), 4) == 0.0276 and quantized_one(8, 3.5) == 36
    assert q.codes.dtype == torch.int8 and q.qmax == 127
    assert int(q.codes.abs().max()) <= 127
    # z is clipped at z_max = 127 * dz: about 0.05% of draws sit at the clip value
    assert int(q.codes.abs().max()) == 127
    z = gaussian(1, (50_000,))
    expected = torch.round(z / q.scale).clamp(-127, 127)
    assert torch.equal(q.codes.float(), expected)
    inside = z.abs() < 3.5 - q.scale
    assert (q.values()[inside] - z[inside]).abs().max() <= q.scale / 2 + 1e-6


@pytest.mark.parametrize("bits,dtype", [(2, torch.int8), (4, torch.int8), (9, torch.int16),
                                        (16, torch.int16)])
def test_quantized_gaussian_code_range(bits, dtype):
    q = quantized_gaussian(3, 20_000, bits=bits, z_max=2.0)
    qmax = 2 ** (bits - 1) - 1
    assert q.codes.dtype == dtype
    assert int(q.codes.min()) >= -qmax and int(q.codes.max()) <= qmax
    assert q.scale == pytest.approx(2.0 / qmax)


@pytest.mark.parametrize("bits", [1, 0, 17, 32, -3, 8.0, True])
def test_quantized_gaussian_bits_validation(bits):
    with pytest.raises(ValueError, match=r"bits.*\[2, 16\]"):
        quantized_gaussian(1, 10, bits=bits)
    with pytest.raises(ValueError, match=r"bits"):
        QuantizedGaussian(bits=bits)


@pytest.mark.parametrize("z_max", [0.0, -1.0, math.inf, math.nan, "3.5"])
def test_quantized_gaussian_z_max_validation(z_max):
    with pytest.raises(ValueError, match="z_max"):
        quantized_gaussian(1, 10, z_max=z_max)
    with pytest.raises(ValueError, match="z_max"):
        get_distribution("quantized_gaussian", z_max=z_max)


def test_quantized_second_moment_matches_empirical():
    for bits, z_max in [(8, 3.5), (2, 3.5), (4, 2.0)]:
        d = get_distribution("quantized_gaussian", bits=bits, z_max=z_max)
        x = d.sample(11, 1_000_000).double()
        emp = (x * x).mean().item()
        # std of the mean of xi^2 is below sqrt(E[xi^4] / n) <= sqrt(3 / n)
        assert abs(emp - d.second_moment) < 5 * math.sqrt(3 / 1_000_000)
    assert quantized_second_moment(2, 3.5) == pytest.approx(12.25 * 2 * (1 - 0.959941), abs=1e-4)


# --- Distribution registry ------------------------------------------------------------------

def test_registry_names_and_lookup():
    names = list_distributions()
    assert names[0] == "rademacher"
    assert set(names) == set(ALL_NAMES)
    for name in names:
        d = get_distribution(name)
        assert isinstance(d, Distribution) and d.name == name
        assert get_distribution(d) is d
    with pytest.raises(ValueError, match="known names.*rademacher_xorshift"):
        get_distribution("normal")
    with pytest.raises(ValueError, match="allowed"):
        get_distribution("rademacher", bits=8)
    with pytest.raises(ValueError, match=r"allowed: \['bits', 'z_max'\]"):
        get_distribution("quantized_gaussian", bitz=8)
    assert get_distribution("quantized_gaussian", bits=8) == QuantizedGaussian()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_distribution_sample_contract(name):
    d = get_distribution(name)
    seed = derive_seed(0, 1, 2)
    x = d.sample(seed, (17, 33))
    assert x.dtype == torch.float32 and x.shape == (17, 33)
    assert torch.equal(x, d.sample(seed, (17, 33)))
    assert not torch.equal(x, d.sample(seed + 1, (17, 33)))
    assert d.sample(seed, (4,), dtype=torch.float64).dtype == torch.float64
    assert d.second_moment == pytest.approx(1.0, abs=1e-3)
    if d.integer_valued:
        z = d.sample_int(seed, (17, 33))
        assert not z.dtype.is_floating_point
        assert torch.equal(z.float() * torch.tensor(d.int_scale, dtype=torch.float32), x)
        assert torch.equal(d.sample_int(seed, (17, 33), dtype=torch.int32), z.int())
    else:
        with pytest.raises(ValueError, match="integer"):
            d.sample_int(seed, (3,))
    with pytest.raises(ValueError, match="dtype"):
        d.sample(seed, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="seed"):
        d.sample(-5, 3)


def test_distribution_values():
    seed = 99
    assert torch.equal(get_distribution("rademacher").sample(seed, 100), rademacher_fast(seed, 100))
    assert torch.equal(get_distribution("rademacher_xorshift").sample(seed, 100),
                       rademacher_xorshift(seed, 100).float())
    assert torch.equal(get_distribution("rademacher_torch").sample(seed, 100),
                       rademacher_torch(seed, 100))
    assert torch.equal(get_distribution("gaussian").sample(seed, 100), gaussian(seed, 100))
    q = quantized_gaussian(seed, 100)
    assert torch.equal(get_distribution("quantized_gaussian").sample(seed, 100), q.values())
    with pytest.raises(ValueError, match=r"seed.*\[1, 4294967295\]"):
        get_distribution("rademacher_xorshift").sample(0, 3)
    with pytest.raises(ValueError, match="int16"):
        get_distribution("quantized_gaussian", bits=12).sample_int(1, 3, dtype=torch.int8)
    assert get_distribution("quantized_gaussian", bits=12).sample_int(1, 3).dtype == torch.int16


# --- derive_seed ----------------------------------------------------------------------------

def _splitmix_reference(base, *indices):
    # Independent transcription of the documented construction.
    m = (1 << 64) - 1

    def mix(z):
        z &= m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    h = mix(base + (len(indices) + 1) * 0x9E3779B97F4A7C15)
    for i in indices:
        h = mix((h ^ i) + 0x9E3779B97F4A7C15)
    return h % (2**32 - 1) + 1


def test_derive_seed_known_values():
    assert derive_seed(0) == 1564374506
    assert derive_seed(1) == 437029551
    assert derive_seed(42, 0, 0, 0) == 1758947728
    assert derive_seed(42, 1, 2, 3) == 260919613
    assert derive_seed(2**64 - 1, 2**64 - 1) == 1366773775
    for args in [(0,), (5, 1), (123, 4, 5, 6), (2**63, 2**40)]:
        assert derive_seed(*args) == _splitmix_reference(*args)


def test_derive_seed_range_uniqueness_and_validation():
    seeds = [derive_seed(7, step, q, t) for step in range(40) for q in range(10) for t in range(10)]
    assert all(1 <= s <= 2**32 - 1 for s in seeds)
    assert len(set(seeds)) == len(seeds)  # 4000 draws from 2**32: collisions would be a bug
    assert derive_seed(7, 0) != derive_seed(7, 0, 0)
    assert derive_seed(7, 1, 2) != derive_seed(7, 2, 1)
    assert derive_seed(np.int64(7), np.uint8(1)) == derive_seed(7, 1)
    xorshift32(derive_seed(7, 1), 1)  # valid xorshift seed
    with pytest.raises(ValueError, match="base"):
        derive_seed(-1)
    with pytest.raises(ValueError, match=r"indices\[1\]"):
        derive_seed(1, 2, -3)
    with pytest.raises(ValueError, match=r"indices\[0\]"):
        derive_seed(1, 1.5)
    with pytest.raises(ValueError, match="base"):
        derive_seed(True)


# --- in-place perturb / restore -------------------------------------------------------------

def _weights(n=20_011, scale=0.05, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("scale", [1e-8, 0.05, 3.0])
def test_perturb_restore_bit_exact(name, scale):
    dist = get_distribution(name)
    alpha = 1e-3
    t = _weights(scale=scale)
    original = t.clone()
    seed = derive_seed(3, 1, 2)
    repair = perturb_(t, dist, seed, alpha)
    assert isinstance(repair, Repair)
    expected = original + alpha * dist.sample(seed, t.shape)
    assert torch.equal(t, expected)
    assert not torch.equal(t, original)
    restore_(t, dist, seed, alpha, repair)
    assert _bit_equal(t, original)
    assert repair.nbytes == len(repair) * 8  # int32 index + float32 bits
    if scale == 1e-8:
        assert len(repair) > 0.9 * t.numel()  # the round trip loses almost every tiny weight
    if scale == 3.0:
        assert len(repair) < 0.01 * t.numel()


def test_perturb_without_repair_is_not_exact():
    # Guards the test above: the plain float round trip really does lose bits.
    t = _weights(scale=1e-8)
    back = (t + 1e-3) - 1e-3
    assert not torch.equal(back, t)


def test_perturb_restore_special_values_fused_path():
    t = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, -1e-30, 3e38, -3e38,
                      1.0, float.fromhex("0x1.000002p0")] * 13)
    t[2] = torch.tensor([0x7FC01234], dtype=torch.int32).view(torch.float32)  # NaN payload
    original = t.clone()
    for alpha in (1e-3, -0.5, 1e38, 0.0):
        repair = perturb_(t, "rademacher", 5, alpha)
        restore_(t, "rademacher", 5, alpha, repair)
        assert _bit_equal(t, original)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_perturb_restore_other_float_dtypes(dtype):
    for name in ("rademacher", "gaussian"):
        t = _weights(n=5_003, scale=0.01, dtype=dtype)
        t[:3] = torch.tensor([-0.0, math.nan, math.inf], dtype=dtype)
        original = t.clone()
        repair = perturb_(t, name, 11, 1e-3)
        assert torch.equal(t[3:], (original + 1e-3 * get_distribution(name).sample(
            11, original.shape, dtype=dtype))[3:])
        restore_(t, name, 11, 1e-3, repair)
        assert _bit_equal(t, original)


def test_perturb_fused_and_generic_paths_agree():
    base = _weights(n=300 * 70, scale=1e-3).reshape(70, 300)
    view = base.t()  # non-contiguous -> torch fallback
    contiguous = view.contiguous()  # same logical values -> fused numba kernel
    original = contiguous.clone()
    r1 = perturb_(view, "rademacher", 8, 1e-3)
    r2 = perturb_(contiguous, "rademacher", 8, 1e-3)
    assert torch.equal(view, contiguous)
    assert torch.equal(r1.indices, r2.indices) and torch.equal(r1.values, r2.values)
    restore_(view, "rademacher", 8, 1e-3, r1)
    restore_(contiguous, "rademacher", 8, 1e-3, r2)
    assert _bit_equal(view.contiguous(), original) and _bit_equal(contiguous, original)


def test_perturb_fused_repair_buffer_growth_and_offsets():
    # Every element needs repair, so the fused kernel must grow its buffers (initial n/16) and
    # resume mid-block.
    t = _weights(n=64 * 500 + 37, scale=1e-9)
    original = t.clone()
    repair = perturb_(t, "rademacher", 1, 1.0)
    assert len(repair) == t.numel()
    assert torch.equal(repair.indices.long(), torch.arange(t.numel()))
    assert torch.equal(t, original + rademacher_fast(1, t.shape))
    restore_(t, "rademacher", 1, 1.0, repair)
    assert _bit_equal(t, original)


def test_perturb_parameter_with_grad_and_shapes():
    p = torch.nn.Parameter(_weights(n=64 * 9).reshape(8, 8, 9))
    original = p.detach().clone()
    repair = perturb_(p, "rademacher", 2, 1e-2)
    assert torch.equal(p.detach(), original + 1e-2 * rademacher_fast(2, p.shape))
    restore_(p, "rademacher", 2, 1e-2, repair)
    assert _bit_equal(p.detach(), original)
    empty = torch.empty(0, 5)
    r = perturb_(empty, "gaussian", 2, 1.0)
    assert len(r) == 0 and r.nbytes == 0
    restore_(empty, "gaussian", 2, 1.0, r)


@pytest.mark.parametrize("name,alpha", [("rademacher", 3), ("rademacher_xorshift", -7),
                                        ("rademacher_torch", 1), ("quantized_gaussian", 5)])
def test_perturb_restore_int32_exact(name, alpha):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(-2**30, 2**30, (4099,), generator=g, dtype=torch.int32)
    original = t.clone()
    dist = get_distribution(name)
    repair = perturb_(t, dist, 17, alpha)
    assert len(repair) == 0 and repair.nbytes == 0
    assert torch.equal(t, original + alpha * dist.sample_int(17, t.shape, dtype=torch.int32))
    restore_(t, dist, 17, alpha, repair)
    assert torch.equal(t, original)


def test_perturb_int_overflow_raises_without_modifying():
    t = torch.full((1000,), 126, dtype=torch.int8)
    t[0] = -128
    original = t.clone()
    with pytest.raises(OverflowError, match=r"\[-128, 127\]"):
        perturb_(t, "rademacher", 3, 2)
    assert torch.equal(t, original)
    # The result fits int8 but alpha * xi = +-150 alone does not: still exact both ways.
    xi = rademacher_fast(3, 1000, dtype=torch.int8)
    t = -100 * xi
    original = t.clone()
    r = perturb_(t, "rademacher", 3, 150)
    assert torch.equal(t, 50 * xi)
    restore_(t, "rademacher", 3, 150, r)
    assert torch.equal(t, original)


def test_perturb_validation():
    t = _weights(n=100)
    with pytest.raises(ValueError, match="integer-valued"):
        perturb_(torch.zeros(10, dtype=torch.int32), "gaussian", 1, 1)
    with pytest.raises(ValueError, match="alpha"):
        perturb_(torch.zeros(10, dtype=torch.int32), "rademacher", 1, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        perturb_(t, "rademacher", 1, math.nan)
    with pytest.raises(ValueError, match="known names"):
        perturb_(t, "bogus", 1, 1e-3)
    with pytest.raises(ValueError, match="seed"):
        perturb_(t, "rademacher_xorshift", 0, 1e-3)
    with pytest.raises(ValueError, match="dtype"):
        perturb_(torch.zeros(3, dtype=torch.bool), "rademacher", 1, 1)
    original = t.clone()
    repair = perturb_(t, "rademacher", 1, 1e-3)
    with pytest.raises(ValueError, match="differ"):
        restore_(t, "rademacher", 2, 1e-3, repair)
    with pytest.raises(ValueError, match="differ"):
        restore_(t, "gaussian", 1, 1e-3, repair)
    with pytest.raises(ValueError, match="elements"):
        restore_(t[:50], "rademacher", 1, 1e-3, repair)
    restore_(t, get_distribution("rademacher"), 1, 1e-3, repair)
    assert _bit_equal(t, original)


@pytest.mark.parametrize("name", ["rademacher", "gaussian", "rademacher_xorshift"])
def test_add_direction_writes_what_perturb_writes(name):
    from bpfree.perturb import add_direction_, get_distribution, perturb_

    dist = get_distribution(name)
    base = torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 0.05
    a, b = base.clone(), base.clone()
    perturb_(a, dist, 77, -3e-3)
    add_direction_(b, dist, 77, -3e-3)
    assert torch.equal(a, b)
    assert not torch.equal(a, base)
