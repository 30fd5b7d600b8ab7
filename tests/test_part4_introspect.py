"""Compiling the book's Triton kernels for sm_90 without a GPU, and what the compiler made of them: 128-bit
loads where alignment is known, tensor-core and async-copy instructions and a pipeline that grows shared memory
with num_stages in the GEMM, threads per program from num_warps, the JIT's specialisation rules, and the
ptxas report parser. One helper process compiles every variant (see snippets/common/introspect.py)."""

from __future__ import annotations

import re

import pytest
import torch
from test_cuda_compile import SPILLING_SAMPLE

from snippets.common import introspect as ins
from snippets.common.gemm import matmul_kernel
from snippets.part1.elementwise import _add_kernel
from snippets.part3.reduce import _sum_kernel

ADD_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
ALL_ADD = ("x_ptr", "y_ptr", "out_ptr", "n")
GEMM_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
            "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
GEMM_TILE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, INPUT_PRECISION="tf32")
STAGES = (2, 3, 4)

JOBS = {
    "add_aligned": (_add_kernel, ADD_SIG, {"BLOCK": 4096}, dict(num_warps=8, divisible=ALL_ADD)),
    "add_n_odd": (_add_kernel, ADD_SIG, {"BLOCK": 4096}, dict(num_warps=8)),  # n not known divisible
    "add_unaligned": (_add_kernel, ADD_SIG, {"BLOCK": 4096}, dict(num_warps=8, divisible=("n",))),
    "add_2_per_thread": (_add_kernel, ADD_SIG, {"BLOCK": 256}, dict(num_warps=4, divisible=ALL_ADD)),
    "add_1_per_thread": (_add_kernel, ADD_SIG, {"BLOCK": 128}, dict(num_warps=4, divisible=ALL_ADD)),
    "sum": (_sum_kernel, {"x_ptr": "*fp32", "partial_ptr": "*fp32", "n": "i32"}, {"BLOCK": 4096},
            dict(num_warps=8, divisible=("x_ptr", "partial_ptr", "n"))),
    **{f"gemm_{s}": (matmul_kernel, GEMM_SIG, GEMM_TILE, dict(num_warps=8, num_stages=s, divisible=tuple(GEMM_SIG)))
       for s in STAGES},
    "gemm_4_warps": (matmul_kernel, GEMM_SIG, GEMM_TILE, dict(num_warps=4, num_stages=3, divisible=tuple(GEMM_SIG))),
    "gemm_strides_unknown": (matmul_kernel, GEMM_SIG, GEMM_TILE, dict(num_warps=8, num_stages=3)),
    "gemm_sm80": (matmul_kernel, GEMM_SIG, GEMM_TILE, dict(arch=80, num_warps=8, num_stages=3,
                                                          divisible=tuple(GEMM_SIG))),
}


@pytest.fixture(scope="module")
def built() -> dict[str, ins.Compiled]:
    return dict(zip(JOBS, ins.compile_many(JOBS.values())))


# ---------------------------------------------------------------- the vector add

def test_add_uses_128_bit_accesses_when_everything_is_divisible(built):
    k = built["add_aligned"]
    assert ins.load_store_widths(k.ptx) == {"ld": {128}, "st": {128}}, ins.excerpt(k.ptx, r"ld\.global")
    assert re.search(r"sizePerThread = \[4\]", ins.layouts(k.ttgir)["#blocked"])


@pytest.mark.parametrize("name", ["add_n_odd", "add_unaligned"])
def test_add_falls_back_to_32_bit_without_divisibility(built, name):
    # With n not a multiple of 16 the mask may change between any two neighbours; with unaligned pointers a
    # 16-byte access could straddle an alignment boundary. Either way: one float per instruction.
    assert ins.load_store_widths(built[name].ptx) == {"ld": {32}, "st": {32}}


@pytest.mark.parametrize("name, bits", [("add_2_per_thread", 64), ("add_1_per_thread", 32)])
def test_add_vector_width_follows_elements_per_thread(built, name, bits):
    # 256 elements over 128 threads: 2 consecutive floats each, one 64-bit access; 128 over 128: one float.
    assert ins.load_store_widths(built[name].ptx)["ld"] == {bits}


