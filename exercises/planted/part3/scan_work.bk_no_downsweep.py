"""part3.scan.1: The additions of Kogge-Stone and Brent-Kung

A PLANTED WRONG SOLUTION ('bk_no_downsweep'): the solution with a bug put in on purpose, for the
checker's tests (--planted bk_no_downsweep checks it).

Chapter: docs/part3/scan.md, exercise 1. Difficulty 2 of 4 (write a few lines).

Count the additions of Kogge-Stone and Brent-Kung for a 1024-element tile (and any power of
two). At what tile size does Brent-Kung do ten times fewer?

Check it:  python -m snippets exercise check part3.scan.1
"""



def kogge_stone_adds(n: int) -> int:
    """Additions of a Kogge-Stone inclusive scan of n elements (n a power of two)."""
    total, d = 0, 1
    while d < n:
        total += n - d
        d *= 2
    return total


def brent_kung_adds(n: int) -> int:
    """Additions of the chapter's Brent-Kung inclusive scan (up-sweep and down-sweep) of n elements."""
    return n - 1


def tenfold_tile() -> int:
    """The smallest power-of-two tile for which Brent-Kung does at least ten times fewer additions."""
    n = 2
    while kogge_stone_adds(n) < 10 * brent_kung_adds(n):
        n *= 2
    return n
