"""part4.softmax.1: The bytes of the three-pass softmax and of v4

A PLANTED WRONG SOLUTION ('three_reads'): the solution with a bug put in on purpose, for the
checker's tests (--planted three_reads checks it).

Chapter: docs/part4/softmax.md, exercise 1. Difficulty 1 of 4 (fill one line).

Compute the bytes of the three-pass softmax (max pass, sum pass, write pass) and of v4 (the
online softmax: a pass for (m, s), a pass to write). At which fraction of the copy rate should
each top out? The rate is reported as 2MN x itemsize over the time, as for every version.

Check it:  python -m snippets exercise check part4.softmax.1
"""


def bytes_three_pass(m: int, n: int, itemsize: int) -> int:
    """A max pass, a sum pass and a write pass over an (m, n) input (the row max and sum stay on the chip)."""
    return 3 * m * n * itemsize + m * itemsize


def bytes_online(m: int, n: int, itemsize: int) -> int:
    """v4: a pass computing (m, s), a pass writing y."""
    return 3 * m * n * itemsize


def top_fraction_three_pass(m: int, n: int, itemsize: int) -> float:
    """The fraction of the copy rate the three-pass kernel can reach (rates count 2 m n itemsize bytes)."""
    return 2 * m * n * itemsize / bytes_three_pass(m, n, itemsize)


def top_fraction_online(m: int, n: int, itemsize: int) -> float:
    return 2 * m * n * itemsize / bytes_online(m, n, itemsize)
