"""tf32_gemm v3 and wmma_gemm v5 on the CPU: what the compiler makes of them for sm_90 (no GPU
needed), and their results under the interpreter.

The compile-time facts the tensor-core chapter states (docs/part3/tensor-cores.md, "TF32 v3: the
order of B in memory"), each a count read from the PTX or the TTGIR:

- v2 (matmul_kernel on fp32, B row-major, so N-major) copies A with 16-byte cp.async and B with
  4-byte ones: Hopper's TF32 wgmma reads B from shared memory K-major only, so the compiler
  transposes B element by element on its way into shared memory;
- v3 (matmul_kmajor_kernel, B given as B^T) copies both with 16-byte cp.async into the same
  shared layouts, and its dot is a TF32 wgmma;
- fp16 needs no transpose (wgmma transposes 16-bit B itself): B stays N-major in shared memory;
- every config of v3 and v5 fits the 227 KiB of shared memory of an H100/H200 SM, without spills.

The static count of cp.async in the PTX is num_stages times the copies of one stage: the software
pipeline issues num_stages - 1 stages before the loop and one in it. These counts were checked
with Triton 3.9 (CPU) and 3.6 (the GPU runner's); other versions may pipeline or vectorise
differently, so the compiler-output tests skip there, saying so.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
import triton
from helpers import read_on_triton

from conftest import poison_allocator
from snippets.common import introspect as ins
from snippets.common.gemm import INTERPRET, SMEM_LIMIT_SM90, matmul_kernel, tolerance_for
from snippets.part3 import sgemm
from snippets.part3 import wmma as w

compiler_facts = read_on_triton({(3, 6), (3, 9)},
                                "compile-time counts: another pipeliner or vectoriser may count "
                                "differently")

THREADS = 256  # 8 warps: every config here


def _sig(dtype: str, kmajor: bool) -> dict[str, str]:
    b, stride = ("bt_ptr", "stride_bn") if kmajor else ("b_ptr", "stride_bk")
    return {"a_ptr": f"*{dtype}", b: f"*{dtype}", "c_ptr": f"*{dtype}", "M": "i32", "N": "i32",
            "K": "i32", "stride_am": "i32", stride: "i32", "stride_cm": "i32"}


def _job(kernel, dtype: str, kmajor: bool, cfg: dict):
    blocks = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    sig = _sig(dtype, kmajor)
    # divisible: every pointer and integer a multiple of 16, as at 4096^3 on whole tensors
    return (kernel, sig, dict(blocks, INPUT_PRECISION="tf32"),
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], divisible=tuple(sig)))


def _kmajor_cfg(c: triton.Config) -> dict:
    return dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)


KMAJOR = {f"v3_{c['BLOCK_M']}x{c['BLOCK_N']}_s{c['num_stages']}": c
          for c in map(_kmajor_cfg, w.KMAJOR_CONFIGS)}
JOBS = {
    "tf32_v2": _job(matmul_kernel, "fp32", False, w.TRITON_CONFIGS[4]),
    # v3's kernel at v2's config: the same tile, only B's order differs
    "tf32_v3_at_v2_config": _job(w.matmul_kmajor_kernel, "fp32", True, w.TRITON_CONFIGS[4]),
    **{name: _job(w.matmul_kmajor_kernel, "fp32", True, c) for name, c in KMAJOR.items()},
    "fp16_v4": _job(matmul_kernel, "fp16", False, w.TRITON_CONFIGS[2]),
    "fp16_v5": _job(matmul_kernel, "fp16", False, w.WIDE_CONFIG),
}
CONFIG_OF = {"tf32_v2": w.TRITON_CONFIGS[4], "tf32_v3_at_v2_config": w.TRITON_CONFIGS[4], **KMAJOR,
             "fp16_v4": w.TRITON_CONFIGS[2], "fp16_v5": w.WIDE_CONFIG}
ITEMSIZE = {name: 2 if name.startswith("fp16") else 4 for name in JOBS}


@pytest.fixture(scope="module")
def built() -> dict[str, ins.Compiled]:
    return dict(zip(JOBS, ins.compile_many(JOBS.values())))


# cp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2;  (the size is the third operand)
_COPY = re.compile(r"cp\.async\.(?:ca|cg)\.shared\.global(?:\.\w+)*"
                   r"\s*\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")


def copy_sizes(ptx: str) -> Counter:
    """{bytes: how many cp.async instructions copy that many bytes from global to shared memory}."""
    return Counter(int(s, 0) for s in _COPY.findall(ptx))


def per_stage(rows: int, cols: int, itemsize: int, width: int) -> int:
    """cp.async instructions per thread for one rows x cols tile copied in ``width``-byte pieces."""
    return rows * cols * itemsize // (THREADS * width)


# ---------------------------------------------------------------- compile-time facts (sm_90)

@compiler_facts
@pytest.mark.op("tf32_gemm")
def test_v2_copies_b_four_bytes_at_a_time(built):
    k, cfg = built["tf32_v2"], CONFIG_OF["tf32_v2"]
    bm, bn, bk, s = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"]
    sizes = copy_sizes(k.ptx)
    assert sizes == {16: s * per_stage(bm, bk, 4, 16), 4: s * per_stage(bk, bn, 4, 4)}, sizes
    # 128 x 32 floats of A: 4 copies of 16 bytes per thread and stage; 32 x 128 of B: 16 copies of 4
    assert (per_stage(bm, bk, 4, 16), per_stage(bk, bn, 4, 4)) == (4, 16)
    assert any(op.startswith("wgmma.mma_async") and op.endswith(".f32.tf32.tf32")
               for op in ins.tensor_core_ops(k.ptx)), ins.tensor_core_ops(k.ptx)


@compiler_facts
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("name", ["tf32_v3_at_v2_config", *KMAJOR])
def test_v3_copies_everything_sixteen_bytes_at_a_time(built, name):
    k, cfg = built[name], CONFIG_OF[name]
    bm, bn, bk, s = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"]
    sizes = copy_sizes(k.ptx)
    assert sizes == {16: s * (per_stage(bm, bk, 4, 16) + per_stage(bn, bk, 4, 16))}, sizes
    mma = ins.tensor_core_ops(k.ptx)
    n_per_wgmma = min(bn, 256)
    assert set(mma) == {f"wgmma.mma_async.sync.aligned.m64n{n_per_wgmma}k8.f32.tf32.tf32"}, mma


@compiler_facts
@pytest.mark.op("tf32_gemm")
def test_v2_and_v3_put_b_in_the_same_k_major_shared_layout(built):
    """The difference is in global memory, not in shared memory: both store B K-major (transposed =
    true) with the 128-byte swizzle; fp16 keeps B N-major (wgmma transposes 16-bit operands)."""
    def b_layout(name):
        ttgir = built[name].ttgir
        cfg = CONFIG_OF[name]
        shape = f"{cfg['num_stages']}x{cfg['BLOCK_K']}x{cfg['BLOCK_N']}"
        alias = re.search(rf"ttg\.local_alloc[^\n]*!ttg\.memdesc<{shape}x\w+, (#\w+)", ttgir)
        assert alias, ins.excerpt(ttgir, "local_alloc")
        return ins.layouts(ttgir)[alias.group(1)]

    for name in ("tf32_v2", "tf32_v3_at_v2_config"):
        layout = b_layout(name)
        assert "nvmma_shared" in layout and "transposed = true" in layout, layout
        assert "swizzlingByteWidth = 128" in layout and "elementBitWidth = 32" in layout, layout
    assert b_layout("tf32_v2") == b_layout("tf32_v3_at_v2_config")
    fp16 = b_layout("fp16_v4")
    assert "transposed = false" in fp16 and "elementBitWidth = 16" in fp16, fp16


@compiler_facts
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("name, n", [("fp16_v4", 128), ("fp16_v5", 256)])
def test_fp16_copies_everything_sixteen_bytes_at_a_time(built, name, n):
    k, cfg = built[name], CONFIG_OF[name]
    bm, bn, bk, s = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"]
    assert copy_sizes(k.ptx) == {16: s * (per_stage(bm, bk, 2, 16) + per_stage(bk, bn, 2, 16))}
    mma = ins.tensor_core_ops(k.ptx)
    assert set(mma) == {f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16"}, mma


@compiler_facts
@pytest.mark.op("wmma_gemm")
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("name", list(JOBS))
def test_every_config_fits_an_sm_without_spilling(built, name):
    """Shared memory is num_stages tiles of A and B and nothing else; within the 227 KiB of sm_90;
    no spills."""
    k, cfg = built[name], CONFIG_OF[name]
    tiles = cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * ITEMSIZE[name]
    assert k.shared == tiles <= SMEM_LIMIT_SM90
    assert k.num_warps * 32 == THREADS
    assert k.spill_stores == 0 and k.spill_loads == 0, k.ptxas_report
    assert 0 < k.registers <= 255


# ---------------------------------------------------------------- results: interpreter or GPU

SHAPES = [(1, 1, 1), (1, 7, 33), (17, 33, 9), (64, 64, 64), (33, 47, 80), (5, 64, 130),
          (70, 45, 100)]


def _operands(m, n, k, device, dtype):
    g = torch.Generator().manual_seed(m * 1_000_003 + n * 1009 + k)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=dtype)
    return a, b


def _check(c, a, b, label):
    m, k = a.shape
    assert c.shape == (m, b.shape[1]) and c.dtype == a.dtype and c.is_contiguous(), label
    assert not c.isnan().any(), f"{label}: unwritten (NaN) outputs"
    rtol, atol = tolerance_for(k, a.dtype)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_v3_any_shape(device, m, n, k):
    """Under the interpreter the 32 x 32 x 32 tiles of INTERPRET: several tiles, groups and K steps
    at these sizes, ragged on every side."""
    a, b = _operands(m, n, k, device, torch.float32)
    poison_allocator(m * n * 4, device)
    _check(w.tf32_kmajor(a, b), a, b, f"tf32 v3 {m}x{n}x{k}")


@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("cfg", [*KMAJOR.values(), INTERPRET], ids=[*KMAJOR, "interpret"])
def test_v3_each_config(device, cfg):
    """Each autotuned config on its own (the interpreter runs the GPU tiles too): 300 x 260 x 100
    cuts every tile shape on every side and takes several 32-deep K steps, one of them partial."""
    m, n, k = 300, 260, 100
    a, b = _operands(m, n, k, device, torch.float32)
    poison_allocator(m * n * 4, device)
    _check(w.tf32_kmajor(a, b, config=cfg), a, b, f"tf32 v3 {cfg}")


@pytest.mark.op("tf32_gemm")
def test_v3_reads_b_not_its_transpose(device):
    """A square B that is not symmetric: a kernel that read B^T as if it were B (or took the wrong
    stride) would give A @ B^T, far outside the tolerance."""
    a, b = _operands(40, 40, 40, device, torch.float32)
    assert not torch.allclose(a @ b, a @ b.t(), atol=1.0)
    _check(w.tf32_kmajor(a, b), a, b, "tf32 v3 square")


@pytest.mark.op("tf32_gemm")
def test_v3_leaves_its_inputs_alone(device):
    a, b = _operands(33, 47, 80, device, torch.float32)
    a0, b0 = a.clone(), b.clone()
    w.tf32_kmajor(a, b)
    assert torch.equal(a, a0) and torch.equal(b, b0) and b.stride() == (47, 1)


@pytest.mark.op("tf32_gemm")
def test_v3_refuses_what_v2_refuses(device):
    a, b = _operands(8, 8, 8, device, torch.float32)
    for bad, exc, words in (((a.half(), b.half()), TypeError, "float32"),
                            ((a, b[:4]), ValueError, "inner dimensions differ"),
                            ((a, b.t()), ValueError, "contiguous"),
                            ((a[None], b), ValueError, "2-D")):
        for fn in (w.tf32_triton, w.tf32_kmajor):
            with pytest.raises(exc, match=words):
                fn(*bad)
    with pytest.raises(RuntimeError, match="grad"):
        w.tf32_kmajor(a.requires_grad_(), b)


@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_v5_any_shape(device, m, n, k):
    """v5 runs its 128 x 256 x 64 blocks everywhere, the interpreter included: ragged on
    every side."""
    a, b = _operands(m, n, k, device, torch.float16)
    poison_allocator(m * n * 2, device)
    _check(w.wmma_triton_wide(a, b), a, b, f"v5 fp16 {m}x{n}x{k}")


@pytest.mark.op("wmma_gemm")
def test_v5_several_tiles_and_k_steps(device):
    """Two block rows and two block columns of 128 x 256, three 64-deep K steps (the
    last partial)."""
    m, n, k = 200, 300, 150
    a, b = _operands(m, n, k, device, torch.float16)
    poison_allocator(m * n * 2, device)
    _check(w.wmma_triton_wide(a, b), a, b, "v5 fp16 200x300x150")


@pytest.mark.op("wmma_gemm")
def test_v5_is_v4_with_another_tile():
    """The same kernel and launcher; only the blocks differ (BLOCK_N doubled); BLOCK_K, the group,
    the warps and the stages are v4's."""
    v4 = w.TRITON_CONFIGS[2]
    assert {k: v for k, v in w.WIDE_CONFIG.items() if k != "BLOCK_N"} == \
        {k: v for k, v in v4.items() if k != "BLOCK_N"}
    assert w.WIDE_CONFIG["BLOCK_N"] == 2 * v4["BLOCK_N"]
    assert w.wmma_gemm.impls["v5"].sources == w.wmma_gemm.impls["v4"].sources
    assert w.wmma_gemm.impls["v5"].dtypes == w.wmma_gemm.impls["v4"].dtypes


