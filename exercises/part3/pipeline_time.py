"""part3.streams.8: The timeline of a chunked copy-compute-copy pipeline

Chapter: docs/part3/streams.md, exercise 8. Difficulty 3 of 4 (write most of it).

Model the chapter's pipeline on a timeline: the upload of the whole buffer takes t_h, the kernel
t_k and the download t_d; the buffer is split into C equal chunks, chunk c goes to stream c mod S,
and each stream queues its chunk's upload, kernel and download. A stream runs its work in order,
and each of the three units (the H2D copy engine, the SMs, the D2H copy engine) does one chunk's
stage at a time, in the order the chunks were queued. When does the last download end? Compare
with the chapter's bound, and answer exercise 2's question: why do 3 streams do as well as 4, and
8 no better?

Check it:  python -m snippets exercise check part3.streams.8
(--solution checks the reference solution; exercise show part3.streams.8 gives the hint)
"""


def overlap_bound(t_h: float, t_k: float, t_d: float) -> float:
    """The best speed-up over the serial time t_h + t_k + t_d that any schedule of the three stages
    can reach: the sum of the stages over the slowest one."""
    raise NotImplementedError("YOUR CODE HERE")


def pipeline_time(t_h: float, t_k: float, t_d: float, chunks: int, streams: int) -> float:
    """The time at which the last download ends, everything starting at time 0. Each chunk's stage
    takes its share of the whole buffer's time (t_h / chunks, ...); chunk c is queued on stream
    c % streams as upload, kernel, download. An operation starts when both the previous operation of
    its stream and the previous chunk's operation on its unit have ended."""
    # YOUR CODE HERE: keep, for each of the three units and for each stream, the time it is free again
    raise NotImplementedError("YOUR CODE HERE")
