"""part2.managing-memory.6: Pageable against pinned: the staging pipeline, and when pinning pays

Chapter: docs/part2/managing-memory.md, exercise 6. Difficulty 3 of 4 (write most of it).

Model the two kinds of host-to-device copy, with the link's rate, the CPU's memcpy rate, the chunk
size and the fixed cost of a call as parameters. A copy from pinned memory is one DMA transfer. A
copy from pageable memory goes through the staging buffer: the CPU copies chunk after chunk while
the DMA engine moves the previous one. Write the time of each, then the number of transfers of the
same buffer after which pinning it pays for itself. Why does a copy smaller than one chunk gain
nothing from the overlap? Why does pinning pay for itself after a few transfers when the CPU copies
more slowly than the link, but only after many more when it copies faster?

Check it:  python -m snippets exercise check part2.managing-memory.6
(--solution checks the reference solution; exercise show part2.managing-memory.6 gives the hint)
"""


def pinned_time(nbytes: int, link: float, overhead: float) -> float:
    """Seconds to copy ``nbytes`` from pinned memory to the device: the fixed cost of a call
    (``overhead`` seconds) and one DMA transfer at ``link`` bytes/s."""
    raise NotImplementedError("YOUR CODE HERE")


def pageable_time(nbytes: int, link: float, memcpy: float, chunk: int, overhead: float) -> float:
    """Seconds to copy ``nbytes`` from pageable memory to the device, staged in chunks of ``chunk``
    bytes (the last chunk holds what is left). The CPU copies chunk after chunk into the staging
    buffers at ``memcpy`` bytes/s, never waiting (there are enough buffers); the DMA engine moves a
    chunk at ``link`` bytes/s once the CPU has copied it and the DMA of the previous chunk is done.
    Plus the fixed cost of the call, ``overhead`` seconds."""
    raise NotImplementedError("YOUR CODE HERE")


def transfers_to_pay_off(nbytes: int, link: float, memcpy: float, chunk: int, overhead: float,
                         pin_rate: float) -> int:
    """The smallest number k of host-to-device copies of the same ``nbytes`` buffer for which
    pinning it once (``nbytes / pin_rate`` seconds) and making k pinned copies takes less time than
    k pageable copies."""
    raise NotImplementedError("YOUR CODE HERE")