def test_add_needs_no_shared_memory_and_does_not_spill(built):
    k = built["add_aligned"]
    assert k.shared == 0 and not ins.shared_memory_ops(k.ptx)
    assert k.registers is not None and 0 < k.registers <= 255
    assert k.spill_stores == 0 and k.spill_loads == 0


# ---------------------------------------------------------------- the reduction

def test_sum_exchanges_partial_sums_through_shared_memory(built):
    k = built["sum"]
    assert ins.load_store_widths(k.ptx)["ld"] == {128}
    assert 0 < k.shared <= 8 * 4 * 2, "one float per warp (8 warps), at most doubled"
    assert ins.shared_memory_ops(k.ptx)["st.shared.b32"] >= 1
    assert "shfl.sync.bfly" in k.ptx, "the in-warp part of tl.sum is shuffles"


# ---------------------------------------------------------------- the GEMM

def test_gemm_uses_hopper_tensor_cores_fed_from_shared_memory(built):
    k = built["gemm_3"]
    mma = ins.tensor_core_ops(k.ptx)
    assert any(op.startswith("wgmma.mma_async") and ".f32.f16.f16" in op for op in mma), mma
    assert ins.async_copies(k.ptx)["cp.async.cg.shared.global"] > 0
    found = ins.layouts(k.ttgir)
    assert any("nvidia_mma" in v and "versionMajor = 3" in v for v in found.values()), found
    assert any("shared" in v and "swizzlingByteWidth" in v for v in found.values()), found
    assert k.spill_stores == 0


def test_gemm_on_ampere_uses_mma_sync_instead(built):
    mma = ins.tensor_core_ops(built["gemm_sm80"].ptx)
    assert mma and all(op.startswith("mma.sync") for op in mma), mma


def test_each_stage_adds_one_tile_of_a_and_b(built):
    per_stage = (128 + 128) * 64 * 2  # A tile 128 x 64 and B tile 64 x 128, fp16
    shared = [built[f"gemm_{s}"].shared for s in STAGES]
    assert shared == [s * per_stage for s in STAGES]


def test_num_warps_is_the_thread_count(built):
    for name, warps in (("gemm_3", 8), ("gemm_4_warps", 4), ("add_aligned", 8), ("add_2_per_thread", 4)):
        k = built[name]
        assert k.num_warps == warps and k.threads == 32 * warps
        assert re.search(rf"\.reqntid {32 * warps}\b", k.ptx), name


def test_gemm_without_divisible_strides_loses_vector_copies(built):
    # The same kernel, but nothing says the strides are multiples of 16: rows may start anywhere, so no
    # 16-byte copies, no cp.async pipeline, and a program that needs far more registers.
    slow, fast = built["gemm_strides_unknown"], built["gemm_3"]
    assert not ins.async_copies(slow.ptx)
    assert max(ins.load_store_widths(slow.ptx)["ld"]) < 128
    assert slow.registers > fast.registers


# ---------------------------------------------------------------- specialisation and helpers

def test_signature_of_follows_the_jit_rules():
    x = torch.randn(64)
    sig, consts, div = ins.signature_of(_add_kernel, x, x, x, 64, BLOCK=1024)
    assert sig == ADD_SIG and consts == {"BLOCK": 1024} and div == ALL_ADD
    v = x[1:]  # 4 bytes past a 16-byte boundary
    _, _, div = ins.signature_of(_add_kernel, v, v, v, 63, BLOCK=1024)
    assert div == ()
    _, consts, _ = ins.signature_of(_add_kernel, x, x, x, 1, BLOCK=1024)
    assert consts == {"n": 1, "BLOCK": 1024}, "an int equal to 1 is compiled in"
    sig, _, div = ins.signature_of(_add_kernel, x, x, x, 2**32, BLOCK=1024)
    assert sig["n"] == "i64" and "n" in div


def test_signature_of_agrees_with_tritons_own_rule():
    native = pytest.importorskip("triton._C.libtriton").__dict__.get("native_specialize_impl")
    if native is None:
        pytest.skip("this Triton has no native_specialize_impl")
    from triton.backends.compiler import BaseBackend
    x = torch.randn(64)
    for args in ((x, x, x, 48), (x[1:], x[1:], x[1:], 17), (x, x[3:], x, 2**31)):
        sig, _, div = ins.signature_of(_add_kernel, *args, BLOCK=1024)
        for name, arg in zip(_add_kernel.arg_names, args):
            ty, spec = native(BaseBackend, arg, False, True, True)
            assert sig[name] == ty and (spec == "D") == (name in div), (name, ty, spec)


