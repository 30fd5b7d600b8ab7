"""Comparisons that say what is wrong: the first mismatching element (index, got, expected), a shape or dtype
problem, a number off by a recognisable factor."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from exercises.engine import Failure

FACTORS = {1000.0: "1000 (milli- against micro- or seconds?)", 1e-3: "1/1000 (seconds against milliseconds?)",
           1e6: "a million", 1e-6: "a millionth", 1e9: "1e9 (bytes against GB?)", 1e-9: "1e-9 (GB against bytes?)",
           2.0: "2", 0.5: "1/2", 4.0: "4 (bytes per element?)", 0.25: "1/4 (bytes per element?)",
           8.0: "8 (bits against bytes?)", 0.125: "1/8 (bits against bytes?)", 32.0: "32 (a warp?)",
           1 / 32: "1/32 (a warp?)", -1.0: "-1 (the sign)"}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return _fmt(v.item())
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def factor_note(got: float, expected: float) -> str:
    """' (off by a factor of 1000 ...)' when got/expected is a factor a unit slip would give, else ''."""
    try:
        if expected == 0 or got == 0 or not math.isfinite(got):
            return ""
        r = got / expected
    except (TypeError, ZeroDivisionError):
        return ""
    for f, what in FACTORS.items():
        if math.isclose(r, f, rel_tol=1e-6):
            return f" (off by a factor of {what})"
    if math.isclose(r, round(r), rel_tol=1e-9) and 2 <= abs(round(r)) <= 64:
        return f" (off by a factor of {round(r)})"
    return ""


def number(name: str, got: Any, expected: Any, rel: float = 1e-9, abs_: float = 0.0) -> None:
    """``got`` equals ``expected`` (a number, a bool or a string; numbers within rel/abs)."""
    if isinstance(expected, bool) or isinstance(expected, str) or expected is None:
        if got != expected:
            raise Failure(f"{name} = {_fmt(got)}, expected {_fmt(expected)}")
        return
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        raise Failure(f"{name} should be a number, got {type(got).__name__} {_fmt(got)}")
    if not math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_):
        raise Failure(f"{name} = {_fmt(got)}, expected {_fmt(expected)}{factor_note(float(got), float(expected))}")


def value(name: str, got: Any, expected: Any, rel: float = 1e-9, abs_: float = 0.0) -> None:
    """Numbers, or tuples/lists/dicts of numbers, item by item."""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            raise Failure(f"{name} should be a dict with keys {sorted(expected)}, got {type(got).__name__}")
        missing = sorted(set(expected) - set(got))
        if missing:
            raise Failure(f"{name} lacks the key(s) {missing}")
        for k in expected:
            value(f"{name}[{k!r}]", got[k], expected[k], rel, abs_)
        return
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            raise Failure(f"{name} should be a tuple of {len(expected)} values, got {_fmt(got)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            value(f"{name}[{i}]", g, e, rel, abs_)
        return
    number(name, got, expected, rel, abs_)


def call_signature(fn_name: str, args: tuple, kwargs: dict) -> str:
    parts = [_fmt(a) for a in args] + [f"{k}={_fmt(v)}" for k, v in kwargs.items()]
    return f"{fn_name}({', '.join(parts)})"


def functions(fn_name: str, got_fn: Callable, expected_fn: Callable, cases: Iterable[Any],
              rel: float = 1e-9, abs_: float = 0.0) -> int:
    """Call ``got_fn`` and ``expected_fn`` on every parameter set (a tuple of args, or a dict of kwargs) and
    compare the results. Returns the number of cases."""
    if not callable(got_fn):
        raise Failure(f"{fn_name} is missing or not a function")
    n = 0
    for case in cases:
        args, kwargs = ((), case) if isinstance(case, dict) else (tuple(case), {})
        where = call_signature(fn_name, args, kwargs)
        expected = expected_fn(*args, **kwargs)
        try:
            got = got_fn(*args, **kwargs)
        except Failure:
            raise
        except NotImplementedError as exc:
            raise Failure(f"{fn_name} is not written yet ({exc or 'NotImplementedError'})") from exc
        except Exception as exc:  # noqa: BLE001
            raise Failure(f"{where} raised {type(exc).__name__}: {exc}") from exc
        value(where, got, expected, rel, abs_)
        n += 1
    return n


def tensors(name: str, got: Any, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6,
            check_dtype: bool = True) -> None:
    """``got`` has ``expected``'s shape (and dtype) and every element is within atol + rtol * |expected|
    (NaN matches only NaN). On failure: the first mismatching element, its index and both values."""
    if not isinstance(got, torch.Tensor):
        raise Failure(f"{name} should be a torch.Tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise Failure(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if check_dtype and got.dtype != expected.dtype:
        raise Failure(f"{name} has dtype {got.dtype}, expected {expected.dtype}")
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    both_nan = torch.isnan(g) & torch.isnan(e)
    close = ((g - e).abs() <= atol + rtol * e.abs()) | both_nan | ((g == e) & torch.isinf(e))
    if bool(close.all()):
        return
    bad = (~close).nonzero()
    first = tuple(int(i) for i in bad[0])
    gv, ev = float(g[first]), float(e[first])
    idx = ", ".join(map(str, first))
    tol = atol + rtol * abs(ev) if math.isfinite(ev) else 0.0
    if math.isnan(gv):
        why = " (nan: an element the kernel never wrote, a 0/0, or an exp that overflowed)"
    elif math.isinf(gv):
        why = " (inf: an overflow)"
    else:
        why = f" (|difference| {abs(gv - ev):.3g} > tolerance {tol:.3g}){factor_note(gv, ev)}"
    count = f"{bad.shape[0]} of {close.numel()} elements differ"
    if g.dim() == 2 and bad.shape[0] > 1:
        rows = sorted({int(r) for r in bad[:, 0]})
        cols = sorted({int(c) for c in bad[:, 1]})
        count += (f" (rows {span(rows)}, columns {span(cols)})")
    elif g.dim() == 1 and bad.shape[0] > 1:
        count += f" (indices {span([int(i) for i in bad[:, 0]])})"
    raise Failure(f"{name}[{idx}] = {gv:.6g}, expected {ev:.6g}{why}; {count}")


def span(xs: list[int]) -> str:
    if len(xs) <= 6:
        return ", ".join(map(str, xs))
    return f"{xs[0]}..{xs[-1]}, {len(xs)} of them"
