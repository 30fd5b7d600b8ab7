"""The cost of talking: the alpha-beta model of one message, and what it predicts for the
collectives of Part 7.

A message of ``n`` bytes from one rank to another takes ``alpha + n / beta`` seconds. ``alpha`` (in
seconds) is what every message pays whatever its size: the software on both ends, the launch of the
copy, the link's latency. ``beta`` (in bytes per second) is the bandwidth of the link the message
crosses. A collective is a schedule of such messages; the functions below add up the messages on the
schedule's critical path, under three assumptions that each docstring repeats where it matters:

- every pair of ranks that talks has a link of its own, with the same ``alpha`` and ``beta``;
- a rank can send and receive at the same time, on all its links at once (full duplex);
- the arithmetic of a reduction (adding what arrived) costs nothing next to moving it.

``n`` is always the size of the data one rank holds: the vector each rank all-reduces, the whole
input of a reduce-scatter, the whole output of an all-gather, everything one rank sends in an
all-to-all. That is the convention of NCCL's tests (``nccl-tests``), whose *algorithm bandwidth* is
``n / time`` and whose *bus bandwidth* rescales it into the bandwidth each link needed
(:func:`bus_bandwidth`).

:func:`fit_alpha_beta` goes the other way: from a sweep of measured (size, time) pairs it finds the
``alpha`` and ``beta`` that explain them, and says how far each point is from the fitted line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


def _check(nbytes: float, p: int, alpha_s: float, beta_bytes_per_s: float, name: str) -> None:
    if not nbytes >= 0:
        raise ValueError(f"{name}: nbytes must be >= 0, got {nbytes!r}")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"{name}: p (the number of ranks) must be an int >= 1, got {p!r}")
    if not alpha_s >= 0:
        raise ValueError(f"{name}: alpha_s must be >= 0, got {alpha_s!r}")
    if not beta_bytes_per_s > 0:
        raise ValueError(f"{name}: beta_bytes_per_s must be > 0, got {beta_bytes_per_s!r}")


def send_time(nbytes: float, alpha_s: float, beta_bytes_per_s: float) -> float:
    """One message of ``nbytes`` from one rank to another: alpha + n / beta."""
    _check(nbytes, 1, alpha_s, beta_bytes_per_s, "send_time")
    return alpha_s + nbytes / beta_bytes_per_s


def ring_reduce_scatter_time(nbytes: float, p: int, alpha_s: float,
                             beta_bytes_per_s: float) -> float:
    """Ring reduce-scatter of ``nbytes`` per rank (the whole input): p - 1 steps, in each of which
    every rank sends one chunk of n / p bytes to its right neighbour while it receives one from its
    left:

        (p - 1) alpha + (p - 1) / p * n / beta
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "ring_reduce_scatter_time")
    return (p - 1) * alpha_s + (p - 1) / p * nbytes / beta_bytes_per_s


def ring_all_gather_time(nbytes: float, p: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Ring all-gather of an output of ``nbytes`` (each rank contributes n / p): p - 1 steps of one
    chunk each, as the reduce-scatter:

        (p - 1) alpha + (p - 1) / p * n / beta
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "ring_all_gather_time")
    return (p - 1) * alpha_s + (p - 1) / p * nbytes / beta_bytes_per_s


def ring_all_reduce_time(nbytes: float, p: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Ring all-reduce of ``nbytes`` per rank: a reduce-scatter, then an all-gather:

        2 (p - 1) alpha + 2 (p - 1) / p * n / beta

    The bandwidth term tends to 2 n / beta as p grows, whatever p: every rank sends (and receives)
    almost twice its data, and no all-reduce can do with less (see the chapter).
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "ring_all_reduce_time")
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * nbytes / beta_bytes_per_s


def tree_depth(p: int) -> int:
    """Depth of the binary tree of ``collectives.tree_all_reduce`` (rank r's children are 2r + 1 and
    2r + 2): floor(log2 p) levels below rank 0."""
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"tree_depth: p must be an int >= 1, got {p!r}")
    return p.bit_length() - 1


def tree_all_reduce_time(nbytes: float, p: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Binary-tree all-reduce of ``nbytes`` per rank, whole messages: a reduce up the tree to rank
    0, then a broadcast down it. A parent receives from its two children at once (two links), so
    each level costs one message, and each phase crosses D = floor(log2 p) levels:

        2 D (alpha + n / beta)

    Few steps (log p instead of p), but every step carries the whole vector. NCCL's tree pipelines
    the vector in small pieces down two trees at once, which removes most of the factor D from the
    bandwidth term; this model is of the unpipelined tree built here.
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "tree_all_reduce_time")
    return 2 * tree_depth(p) * (alpha_s + nbytes / beta_bytes_per_s)


