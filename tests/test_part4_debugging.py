"""The debugging chapter's claims, each shown happening: what the interpreter prints and where pdb stops, the
messages of static_assert and of the common compile errors (under the interpreter and from the sm_90 compiler),
device_assert kept only with debug on, and every bug next to its fix: the bug shows (a clobbered neighbour, a
wrong sum, a wrapped offset, an exception) and the fix cures it. GPU-only behaviour (a lost update, the assert
firing, OutOfResources at launch, printf) is in the tests marked gpu."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import HAS_GPU
from snippets.common import introspect as ins
from snippets.common.gemm import matmul_kernel
from snippets.part4 import debugging as dbg

needs_interpreter = pytest.mark.skipif(HAS_GPU, reason="checks the CPU interpreter's behaviour")


# ---------------------------------------------------------------- compiled for sm_90, on any machine

FP32_IO = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
GEMM_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
            "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}


def _oversized():
    cfg = dbg.oversized_gemm_config()
    opts = dict(num_warps=cfg.pop("num_warps"), num_stages=cfg.pop("num_stages"), divisible=tuple(GEMM_SIG))
    return (matmul_kernel, GEMM_SIG, cfg, opts)


JOBS = {
    "python_if": (dbg._relu_python_if, FP32_IO, {"BLOCK": 64}, {}),
    "relu_where": (dbg._relu_where, FP32_IO, {"BLOCK": 64}, {}),
    "runtime_shape": (dbg._fill_runtime_shape, {"out_ptr": "*fp32", "n": "i32", "value": "fp32"}, {}, {}),
    "block_100": (dbg._fill, {"out_ptr": "*fp32", "n": "i32", "value": "fp32"}, {"BLOCK": 100}, {}),
    "block_128": (dbg._fill, {"out_ptr": "*fp32", "n": "i32", "value": "fp32"}, {"BLOCK": 128}, {}),
    "static_assert": (dbg._group_sums_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_groups": "i32"},
                      {"BLOCK": 256, "GROUP": 512}, {}),
    "true_div": (dbg._repeat2_true_div, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_out": "i32"}, {"BLOCK": 64}, {}),
    "floor_div": (dbg._repeat2, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_out": "i32"}, {"BLOCK": 64}, {}),
    "log_debug": (dbg._log_kernel, FP32_IO, {"BLOCK": 128}, {"debug": True}),
    "log": (dbg._log_kernel, FP32_IO, {"BLOCK": 128}, {}),
    "scale_no_break": (dbg._scale_kernel, {**FP32_IO, "alpha": "fp32"}, {"BLOCK": 128, "BREAK": False}, {}),
    "print": (dbg._print_kernel, {"x_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128}, {}),
    "total_atomic": (dbg._total_kernel, FP32_IO, {"BLOCK": 256, "MODE": "atomic"}, {}),
    "oversized_gemm": _oversized(),
    "offsets_debug": (dbg._offsets_int32, {"out_ptr": "*i64", "first_pid": "i32"}, {"BLOCK": 256}, {"debug": True}),
}


@pytest.fixture(scope="module")
def compiled() -> dict:
    return dict(zip(JOBS, ins.compile_many(JOBS.values(), raise_errors=False)))


@pytest.mark.parametrize("name, kind, message", [
    ("python_if", "UnsupportedLanguageConstruct", "^Boolean value of Tensor with more than one value is ambiguous$"),
    ("runtime_shape", "CompilationError", "^arange's arguments must be of type tl.constexpr$"),
    ("block_100", "CompilationError", "^arange's range must be a power of 2$"),
    ("static_assert", "CompileTimeAssertionFailure", "^BLOCK must be a multiple of GROUP: a program sums whole groups$"),  # noqa: E501
    # Triton 3.9 names the float type triton.language.float32; older versions spell it differently
    ("true_div", "CompilationError", r"invalid operands of type pointer<fp32> and \S*(float32|fp32)"),
])
def test_compiler_refuses_with_its_message(compiled, name, kind, message):
    err = compiled[name]
    assert isinstance(err, ins.CompileError), f"{name} compiled, but should not"
    assert err.kind == kind
    assert re.search(message, str(err).rstrip().splitlines()[-1]), str(err)
    assert str(err).startswith("at "), "the message points at a line and column of the kernel"


@pytest.mark.parametrize("name", ["relu_where", "block_128", "floor_div", "log", "scale_no_break", "print",
                                  "total_atomic"])
def test_fixed_kernels_compile(compiled, name):
    assert isinstance(compiled[name], ins.Compiled), compiled[name]


def test_device_assert_is_compiled_in_only_with_debug(compiled):
    assert "__assertfail" in compiled["log_debug"].ptx
    assert "__assertfail" not in compiled["log"].ptx


def test_debug_mode_checks_int32_overflow(compiled):
    assert "int32 overflow detected for operation mul" in compiled["offsets_debug"].llir


def test_device_print_is_printf(compiled):
    assert "vprintf" in compiled["print"].ptx


def test_atomic_add_is_one_instruction(compiled):
    assert any(op.startswith("atom.global") and ".add.f32" in op
               for op in ins._ops(compiled["total_atomic"].ptx, r"atom"))


def test_oversized_gemm_needs_more_shared_memory_than_an_sm_has(compiled):
    k = compiled["oversized_gemm"]
    assert k.shared == 4 * (256 * 64 + 64 * 256) * 2 > dbg.SM90_MAX_SHARED_PER_BLOCK


def test_out_of_resources_message():
    msg = dbg.out_of_resources_message(262144)
    assert msg.startswith("out of resource: shared memory, Required: 262144, Hardware limit: 232448.")


# ---------------------------------------------------------------- the interpreter: printing and pdb

@needs_interpreter
def test_device_print_and_print_under_the_interpreter(capsys):
    dbg.debug_print(torch.arange(10, dtype=torch.float32), block=4)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["(0, 0, 0)  x:  [0. 1. 2. 3.]", "first block max [3.]",
                     "(1, 0, 0)  x:  [4. 5. 6. 7.]", "(2, 0, 0)  x:  [8. 9. 0. 0.]"]


@needs_interpreter
def test_pdb_stops_in_every_program():
    x = torch.arange(10, dtype=torch.float32)
    text = dbg.pdb_transcript(["p offs", "p y", "c"], dbg.scale, x, 2.0, 4, True)
    assert text.count("_scale_kernel()") == 3, "one stop per program: 3 programs of 4 elements"
    assert "array([0, 1, 2, 3], dtype=int32)" in text
    assert "array([16., 18.,  0.,  0.], dtype=float32)" in text, "the masked lanes hold other=0"


def test_breakpoint_off_runs_through(device):
    x = torch.arange(10, dtype=torch.float32, device=device)
    torch.testing.assert_close(dbg.scale(x, 2.0), 2 * x)


# ---------------------------------------------------------------- static_assert and device_assert

@needs_interpreter
def test_static_assert_under_the_interpreter():
    with pytest.raises(Exception, match="BLOCK must be a multiple of GROUP") as info:
        dbg.group_sums(torch.ones(1024), 512, block=256)
    assert type(info.value).__name__ == "InterpreterError"


def test_group_sums(device):
    x = torch.arange(1000, dtype=torch.float32, device=device)
    torch.testing.assert_close(dbg.group_sums(x, 8), x.view(-1, 8).sum(1))
    with pytest.raises(ValueError, match="not a multiple of group=8"):
        dbg.group_sums(x[:999], 8)


@needs_interpreter
def test_device_assert_is_skipped_by_the_interpreter():
    # Triton 3.9's interpreter never evaluates tl.device_assert (its options have debug off and nothing turns
    # it on): the log of -1 goes through as NaN. If a later Triton checks it here, this test says so.
    out = dbg.log(torch.tensor([1.0, -1.0, 2.0]))
    assert torch.isnan(out[1]) and out[0] == 0


# ---------------------------------------------------------------- bugs and fixes

@needs_interpreter
def test_missing_mask_writes_into_the_neighbour():
    # x and out are the first 100 elements of larger buffers: the unmasked kernel's second program (128
    # lanes, 28 past the end) reads the 28 values after x and overwrites the 28 after out. Under the
    # interpreter nothing stops it: it is a raw read and write of host memory (past a buffer's end it can
    # corrupt the heap and crash the process later).
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.full((256,), -1.0)
    dbg.double(src[:100], dst[:100], masked=False)
    assert torch.equal(dst[100:128], 2 * src[100:128]), "the neighbour was overwritten"
    assert torch.equal(dst[128:], torch.full((128,), -1.0))
    dst.fill_(-1.0)
    dbg.double(src[:100], dst[:100], masked=True)
    assert torch.equal(dst[:100], 2 * src[:100]) and torch.equal(dst[100:], torch.full((156,), -1.0))


@pytest.mark.parametrize("shape", [(1, 1), (5, 17), (33, 8)])
def test_wrong_strides_give_wrong_sums_and_strides_fix_them(device, shape):
    x = torch.randn(shape, device=device).t()  # a transposed view: stride (1, rows)
    ref = x.double().sum(1).float()
    torch.testing.assert_close(dbg.row_sums(x), ref)
    torch.testing.assert_close(dbg.row_sums(x.contiguous()), ref)
    torch.testing.assert_close(dbg.row_sums_buggy(x.contiguous()), ref)
    if min(shape) > 1:
        assert not torch.allclose(dbg.row_sums_buggy(x), ref), "the buggy kernel read the wrong elements"


@needs_interpreter
@pytest.mark.parametrize("call, message", [
    (dbg.fill_runtime_shape, "arange's arguments must be of type tl.constexpr"),
    (dbg.fill_wrong_block, "arange's range must be a power of 2"),
])
def test_shape_errors_under_the_interpreter(call, message):
    with pytest.raises(Exception, match=message) as info:
        call(torch.empty(100), 1.0)
    assert type(info.value).__name__ == "InterpreterError"


@pytest.mark.parametrize("n", [1, 100, 1000, 4097])
def test_fill_rounds_the_block_up(device, n):
    out = torch.full((n,), float("nan"), device=device)
    assert torch.equal(dbg.fill(out, 3.0), torch.full((n,), 3.0, device=device))


def test_fp16_accumulator_loses_what_fp32_keeps(device):
    # 2048 values of 0.1 in fp16, 8 lanes: each lane adds 256 of them. Past 16 the spacing of fp16 numbers
    # (2**-6) is a sixth of 0.1, so each add rounds: the fp16 running sums end almost 2% low.
    x = torch.full((2048,), 0.1, dtype=torch.float16, device=device)
    exact = x.double().sum().item()
    bad = dbg.sum_one_program(x, fp32_accumulator=False, block=8).item()
    good = dbg.sum_one_program(x, fp32_accumulator=True, block=8).item()
    assert abs(good - exact) / exact < 1e-6
    assert abs(bad - exact) / exact > 1e-2


@needs_interpreter
def test_true_division_in_an_index_under_the_interpreter():
    with pytest.raises(Exception, match=r"invalid operands of type pointer<fp32> and triton\.language\.float32"):
        dbg.repeat2(torch.arange(5.0), buggy=True)


def test_floor_division_index(device):
    x = torch.arange(17, dtype=torch.float32, device=device)
    assert torch.equal(dbg.repeat2(x), x.repeat_interleave(2))


def test_int32_offsets_wrap_and_int64_offsets_do_not(device):
    block = 256
    pid = 2**31 // block  # the first program whose first offset is 2**31
    exact = torch.arange(pid * block, (pid + 1) * block, dtype=torch.int64)
    assert torch.equal(dbg.element_offsets(pid, block, wide=True, device=device).cpu(), exact)
    wrapped = dbg.element_offsets(pid, block, wide=False, device=device).cpu()
    assert torch.equal(wrapped, exact - 2**32), "int32 arithmetic wraps to negative offsets"
    assert torch.equal(dbg.element_offsets(pid - 1, block, wide=False, device=device).cpu(), exact - block)


@needs_interpreter
def test_python_if_on_a_block_is_silently_wrong_under_the_interpreter():
    # The interpreter makes a block's truth value True (only a compiled kernel refuses): every element,
    # positive or not, goes through the branch.
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    assert torch.equal(dbg.relu(x, buggy=True).abs(), torch.zeros(4))


def test_where_is_the_fix(device):
    x = torch.randn(300, device=device)
    assert torch.equal(dbg.relu(x), torch.relu(x))


@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_atomic_total_is_exact(device, n):
    x = torch.arange(n, dtype=torch.int32, device=device) % 97
    assert dbg.total(x, "atomic").item() == x.sum().item()


def test_plain_store_keeps_one_programs_part(device):
    x = torch.arange(1000, dtype=torch.int32, device=device)
    parts = {x[i:i + 256].sum().item() for i in range(0, 1000, 256)}
    got = dbg.total(x, "store").item()
    assert got in parts and got != x.sum().item()


@needs_interpreter
def test_interpreter_hides_the_read_modify_write_race():
    # One program at a time: nobody else can run between a program's load and its store.
    x = torch.arange(1000, dtype=torch.int32)
    assert dbg.total(x, "load_add_store").item() == x.sum().item()


def test_total_refuses_bad_input(device):
    with pytest.raises(ValueError, match="mode must be one of"):
        dbg.total(torch.ones(4, device=device), "add")
    with pytest.raises(TypeError, match="dtype"):
        dbg.total(torch.ones(4, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="empty"):
        dbg.total(torch.ones(0, device=device))


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
def test_read_modify_write_loses_updates_on_a_gpu():
    # 4096 programs read, add and write one word with nothing ordering them: with that many in flight at
    # once, many read the same old value and all but one of their additions are lost.
    x = torch.ones(4096 * 256, dtype=torch.int32, device="cuda")
    assert dbg.total(x, "load_add_store").item() < x.numel()
    assert dbg.total(x, "atomic").item() == x.numel()


@pytest.mark.gpu
def test_missing_mask_on_a_gpu_clobbers_the_neighbour():
    src = torch.arange(256, dtype=torch.float32, device="cuda")
    dst = torch.full((256,), -1.0, device="cuda")
    dbg.double(src[:100], dst[:100], masked=False)
    assert torch.equal(dst[100:128], 2 * src[100:128])


@pytest.mark.gpu
def test_oversized_config_raises_out_of_resources_at_launch():
    from triton.runtime.errors import OutOfResources
    kernel, _, consts, opts = _oversized()
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    with pytest.raises(OutOfResources, match="out of resource: shared memory, Required: 262144"):
        kernel[(1,)](a, a, c, 256, 256, 256, 256, 256, 256, num_warps=opts["num_warps"],
                     num_stages=opts["num_stages"], **consts)


@pytest.mark.gpu
def test_device_print_on_a_gpu_prints_what_each_thread_holds(capfd):
    # 2 programs of 128 elements on 4 warps (128 threads): one element per thread, one line per element,
    # masked lanes included. A 4-element block on the same 128 threads is held 32 times over: 32 lines each.
    dbg.debug_print(torch.arange(200, dtype=torch.float32, device="cuda"), block=128)
    torch.cuda.synchronize()
    out = capfd.readouterr().out
    assert out.count(" x: ") == 256, out[:2000]
    assert "pid (1, 0, 0) idx (127) x: 0.000000" in out, "the masked lanes print their other= value"
    dbg.debug_print(torch.arange(8, dtype=torch.float32, device="cuda"), block=4)
    torch.cuda.synchronize()
    assert capfd.readouterr().out.count(" x: ") == 8 * 32


@pytest.mark.gpu
def test_device_assert_fires_with_triton_debug():
    # A failed device assert leaves the CUDA context unusable, so it runs in a child process.
    code = ("import torch; from snippets.part4 import debugging as d; "
            "d.log(torch.tensor([1.0, -1.0], device='cuda')); torch.cuda.synchronize()")
    env = dict(os.environ, TRITON_DEBUG="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert "log of a value <= 0" in proc.stdout + proc.stderr
    ok = subprocess.run([sys.executable, "-c", code.replace("-1.0", "3.0")], capture_output=True, text=True,
                        env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
