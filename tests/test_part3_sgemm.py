"""SGEMM beyond the generic reference check: every version on ragged shapes against float64 with a tolerance
scaled to K, the float4 paths and their scalar fallbacks, IEEE fp32 (not TF32) in v0, and clear refusal of
what the kernels cannot take."""

from __future__ import annotations

import pytest
import torch

from conftest import poison_allocator
from snippets.part3 import sgemm as sg

VERSIONS = {
    "v0": sg.sgemm_cublas, "v1": sg.sgemm_naive, "v2": sg.sgemm_coalesced, "v3": sg.sgemm_smem,
    "v4": sg.sgemm_1d_tiling, "v5": sg.sgemm_2d_tiling, "v6": sg.sgemm_vectorized, "v7": sg.sgemm_warptile,
    "v8": sg.sgemm_double_buffer, "v11": sg.sgemm_tuned, "v12": sg.sgemm_autotuned,
}
# (M, N, K): the brief's edge cases; then shapes that cut the 128 x 128 x 8 tiles in every direction, row
# lengths that are multiples of 4 (float4 paths with partial tiles) and ones that are not (scalar fallback),
# K shorter than one BK step, and several whole tiles.
SHAPES = [(1, 1, 1), (17, 33, 9), (64, 64, 64), (127, 129, 65), (256, 192, 320),
          (1, 300, 7), (300, 1, 5), (5, 7, 300), (129, 131, 3), (132, 136, 12), (260, 4, 20), (4, 260, 8),
          (33, 64, 17), (256, 256, 256), (384, 130, 136)]


def _check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, label: str) -> None:
    m, k = a.shape
    n = b.shape[1]
    assert c.shape == (m, n) and c.dtype == torch.float32 and c.device == a.device and c.is_contiguous()
    ref = a.double() @ b.double()
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = sg.tolerance_for_k(k)
    torch.testing.assert_close(c.double(), ref, rtol=rtol, atol=atol, msg=lambda s: f"{label}: {s}")


def _operands(m, n, k, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(m, k, generator=g, device=device), torch.randn(k, n, generator=g, device=device))


# ---------------------------------------------------------------- CPU: the reference and the checks

@pytest.mark.op("sgemm")
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 33, 9), (5, 3, 40)])
def test_reference_is_a_sum_of_outer_products(m, n, k):
    a, b = _operands(m, n, k, "cpu")
    expected = a.double() @ b.double()
    torch.testing.assert_close(sg.sgemm_ref(a.double(), b.double()), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sg._reference(a.double(), b.double()), expected, rtol=1e-12, atol=1e-12)


