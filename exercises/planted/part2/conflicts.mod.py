"""part2.bank-conflicts.1: Conflict degree by the gcd rule

A PLANTED WRONG SOLUTION ('mod'): the solution with a bug put in on purpose, for the
checker's tests (--planted mod checks it).

Chapter: docs/part2/bank-conflicts.md, exercise 1. Difficulty 1 of 4 (fill one line).

Predict the conflict degree of strides 6, 12, 24 and 48 (and every other stride) with the gcd
rule: a warp reads one column of a float tile whose rows are `stride` words apart, lane i
reading word i * stride. How many words fall in the busiest of the 32 banks?

Check it:  python -m snippets exercise check part2.bank-conflicts.1
"""


BANKS = 32


def conflict_degree(stride: int) -> int:
    """Passes one warp-wide read of a column takes when lane i reads 4-byte word i * stride."""
    return stride % BANKS or BANKS
