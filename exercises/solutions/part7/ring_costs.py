"""part7.cost-of-talking.7: The alpha-beta cost of the ring collectives

The reference solution.

Chapter: docs/part7/cost-of-talking.md, exercise 7. Difficulty 1 of 4 (fill one line).

Write the alpha-beta time of the ring reduce-scatter of n bytes per rank (p - 1 steps, each sending
one chunk of n / p bytes), of the ring all-gather of an output of n bytes (each rank contributes
n / p), and of the ring all-reduce of n bytes per rank (a reduce-scatter, then an all-gather), for p
ranks, a latency alpha (seconds) and a bandwidth beta (bytes per second).

Check it:  python -m snippets exercise check part7.cost-of-talking.7
"""


def ring_reduce_scatter_time(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """p - 1 steps; in each, every rank sends one chunk of nbytes / p to its right neighbour."""
    return (p - 1) * alpha + (p - 1) / p * nbytes / beta


def ring_all_gather_time(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """An output of nbytes, n / p from each rank: p - 1 steps of one chunk each."""
    return (p - 1) * alpha + (p - 1) / p * nbytes / beta


def ring_all_reduce_time(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """A reduce-scatter of the nbytes, then an all-gather of the reduced nbytes."""
    reduce_scatter = ring_reduce_scatter_time(nbytes, p, alpha, beta)
    return reduce_scatter + ring_all_gather_time(nbytes, p, alpha, beta)