def test_signature_of_refuses_what_it_cannot_specialise():
    with pytest.raises(TypeError, match="no value for"):
        ins.signature_of(_add_kernel, torch.randn(4), BLOCK=4)
    with pytest.raises(TypeError, match="cannot specialise"):
        ins.signature_of(_add_kernel, torch.randn(4), torch.randn(4), torch.randn(4), "4", BLOCK=4)


def test_compile_for_names_unknown_and_missing_arguments():
    with pytest.raises(TypeError, match="has no argument nn"):
        ins.compile_for(_add_kernel, {**ADD_SIG, "nn": "i32"}, {"BLOCK": 4})
    with pytest.raises(TypeError, match="BLOCK"):
        ins.compile_for(_add_kernel, ADD_SIG, {})


def test_parse_ptxas_matches_the_cuda_report_format():
    kernels = ins.parse_ptxas(SPILLING_SAMPLE)
    assert kernels["_Z1kPfi"] == {"spill_store_bytes": 736, "spill_load_bytes": 820, "registers": 24}
    assert kernels["vector_add_v1"] == {"spill_store_bytes": 0, "spill_load_bytes": 0, "registers": 12}


def test_finders_on_hand_written_ptx():
    ptx = """
    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];
    @%p1 ld.global.v2.b32 {%r5, %r6}, [%rd2];
    st.global.b16 [%rd3], %rs1;
    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd4, {%r2, %r3}], [%r4];
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2}, {%r3}, {%f5, %f6};
    """
    assert ins.load_store_widths(ptx) == {"ld": {128, 64}, "st": {16}}
    assert set(ins.tensor_core_ops(ptx)) == {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}
    assert list(ins.async_copies(ptx)) == ["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"]  # noqa: E501


def test_excerpt_drops_source_locations():
    text = '%0 = tt.get_program_id x : i32 loc(#loc1)\n%1 = arith.muli %0, %c : i32 loc("pid"(#loc2))\n'
    assert ins.excerpt(text, "get_program_id") == "%0 = tt.get_program_id x : i32"
    assert ins.excerpt(text, "muli") == "%1 = arith.muli %0, %c : i32"


# ---------------------------------------------------------------- the GPU's own view

@pytest.mark.gpu
def test_a_launch_reports_what_compile_for_predicts():
    from snippets.part3.wmma import TRITON_CONFIGS
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    cfg = TRITON_CONFIGS[2]
    launched = matmul_kernel[(16,)](a, a, c, 512, 512, 512, 512, 512, 512, INPUT_PRECISION="tf32", **cfg)
    torch.cuda.synchronize()
    sig, consts, div = ins.signature_of(matmul_kernel, a, a, c, 512, 512, 512, 512, 512, 512,
                                        INPUT_PRECISION="tf32", **{k: v for k, v in cfg.items()
                                                                   if k not in ("num_warps", "num_stages")})
    offline = ins.compile_for(matmul_kernel, sig, consts, divisible=div, num_warps=cfg["num_warps"],
                              num_stages=cfg["num_stages"])
    seen = ins.launched_resources(launched)
    assert seen["shared"] == offline.shared and seen["num_warps"] == 8 and seen["num_stages"] == 3
    assert seen["n_spills"] == 0 and 0 < seen["n_regs"] <= 255
    assert ins.tensor_core_ops(launched.asm["ptx"]) == ins.tensor_core_ops(offline.ptx)


def test_finders_read_the_state_space_either_way():
    # Triton 3.8 writes the CTA's shared memory as .shared::cta, 3.6 and 3.9 as .shared
    for ptx in ("st.shared::cta.b32 [ %r18 + 0 ], %r19;", "st.shared.b32 [%r54], %r50;"):
        assert ins.shared_memory_ops(ptx) == {"st.shared.b32": 1}
        assert ins.load_store_widths(ptx, "shared") == {"ld": set(), "st": {32}}
    assert ins.shared_memory_ops("ld.shared::cluster.u32 %r1, [%r2];") == {"ld.shared::cluster.u32": 1}
