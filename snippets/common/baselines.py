"""Library baselines that more than one chapter compares against (torch.compile, Liger-Kernel), and
the gradient helper every forward + backward version is timed through.

Both libraries are optional in a way torch eager is not: torch.compile needs a GPU here (on the CPU
it would need a C++ toolchain and compile times the test suite cannot afford), and Liger-Kernel is a
separate package. A version that uses one declares ``requires=`` on its
:class:`~snippets.registry.Impl`, so tests skip it and the harness leaves it out, with the reason,
where it cannot run.

Importing this module changes nothing: torch's recompile limit is raised on the first call of a
function that :func:`compiled` returned, not before.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

import torch


def _raise_recompile_limit(limit: int = 64) -> None:
    """torch.compile specialises a function per input shape and dtype and, past a limit (8 by
    default), falls back to eager without an error. A sweep of 5 sizes x 2 dtypes passes it, so
    raise it."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)


# --8<-- [start:compiled]
def compiled(fn: Callable) -> Callable:
    """``fn`` through torch.compile (default mode, static shapes: one specialised kernel per shape,
    as a model with fixed sizes gets). Nothing happens until the first call: it raises torch's
    recompile limit and wraps ``fn``; the first call for each shape compiles. The harness checks
    every version once before timing it, so compile time is never timed."""
    compiled_fn = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled_fn
        if compiled_fn is None:
            _raise_recompile_limit()
            compiled_fn = torch.compile(fn, dynamic=False)
        return compiled_fn(*args, **kwargs)

    return call
# --8<-- [end:compiled]


def needs_gpu() -> str | None:
    """For ``Impl(requires=...)``: why a GPU-only baseline cannot run here, or None."""
    return None if torch.cuda.is_available() else "needs a CUDA GPU"


@functools.lru_cache(maxsize=None)
def liger_missing() -> str | None:
    """For ``Impl(requires=...)``: why Liger-Kernel cannot be compared here, or None. It is a
    pure-Python package of Triton kernels for CUDA GPUs: ``pip install liger-kernel``."""
    if not torch.cuda.is_available():
        return "Liger-Kernel runs on CUDA GPUs only"
    try:
        importlib.import_module("liger_kernel")
    except ImportError:
        return "Liger-Kernel is not installed (pip install liger-kernel)"
    return None


@functools.lru_cache(maxsize=None)
def liger(name: str):
    """Liger-Kernel's module ``liger_kernel.ops.<name>`` (``"layer_norm"``, ``"rms_norm"``,
    ``"swiglu"``, ``"rope"``, ``"cross_entropy"``, ...), imported on first use: the package is
    optional (see :func:`liger_missing`)."""
    return importlib.import_module(f"liger_kernel.ops.{name}")


# --8<-- [start:grads_through]
def grads_through(forward: Callable, leaves: tuple[torch.Tensor, ...],
                  grad_out: torch.Tensor | tuple[torch.Tensor, ...] | None = None, *,
                  with_output: bool = False) -> tuple:
    """A training step's two passes through ``forward``, as every forward+backward version times
    them: fresh leaves that require gradients (``detach`` makes views, not copies),
    ``forward(*leaves)``, then ``torch.autograd.grad`` with ``grad_out`` as the incoming gradient
    (a tuple for a forward with several outputs; None for a scalar loss). Returns the leaves'
    gradients, preceded by the detached output if ``with_output``. Arguments that are not leaves
    (a frozen weight, targets) go in through a closure: ``lambda x: f(x, w, targets)``. Grad mode
    is on inside, so a step called under ``torch.no_grad()`` still records its forward."""
    leaves = tuple(t.detach().requires_grad_() for t in leaves)
    with torch.enable_grad():
        out = forward(*leaves)
        grads = torch.autograd.grad(out, leaves, grad_out)
    return (out.detach(), *grads) if with_output else grads
# --8<-- [end:grads_through]
