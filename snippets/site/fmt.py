"""Formatting shared by the site's tables and plots: ceiling names, sizes, times, slugs."""

from __future__ import annotations

import re

CEILING_SHORT = {"copy": "copy", "gemm_fp32": "cuBLAS fp32", "gemm_tf32": "cuBLAS tf32",
                 "gemm_fp16": "cuBLAS fp16", "gemm_bf16": "cuBLAS bf16"}


def _cname(name: str | None) -> str:
    return CEILING_SHORT.get(name, str(name).replace("_", " "))


def _args(text: str) -> tuple[list[str], dict[str, str]]:
    pos, kw = [], {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            kw[k] = v
        else:
            pos.append(tok)
    return pos, kw


def _fmt_size(size: dict) -> str:
    parts = []
    for k in sorted(size):
        v = size[k]
        if isinstance(v, bool):  # before int: a flag such as causal=False is not the number 0
            parts.append(f"{k} = {v}")
        elif isinstance(v, int) and v >= 1024 and (v & (v - 1)) == 0:
            parts.append(f"{k} = 2<sup>{v.bit_length() - 1}</sup>")
        elif isinstance(v, int):
            parts.append(f"{k} = {v:,}")
        else:
            parts.append(f"{k} = {v}")
    return ", ".join(parts)


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.1f} MiB"


# Letters that name a dimension by convention (batch, heads, sequence, head dim, tokens, vocabulary): written as
# the capital letter glued to its value, "B4 H32 S4096 D128", as papers write attention shapes.
DIM_LETTERS = {"b": "B", "h": "H", "hkv": "KV", "s": "S", "d": "D", "t": "T", "v": "V"}


def _sup(base: str, exp: int, html: bool) -> str:
    return f"{base}<sup>{exp}</sup>" if html else f"{base}^{exp}"


def _short_value(key: str, v, html: bool) -> str:
    if isinstance(v, bool):
        return key if v else ""
    if isinstance(v, int) and "bytes" in key and v >= 1024:
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if v >= 1 << shift and v % (1 << shift) == 0:
                return f"{v >> shift} {unit}"
    if isinstance(v, int) and v >= 1 << 16 and (v & (v - 1)) == 0:
        return _sup("2", v.bit_length() - 1, html)
    if isinstance(v, int) and v >= 100_000:
        return f"{v:,}"
    return str(v)


def short_size(size: dict, html: bool = True) -> str:
    """A size as a reader scans it in a table or a legend: ``8192^3`` for a square GEMM, ``16384x4096x14336``
    (M x N x K) otherwise, ``16384x8192`` for rows x columns, ``B4 H32 S4096 D128 causal`` for attention-like
    shapes, ``2^28`` for a lone power-of-two count, and ``name value`` pairs for anything else. ``html=False``
    writes exponents as ``^`` for plots and search text."""
    keys = list(size)
    if {"m", "n", "k"} <= set(keys):
        m, n, k = size["m"], size["n"], size["k"]
        head = _sup(str(m), 3, html) if m == n == k else f"{m}×{n}×{k}"
        # a "shape" key is a label of m, n and k themselves (a sweep's categorical axis): said already
        rest = {key: v for key, v in size.items() if key not in ("m", "n", "k", "shape")}
        return " ".join([head] + ([short_size(rest, html)] if rest else []))
    if set(keys) == {"m", "n"}:
        return f"{size['m']}×{size['n']}"
    if len(keys) == 1 and keys[0] == "n":
        return _short_value("n", size["n"], html)
    parts = []
    for key in keys:
        v = size[key]
        if key in DIM_LETTERS and isinstance(v, int) and not isinstance(v, bool):
            parts.append(f"{DIM_LETTERS[key]}{v}")
        elif isinstance(v, bool):  # a flag reads as its name when set and is left out when not
            parts.append(_short_value(key, v, html))
        else:
            parts.append(f"{key}={_short_value(key, v, html)}")
    return " ".join(p for p in parts if p)
