"""part1.why-gpus.2: Little's law on an H200

A PLANTED WRONG SOLUTION ('floor'): the solution with a bug put in on purpose, for the
checker's tests (--planted floor checks it).

Chapter: docs/part1/why-gpus.md, exercise 2. Difficulty 1 of 4 (fill one line).

Redo the Little's-law calculation for an H200, whose datasheet gives 4.8 TB/s, with the same
assumed latency (500 ns). How many bytes must each of its 132 SMs keep in flight? With 2048
resident threads per SM, how many 16-byte loads must each thread have outstanding? Write the
three functions; the check tries them on the H100 and H200 and on other GPUs, latencies and load
widths.

Check it:  python -m snippets exercise check part1.why-gpus.2
"""



def bytes_in_flight(bandwidth: float, latency: float) -> float:
    """Bytes that must be in flight to sustain ``bandwidth`` (bytes/s) with a ``latency`` (s) per access."""
    return bandwidth * latency


def bytes_per_sm(bandwidth: float, latency: float, sms: int) -> float:
    """The share of each of ``sms`` SMs."""
    return bytes_in_flight(bandwidth, latency) / sms


def loads_per_thread(bandwidth: float, latency: float, sms: int, threads_per_sm: int = 2048,
                     load_bytes: int = 16) -> int:
    """How many ``load_bytes``-byte loads each of an SM's resident threads must have outstanding (a whole
    number)."""
    return int(bytes_per_sm(bandwidth, latency, sms) / (threads_per_sm * load_bytes))
