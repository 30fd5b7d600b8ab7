"""Library baselines that more than one Part 4 op compares against: torch.compile and Liger-Kernel.

Both are optional in a way torch eager is not: torch.compile needs a GPU here (on the CPU it would
need a C++ toolchain and compile times the test suite cannot afford), and Liger-Kernel is a separate
package. A version that uses one declares ``requires=`` on its :class:`~snippets.registry.Impl`, so
tests skip it and the harness leaves it out, with the reason, where it cannot run.
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
    as a model with fixed sizes gets). The first call for a shape compiles; the harness checks every
    version once before timing it, so compile time is never timed."""
    _raise_recompile_limit()
    return torch.compile(fn, dynamic=False)
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


# --8<-- [start:grads_through]
def grads_through(forward: Callable, leaves: tuple[torch.Tensor, ...],
                  grad_out: torch.Tensor) -> tuple:
    """A training step's two passes through ``forward``, as every forward+backward version times
    them: fresh leaves that require gradients (``detach`` makes views, not copies),
    ``forward(*leaves)``, then ``torch.autograd.grad`` with ``grad_out`` as the incoming gradient.
    Returns the leaves' gradients."""
    leaves = tuple(t.detach().requires_grad_() for t in leaves)
    return torch.autograd.grad(forward(*leaves), leaves, grad_out)
# --8<-- [end:grads_through]
