"""part8.kv-cache.6: Fork and copy-on-write in a paged cache

Chapter: docs/part8/kv-cache.md, exercise 6. Difficulty 3 of 4 (write most of it).

Write fork and append of a paged cache's bookkeeping, on the book's BlockAllocator (allocate, share,
free, refcount; OutOfBlocks when none is free). fork(parent, child) makes child share every block of
parent (counts up, no copy). append(seq, token) writes one token at position length: a new block
when the last one is full (or there is none), and a private copy of the last block first when
another sequence shares it (copy-on-write). When a block is needed and none is free, OutOfBlocks
must leave everything as it was. The check runs random traces against the book's PagedKVCache.

Check it:  python -m snippets exercise check part8.kv-cache.6
"""

from snippets.part8.kv_cache import BlockAllocator, OutOfBlocks  # noqa: F401 (OutOfBlocks: raised)


class PagedTables:
    """Block tables, lengths and the tokens of a paged cache: ``data[block][slot]`` is the token in
    that slot (it stands for the token's K and V)."""

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int) -> None:
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.data = [[None] * block_size for _ in range(num_blocks)]
        self.tables: dict = {}
        self.length: dict = {}

    def add_sequence(self, seq) -> None:
        """A new, empty sequence: no block until its first token. Given."""
        self.tables[seq], self.length[seq] = [], 0

    def free(self, seq) -> None:
        """The sequence is finished: each of its blocks loses an owner. Given."""
        for block in self.tables.pop(seq):
            self.allocator.free(block)
        del self.length[seq]

    def tokens(self, seq) -> list:
        """The sequence's tokens, read through its block table. Given."""
        n, b = self.length[seq], self.block_size
        return [self.data[self.tables[seq][t // b]][t % b] for t in range(n)]

    def fork(self, parent, child) -> None:
        """``child``: a new sequence equal to ``parent`` that shares all its blocks."""
        raise NotImplementedError("YOUR CODE HERE")

    def append(self, seq, token) -> None:
        """Write ``token`` at position ``length[seq]``: a new block when the last is full (or there
        is none), a private copy of a shared last block first. ValueError when the sequence already
        has max_blocks_per_seq full blocks."""
        raise NotImplementedError("YOUR CODE HERE")