def halving_doubling_all_reduce_time(nbytes: float, p: int, alpha_s: float,
                                     beta_bytes_per_s: float) -> float:
    """Recursive halving (a reduce-scatter) then recursive doubling (an all-gather), p a power of
    two (Rabenseifner's algorithm). Step k (from 1) of the halving exchanges n / 2^k bytes with the
    rank whose index differs in one bit; the log2 p steps send n/2 + n/4 + ... + n/p, that is
    (p - 1)/p n; the doubling mirrors them:

        2 log2(p) alpha + 2 (p - 1) / p * n / beta

    The tree's few steps and the ring's bandwidth at once, but only for p a power of two.
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "halving_doubling_all_reduce_time")
    if p & (p - 1):
        raise ValueError(f"halving_doubling_all_reduce_time: p must be a power of two, got {p}")
    steps = p.bit_length() - 1
    return 2 * steps * alpha_s + 2 * (p - 1) / p * nbytes / beta_bytes_per_s


def all_to_all_time(nbytes: float, p: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Pairwise-exchange all-to-all, each rank sending ``nbytes`` in all (n / p to every rank,
    itself included): p - 1 steps, in step s rank r sends to r + s and receives from r - s:

        (p - 1) alpha + (p - 1) / p * n / beta
    """
    _check(nbytes, p, alpha_s, beta_bytes_per_s, "all_to_all_time")
    return (p - 1) * alpha_s + (p - 1) / p * nbytes / beta_bytes_per_s


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """NCCL's *algorithm bandwidth* of a collective: the data size n over the time, bytes/s."""
    if not nbytes >= 0 or not seconds > 0:
        raise ValueError(f"algorithm_bandwidth: need nbytes >= 0 and seconds > 0, "
                         f"got {nbytes!r}, {seconds!r}")
    return nbytes / seconds


# --8<-- [start:bus_bandwidth]
# How many bytes each link must carry, as a fraction of n, for each collective when it is run by
# the bandwidth-optimal algorithm: NCCL's factors for bus bandwidth (nccl-tests, PERFORMANCE.md).
BUS_FACTORS = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "send_recv": lambda p: 1.0,
}


def bus_bandwidth(algbw: float, op: str, p: int) -> float:
    """NCCL's *bus bandwidth*: the algorithm bandwidth times the fraction of n that each link must
    carry, so that it can be compared with a link's bandwidth whatever p is:

    - all_reduce: algbw * 2 (p - 1) / p
    - reduce_scatter, all_gather, all_to_all: algbw * (p - 1) / p
    - broadcast, reduce, send_recv: algbw
    """
    if op not in BUS_FACTORS:
        raise ValueError(f"bus_bandwidth: op must be one of {sorted(BUS_FACTORS)}, got {op!r}")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"bus_bandwidth: p must be an int >= 1, got {p!r}")
    if not algbw >= 0:
        raise ValueError(f"bus_bandwidth: algbw must be >= 0, got {algbw!r}")
    return algbw * BUS_FACTORS[op](p)
# --8<-- [end:bus_bandwidth]


# --8<-- [start:fit]
class AlphaBetaFit(NamedTuple):
    alpha_s: float           # the fitted latency, s
    beta_bytes_per_s: float  # the fitted bandwidth, bytes/s
    rel_errors: list[float]  # (predicted - measured) / measured, one per point of the sweep


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> AlphaBetaFit:
    """The ``alpha`` and ``beta`` of ``t = alpha + n / beta`` that fit a sweep of message sizes
    (bytes) and times (seconds), and each point's relative error.

    A least-squares fit of the *relative* error: every point is divided by its own time before the
    fit (weights 1 / t). A sweep spans many decades of size; an ordinary least-squares fit of the
    times would be decided by the largest messages alone and could miss ``alpha`` entirely. Data
    that lie exactly on such a line are recovered exactly (to rounding). ``alpha`` is kept >= 0:
    where the free fit puts it below zero, the fit is redone with ``alpha = 0``.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"fit_alpha_beta: sizes and times must be 1-D of one length, "
                         f"got shapes {n.shape} and {t.shape}")
    if len(np.unique(n)) < 2:
        raise ValueError("fit_alpha_beta: need at least two different sizes")
    if not (np.all(np.isfinite(n)) and np.all(n >= 0)):
        raise ValueError(f"fit_alpha_beta: sizes must be finite and >= 0, got {n.tolist()}")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError(f"fit_alpha_beta: times must be finite and > 0, got {t.tolist()}")
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]   # rows (1, n) / t
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0:
        # a latency below zero means nothing: noise in the small messages' times pulled the line
        # under the origin. The best line with alpha = 0 then minimises sum (n/t * inv_beta - 1)^2.
        x = n / t
        alpha, inv_beta = 0.0, float(np.sum(x) / np.sum(x * x))
    if not inv_beta > 0:
        raise ValueError("fit_alpha_beta: the times do not grow with the size; no bandwidth fits")
    predicted = alpha + n * inv_beta
    return AlphaBetaFit(float(alpha), float(1.0 / inv_beta), ((predicted - t) / t).tolist())
# --8<-- [end:fit]


# --8<-- [start:piecewise]
class Piece(NamedTuple):
    lo_bytes: float                 # the smallest size of the sweep this piece was fitted to
    hi_bytes: float                 # the largest
    alpha_s: float
    beta_bytes_per_s: float | None  # None: the times of this range do not grow with the size


class PiecewiseFit(NamedTuple):
    pieces: list[Piece]     # by size; consecutive ranges of the sweep
    rel_errors: list[float]  # one per point of the sweep, in the order of the sizes


def _fit_range(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(alpha, 1/beta) >= 0 minimising the squared relative error of alpha + n/beta over one range:
    the free fit when both come out >= 0, else the better of alpha = 0 and 1/beta = 0."""
    a, b = np.stack([np.ones_like(n), n], axis=1) / t[:, None], np.ones_like(t)
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, b, rcond=None)
    if alpha >= 0 and inv_beta >= 0:
        # a size term below rounding at the range's largest size is no bandwidth: a flat range
        return float(alpha), (float(inv_beta) if inv_beta * n[-1] > 1e-9 * alpha else 0.0)
    x, y = n / t, 1 / t
    options = [(0.0, float(np.sum(x) / np.sum(x * x)) if np.any(x > 0) else 0.0),
               (float(np.sum(y) / np.sum(y * y)), 0.0)]
    return min(options, key=lambda o: float(np.sum((o[0] * y + o[1] * x - 1) ** 2)))


