"""Reading what torch.compile generated: the kernel-name parser and the wrapper reader on a hand-written module
in the layout Inductor writes for a GPU, then one real compilation (C++ on a CPU, Triton on a GPU) of a block
that shows three fusion boundaries at once: a cuBLAS matmul, a custom op, and a graph break. The max-autotune
template with a fused epilogue is GPU-only."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, HAS_GPU
from snippets.part5 import inductor as ind

# ---------------------------------------------------------------- names and the wrapper (no compiling)

@pytest.mark.parametrize("name, want", [
    ("triton_poi_fused_add_gelu_0", ("triton", "pointwise", "add_gelu")),
    ("triton_per_fused__softmax_1", ("triton", "reduction (persistent)", "_softmax")),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_12", ("triton", "reduction (looped)",
                                                             "_to_copy_add_mean_mul_pow_rsqrt")),
    ("triton_tem_fused_addmm_gelu_0", ("triton", "template", "addmm_gelu")),
    ("cpp_fused_add_gelu_native_dropout_0", ("cpp", "", "add_gelu_native_dropout")),
    ("triton_poi_3", ("triton", "pointwise", "")),
    ("my_kernel", ("", "", "")),
    ("triton_poi_fused_add", ("", "", "")),  # no index: not a generated name
])
def test_parse_name(name, want):
    assert ind.parse_name(name) == want


# A module in the layout of Inductor's GPU output (kernel bodies shortened): two generated kernels, a cuBLAS
# call between them, and a custom op the compiler calls as it is.
MODULE = '''
from torch._inductor.select_algorithm import extern_kernels
async_compile = AsyncCompile()

# kernel path: /tmp/torchinductor/ab/cab.py
# Topologically Sorted Source Nodes: [add, gelu], Original ATen: [aten.add, aten.gelu]
# Source node to ATen node mapping:
#   add => add
triton_poi_fused_add_gelu_0 = async_compile.triton('triton_poi_fused_add_gelu_0', \'\'\'
import triton
@triton_heuristics.pointwise(size_hints={'x': 1024})
@triton.jit
def triton_poi_fused_add_gelu_0(in_out_ptr0, in_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
\'\'\', device_str='cuda')

# Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax]
triton_per_fused__softmax_1 = async_compile.triton('triton_per_fused__softmax_1', \'\'\'
@triton.jit
def triton_per_fused__softmax_1(in_ptr0, out_ptr2, xnumel, r0_numel):
    pass
\'\'\', device_str='cuda')

async_compile.wait(globals())

class Runner:
    def call(self, args):
        arg0_1, arg1_1, arg2_1 = args
        assert_size_stride(arg0_1, (32, 48), (48, 1), 'input')
        # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.addmm]
        extern_kernels.mm(arg0_1, arg1_1, out=buf0)
        triton_poi_fused_add_gelu_0.run(buf1, arg2_1, 1024, stream=stream0)
        buf2 = torch.ops.mylib.scale_rows.default(buf1, arg2_1)
        assert_size_stride(buf2, (32, 32), (32, 1), 'torch.ops.mylib.scale_rows.default')
        triton_per_fused__softmax_1.run(buf2, buf3, 32, 32, stream=stream0)
        return (buf3, )

def benchmark_compiled_module(args, times=10, repeat=10):
    fn = lambda: call(list(args))
'''


def test_schedule_of_a_gpu_module():
    s = ind.schedule(MODULE)
    assert list(s.kernels) == ["triton_poi_fused_add_gelu_0", "triton_per_fused__softmax_1"]
    gelu = s.kernels["triton_poi_fused_add_gelu_0"]
    assert (gelu.backend, gelu.kind, gelu.ops, gelu.aten) == ("triton", "pointwise", "add_gelu",
                                                              ("aten.add", "aten.gelu"))
    assert gelu.source.startswith("@triton.jit\ndef triton_poi_fused_add_gelu_0(")
    assert s.kernels["triton_per_fused__softmax_1"].aten == ("aten._softmax",)
    assert s.steps == [("extern", "mm"), ("kernel", "triton_poi_fused_add_gelu_0"), ("op", "mylib.scale_rows"),
                       ("kernel", "triton_per_fused__softmax_1")]
    assert s.launches == 4 and s.externs() == ["mm"] and s.ops_called() == ["mylib.scale_rows"]
    text = s.describe()
    assert "extern  mm" in text and "reduction (persistent)" in text and "ATen: aten.add, aten.gelu" in text


def test_schedule_of_nothing():
    """A module without a call function or kernels reads as empty: the parser invents nothing."""
    s = ind.schedule("import torch\nx = 1\n")
    assert s.kernels == {} and s.steps == [] and s.launches == 0


def test_block_inputs_fit_the_blocks():
    for name, (fn, _) in ind.BLOCKS.items():
        args = ind.block_inputs(name, "cpu", torch.float32, rows=8, width=16)
        out = fn(*args)
        assert out.shape == (8, 16), name
    with pytest.raises(KeyError, match="unknown block"):
        ind.block_inputs("attention", "cpu", torch.float32)


def test_rmsnorm_block_is_llamas():
    x, w = ind.block_inputs("rmsnorm", "cpu", torch.float64, rows=4, width=8)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(ind.rmsnorm(x, w), want)


# ---------------------------------------------------------------- one real compilation

@torch.library.custom_op("kernels_measured_test::scale_rows", mutates_args=())
def scale_rows(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """An op the compiler cannot see into: it runs it as it is, between kernels."""
    return x * s[:, None]


@scale_rows.register_fake
def _(x, s):
    return torch.empty_like(x)


def _three_walls(x, w, b, s):
    y = F.gelu(F.linear(x, w, b))   # a matmul (cuBLAS) with a pointwise epilogue
    y = scale_rows(y, s) + 1.0      # a custom op, then an add that cannot join the GELU across it
    torch._dynamo.graph_break()     # what Dynamo cannot trace: the function splits into two graphs
    return torch.tanh(y) * 3.0


def _have_compiler() -> bool:
    return HAS_GPU or shutil.which("g++") is not None or shutil.which("c++") is not None


@pytest.mark.skipif(not _have_compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_what_inductor_fuses_and_what_it_cannot():
    """Compiled for real (C++ on a CPU, Triton on a GPU): the matmul stays an external call, the bias (in the
    call) and the GELU after it form one kernel, the custom op is called as it is and the add after it gets
    a kernel of its own, and the graph break makes a second graph with one kernel for tanh and the multiply."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x, w = torch.randn(32, 48, generator=g, device=DEVICE), torch.randn(40, 48, generator=g, device=DEVICE)
    b, s = torch.randn(40, generator=g, device=DEVICE), torch.randn(32, generator=g, device=DEVICE)
    cap = ind.capture(_three_walls, x, w, b, s)
    torch.testing.assert_close(cap.output, _three_walls(x, w, b, s), rtol=1e-4, atol=1e-4)
    assert len(cap.code) == 2, "a graph break: two graphs, two generated modules"
    first, second = cap.schedules
    kinds = [kind for kind, _ in first.steps]
    assert kinds == ["extern", "kernel", "op", "kernel"], first.describe()
    assert first.externs()[0] in ("addmm", "mm"), first.describe()
    assert first.ops_called() == ["kernels_measured_test.scale_rows"]
    gelu_kernel = first.kernels[first.steps[1][1]]
    assert "gelu" in gelu_kernel.ops and gelu_kernel.backend == ("triton" if DEVICE == "cuda" else "cpp")
    assert "add" in first.kernels[first.steps[3][1]].ops
    (tail,) = second.kernels.values()
    assert "tanh" in tail.ops and "mul" in tail.ops and [k for k, _ in second.steps] == ["kernel"]


