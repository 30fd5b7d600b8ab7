"""part2.bank-conflicts.3: The padding that makes column reads conflict-free

The reference solution.

Chapter: docs/part2/bank-conflicts.md, exercise 3. Difficulty 3 of 4 (write most of it).

Padding a tile of float[32][32] by one word fixes column reads. What padding fixes column reads
of a float[32][64] tile? Of a tile of half (2-byte) values, where two values share a bank word?
Write column_degree() (the address model) and smallest_padding(): the fewest elements to add to
each row of a 32-row tile so that a warp reading any one column (lane = row) never has two
different words in one bank.

Check it:  python -m snippets exercise check part2.bank-conflicts.3
"""

BANKS, WORD = 32, 4  # 32 banks of 4-byte words


def column_degree(pitch: int, itemsize: int, col: int, rows: int = 32) -> int:
    """The most distinct 4-byte words in one bank when lane r (r < rows) reads element (r, col) of a tile whose
    rows are ``pitch`` elements of ``itemsize`` bytes long."""
    words = {(r * pitch + col) * itemsize // WORD for r in range(rows)}
    per_bank: dict[int, int] = {}
    for w in words:
        per_bank[w % BANKS] = per_bank.get(w % BANKS, 0) + 1
    return max(per_bank.values())


def smallest_padding(cols: int, itemsize: int) -> int:
    """The fewest elements to add to each row of a [32][cols] tile of ``itemsize``-byte elements so that reading
    any one column is conflict-free (degree 1)."""
    pad = 0
    while any(column_degree(cols + pad, itemsize, c) > 1 for c in range(cols)):
        pad += 1
    return pad
