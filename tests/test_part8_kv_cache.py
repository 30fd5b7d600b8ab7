"""The KV caches: the block allocator's free list and reference counts, paged appends that open a
block every block_size tokens, fork without copying, copy-on-write of a shared last block, free on
finish, gathering equal to the contiguous cache, the fragmentation of both caches in exact numbers,
and the errors a scheduler relies on (OutOfBlocks before any change) or a caller's bug produces
(appending past the table, freeing twice)."""

from __future__ import annotations

import pytest
import torch

from snippets.part8.kv_cache import (
    BlockAllocator,
    ContiguousKVCache,
    OutOfBlocks,
    PagedKVCache,
    contiguous_waste,
    paged_waste,
)

H, D = 2, 4


def _token(seq, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A token's K and V that say which sequence and position they are: no two alike."""
    tag = seq if isinstance(seq, int) else sum(map(ord, seq))
    k = torch.full((H, D), 1000.0 * tag + t) + torch.arange(H * D).view(H, D) / 100
    return k, -k


def _fill(cache, seq, n, start=0, tag=None):
    for t in range(start, start + n):
        cache.append(seq, *_token(seq if tag is None else tag, t))


# ---------------------------------------------------------------- the allocator

def test_allocator_free_list_and_refcounts():
    a = BlockAllocator(3)
    assert [a.allocate(), a.allocate()] == [0, 1] and a.num_free == 1
    a.share(1)
    assert a.refcount(1) == 2
    a.free(1)
    assert a.refcount(1) == 1 and a.num_free == 1      # still owned once
    a.free(1)
    assert a.refcount(1) == 0 and a.num_free == 2
    assert a.allocate() == 1                           # the block freed last comes back first
    assert a.allocate() == 2
    with pytest.raises(OutOfBlocks, match="all 3 blocks"):
        a.allocate()


def test_allocator_errors():
    a = BlockAllocator(2)
    with pytest.raises(ValueError, match="already free"):
        a.free(0)
    with pytest.raises(ValueError, match="is free"):
        a.share(1)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        a.free(2)
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        BlockAllocator(0)


# ---------------------------------------------------------------- the paged cache

def _paged(num_blocks=8, block_size=4, width=4):
    return PagedKVCache(num_blocks, block_size, H, D, max_blocks_per_seq=width)


def test_append_opens_a_block_every_block_size_tokens():
    c = _paged()
    c.add_sequence("a")
    assert c.tables["a"] == [] and c.slots_reserved() == 0
    _fill(c, "a", 4)
    assert c.tables["a"] == [0]
    _fill(c, "a", 1, start=4)
    assert c.tables["a"] == [0, 1] and c.length["a"] == 5
    assert c.slots_reserved() == 8


@pytest.mark.parametrize("lengths", [[1], [4, 7, 13], [16, 2, 9, 5]])
def test_gather_equals_the_contiguous_cache(lengths):
    paged = PagedKVCache(16, 4, H, D, max_blocks_per_seq=4)
    flat = ContiguousKVCache(len(lengths), 16, H, D)
    for s in range(len(lengths)):
        paged.add_sequence(s)
        flat.add_sequence(s)
    # interleaved appends: each sequence's blocks are scattered over the cache
    for t in range(max(lengths)):
        for s, n in enumerate(lengths):
            if t < n:
                paged.append(s, *_token(s, t))
                flat.append(s, *_token(s, t))
    for s, n in enumerate(lengths):
        pk, pv = paged.gather(s)
        fk, fv = flat.gather(s)
        assert pk.shape == (n, H, D)
        assert torch.equal(pk, fk) and torch.equal(pv, fv)
    if len(lengths) > 1:                               # really scattered
        last = paged.tables[len(lengths) - 1]
        assert last != list(range(last[0], last[0] + len(last)))


def test_block_tables_for_the_kernels():
    c = _paged()
    for s, n in (("a", 5), ("b", 1)):
        c.add_sequence(s)
        _fill(c, s, n)
    tables, lens = c.block_tables(["b", "a"])
    assert tables.dtype == torch.int32 and lens.dtype == torch.int32
    assert tables.tolist() == [[c.tables["b"][0], 0, 0, 0], c.tables["a"] + [0, 0]]
    assert lens.tolist() == [1, 5]


def test_fork_shares_blocks_and_copy_on_write_splits_the_last():
    c = _paged()
    c.add_sequence("p")
    _fill(c, "p", 6)                                  # blocks [0 full, 1 half]
    c.fork("p", "c")
    assert c.tables["c"] == c.tables["p"] == [0, 1]
    assert c.allocator.refcount(0) == c.allocator.refcount(1) == 2
    assert c.slots_reserved() == 8                     # shared blocks counted once
    c.append("c", *_token(99, 6))                     # the shared, half-full block is copied
    assert c.tables["c"][0] == 0 and c.tables["c"][1] not in (0, 1)
    assert c.allocator.refcount(1) == 1 and c.allocator.refcount(0) == 2
    pk, _ = c.gather("p")
    ck, cv = c.gather("c")
    assert torch.equal(ck[:6], pk) and torch.equal(ck[6], _token(99, 6)[0])
    assert torch.equal(cv[6], _token(99, 6)[1])
    c.append("p", *_token(7, 6))                      # the parent's block is its own again: no copy
    assert c.tables["p"] == [0, 1]
    assert torch.equal(c.gather("p")[0][6], _token(7, 6)[0])
    assert torch.equal(c.gather("c")[0][6], _token(99, 6)[0])   # the child's copy untouched


def test_fork_at_a_block_boundary_copies_nothing():
    c = _paged()
    c.add_sequence("p")
    _fill(c, "p", 4)
    c.fork("p", "c")
    free = c.allocator.num_free
    _fill(c, "c", 1, start=4, tag=5)                  # a new block, the full shared one untouched
    assert c.allocator.num_free == free - 1 and c.allocator.refcount(0) == 2


def test_free_returns_blocks_when_the_last_owner_goes():
    c = _paged()
    c.add_sequence("p")
    _fill(c, "p", 6)
    c.fork("p", "c")
    c.free("p")
    assert c.allocator.num_free == 6                  # blocks 0 and 1 still owned by c
    c.free("c")
    assert c.allocator.num_free == 8 and c.slots_reserved() == 0
    with pytest.raises(ValueError, match="already freed"):
        c.free("c")


def test_out_of_blocks_changes_nothing():
    c = _paged(num_blocks=2)
    c.add_sequence("p")
    _fill(c, "p", 6)
    c.fork("p", "c")
    before = (list(c.tables["c"]), c.length["c"], c.allocator.num_free)
    with pytest.raises(OutOfBlocks):
        c.append("c", *_token(1, 6))                  # copy-on-write needs a block: none left
    assert (c.tables["c"], c.length["c"], c.allocator.num_free) == before
    assert c.allocator.refcount(1) == 2
    c.free("p")                                       # the scheduler frees a sequence, retries
    c.append("c", *_token(1, 6))                      # sole owner now: writes in place
    assert c.length["c"] == 7 and c.tables["c"] == [0, 1]


def test_appending_past_the_table():
    c = _paged(width=2)
    c.add_sequence("a")
    _fill(c, "a", 8)
    with pytest.raises(ValueError, match="is full: 8 tokens fill its 2 blocks of 4"):
        c.append("a", *_token(0, 8))
    assert c.length["a"] == 8


def test_paged_errors():
    c = _paged()
    c.add_sequence("a")
    with pytest.raises(ValueError, match="already exists"):
        c.add_sequence("a")
    with pytest.raises(ValueError, match="no sequence 'b'"):
        c.append("b", *_token(0, 0))
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        c.append("a", torch.zeros(D), torch.zeros(D))
    with pytest.raises(TypeError, match="dtype"):
        c.append("a", torch.zeros(H, D, dtype=torch.float64), torch.zeros(H, D))
    with pytest.raises(ValueError, match="already exists"):
        c.fork("a", "a")
    with pytest.raises(TypeError, match="dtype"):
        PagedKVCache(4, 4, H, D, 2, dtype=torch.int32)


def test_contiguous_cache_errors():
    c = ContiguousKVCache(1, 2, H, D)
    c.add_sequence("a")
    with pytest.raises(OutOfBlocks, match="slots"):
        c.add_sequence("b")
    _fill(c, "a", 2)
    with pytest.raises(ValueError, match="full"):
        c.append("a", *_token(0, 2))
    c.free("a")
    with pytest.raises(ValueError, match="already freed"):
        c.free("a")
    c.add_sequence("b")                               # the slot is reused
    assert c.slots_reserved() == 2


# ---------------------------------------------------------------- fragmentation

def test_fragmentation_exact():
    lengths = [1, 16, 17, 100, 250]                   # 384 tokens
    paged = paged_waste(lengths, 16)
    # blocks: 1 + 1 + 2 + 7 + 16 = 27 blocks of 16 = 432 slots
    assert (paged.tokens, paged.reserved, paged.wasted) == (384, 432, 48)
    flat = contiguous_waste(lengths, 2048)
    assert (flat.tokens, flat.reserved, flat.wasted) == (384, 5 * 2048, 10240 - 384)
    assert flat.fraction == pytest.approx(9856 / 10240)
    assert paged.fraction == pytest.approx(48 / 432)
    assert paged_waste(lengths, 1).wasted == 0


def test_fragmentation_matches_a_filled_cache():
    lengths = [3, 8, 9]
    c = PagedKVCache(16, 4, H, D, max_blocks_per_seq=4)
    for s, n in enumerate(lengths):
        c.add_sequence(s)
        _fill(c, s, n)
    assert c.slots_reserved() == paged_waste(lengths, 4).reserved == 4 + 8 + 12


def test_fragmentation_errors():
    with pytest.raises(ValueError, match="empty"):
        paged_waste([], 16)
    with pytest.raises(ValueError, match="length must be >= 1"):
        paged_waste([3, 0], 16)
    with pytest.raises(ValueError, match="exceeds max_len"):
        contiguous_waste([3, 9], 8)