def _shared_memory_refusal(exc: BaseException) -> tuple[int, int] | None:
    """(bytes required, hardware limit) when ``exc`` or an exception it was raised from is Triton's refusal of a
    kernel that needs more shared memory than the GPU gives one program ("out of resource: shared memory,
    Required: R, Hardware limit: L"), else None."""
    import re

    while exc is not None:
        m = re.search(r"shared memory, Required: (\d+), Hardware limit: (\d+)", str(exc))
        if m:
            return int(m[1]), int(m[2])
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.mark.gpu
def test_max_autotune_template_fuses_the_epilogue():
    """With Triton templates as the only GEMM backend, Inductor writes the matmul itself, and the bias and GELU
    can join it: one template kernel, no cuBLAS call. By default Inductor decides whether an epilogue joins by
    timing both ways (the 4096 x 4096 capture of the chapter keeps the GELU in a kernel of its own), and a timing
    taken while other tests share the GPU can go either way: the test switches that benchmark off
    (``benchmark_epilogue_fusion``), so what it checks is that the fusion is possible, not which way a race went.

    Inductor's template configurations are not all within every GPU's shared memory (a 256 x 256 x 64 tile in
    4 stages needs 262144 bytes; an H100 or H200 gives a program 232448): the test asks Inductor to prune the
    configurations its own estimate puts over this GPU's limit (``shared_memory_per_block_optin``), where this
    torch has the option, and skips, naming both numbers, if one over the limit is still chosen."""
    import torch._inductor.config as inductor_config

    fn, kwargs = ind.BLOCKS["linear_gelu_autotune"]
    options = dict(kwargs["options"])
    if hasattr(inductor_config, "max_autotune_prune_choices_based_on_shared_mem"):
        options["max_autotune_prune_choices_based_on_shared_mem"] = True
    if hasattr(inductor_config, "benchmark_epilogue_fusion"):
        options["benchmark_epilogue_fusion"] = False
    args = ind.block_inputs("linear_gelu_autotune", "cuda", torch.bfloat16, rows=256, width=256)
    try:
        cap = ind.capture(fn, *args, **{**kwargs, "options": options})
    except Exception as exc:  # noqa: BLE001 (only a refusal over this GPU's shared memory is a skip)
        refusal = _shared_memory_refusal(exc)
        limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        if refusal is None or refusal[0] <= limit:
            raise
        pytest.skip(f"Inductor chose a template that needs {refusal[0]} bytes of shared memory; this GPU "
                    f"gives a program {limit} (shared_memory_per_block_optin)")
    (sched,) = cap.schedules
    assert sched.externs() == [], sched.describe()
    templates = [k for k in sched.kernels.values() if k.kind == "template"]
    assert templates and any("gelu" in k.ops for k in templates), sched.describe()
    torch.testing.assert_close(cap.output.float(), fn(*args).float(), rtol=2e-2, atol=2e-2)
