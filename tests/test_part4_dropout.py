"""Dropout beyond the generic check: the NumPy Philox against published known answers and against tl.randint /
tl.rand / tl.rand4x bit for bit, every Triton version against that exact reference, reproducibility (same seed,
other launches, other block sizes) and its opposite (other seeds), the statistics of the stream (uniformity,
kept fraction, independence of neighbours and of neighbouring seeds), the gradient of SeededDropout and
MaskedDropout, the edges p = 0 and p = 1, clear refusal of bad input, and the check that replaces the reference
comparison failing on outputs that are not dropout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from helpers import assert_refuses

import snippets._checks as checks
from conftest import HAS_GPU, poison_allocator
from snippets.common import dropout as cd
from snippets.part4 import dropout as d

VERSIONS = {"v1": d.dropout_masked, "v2": d.seeded_dropout, "v3": d.seeded_dropout4x}
PER_CALL = {"v1": 1, "v2": 1, "v3": 4}  # which stream each version draws (see keep_ref)
CPU_DTYPES = [torch.float32, torch.float16]  # bf16 only on the GPU: the interpreter rounds fp32 -> bf16 toward 0
SIZES = [1, 3, 17, 123, 2048, 2049, 6147]    # around one block (2048) and one Philox call (4 elements)
SEEDS = [0, 1, 123, 2**31 - 1, 2**32 + 7, 2**62 + 3]  # int32 and int64 arguments, a key with a high word


def _x(n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g) + 0.5) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    return x.to(device=device, dtype=dtype)


def _expected(x, p, seed, per_call=1):
    """The exact output: keep bits from the NumPy Philox, x * scale rounded as the kernel does (fp32 multiply,
    then one rounding to x's dtype)."""
    keep = torch.from_numpy(d.keep_ref(seed, p, x.numel(), per_call)).to(x.device).view(x.shape)
    scale = np.float32(0.0 if p == 1 else 1.0 / (1.0 - p))
    return torch.where(keep, (x.float() * float(scale)).to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device))


