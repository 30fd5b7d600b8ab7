"""Book kernels as PyTorch operators (snippets/part4/custom_op.py).

The Triton dropout as ``kernels_measured::seeded_dropout`` (custom_op) and
``kernels_measured::seeded_dropout_traceable`` (triton_op): bit for bit against the exact
reference and the book's own host function, eagerly (on the CPU through Triton's interpreter),
``torch.library.opcheck`` (schema, fake tensor, autograd registration, AOT dispatch) where it runs,
gradients through ``register_autograd``, refusal of bad input, and ``torch.compile`` with
``fullgraph=True`` (AOTAutograd on the CPU; Inductor on a GPU). The CUDA softmax for
``load_inline``: its CUDA translation unit compiles with nvcc and its C++ wrapper with the host
compiler against torch's headers, without a GPU; built, checked and compiled on a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig

import numpy as np
import pytest
import torch

from conftest import DEVICE, HAS_GPU
from snippets.common.dropout import keep_ref, seeded_dropout
from snippets.part4 import custom_op as co
from snippets.part4 import softmax

OPS = {"custom_op": torch.ops.kernels_measured.seeded_dropout,
       "triton_op": torch.ops.kernels_measured.seeded_dropout_traceable}
DEFS = {"custom_op": co.seeded_dropout_op, "triton_op": co.seeded_dropout_traceable_op}


def expected(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """The exact output: keep bits from the NumPy Philox, x * scale in fp32 rounded once."""
    keep = torch.from_numpy(keep_ref(seed, p, x.numel())).to(x.device).view(x.shape)
    scale = np.float32(0.0 if p == 1 else 1.0 / (1.0 - p))
    return torch.where(keep, (x.float() * float(scale)).to(x.dtype), torch.zeros((), dtype=x.dtype,
                                                                                 device=x.device))


def test_the_ops_are_registered_with_their_schemas():
    assert str(OPS["custom_op"].default._schema) == (
        "kernels_measured::seeded_dropout(Tensor x, float p, SymInt seed) -> Tensor")
    assert str(OPS["triton_op"].default._schema) == (
        "kernels_measured::seeded_dropout_traceable(Tensor x, float p, SymInt seed) -> Tensor")
    assert str(torch.ops.kernels_measured.softmax_cuda.default._schema) == (
        "kernels_measured::softmax_cuda(Tensor x) -> Tensor")


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("n", [1, 2049])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_eager_matches_the_reference_and_the_host_function(kind, n, p, dtype):
    x = torch.randn(n, device=DEVICE).to(dtype)
    y = OPS[kind](x, p, 1234)
    assert torch.equal(y, expected(x, p, 1234))
    with torch.no_grad():
        assert torch.equal(y, seeded_dropout(x, p, 1234))


@pytest.mark.parametrize("kind", OPS)
def test_a_2d_input_keeps_its_shape_and_another_seed_drops_others(kind):
    x = torch.randn(33, 65, device=DEVICE)
    a, b = OPS[kind](x, 0.5, 1), OPS[kind](x, 0.5, 2)
    assert a.shape == x.shape and torch.equal(a, expected(x, 0.5, 1))
    assert not torch.equal(a != 0, b != 0)


@pytest.mark.parametrize("kind", OPS)
def test_the_gradient_is_the_same_dropout_of_dy(kind):
    x = torch.randn(3000, device=DEVICE, requires_grad=True)
    y = OPS[kind](x, 0.25, 99)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.equal(x.grad, expected(dy, 0.25, 99))
    # through a non-contiguous gradient (sum's is an expanded scalar): the backward makes it dense
    x.grad = None
    OPS[kind](x, 0.25, 99).sum().backward()
    assert torch.equal(x.grad, expected(torch.ones_like(dy), 0.25, 99))


def test_opcheck_of_the_custom_op():
    """Schema, fake tensor, autograd registration and AOT dispatch with dynamic shapes."""
    for shape in [(100,), (8, 33)]:
        x = torch.randn(shape, device=DEVICE)
        report = torch.library.opcheck(co.seeded_dropout_op, (x, 0.5, 3))
        assert set(report.values()) == {"SUCCESS"}, report


def test_opcheck_of_the_triton_op():
    """On a GPU, every check. Under Triton's interpreter wrap_triton hands back the plain kernel (there
    is no compiled launch to capture), so the fake-tensor checks would run the interpreter on fake
    tensors: there, only the schema and the autograd registration are checked."""
    x = torch.randn(8, 33, device=DEVICE)
    utils = None if HAS_GPU else ("test_schema", "test_autograd_registration")
    kwargs = {} if utils is None else {"test_utils": utils}
    report = torch.library.opcheck(co.seeded_dropout_traceable_op, (x, 0.5, 3), **kwargs)
    assert set(report.values()) == {"SUCCESS"}, report


@pytest.mark.parametrize("kind", OPS)
def test_bad_input_is_refused(kind):
    x = torch.randn(64, device=DEVICE)
    with pytest.raises(ValueError, match="p must be in"):
        OPS[kind](x, 1.5, 0)
    with pytest.raises(ValueError, match="contiguous"):
        OPS[kind](torch.randn(8, 8, device=DEVICE).t(), 0.5, 0)
    with pytest.raises(ValueError, match="seed"):
        OPS[kind](x, 0.5, -1)


def test_the_fake_runs_no_kernel_and_checks_its_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, device=DEVICE, dtype=torch.float16)
        y = OPS["custom_op"](x, 0.5, 3)
        assert y.shape == (5, 7) and y.dtype == torch.float16
        with pytest.raises(ValueError, match="p must be in"):
            OPS["custom_op"](x, 2.0, 3)


def test_compiled_on_the_cpu_with_aot_autograd():
    """torch.compile traces the op with its fake implementation into one graph (fullgraph: no break),
    AOTAutograd builds the backward from register_autograd, and both match eager."""
    if HAS_GPU:
        pytest.skip("the GPU test below compiles with Inductor")

    def f(a):
        return OPS["custom_op"](a * 2, 0.5, 5) + 1

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    a = torch.randn(4, 100, requires_grad=True)
    out = compiled(a)
    out.sum().backward()
    assert torch.equal(out, f(a.detach()))
    assert torch.equal(a.grad, 2 * expected(torch.ones(4, 100), 0.5, 5))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", OPS)
def test_compiled_with_inductor(kind):
    from torch._inductor.utils import run_and_get_code

    def f(a):
        return OPS[kind](torch.relu(a), 0.5, 5) * 3

    compiled = torch.compile(f, fullgraph=True)
    a = torch.randn(1000, 257, device="cuda", requires_grad=True)
    out, code = run_and_get_code(compiled, a)
    torch.testing.assert_close(out, f(a.detach()), rtol=1e-6, atol=1e-6)
    out.backward(torch.ones_like(out))
    want = 3 * expected(torch.ones_like(a), 0.5, 5) * (a > 0)
    torch.testing.assert_close(a.grad, want, rtol=1e-6, atol=1e-6)
    if kind == "triton_op":  # Inductor sees the user's kernel and emits it into its own code
        assert "dropout_kernel" in "\n".join(code)


# --------------------------------------------------------------------------------------------------
# The CUDA kernel for load_inline
# --------------------------------------------------------------------------------------------------

def test_the_cuda_translation_unit_compiles(tmp_path):
    """The .cu load_inline builds (the book's softmax.cu, then the launcher), compiled by nvcc with
    the flags torch's extensions pass; no GPU needed."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    src = tmp_path / "cuda.cu"
    src.write_text(co.cuda_source())
    cmd = [nvcc, "-std=c++17", "-c", "-arch=sm_80", *COMMON_NVCC_FLAGS, *softmax.CU_OPTIONS,
           str(src), "-o", str(tmp_path / "cuda.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_cpp_wrapper_compiles_against_torch(tmp_path):
    """The C++ side, syntax-checked by the host compiler against the installed torch's headers."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    from torch.utils.cpp_extension import include_paths

    src = tmp_path / "main.cpp"
    src.write_text(co.WRAPPER_CPP)
    incs = [*include_paths(), sysconfig.get_paths()["include"]]
    cmd = [cxx, "-std=c++20", "-fsyntax-only", *(f"-I{p}" for p in incs), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_cuda_op_has_no_cpu_implementation():
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.ops.kernels_measured.softmax_cuda(torch.randn(4, 8))


@pytest.mark.gpu
def test_the_cuda_op_on_the_gpu():
    x = torch.randn(64, 1000, device="cuda")
    y = torch.ops.kernels_measured.softmax_cuda(x)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-6)
    odd = torch.randn(7, 333, device="cuda")  # the scalar kernel
    torch.testing.assert_close(torch.ops.kernels_measured.softmax_cuda(odd),
                               torch.softmax(odd, dim=-1), rtol=1e-5, atol=1e-6)
    report = torch.library.opcheck(co.softmax_cuda_op, (torch.randn(8, 64, device="cuda"),))
    assert set(report.values()) == {"SUCCESS"}, report
    xr = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    torch.ops.kernels_measured.softmax_cuda(xr).backward(dy)
    xt = x.clone().requires_grad_()
    torch.softmax(xt, dim=-1).backward(dy)
    torch.testing.assert_close(xr.grad, xt.grad, rtol=1e-4, atol=1e-6)
    compiled = torch.compile(lambda a: torch.ops.kernels_measured.softmax_cuda(a * 2),
                             fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.softmax(2 * x, dim=-1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="columns"):
        torch.ops.kernels_measured.softmax_cuda(torch.randn(2, softmax.CUDA_MAX_N + 1,
                                                            device="cuda"))
