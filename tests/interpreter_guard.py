"""Bounds checks for Triton's CPU interpreter: an out-of-bounds access fails one test instead of the run.

Under ``TRITON_INTERPRET=1`` a ``tl.load`` or ``tl.store`` is a raw read or write at a host address
(``triton/runtime/interpreter.py`` hands the pointers to C): a mask off by one (``rows <= M``) reads
whatever lies past the tensor, or writes over it, and a wild pointer segfaults the Python process,
taking pytest and every later test with it. Triton's interpreter (3.6 to 3.9) has no bounds option of its own,
so :func:`install` adds one: every launch records the storage of each tensor argument (a view's whole
storage, a ``TensorDescriptor``'s base), and every masked load, store and atomic checks, before it
touches memory, that each active lane's element lies inside one of them. A stray lane raises
:class:`OutOfBounds`, which the interpreter turns into the ``InterpreterError`` that fails the test.

Installed by the root conftest.py whenever the interpreter is on (tests, docs code blocks and README
alike); a GPU run is untouched. The cost is a min/max over each pointer block.
"""

from __future__ import annotations

import contextlib

import numpy as np

# ranges: (lo, hi, argument name); reachable: the same for tensors declared with :func:`reachable`
_STATE = {"installed": False, "kernel": "?", "ranges": [], "reachable": []}


def version_problem() -> str | None:
    """Why Triton's interpreter cannot run this suite with the installed versions, or None. Triton 3.6's
    interpreter turns a scalar (a kernel argument, ``tl.program_id``) into a Python int with ``int()`` of
    a one-element array, which NumPy 2.4 refuses: every loop with a runtime bound fails."""
    import triton

    major_minor = tuple(int(x) for x in triton.__version__.split(".")[:2])
    numpy_mm = tuple(int(x) for x in np.__version__.split(".")[:2])
    if major_minor <= (3, 6) and numpy_mm >= (2, 4):
        return (f"Triton {triton.__version__}'s CPU interpreter needs NumPy < 2.4 (installed: "
                f"{np.__version__}): pip install 'numpy<2.4', or a newer Triton")
    return None


class OutOfBounds(IndexError):
    """A kernel under the interpreter touched memory outside every tensor it was given."""


@contextlib.contextmanager
def reachable(*tensors):
    """Within the block, kernels may also touch ``tensors``: memory a kernel reaches through
    addresses it loads (a table of pointers to other ranks' buffers, as symmetric memory hands out)
    rather than through its arguments."""
    extra = _ranges([f"reachable[{i}]" for i in range(len(tensors))], tensors)
    _STATE["reachable"].extend(extra)
    try:
        yield
    finally:
        for r in extra:
            _STATE["reachable"].remove(r)


def _ranges(names, args) -> list[tuple[int, int, str]]:
    """(first byte, one past the last byte, name) of the storage of every tensor among ``args``."""
    out = []

    def visit(name, arg):
        if isinstance(arg, (tuple, list)):
            for i, a in enumerate(arg):
                visit(f"{name}[{i}]", a)
            return
        if not hasattr(arg, "untyped_storage"):  # a TensorDescriptor, a TensorWrapper: their base
            base = getattr(arg, "base", None)
            if base is not None and hasattr(base, "untyped_storage"):
                visit(name, base)
            return
        st = arg.untyped_storage()
        if st.nbytes():
            out.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))

    for name, arg in zip(names, args):
        visit(name, arg)
    return out


_NO_ADDRESS = np.iinfo(np.uint64).max


def _check(what: str, ptrs: np.ndarray, mask, itemsize: int) -> None:
    addr = ptrs if isinstance(ptrs, np.ndarray) and ptrs.dtype == np.uint64 else np.asarray(ptrs, np.uint64)
    if mask is not None:
        mask = np.broadcast_to(mask, addr.shape)
        lo_addr = int(np.min(addr, where=mask, initial=_NO_ADDRESS))
        if lo_addr == _NO_ADDRESS:
            return  # no active lane
        hi_addr = int(np.max(addr, where=mask, initial=0)) + itemsize
    else:
        lo_addr, hi_addr = int(addr.min()), int(addr.max()) + itemsize
    ranges = _STATE["ranges"]
    for lo, hi, _ in ranges:
        if lo <= lo_addr and hi_addr <= hi:
            return  # the usual case: the whole block inside one tensor
    if mask is not None:
        addr = addr[mask]
    ok = np.zeros(addr.shape, dtype=bool)
    for lo, hi, _ in ranges:
        ok |= (addr >= np.uint64(lo)) & (addr <= np.uint64(hi - itemsize))
    if ok.all():
        return
    bad = int(addr[~ok][0])
    near = min(ranges, key=lambda r: min(abs(bad - r[0]), abs(bad - r[1])), default=None)
    where = "no tensor arguments"
    if near is not None:
        lo, hi, name = near
        where = (f"{(bad - hi) // itemsize} elements past the end of {name}" if bad >= hi
                 else f"{(lo - bad) // itemsize} elements before the start of {name}")
    raise OutOfBounds(f"{_STATE['kernel']}: out-of-bounds {what} of {int((~ok).sum())} of {ok.size} "
                      f"active lanes ({itemsize}-byte elements; the first {where})")


def install() -> bool:
    """Add the checks to Triton's interpreter (once). Returns False when Triton has no interpreter to
    patch (another version's layout): the run goes on unguarded."""
    if _STATE["installed"]:
        return True
    try:
        from triton.runtime import interpreter as ti
        builder, executor = ti.InterpreterBuilder, ti.GridExecutor
        originals = (builder.create_masked_load, builder.create_masked_store,
                     builder.create_atomic_rmw, builder.create_atomic_cas, executor._init_args_hst)
    except (ImportError, AttributeError):
        return False
    load, store, rmw, cas, init_args = originals

    # The leading arguments are the same in Triton 3.6 to 3.9; the rest (cache and eviction policies,
    # volatility, memory scope) vary by version and pass through untouched.
    def create_masked_load(self, ptrs, mask, *rest, **kw):
        _check("load", ptrs.data, mask.data, ptrs.get_element_ty().primitive_bitwidth // 8)
        return load(self, ptrs, mask, *rest, **kw)

    def create_masked_store(self, ptrs, value, mask, *rest, **kw):
        _check("store", ptrs.data, mask.data, ptrs.get_element_ty().primitive_bitwidth // 8)
        return store(self, ptrs, value, mask, *rest, **kw)

    def create_atomic_rmw(self, rmw_op, ptr, val, mask, *rest, **kw):
        _check("atomic", ptr.data, mask.data, ptr.get_element_ty().primitive_bitwidth // 8)
        return rmw(self, rmw_op, ptr, val, mask, *rest, **kw)

    def create_atomic_cas(self, ptr, *rest, **kw):
        _check("atomic", ptr.data, None, ptr.get_element_ty().primitive_bitwidth // 8)
        return cas(self, ptr, *rest, **kw)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        _STATE["kernel"] = getattr(self.fn, "__name__", "kernel")
        _STATE["ranges"] = (_ranges(self.arg_names, args_hst)
                            + _ranges(list(kwargs_hst), list(kwargs_hst.values()))
                            + _STATE["reachable"])
        return args_hst, kwargs_hst

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    builder.create_atomic_rmw = create_atomic_rmw
    builder.create_atomic_cas = create_atomic_cas
    executor._init_args_hst = _init_args_hst
    _STATE["installed"] = True
    return True
