"""part2.memory-spaces.6: Project: add shared memory to vector add, and see why it does not help

A PLANTED WRONG SOLUTION ('prediction_faster'): the solution with a bug put in on purpose, for the
checker's tests (--planted prediction_faster checks it).

Chapter: docs/part2/memory-spaces.md, exercise 6. Difficulty 2 of 4 (write a few lines).

A classic first project: make the vector add go through shared memory (each thread stores x[i]
and y[i] in __shared__ arrays, then adds from them). Before you measure, predict with the bytes
model: how many bytes cross DRAM with and without shared memory, how many go through shared
memory, and what speed-up to expect. Write the kernel in the .cu file and the prediction in the
.py file.

Check it:  python -m snippets exercise check part2.memory-spaces.6
"""


def dram_bytes_plain(n: int) -> int:
    """Bytes the plain fp32 vector add moves through DRAM."""
    return 12 * n


def dram_bytes_shared(n: int) -> int:
    """Bytes the shared-memory version moves through DRAM."""
    return 8 * n  # (wrong: shared memory saves a DRAM pass?)


def shared_bytes(n: int) -> int:
    """Bytes the shared-memory version moves through shared memory (stores and loads)."""
    return 2 * 2 * 4 * n  # x and y: each element stored once and loaded once


def predicted_speedup() -> float:
    """The speed-up of the shared-memory version over the plain one that the DRAM bytes predict."""
    return 1.5