# ---------------------------------------------------------------- GPU: real sizes, both dtypes

@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1024, 1024, 1024), (300, 12, 1028),
                                     (129, 260, 68), (2048, 4096, 520)])
def test_gpu_v3_real_sizes(m, n, k):
    a, b = _operands(m, n, k, "cuda", torch.float32)
    poison_allocator(m * n * 4, "cuda")
    _check(w.tf32_kmajor(a, b), a, b, f"tf32 v3 {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
def test_gpu_v3_is_tf32():
    """The wgmma rounds its inputs to TF32: the IEEE fp32 tolerance (SGEMM's) must fail, the TF32
    one hold, as for v2 (the same accuracy, not the same bits: the tiles and sums may differ)."""
    m = n = k = 1024
    a, b = _operands(m, n, k, "cuda", torch.float32)
    c = w.tf32_kmajor(a, b)
    exact = a.double() @ b.double()
    rtol32, atol32 = sgemm.tolerance_for_k(k)
    assert not torch.allclose(c.double(), exact, rtol=rtol32, atol=atol32), "v3 did not use TF32"
    _check(c, a, b, "tf32 v3 1024^3")
    _check(w.tf32_triton(a, b), a, b, "tf32 v2 1024^3")


@pytest.mark.gpu
@pytest.mark.op("tf32_gemm")
@pytest.mark.parametrize("cfg", list(KMAJOR.values()), ids=list(KMAJOR))
def test_gpu_v3_each_config(cfg):
    m, n, k = 1000, 1100, 520
    a, b = _operands(m, n, k, "cuda", torch.float32)
    poison_allocator(m * n * 4, "cuda")
    _check(w.tf32_kmajor(a, b, config=cfg), a, b, f"tf32 v3 {cfg}")


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1024, 1024, 1024), (129, 264, 72),
                                     (300, 8, 520), (2048, 4096, 1000)])
def test_gpu_v5_real_sizes(dtype, m, n, k):
    a, b = _operands(m, n, k, "cuda", dtype)
    poison_allocator(m * n * 2, "cuda")
    _check(w.wmma_triton_wide(a, b), a, b, f"v5 {dtype} {m}x{n}x{k}")


@pytest.mark.op("wmma_gemm")
def test_v5_refuses_what_v4_refuses(device):
    a, b = _operands(8, 8, 8, device, torch.float16)
    for bad, exc, words in (((a.float(), b.float()), TypeError, "dtype"),
                            ((a, b[:4]), ValueError, "inner dimensions differ"),
                            ((a, b.t()), ValueError, "contiguous"),
                            ((a, b[None]), ValueError, "2-D")):
        for fn in (w.wmma_triton, w.wmma_triton_wide):
            with pytest.raises(exc, match=words):
                fn(*bad)
    with pytest.raises(RuntimeError, match="grad"):
        w.wmma_triton_wide(a, b.requires_grad_())
