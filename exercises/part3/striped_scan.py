"""part3.scan.10: v11's order of additions, bit for bit

Chapter: docs/part3/scan.md, exercise 10. Difficulty 3 of 4 (a function with some thought).

v11 scans a warp's segment where its 16-byte loads put it: row k (the k-th vector load) is 128
consecutive elements, lane l holding elements 4l .. 4l + 3 of the row. Write the segment's
inclusive prefix sums in exactly v11's order of additions (the listing's step 2), so that for
float32 input your result equals the kernel's bit for bit, not just within rounding.

Check it:  python -m snippets exercise check part3.scan.10
(--solution checks the reference solution; exercise show part3.scan.10 gives the hint)
"""

import numpy as np


def warp_inclusive_scan(v: np.ndarray) -> np.ndarray:
    """The book's warp_inclusive_scan on 32 lanes' values: at d = 1, 2, 4, 8, 16 every lane l >= d
    adds the value lane l - d held before that step (a shuffle up by d)."""
    v = v.copy()
    for d in (1, 2, 4, 8, 16):
        v[d:] = v[d:] + v[:-d].copy()
    return v


def striped_scan(segment: np.ndarray) -> np.ndarray:
    """The inclusive prefix sums of one warp's segment (1-D, float32 or int32, a multiple of 128
    elements long), added up in v11's order; the result has the input's dtype."""
    raise NotImplementedError("YOUR CODE HERE")
