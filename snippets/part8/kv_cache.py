"""The KV cache, two ways: a contiguous cache that reserves each sequence's maximum length up front,
and a paged cache that hands out fixed-size blocks as sequences grow (vLLM's PagedAttention, Kwon
et al., 2023).

One layer's cache is shown; a model keeps one per layer, all sharing the same block tables (a
token's position in the cache is the same in every layer). K and V of a token are vectors of
``head_dim`` per kv head; the storage of both caches is ``(slots, kv_heads, head_dim)`` rows, which
the paged cache groups as ``(num_blocks, block_size, kv_heads, head_dim)``: token ``t`` of a
sequence lives in block ``table[t // block_size]`` at offset ``t % block_size``. That is the
layout the decode-attention kernels of this part read.

The paged cache's bookkeeping:

- a :class:`BlockAllocator`: a free list and a reference count per block. A block is free when its
  count is zero; running out raises :class:`OutOfBlocks`, which a scheduler catches to preempt or
  to wait, before anything has changed.
- per sequence, a block table (a list of block ids) and a length.
- :meth:`PagedKVCache.fork`: a new sequence that shares every block of its parent (beam search,
  parallel sampling, a shared prompt); the counts go up, nothing is copied.
- copy-on-write: appending to a last block that another sequence shares first copies that block
  into a fresh one; full shared blocks are never written again, so they stay shared.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from snippets._checks import check_int


class OutOfBlocks(RuntimeError):
    """No free block is left. Raised before the cache changes, so the caller (a scheduler) can
    free or preempt a sequence and try again."""


# --8<-- [start:allocator]
class BlockAllocator:
    """Blocks ``0 .. num_blocks - 1``: a free list (a stack: the block freed last is reused first,
    still warm in L2) and a reference count per block."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_int("BlockAllocator: num_blocks", num_blocks, 1)
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def refcount(self, block: int) -> int:
        self._check_block(block, "refcount")
        return self._refs[block]

    def allocate(self) -> int:
        """A free block, its count set to one."""
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more owner for a block in use."""
        self._check_block(block, "share")
        if self._refs[block] == 0:
            raise ValueError(f"BlockAllocator.share: block {block} is free; allocate it first")
        self._refs[block] += 1

    def free(self, block: int) -> None:
        """One owner fewer; the block returns to the free list when it has none."""
        self._check_block(block, "free")
        if self._refs[block] == 0:
            raise ValueError(f"BlockAllocator.free: block {block} is already free (freed twice?)")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def _check_block(self, block: int, what: str) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not (
                0 <= block < self.num_blocks):
            raise ValueError(f"BlockAllocator.{what}: block must be an int in [0, "
                             f"{self.num_blocks}), got {block!r}")
# --8<-- [end:allocator]


def _check_kv_args(name: str, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    check_int(f"{name}: kv_heads", kv_heads, 1)
    check_int(f"{name}: head_dim", head_dim, 1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name}: dtype must be a floating-point torch.dtype, got {dtype!r}")


def _check_token(name: str, k: torch.Tensor, v: torch.Tensor, shape: tuple, dtype: torch.dtype):
    for what, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {what} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: {what} must have shape {shape} (kv_heads, head_dim), got "
                             f"{tuple(t.shape)}")
        if t.dtype != dtype:
            raise TypeError(f"{name}: {what} has dtype {t.dtype}, the cache holds {dtype}")


# --8<-- [start:contiguous]
class ContiguousKVCache:
    """Each sequence gets a slot of ``max_len`` tokens when it starts, used or not."""

    def __init__(self, max_seqs: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        check_int("ContiguousKVCache: max_seqs", max_seqs, 1)
        self.max_len = check_int("ContiguousKVCache: max_len", max_len, 1)
        _check_kv_args("ContiguousKVCache", kv_heads, head_dim, dtype)
        shape = (max_seqs, max_len, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self.slot: dict[Hashable, int] = {}
        self.length: dict[Hashable, int] = {}

    def add_sequence(self, seq: Hashable) -> None:
        if seq in self.slot:
            raise ValueError(f"ContiguousKVCache.add_sequence: sequence {seq!r} already exists")
        if not self._free_slots:
            raise OutOfBlocks(f"all {self.k.shape[0]} sequence slots are in use")
        self.slot[seq], self.length[seq] = self._free_slots.pop(), 0

    def append(self, seq: Hashable, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one token's K and V, each (kv_heads, head_dim), after the sequence's last."""
        self._check_seq(seq, "append")
        _check_token("ContiguousKVCache.append", k, v, tuple(self.k.shape[2:]), self.k.dtype)
        n = self.length[seq]
        if n == self.max_len:
            raise ValueError(f"ContiguousKVCache.append: sequence {seq!r} is full ({n} tokens, "
                             f"max_len {self.max_len})")
        self.k[self.slot[seq], n], self.v[self.slot[seq], n] = k, v
        self.length[seq] = n + 1

    def gather(self, seq: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V, each (length, kv_heads, head_dim): a view, no copy."""
        self._check_seq(seq, "gather")
        s, n = self.slot[seq], self.length[seq]
        return self.k[s, :n], self.v[s, :n]

    def free(self, seq: Hashable) -> None:
        self._check_seq(seq, "free")
        self._free_slots.append(self.slot.pop(seq))
        del self.length[seq]

    def slots_reserved(self) -> int:
        """Token slots held by live sequences: max_len each."""
        return len(self.slot) * self.max_len

    def _check_seq(self, seq: Hashable, what: str) -> None:
        if seq not in self.slot:
            raise ValueError(f"ContiguousKVCache.{what}: no sequence {seq!r} (never added, or "
                           "already freed)")
# --8<-- [end:contiguous]


# --8<-- [start:paged]
class PagedKVCache:
    """K and V in ``num_blocks`` blocks of ``block_size`` tokens, handed out as sequences grow.
    ``max_blocks_per_seq`` is the width of a block table: the longest sequence is
    ``max_blocks_per_seq * block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 max_blocks_per_seq: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        self.block_size = check_int("PagedKVCache: block_size", block_size, 1)
        self.max_blocks_per_seq = check_int("PagedKVCache: max_blocks_per_seq",
                                            max_blocks_per_seq, 1)
        _check_kv_args("PagedKVCache", kv_heads, head_dim, dtype)
        self.allocator = BlockAllocator(num_blocks)
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.tables: dict[Hashable, list[int]] = {}
        self.length: dict[Hashable, int] = {}

    def add_sequence(self, seq: Hashable) -> None:
        """A new, empty sequence: no block until its first token."""
        if seq in self.tables:
            raise ValueError(f"PagedKVCache.add_sequence: sequence {seq!r} already exists")
        self.tables[seq], self.length[seq] = [], 0

    def append(self, seq: Hashable, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one token's K and V, each (kv_heads, head_dim). A new block when the last is full;
        a private copy of the last block first when another sequence shares it (copy-on-write).
        Raises OutOfBlocks, with nothing changed, when a block is needed and none is free."""
        self._check_seq(seq, "append")
        _check_token("PagedKVCache.append", k, v, tuple(self.k.shape[2:]), self.k.dtype)
        table, n = self.tables[seq], self.length[seq]
        slot = n % self.block_size
        if slot == 0:                                   # the last block is full (or there is none)
            if len(table) == self.max_blocks_per_seq:
                raise ValueError(
                    f"PagedKVCache.append: sequence {seq!r} is full: {n} tokens fill its "
                    f"{self.max_blocks_per_seq} blocks of {self.block_size}")
            table.append(self.allocator.allocate())
        elif self.allocator.refcount(table[-1]) > 1:    # shared: copy before writing
            fresh = self.allocator.allocate()
            self.k[fresh, :slot] = self.k[table[-1], :slot]
            self.v[fresh, :slot] = self.v[table[-1], :slot]
            self.allocator.free(table[-1])
            table[-1] = fresh
        self.k[table[-1], slot], self.v[table[-1], slot] = k, v
        self.length[seq] = n + 1

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """A new sequence ``child`` equal to ``parent``, sharing all its blocks: no copy."""
        self._check_seq(parent, "fork")
        if child in self.tables:
            raise ValueError(f"PagedKVCache.fork: sequence {child!r} already exists")
        for block in self.tables[parent]:
            self.allocator.share(block)
        self.tables[child], self.length[child] = list(self.tables[parent]), self.length[parent]

    def free(self, seq: Hashable) -> None:
        """The sequence is finished: each of its blocks loses an owner."""
        self._check_seq(seq, "free")
        for block in self.tables.pop(seq):
            self.allocator.free(block)
        del self.length[seq]

    def gather(self, seq: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V, each (length, kv_heads, head_dim), copied out of its blocks."""
        self._check_seq(seq, "gather")
        n, table = self.length[seq], self.tables[seq]
        idx = torch.tensor(table, dtype=torch.long, device=self.k.device)
        k = self.k[idx].flatten(0, 1)[:n]
        v = self.v[idx].flatten(0, 1)[:n]
        return k, v

    def block_tables(self, seqs: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernels' view of a batch: block tables (len(seqs), max_blocks_per_seq) int32, padded
        with block 0 (never read: it lies past the sequence's length), and the lengths (int32)."""
        for s in seqs:
            self._check_seq(s, "block_tables")
        tables = torch.zeros(len(seqs), self.max_blocks_per_seq, dtype=torch.int32)
        for i, s in enumerate(seqs):
            tables[i, :len(self.tables[s])] = torch.tensor(self.tables[s], dtype=torch.int32)
        lens = torch.tensor([self.length[s] for s in seqs], dtype=torch.int32)
        return tables.to(self.k.device), lens.to(self.k.device)

    def slots_reserved(self) -> int:
        """Token slots held by live sequences: every block in use, counted once however many
        sequences share it."""
        return (self.allocator.num_blocks - self.allocator.num_free) * self.block_size

    def _check_seq(self, seq: Hashable, what: str) -> None:
        if seq not in self.tables:
            raise ValueError(f"PagedKVCache.{what}: no sequence {seq!r} (never added, or already "
                           "freed)")
# --8<-- [end:paged]


# --8<-- [start:waste]
@dataclass(frozen=True)
class Waste:
    """Token slots a cache reserves for a set of sequences, and how many of them hold nothing."""

    tokens: int
    reserved: int

    @property
    def wasted(self) -> int:
        return self.reserved - self.tokens

    @property
    def fraction(self) -> float:
        """Wasted slots over reserved slots."""
        return self.wasted / self.reserved


def _check_lengths(name: str, lengths: Sequence[int]) -> list[int]:
    if len(lengths) == 0:
        raise ValueError(f"{name}: lengths is empty")
    return [check_int(f"{name}: length", n, 1) for n in lengths]


def paged_waste(lengths: Sequence[int], block_size: int) -> Waste:
    """A paged cache reserves ceil(n / block_size) blocks per sequence: at most block_size - 1
    empty slots each, in its last block."""
    lengths = _check_lengths("paged_waste", lengths)
    check_int("paged_waste: block_size", block_size, 1)
    reserved = sum(-(-n // block_size) * block_size for n in lengths)
    return Waste(tokens=sum(lengths), reserved=reserved)


def contiguous_waste(lengths: Sequence[int], max_len: int) -> Waste:
    """A contiguous cache reserves max_len slots per sequence."""
    lengths = _check_lengths("contiguous_waste", lengths)
    check_int("contiguous_waste: max_len", max_len, 1)
    if max(lengths) > max_len:
        raise ValueError(f"contiguous_waste: a length ({max(lengths)}) exceeds max_len "
                         f"({max_len})")
    return Waste(tokens=sum(lengths), reserved=len(lengths) * max_len)
# --8<-- [end:waste]
