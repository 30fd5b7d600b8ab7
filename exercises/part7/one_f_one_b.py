"""part7.pipeline-parallel.9: The 1F1B schedule and its bubble

Chapter: docs/part7/pipeline-parallel.md, exercise 9. Difficulty 3 of 4 (write most of it).

Write one_f_one_b_schedule(p, m): for each of p stages, the list of its actions ("F", i) and
("B", i) over m micro-batches under 1F1B. Stage s first forwards w = min(p - s - 1, m) micro-batches
(the warm-up), then alternates one forward and one backward (F(i + w), then B(i)), then backwards
what is left. Write bubble(p, m), the idle fraction with equal action times, and peak_in_flight(
actions), the most micro-batches a stage holds forwarded but not yet backwarded. The check compares
the schedules with the book's and runs them through the book's simulate.

Check it:  python -m snippets exercise check part7.pipeline-parallel.9
"""

from fractions import Fraction


def one_f_one_b_schedule(p: int, m: int) -> list[list[tuple[str, int]]]:
    """Stage s's actions, for s = 0 .. p - 1."""
    raise NotImplementedError("YOUR CODE HERE")


def bubble(p: int, m: int) -> Fraction:
    """The idle fraction of p stages running m micro-batches with equal forward and backward
    times: (p - 1) / (m + p - 1), exactly."""
    raise NotImplementedError("YOUR CODE HERE")


def peak_in_flight(actions: list[tuple[str, int]]) -> int:
    """The most micro-batches forwarded and not yet backwarded at any point of ``actions``."""
    raise NotImplementedError("YOUR CODE HERE")
