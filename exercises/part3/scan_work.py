"""part3.scan.1: The additions of Kogge-Stone and Brent-Kung

Chapter: docs/part3/scan.md, exercise 1. Difficulty 2 of 4 (write a few lines).

Count the additions of Kogge-Stone and Brent-Kung for a 1024-element tile (and any power of
two). At what tile size does Brent-Kung do ten times fewer?

Check it:  python -m snippets exercise check part3.scan.1
(--solution checks the reference solution; exercise show part3.scan.1 gives the hint)
"""



def kogge_stone_adds(n: int) -> int:
    """Additions of a Kogge-Stone inclusive scan of n elements (n a power of two)."""
    raise NotImplementedError("YOUR CODE HERE")


def brent_kung_adds(n: int) -> int:
    """Additions of the chapter's Brent-Kung inclusive scan (up-sweep and down-sweep) of n elements."""
    raise NotImplementedError("YOUR CODE HERE")


def tenfold_tile() -> int:
    """The smallest power-of-two tile for which Brent-Kung does at least ten times fewer additions."""
    raise NotImplementedError("YOUR CODE HERE")
