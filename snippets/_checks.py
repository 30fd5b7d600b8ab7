"""Input checks shared by every public host function.

Kernels do no checking (a bad pointer or size inside a kernel is an illegal memory access or a
silently wrong answer), so every public function calls these first and raises a ``TypeError`` or
``ValueError`` that names the offending argument, its shape and its dtype.

Autograd too: a kernel's output is written outside autograd's graph, so a function with no backward
calls :func:`refuse_grad` and raises a ``RuntimeError`` on inputs that require grad (with grad mode
on), and a function with a ``torch.autograd.Function`` asks :func:`wants_grad` whether to go
through it.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensors(
    names: Iterable[str],
    tensors: Iterable[object],
    *,
    dtypes: Iterable[torch.dtype],
    device: str = "cuda",
    same_shape: bool = True,
    contiguous: bool = True,
    allow_empty: bool = True,
) -> None:
    """Validate the tensor arguments of a kernel launch.

    ``device="cuda"`` accepts CUDA tensors; for Triton kernels pass ``device=triton_device()`` so
    that CPU tensors are accepted under the interpreter. All tensors must share one device, one
    dtype and (if ``same_shape``) one shape.
    """
    names, tensors, dtypes = list(names), list(tensors), tuple(dtypes)
    first = None
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != device:
            hint = " (move it with .cuda())" if device == "cuda" else ""
            raise ValueError(f"{name} must be on a {device} device, got {describe(t)}{hint}")
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d) for d in dtypes)
            raise TypeError(f"{name} has dtype {t.dtype}; this function supports {allowed}")
        if contiguous and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for "
                             f"{describe(t)}; call .contiguous() first")
        if not allow_empty and t.numel() == 0:
            raise ValueError(f"{name} is empty ({describe(t)})")
        if first is None:
            first = (name, t)
            continue
        fname, f = first
        if t.device != f.device:
            raise ValueError(f"{name} is on {t.device} but {fname} is on {f.device}")
        if t.dtype != f.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {fname} has dtype {f.dtype}")
        if same_shape and t.shape != f.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {fname} has shape "
                             f"{tuple(f.shape)}")


def wants_grad(*tensors: object) -> bool:
    """True when autograd is recording (``torch.is_grad_enabled()``) and one of ``tensors``
    requires grad: a call that must go through a ``torch.autograd.Function`` to have gradients.
    Reads flags on the host only: no device work, no synchronization."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in tensors)


FORWARD_ONLY = "is forward-only: an input requires grad and this kernel computes no gradient"
# what a forward + backward step says: its gradients come from kernels, not from autograd's graph
GRADS_ONLY = ("returns gradients of its own kernels, which autograd cannot differentiate: an "
              "input requires grad")


def refuse_grad(name: str, *tensors: object, instead: str = "its PyTorch reference",
                why: str = FORWARD_ONLY) -> None:
    """Raise before a forward-only kernel launches on inputs that autograd is tracking.

    A kernel launched from Python writes its output outside autograd: the output does not require
    grad, and a loss built on it backpropagates without an error but without this op's
    contribution (a weight's ``.grad`` stays None, the gradient of an input is wrong). So a
    function with no backward refuses such inputs, unless grad mode is off
    (``torch.no_grad()``, ``torch.inference_mode()``). ``instead`` names what trains."""
    if wants_grad(*tensors):
        raise RuntimeError(f"{name} {why}; call it under torch.no_grad(), or use {instead} "
                           "for training")


def triton_device() -> str:
    """The device a Triton kernel's tensors must live on: ``cpu`` under the interpreter,
    else ``cuda``."""
    return "cpu" if triton_interpreting() else "cuda"


def check_scalar(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python int or float, got {type(value).__name__}")
    return float(value)


def check_int(name: str, value: object, lo: int) -> int:
    """A Python (or NumPy) integer argument of at least ``lo``; bools are refused (True is not
    a size)."""
    import numpy as np

    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return int(value)