def fit_piecewise(sizes: Sequence[float], times: Sequence[float], max_pieces: int = 3,
                  min_points: int = 3) -> PiecewiseFit:
    """An alpha and a beta per range of sizes: the sweep is cut into at most ``max_pieces``
    consecutive ranges of at least ``min_points`` sizes each, every range gets its own fit of the
    relative error (alpha and 1/beta kept >= 0), and the cut whose worst relative error is
    smallest wins.

    This is how NCCL's own tuner models a collective: one latency and one bandwidth per protocol,
    each protocol used over a range of sizes. With ``max_pieces=1`` it is one line, as
    :func:`fit_alpha_beta` fits (with the same weights)."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"fit_piecewise: sizes and times must be 1-D of one length, "
                         f"got shapes {n.shape} and {t.shape}")
    if not (np.all(np.isfinite(n)) and np.all(n >= 0) and np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("fit_piecewise: sizes must be finite and >= 0, times finite and > 0")
    if not (isinstance(max_pieces, int) and max_pieces >= 1 and isinstance(min_points, int)
            and min_points >= 2):
        raise ValueError(f"fit_piecewise: need max_pieces >= 1 and min_points >= 2, got "
                         f"{max_pieces!r} and {min_points!r}")
    if len(n) < min_points:
        raise ValueError(f"fit_piecewise: need at least {min_points} points, got {len(n)}")
    order = np.argsort(n, kind="stable")
    n, t = n[order], t[order]
    if np.any(np.diff(n) == 0):
        raise ValueError("fit_piecewise: every size must appear once")
    best = None
    for k in range(1, max_pieces + 1):
        for cuts in _cuts(len(n), k, min_points):
            bounds = [0, *cuts, len(n)]
            pieces, pred = [], np.empty_like(t)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                alpha, inv_beta = _fit_range(n[lo:hi], t[lo:hi])
                pred[lo:hi] = alpha + n[lo:hi] * inv_beta
                pieces.append(Piece(float(n[lo]), float(n[hi - 1]), alpha,
                                    1.0 / inv_beta if inv_beta > 0 else None))
            worst = float(np.max(np.abs(pred - t) / t))
            if best is None or worst < best[0] - 1e-12:   # ties: the fewest pieces
                rel = np.empty_like(t)
                rel[order] = (pred - t) / t
                best = (worst, PiecewiseFit(pieces, rel.tolist()))
    return best[1]


def _cuts(count: int, k: int, min_points: int, start: int = 0):
    """Every way to cut ``count`` points from ``start`` into ``k`` ranges of >= ``min_points``."""
    if k == 1:
        if count - start >= min_points:
            yield []
        return
    for cut in range(start + min_points, count - min_points * (k - 1) + 1):
        for rest in _cuts(count, k - 1, min_points, cut):
            yield [cut, *rest]


def predict_piecewise(fit: PiecewiseFit, nbytes: float) -> float:
    """The time the fit predicts for a message of ``nbytes``: the piece whose range holds it (below
    the first range: the first piece; between two ranges: the lower one)."""
    piece = fit.pieces[0]
    for p in fit.pieces:
        if nbytes >= p.lo_bytes:
            piece = p
    return piece.alpha_s + (nbytes / piece.beta_bytes_per_s if piece.beta_bytes_per_s else 0.0)
# --8<-- [end:piecewise]


def crossover_bytes(p: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """The message size above which the ring all-reduce beats the unpipelined binary tree of
    ``collectives.tree_all_reduce`` on p ranks: where 2 D (alpha + n / beta) equals
    2 (p - 1) alpha + 2 (p - 1) / p * n / beta, with D = floor(log2 p), that is

        n = alpha beta (p - 1 - D) / (D - (p - 1) / p)

    0 for p <= 2, where the ring is never slower."""
    _check(0, p, alpha_s, beta_bytes_per_s, "crossover_bytes")
    if p <= 2:
        return 0.0
    d = tree_depth(p)
    return alpha_s * beta_bytes_per_s * (p - 1 - d) / (d - (p - 1) / p)
