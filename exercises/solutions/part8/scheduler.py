"""part8.serving.7: Continuous batching: admission and preemption

The reference solution.

Chapter: docs/part8/serving.md, exercise 7. Difficulty 3 of 4 (write most of it).

The step loop of a continuous-batching engine (no chunked prefill) is given; write its two
decisions. admit: first come, first served, while the batch has a free slot and the free blocks hold
the waiting request's tokens to prefill (stop at the first that does not fit). make_room: before a
decode step, each running sequence (in order of admission) needs a block when its last one is full;
when none is free, preempt the latest admitted running sequence (free its blocks; it goes back to
the front of the queue, to be prefilled again over its prompt and the tokens it emitted) and try
again. The check replays traces through the book's simulator and compares every request's token
steps.

Check it:  python -m snippets exercise check part8.serving.7
"""

from snippets.part8.kv_cache import BlockAllocator, OutOfBlocks


class Seq:
    """A request in the engine: ``cached`` tokens in the cache, ``target`` tokens to prefill before
    its next token (prompt + tokens emitted), its blocks, and the steps at which it emitted
    tokens."""

    def __init__(self, rid: int, prompt: int, output: int) -> None:
        self.rid, self.prompt, self.output = rid, prompt, output
        self.generated, self.cached, self.target = 0, 0, prompt
        self.blocks: list[int] = []
        self.token_steps: list[int] = []
        self.preempted = 0

    @property
    def prefilling(self) -> bool:
        return self.cached < self.target


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def grow(s: Seq, tokens: int, alloc: BlockAllocator, block_size: int) -> None:
    """Blocks for ``tokens`` cached tokens (OutOfBlocks, before any change, when one is missing)."""
    need = blocks_for(tokens, block_size) - len(s.blocks)
    if need > alloc.num_free:
        raise OutOfBlocks(f"request {s.rid} needs {need} block(s), {alloc.num_free} free")
    for _ in range(need):
        s.blocks.append(alloc.allocate())


def release(s: Seq, alloc: BlockAllocator) -> None:
    for b in s.blocks:
        alloc.free(b)
    s.blocks = []


def admit(waiting: list[Seq], running: list[Seq], alloc: BlockAllocator, block_size: int,
          max_batch: int) -> None:
    """Move requests from the front of ``waiting`` to the end of ``running`` (their blocks for
    ``target`` tokens allocated) while there is a slot and they fit; first come, first served."""
    while waiting and len(running) < max_batch:
        s = waiting[0]
        if blocks_for(s.target, block_size) > alloc.num_free:
            break                                  # the head does not fit: nobody overtakes it
        grow(s, s.target, alloc, block_size)
        running.append(waiting.pop(0))


def make_room(running: list[Seq], waiting: list[Seq], alloc: BlockAllocator,
              block_size: int) -> int:
    """Before a decode step: each running sequence, in order, gets the block for its next token;
    when none is free, the latest admitted is preempted (recompute later). Returns the
    preemptions."""
    preemptions = 0
    for s in list(running):
        while s in running:
            try:
                grow(s, s.cached + 1, alloc, block_size)
                break
            except OutOfBlocks:
                victim = running.pop()             # the latest admitted
                release(victim, alloc)
                victim.cached, victim.target = 0, victim.prompt + victim.generated
                victim.preempted += 1
                preemptions += 1
                waiting.insert(0, victim)
    return preemptions


def serve(requests: list[tuple[int, int]], num_blocks: int, block_size: int, max_batch: int):
    """Every request (prompt, output) waiting at step 0. Returns (the Seqs, by request id, with the
    steps of their tokens; the number of steps; the preemptions). A step that has prompts to prefill
    runs only them (each emits its next token); otherwise it decodes every running sequence.
    Given."""
    alloc = BlockAllocator(num_blocks)
    seqs = [Seq(i, p, o) for i, (p, o) in enumerate(requests)]
    waiting, running, step, preemptions = list(seqs), [], 0, 0
    while waiting or running:
        admit(waiting, running, alloc, block_size, max_batch)
        if not running:
            raise RuntimeError(f"step {step}: nothing runs and request {waiting[0].rid} never fits")
        prefills = [s for s in running if s.prefilling]
        if prefills:
            for s in prefills:
                s.cached = s.target
                s.generated += 1
                s.token_steps.append(step)
        else:
            preemptions += make_room(running, waiting, alloc, block_size)
            for s in running:
                s.cached += 1
                s.generated += 1
                s.token_steps.append(step)
        for s in [s for s in running if s.generated == s.output]:
            running.remove(s)
            release(s, alloc)
        step += 1
    return seqs, step, preemptions
