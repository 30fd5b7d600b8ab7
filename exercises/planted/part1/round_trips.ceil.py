"""part1.why-gpus.5: k operations: PCIe round trips against data kept on the GPU

A PLANTED WRONG SOLUTION ('ceil'): the solution with a bug put in on purpose, for the
checker's tests (--planted ceil checks it).

Chapter: docs/part1/why-gpus.md, exercise 5. Difficulty 2 of 4 (write a few lines).

A program applies k element-wise operations (each reads n elements and writes n) to the same
array. Write the time of doing it with a round trip over PCIe for each operation, and with the
data kept on the GPU, using the bytes model. How large must k be before the one-time transfer
costs less than the operations themselves?

Check it:  python -m snippets exercise check part1.why-gpus.5
"""

import math


def time_round_trips(n: int, k: int, itemsize: int, pcie: float, hbm: float) -> float:
    """Seconds for k operations, each with its own round trip: upload n elements over PCIe (``pcie`` bytes/s
    each way), run the operation on the GPU (read n, write n at ``hbm`` bytes/s), download n."""
    per_op = n * itemsize / pcie + 2 * n * itemsize / hbm + n * itemsize / pcie
    return k * per_op


def time_resident(n: int, k: int, itemsize: int, pcie: float, hbm: float) -> float:
    """Seconds for one upload, the k operations on the GPU, one download."""
    return 2 * n * itemsize / pcie + k * 2 * n * itemsize / hbm


def smallest_k(pcie: float, hbm: float) -> int:
    """The smallest k for which the one-time transfer (upload and download) costs less than the k operations
    themselves (for any n and itemsize)."""
    # transfer 2 n s / pcie < k * 2 n s / hbm  <=>  k > hbm / pcie
    return math.ceil(hbm / pcie)