@triton.jit
def _randint_kernel(offs_ptr, r_ptr, u_ptr, w_ptr, seed, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs = tl.load(offs_ptr + i, mask=i < n)
    tl.store(r_ptr + i, tl.randint(seed, offs).to(tl.int32, bitcast=True), mask=i < n)
    tl.store(u_ptr + i, tl.rand(seed, offs), mask=i < n)
    r0, r1, r2, r3 = tl.randint4x(seed, offs)
    tl.store(w_ptr + 4 * i + 0, r0.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(w_ptr + 4 * i + 1, r1.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(w_ptr + 4 * i + 2, r2.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(w_ptr + 4 * i + 3, r3.to(tl.int32, bitcast=True), mask=i < n)


def _triton_random(seed, offsets: np.ndarray, device):
    """tl.randint, tl.rand and the four words of tl.randint4x at int64 ``offsets``, as NumPy arrays."""
    n = len(offsets)
    offs = torch.from_numpy(offsets.astype(np.int64)).to(device)
    r = torch.empty(n, dtype=torch.int32, device=device)
    u = torch.empty(n, dtype=torch.float32, device=device)
    w = torch.empty(4 * n, dtype=torch.int32, device=device)
    _randint_kernel[(triton.cdiv(n, 4096),)](offs, r, u, w, seed, n, BLOCK=4096)
    return r.cpu().numpy().view(np.uint32), u.cpu().numpy(), w.cpu().numpy().view(np.uint32).reshape(n, 4)


# ---------------------------------------------------------------- the NumPy Philox

@pytest.mark.op("dropout")
@pytest.mark.parametrize("counter, key, want", [
    # Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors): zeros, all ones, pi's digits.
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, want):
    got = cd.philox4x32(*counter, *key)
    assert tuple(int(w) for w in got) == want


@pytest.mark.op("dropout")
def test_philox_rounds_matter():
    """Fewer rounds give other numbers: the round count is part of the stream (and of the known answers)."""
    ten, seven = cd.philox4x32(0, 0, 0, 0, 0, 0), cd.philox4x32(0, 0, 0, 0, 0, 0, n_rounds=7)
    assert tuple(map(int, ten)) != tuple(map(int, seven))


@pytest.mark.op("dropout")
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_philox_matches_triton_bit_for_bit(seed, device):
    # small offsets, offsets past 2^31 and 2^32 (the counter's high word), and the largest int64 offsets
    offsets = np.concatenate([np.arange(1000), 2**31 - 3 + np.arange(6), 2**32 + np.arange(5), [2**40 + 12345],
                              2**63 - 1 - np.arange(3)]).astype(np.int64)
    r, u, w = _triton_random(seed, offsets, device)
    np.testing.assert_array_equal(r, cd.randint_ref(seed, offsets))
    np.testing.assert_array_equal(u, cd.rand_ref(seed, offsets))
    np.testing.assert_array_equal(w, np.stack(cd.randint4x_ref(seed, offsets), axis=1))


@pytest.mark.op("dropout")
def test_uniform_conversion_edges():
    u = cd.uint_to_uniform_ref(np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32))
    assert u.dtype == np.float32 and u[0] == 0 and u[-1] == 0  # 0 and ~(-1) both give 0
    assert u.max() < 1.0 and u[2] == u[3]                      # 2^31 - 1 and ~(-2^31) give the largest, below 1


# ---------------------------------------------------------------- every version is exact

@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_versions_match_exact_reference(version, dtype, n, device):
    x = _x(n, dtype, device, seed=n)
    poison_allocator(4 * n, device)
    y = VERSIONS[version](x, 0.3, 77)
    assert torch.equal(y, _expected(x, 0.3, 77, PER_CALL[version]))


@pytest.mark.op("dropout")
def test_reference_is_v2(device):
    x = _x(4097, torch.float32, device)
    ref = d.dropout_ref(x.double(), 0.25, 9)
    torch.testing.assert_close(d.seeded_dropout(x, 0.25, 9).double(), ref, rtol=1e-6, atol=0)


@pytest.mark.op("dropout")
def test_v1_mask_is_the_keep_bits(device):
    x = _x(5000, torch.float16, device)
    y, mask = d.dropout_with_mask(x, 0.4, 31)
    assert mask.dtype == torch.uint8 and mask.shape == x.shape
    np.testing.assert_array_equal(mask.cpu().bool().numpy(), d.keep_ref(31, 0.4, 5000))
    assert torch.equal(y, d.seeded_dropout(x, 0.4, 31))


@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_shape_is_kept_and_elements_are_flat_indices(version, device):
    x = _x(6 * 7 * 5, torch.float32, device).view(6, 7, 5)
    y = VERSIONS[version](x, 0.5, 3)
    assert y.shape == x.shape
    assert torch.equal(y.flatten(), VERSIONS[version](x.flatten(), 0.5, 3))


# ---------------------------------------------------------------- reproducibility

@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_same_seed_same_mask_whatever_the_data(version, device):
    fn = VERSIONS[version]
    x, ones = _x(3000, torch.float32, device, seed=1), torch.ones(3000, device=device)
    assert torch.equal(fn(x, 0.5, 42), fn(x, 0.5, 42))
    assert torch.equal(fn(x, 0.5, 42) != 0, fn(ones, 0.5, 42) != 0)  # the mask is a function of (seed, i) only


@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_other_seed_other_mask(version, device):
    fn = VERSIONS[version]
    ones = torch.ones(3000, device=device)
    masks = [(fn(ones, 0.5, s) != 0).cpu().numpy() for s in (42, 43, 2**40 + 42)]
    for a in range(3):
        for b in range(a + 1, 3):
            agree = (masks[a] == masks[b]).mean()
            assert 0.45 < agree < 0.55, f"masks of two seeds agree on {agree:.3f} of elements, not about half"


@pytest.mark.op("dropout")
@pytest.mark.parametrize("block", [128, 512, 4096])
def test_mask_does_not_depend_on_block_size(block, device):
    """The counter is the element index, not (program, lane): any BLOCK gives the same mask, so a backward
    launched with another block size (or an autotuned one) still regenerates the forward's bits."""
    x, n = _x(5000, torch.float32, device), 5000
    p, scale, seed = cd.check_dropout_args(x, 0.3, 5)
    y, y4 = torch.empty_like(x), torch.empty_like(x)
    cd.dropout_kernel[(triton.cdiv(n, block),)](x, y, y, n, p, scale, seed, BLOCK=block, STORE_MASK=False)
    d._dropout4x_kernel[(triton.cdiv(n, block),)](x, y4, n, p, scale, seed, BLOCK=block)
    assert torch.equal(y, d.seeded_dropout(x, 0.3, 5))
    assert torch.equal(y4, d.seeded_dropout4x(x, 0.3, 5))


# ---------------------------------------------------------------- statistics

@pytest.mark.op("dropout")
def test_tl_rand_is_uniform(device):
    _, u, _ = _triton_random(2024, np.arange(2**16), device)
    stat, limit = d.chi_square_uniform(u)
    assert stat < limit, f"chi-square {stat:.1f} over 63 degrees of freedom (limit {limit:.1f})"
    dist, dlimit = d.ks_uniform(u)
    assert dist < dlimit, f"KS distance {dist:.4f} (limit {dlimit:.4f})"
    assert 0.0 <= u.min() and u.max() < 1.0


@pytest.mark.op("dropout")
def test_stream_of_four_words_is_uniform():
    """Each of the four words of a Philox output is uniform on its own (v3 uses all four)."""
    words = cd.randint4x_ref(99, np.arange(2**14))
    for w in words:
        stat, limit = d.chi_square_uniform(cd.uint_to_uniform_ref(w))
        assert stat < limit


@pytest.mark.op("dropout")
def test_statistics_catch_bad_generators():
    n = 2**16
    ramp = (np.arange(n) * 0.6180339887) % 1.0  # uniform but each element decides the next
    assert d.chi_square_uniform(ramp)[0] < d.chi_square_uniform(ramp)[1]
    assert abs(d.lag_correlation(ramp >= 0.5)) > 0.1
    skewed = np.random.default_rng(0).random(n) ** 1.1
    assert d.chi_square_uniform(skewed)[0] > d.chi_square_uniform(skewed)[1]
    assert d.ks_uniform(skewed)[0] > d.ks_uniform(skewed)[1]
    assert d.lag_correlation(np.arange(n) % 2) == pytest.approx(-1.0)


@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_check(version, p, device):
    x = _x(2**15, torch.float32, device, seed=3)
    y = VERSIONS[version](x, p, 1234)
    d.check_dropout(y, (x, p, 1234), torch.float32, sigmas=5.0)


@pytest.mark.op("dropout")
@pytest.mark.parametrize("per_call", [1, 4])
@pytest.mark.parametrize("seed", [7, 2**33 + 1])
def test_neighbouring_keep_bits_are_independent(per_call, seed):
    """Adjacent elements (and, for v3, the four elements of one Philox output: lags 1 to 4) are uncorrelated to
    within 5 standard deviations (1/sqrt(n) each)."""
    n = 2**17
    keep = d.keep_ref(seed, 0.5, n, per_call)
    for lag in (1, 2, 3, 4, 2048):
        r = d.lag_correlation(keep, lag)
        assert abs(r) < 5 / math.sqrt(n), f"lag {lag}: correlation {r:.4f}"


@pytest.mark.op("dropout")
def test_neighbouring_seeds_are_independent():
    """seed and seed + 1 (one per layer, say) give uncorrelated masks."""
    n = 2**16
    a, b = d.keep_ref(1000, 0.5, n), d.keep_ref(1001, 0.5, n)
    r = np.corrcoef(a.astype(float), b.astype(float))[0, 1]
    assert abs(r) < 5 / math.sqrt(n)


# ---------------------------------------------------------------- the check used by the harness can fail

@pytest.mark.op("dropout")
def test_check_accepts_torch_dropout():
    x = _x(2**14, torch.float32, "cpu")
    d.check_dropout(torch.nn.functional.dropout(x, 0.1, training=True), (x, 0.1, 0), torch.float32)


@pytest.mark.op("dropout")
@pytest.mark.parametrize("label, make, words", [
    ("nothing dropped", lambda x, k: x / 0.5, "kept"),
    ("not scaled", lambda x, k: x * k, "neither 0 nor"),
    ("one element off", lambda x, k: torch.where(torch.arange(len(x)) == 5, x * 3, x * k / 0.5), "neither 0 nor"),
    ("NaN", lambda x, k: torch.full_like(x, float("nan")), "NaN"),
    ("wrong dtype", lambda x, k: (x * k / 0.5).half(), "output"),
    ("wrong shape", lambda x, k: (x * k / 0.5)[:-1], "output"),
])
def test_check_rejects_what_is_not_dropout(label, make, words):
    x = _x(4096, torch.float32, "cpu")
    keep = torch.from_numpy(d.keep_ref(0, 0.5, 4096)).float()
    with pytest.raises(AssertionError, match=words):
        d.check_dropout(make(x, keep), (x, 0.5, 0), torch.float32)


# ---------------------------------------------------------------- training: the gradient

@pytest.mark.op("dropout")
@pytest.mark.parametrize("fn", [d.SeededDropout.apply, d.MaskedDropout.apply], ids=["seeded", "masked"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_gradient_is_mask_times_upstream(fn, dtype, device):
    x = _x(3001, dtype, device).requires_grad_()
    w = _x(3001, dtype, device, seed=8)
    y = fn(x, 0.2, 55)
    (y * w).sum().backward()
    assert torch.equal(y.detach(), d.seeded_dropout(x.detach(), 0.2, 55))
    assert torch.equal(x.grad, _expected(w, 0.2, 55))


@pytest.mark.op("dropout")
def test_gradient_through_sum_of_a_view(device):
    """sum() sends back an expanded (stride-0) gradient; the backward makes it contiguous first."""
    x = _x(600, torch.float32, device).view(20, 30).requires_grad_()
    d.SeededDropout.apply(x, 0.5, 1).sum().backward()
    assert torch.equal(x.grad, _expected(torch.ones_like(x), 0.5, 1))


@pytest.mark.op("dropout")
@pytest.mark.filterwarnings("ignore:Input #0 requires gradient and is not a double")
def test_gradcheck(device):
    """Finite differences of a linear map are exact up to rounding, so fp32 gradcheck with loose tolerances is
    meaningful (the kernels take no float64)."""
    x = _x(40, torch.float32, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: d.SeededDropout.apply(t, 0.3, 11), (x,), eps=1e-2, atol=1e-3,
                                    rtol=1e-3, nondet_tol=0.0)


@pytest.mark.op("dropout")
def test_p_zero_and_p_one(device):
    x = _x(1000, torch.float16, device).requires_grad_()
    for fn in VERSIONS.values():
        assert torch.equal(fn(x.detach(), 0.0, 3), x.detach())
        y = fn(x.detach(), 1.0, 3)
        assert torch.equal(y, torch.zeros_like(y)) and not y.isnan().any()
    d.SeededDropout.apply(x, 1.0, 3).sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.op("dropout")
def test_dropped_inf_is_zero(device):
    x = torch.full((4096,), float("inf"), device=device)
    y = d.seeded_dropout(x, 0.5, 2)
    assert not y.isnan().any() and ((y == 0) | (y == float("inf"))).all() and (y == 0).any()


@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_empty_input(version, device):
    x = torch.empty(0, 5, device=device)
    assert VERSIONS[version](x, 0.5, 1).shape == (0, 5)


# ---------------------------------------------------------------- bad input

def _bad_inputs(device):
    x = torch.randn(16, device=device)
    return [
        ("p negative", (x, -0.1, 1), ValueError, r"p must be in \[0, 1\]"),
        ("p above 1", (x, 1.5, 1), ValueError, r"p must be in \[0, 1\]"),
        ("p nan", (x, float("nan"), 1), ValueError, r"p must be in \[0, 1\]"),
        ("p a string", (x, "0.1", 1), TypeError, "p must be a Python int or float"),
        ("p a tensor", (x, torch.tensor(0.1), 1), TypeError, "p must be a Python int or float"),
        ("seed negative", (x, 0.1, -1), ValueError, "seed must be >= 0"),
        ("seed too large", (x, 0.1, 2**63), ValueError, "seed must be below 2"),
        ("seed a float", (x, 0.1, 1.5), TypeError, "seed must be a Python int"),
        ("seed a bool", (x, 0.1, True), TypeError, "seed must be a Python int"),
        ("float64", (x.double(), 0.1, 1), TypeError, "dtype"),
        ("int32", (x.int(), 0.1, 1), TypeError, "dtype"),
        ("strided view", (x[::2], 0.1, 1), ValueError, "contiguous"),
        ("transposed", (x.view(4, 4).t(), 0.1, 1), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(), 0.1, 1), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))), ids=[c[0] for c in _bad_inputs("cpu")])
def test_refuses_bad_input(version, case, device):
    assert_refuses(VERSIONS[version], _bad_inputs(device)[case])


@pytest.mark.op("dropout")
def test_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    for fn in VERSIONS.values():
        with pytest.raises(ValueError, match="cuda device"):
            fn(torch.randn(8), 0.1, 1)


@pytest.mark.op("dropout")
def test_mask_backward_refuses_bad_mask(device):
    dy = torch.randn(16, device=device)
    with pytest.raises(TypeError, match="uint8"):
        d.dropout_mask_backward(dy, torch.ones(16, dtype=torch.bool, device=device), 0.5)
    with pytest.raises(ValueError, match="shape"):
        d.dropout_mask_backward(dy, torch.ones(8, dtype=torch.uint8, device=device), 0.5)


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.op("dropout")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_bf16_exact_on_gpu(version):
    x = _x(100_003, torch.bfloat16, "cuda")
    assert torch.equal(VERSIONS[version](x, 0.3, 5), _expected(x, 0.3, 5, PER_CALL[version]))


@pytest.mark.gpu
@pytest.mark.op("dropout")
def test_torch_dropout_passes_the_check_on_gpu():
    x = _x(2**20, torch.bfloat16, "cuda")
    d.check_dropout(d.dropout_torch(x, 0.1, 0), (x, 0.1, 0), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.op("dropout")
def test_seeded_dropout_keeps_no_mask_on_gpu():
    """Forward and backward through SeededDropout peak at least n bytes (one mask) below MaskedDropout."""
    n = 2**24
    peaks = {}
    for name, fn in (("seeded", d.SeededDropout.apply), ("masked", d.MaskedDropout.apply)):
        x = torch.randn(n, device="cuda", requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(x, 0.1, 1).sum().backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        del x
    assert peaks["masked"] - peaks["seeded"] >= n, peaks


@pytest.mark.skipif(HAS_GPU, reason="the interpreter's bf16 rounding, checked on the CPU only")
@pytest.mark.op("dropout")
def test_bf16_in_the_interpreter_passes_the_check():
    x = _x(5000, torch.bfloat16, "cpu")
    for fn in VERSIONS.values():
        d.check_dropout(fn(x, 0.3, 5), (x, 0.3, 5), torch.bfloat16)