def _bad_operands(device):
    a, b = _operands(6, 5, 4, device)
    return [
        ("float64 a", (a.double(), b), TypeError, "dtype"),
        ("float16 b", (a, b.half()), TypeError, "dtype"),
        ("int32", (a.int(), b.int()), TypeError, "dtype"),
        ("inner dims differ", (a, torch.randn(5, 5, device=device)), ValueError, "inner dimensions"),
        ("1-D a", (a.reshape(-1), b), ValueError, "2-D"),
        ("3-D b", (a, b.reshape(2, 2, 5)), ValueError, "2-D"),
        ("transposed a", (torch.randn(4, 6, device=device).t(), b), ValueError, "contiguous"),
        ("column slice b", (a, torch.randn(4, 10, device=device)[:, :5]), ValueError, "contiguous"),
        ("empty a", (a[:0], b), ValueError, "empty"),
        ("empty k", (torch.randn(6, 0, device=device), torch.randn(0, 5, device=device)), ValueError, "empty"),
        ("not a tensor", (a.tolist(), b), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("case", range(len(_bad_operands("cpu"))))
def test_check_operands_refuses(case):
    """The shared check, run on CPU tensors with device="cpu": what every version refuses before launching."""
    label, args, exc, words = _bad_operands("cpu")[case]
    with pytest.raises(exc, match=words):
        sg.check_operands(*args, device="cpu")


@pytest.mark.op("sgemm")
def test_check_operands_returns_sizes():
    a, b = _operands(6, 5, 4, "cpu")
    assert sg.check_operands(a, b, device="cpu") == (6, 5, 4)


@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_cpu_tensors_refused(version):
    """CPU tensors are refused with a ValueError naming the device, before any GPU is needed."""
    a, b = _operands(8, 8, 8, "cpu")
    with pytest.raises(ValueError, match="cuda device"):
        VERSIONS[version](a, b)


@pytest.mark.op("sgemm")
def test_configs_match_the_ladder():
    assert set(sg.CONFIGS) == set(VERSIONS) - {"v0", "v12"}  # v12 picks one of TUNED_CONFIGS per shape
    assert set(sg.sgemm.impls) == set(VERSIONS) | {"v9", "v10"}  # v9, v10: the CPU comparison
    per_thread = {name: cfg.results_per_thread for name, cfg in sg.CONFIGS.items()}
    assert per_thread == {"v1": 1, "v2": 1, "v3": 1, "v4": 8, "v5": 64, "v6": 64, "v7": 64, "v8": 64, "v11": 128}


@pytest.mark.op("sgemm")
def test_tuned_configs_are_the_instantiated_kernels():
    """v11_tuned.cu instantiates one kernel per entry of TUNED, the list sgemm.py passes to the compiler
    (-D SGEMM_TUNED_CONFIGS), and TUNED_CONFIGS sizes their grids: the option must carry every entry, in
    order, and each kernel name must spell out its launch numbers. (tests/test_cuda_compile.py compiles the
    file with the option and compares the kernels it gets with these names.)"""
    import re

    (option,) = sg.CU_OPTIONS[sg.TUNED_CONFIGS[0].path]
    params = [tuple(int(v) for v in m.split(",")) for m in re.findall(r"SGEMM_TUNED\(([^)]*)\)", option)]
    assert params == list(sg.TUNED) and len(params) == len(sg.TUNED_CONFIGS) >= 2
    for (bm, bn, bk, wm, wn, nt, g, pad), cfg in zip(params, sg.TUNED_CONFIGS):
        assert cfg.kernel == f"sgemm_t_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{nt}_g{g}_p{pad}"
        assert cfg.tile == (bm, bn) and cfg.bk == bk and cfg.threads == (nt,)
        # a lane owns (wm / 32) x (wn / 16) pieces of 4 x 4 results; one warp per warp tile
        assert wm % 32 == 0 and wn % 16 == 0 and (bm // wm) * (bn // wn) * 32 == nt
    assert sg.CONFIGS["v11"] == sg.TUNED_CONFIGS[0]
    assert len({c.kernel for c in sg.TUNED_CONFIGS}) == len(sg.TUNED_CONFIGS)


@pytest.mark.op("sgemm")
def test_slow_steps_skip_only_the_largest_size():
    """The naive steps and CPU versions are timed up to 4096^3 (always at the headline), the rest everywhere."""
    big = {"m": 8192, "n": 8192, "k": 8192}
    assert big in sg.SWEEP
    skipped = {name for name, impl in sg.sgemm.impls.items() if not impl.benched_at(big, sg.HEADLINE)}
    assert skipped == {"v1", "v2", "v3", "v9", "v10"}
    assert all(impl.benched_at(sg.HEADLINE, sg.HEADLINE) for impl in sg.sgemm.impls.values())


@pytest.mark.op("sgemm")
def test_tolerance_scales_with_k():
    assert sg.tolerance_for_k(4096)[1] > sg.tolerance_for_k(64)[1] > sg.tolerance_for_k(1)[1] > 0
    assert sg.sgemm.tolerance(torch.float32) == sg.tolerance_for_k(8192)


# ---------------------------------------------------------------- GPU: every version

@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_versions_match_float64(version, m, n, k):
    a, b = _operands(m, n, k, "cuda", seed=m * 1_000_003 + n * 1009 + k)
    poison_allocator(m * n * 4, "cuda")
    _check(VERSIONS[version](a, b), a, b, f"{version} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", ["v6", "v7", "v8", "v11", "v12"])
def test_vector_paths_misaligned_views(version):
    """Operands whose base is not 16-byte aligned (a view one float into a buffer) take the scalar path of the
    float4 kernels even when the row lengths are multiples of 4."""
    m, n, k = 130, 132, 24
    buf_a = torch.randn(m * k + 1, device="cuda")
    buf_b = torch.randn(k * n + 1, device="cuda")
    a, b = buf_a[1:].view(m, k), buf_b[1:].view(k, n)
    assert a.data_ptr() % 16 != 0 and a.is_contiguous()
    _check(VERSIONS[version](a, b), a, b, f"{version} misaligned")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_special_values(version):
    """Zeros give exact zeros; an infinity in A spreads along its row of C only; identity gives B back."""
    a, b = _operands(70, 90, 33, "cuda")
    assert torch.count_nonzero(VERSIONS[version](torch.zeros_like(a), b)) == 0
    eye = torch.eye(33, device="cuda")
    assert torch.equal(VERSIONS[version](eye, b[:33].contiguous()), b[:33])
    a_inf = a.abs().clone()
    a_inf[5, 3] = float("inf")
    c = VERSIONS[version](a_inf, b.abs().contiguous())
    assert torch.isinf(c[5]).all() and torch.isfinite(torch.cat([c[:5], c[6:]])).all()


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("cfg", sg.TUNED_CONFIGS, ids=lambda c: c.kernel)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (127, 129, 65), (257, 255, 33), (300, 1, 5), (384, 130, 136)])
def test_every_tuned_config(cfg, m, n, k):
    """Each configuration v12 may pick is itself correct at ragged shapes (autotuning only picks the fastest)."""
    a, b = _operands(m, n, k, "cuda", seed=m + n + k)
    poison_allocator(m * n * 4, "cuda")
    _check(sg._launch_sgemm(a, b, cfg), a, b, f"{cfg.kernel} {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_autotune_picks_once_per_shape():
    a, b = _operands(256, 384, 64, "cuda")
    sg._TUNED.clear()
    first = sg.autotune(a, b)
    assert first in sg.TUNED_CONFIGS and list(sg._TUNED.values()) == [first]
    assert sg.autotune(a, b) is first  # remembered, not re-timed
    sg.autotune(a[:, :32].contiguous(), b[:32].contiguous())
    assert len(sg._TUNED) == 2  # a new shape is tuned on its own


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_v0_is_ieee_fp32_and_restores_the_flag():
    """With TF32 on, cuBLAS would round the inputs to 10-bit mantissas: an error ~100 times the fp32 one at
    K = 320, far outside tolerance_for_k. v0 must turn it off and put the caller's setting back."""
    a, b = _operands(256, 192, 320, "cuda")
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for setting in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = setting
            _check(sg.sgemm_cublas(a, b), a, b, f"v0 with allow_tf32={setting}")
            assert torch.backends.cuda.matmul.allow_tf32 is setting
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.op("sgemm")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("case", range(len(_bad_operands("cpu"))))
def test_gpu_bad_input_refused(version, case):
    label, args, exc, words = _bad_operands("cuda")[case]
    with pytest.raises(exc, match=words):
        VERSIONS[version](*args)


@pytest.mark.gpu
@pytest.mark.op("sgemm")
def test_grid_limit_refused():
    """v5's grid puts tiles of 128 rows on gridDim.y: more than 65535 of them is refused, not launched."""
    a = torch.empty((128 * 65535 + 1, 1), device="cuda")
    b = torch.empty((1, 1), device="cuda")
    with pytest.raises(ValueError, match="gridDim.y"):
        sg.sgemm_2d_tiling(a, b)

