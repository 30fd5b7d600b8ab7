"""part2.coalescing.2: Sectors per warp load, for fp32, fp16 and other widths

A PLANTED WRONG SOLUTION ('ignores_itemsize'): the solution with a bug put in on purpose, for the
checker's tests (--planted ignores_itemsize checks it).

Chapter: docs/part2/coalescing.md, exercise 2. Difficulty 2 of 4 (write a few lines).

Redo the sector table for fp16 (2-byte) elements, and for any element size: how many 32-byte
sectors does one warp-wide load touch when lane i reads element i * stride, and what fraction of
the bytes read is used? From which stride on does every lane get a sector of its own?

Check it:  python -m snippets exercise check part2.coalescing.2
"""

SECTOR = 32  # bytes


def sectors_per_request(stride: int, itemsize: int = 4, lanes: int = 32) -> int:
    """Distinct 32-byte sectors touched by one warp-wide load in which lane i reads element i * stride of an
    array of ``itemsize``-byte elements that starts on a sector boundary."""
    return len({(i * stride * 4) // SECTOR for i in range(lanes)})


def used_fraction(stride: int, itemsize: int = 4, lanes: int = 32) -> float:
    """The fraction of the bytes fetched (whole sectors) that the warp uses."""
    return lanes * itemsize / (SECTOR * sectors_per_request(stride, itemsize, lanes))


def first_stride_one_sector_per_lane(itemsize: int) -> int:
    """The smallest stride at which every one of the 32 lanes gets a sector of its own."""
    stride = 1
    while sectors_per_request(stride, itemsize) < 32:
        stride += 1
    return stride
