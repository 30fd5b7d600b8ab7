"""Shared-memory bank conflicts: the address model and the gcd rule, the reference against a plain loop, bad
patterns refused, and (on a GPU) every thread's checksum for every stride and layout."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import poison_allocator
from snippets.part2 import banks as bk
from snippets.registry import CEILING_MEASURES, CEILINGS

# ---------------------------------------------------------------- the address model

@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride", range(1, 66))
def test_gcd_rule(stride):
    """Stride s words: gcd(s, 32) lanes share each bank used, each at its own word: a gcd(s, 32)-way conflict."""
    assert bk.conflict_ways(stride, "plain") == math.gcd(stride, 32)


@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride", [32, 64])
def test_padding_and_swizzle_remove_the_conflict(stride):
    assert bk.conflict_ways(stride, "plain") == 32
    assert bk.conflict_ways(stride, "padded") == 1  # pitch 33 (or 65): odd, so every lane in its own bank
    assert bk.conflict_ways(stride, "swizzled") == 1


@pytest.mark.op("smem_bank_stride")
def test_padding_is_not_always_a_fix():
    """Padding turns stride s into s + 1: a fix for even strides, a 2-way conflict for stride 1."""
    assert bk.conflict_ways(1, "padded") == 2
    assert bk.conflict_ways(31, "padded") == 32


@pytest.mark.op("smem_bank_stride")
def test_broadcast_is_not_a_conflict():
    """Stride 0: all 32 lanes read the same word, which one pass broadcasts to all of them."""
    assert bk.conflict_ways(0, "plain") == 1


@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride", [32, 64])
def test_swizzle_is_a_permutation_of_each_row(stride):
    """The XOR only reorders the 32 words of row `lane`: the tile holds the same data, no word is lost."""
    lanes = torch.arange(32)[:, None]
    cols = torch.arange(32)[None, :]
    addr = bk.word_address(lanes, cols, stride, "swizzled")
    for lane in range(32):
        row = addr[lane].sort().values
        assert torch.equal(row, lane * stride + torch.arange(32))
    # ...and every column read (one word per lane) hits all 32 banks once.
    assert all(len(set((addr[:, c] % 32).tolist())) == 32 for c in range(32))


# ---------------------------------------------------------------- the reference

def _brute(seed: torch.Tensor, stride: int, layout: str, threads: int) -> list[int]:
    """What the kernel computes, as plain loops over threads, steps and columns (first `threads` threads
    of each block)."""
    out = []
    for s in seed.tolist():
        for t in range(threads):
            lane, acc = t % 32, 0
            for _ in range(bk.REPS):
                for c in range(bk.COLS):
                    w = bk.word_address(lane, c, stride, layout)
                    acc = (acc + (c + 1) * ((w * w) ^ (s & 0xFFFFFFFF))) % 2**32
            out.append(acc - 2**32 if acc >= 2**31 else acc)
    return out


@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride, layout", [(1, "plain"), (3, "plain"), (32, "plain"), (32, "padded"),
                                            (32, "swizzled"), (64, "swizzled")])
def test_reference_matches_loops(stride, layout):
    seed = torch.tensor([0, 12345, 2**20 - 1], dtype=torch.int32)
    ref = bk.smem_bank_read_ref(seed, stride, layout).view(3, bk.THREADS)
    assert ref.dtype == torch.int32
    brute = torch.tensor(_brute(seed, stride, layout, 40), dtype=torch.int32).view(3, 40)
    assert torch.equal(ref[:, :40], brute)
    assert torch.equal(ref[:, 32:64], ref[:, :32])  # every warp of a block reads the same words


@pytest.mark.op("smem_bank_stride")
def test_reference_tells_layouts_apart():
    """A kernel that forgot the swizzle or the padding reads other words, and its sums differ."""
    seed = torch.tensor([7], dtype=torch.int32)
    plain = bk.smem_bank_read_ref(seed, 32, "plain")
    assert not torch.equal(plain, bk.smem_bank_read_ref(seed, 32, "swizzled"))
    assert not torch.equal(plain, bk.smem_bank_read_ref(seed, 32, "padded"))
    assert not torch.equal(plain, bk.smem_bank_read_ref(seed, 16, "plain"))


# ---------------------------------------------------------------- refusing bad input

PATTERN_CASES = [
    (1.0, "plain", TypeError, "stride must be a Python int"),
    (True, "plain", TypeError, "stride must be a Python int"),
    (0, "plain", ValueError, "stride must be >= 1"),
    (1, "diagonal", ValueError, "unknown layout"),
    (1, 3, TypeError, "layout must be a str"),
    (16, "swizzled", ValueError, "multiple of 32"),
    (66, "plain", ValueError, "past the 2048-word"),
    (65, "padded", ValueError, "past the 2048-word"),
    (96, "swizzled", ValueError, "past the 2048-word"),
]


@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride, layout, exc, words", PATTERN_CASES)
def test_bad_pattern_refused(stride, layout, exc, words):
    """Checked before the tensor, so this runs on any machine."""
    with pytest.raises(exc, match=words):
        bk.smem_bank_read(torch.zeros(2, dtype=torch.int32), stride, layout)


@pytest.mark.op("smem_bank_stride")
def test_largest_patterns_accepted_by_the_checks():
    for stride, layout in [(64, "plain"), (65, "plain"), (64, "padded"), (64, "swizzled")]:
        assert bk._check_pattern(stride, layout) == (stride, layout)


@pytest.mark.op("smem_bank_stride")
def test_refuses_host_seed():
    with pytest.raises(ValueError, match="cuda device"):
        bk.smem_bank_read(torch.zeros(2, dtype=torch.int32), 1, "plain")


@pytest.mark.gpu
@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("seed, exc, words", [
    (lambda: torch.zeros(2, dtype=torch.int64, device="cuda"), TypeError, "dtype"),
    (lambda: torch.zeros(2, dtype=torch.float32, device="cuda"), TypeError, "dtype"),
    (lambda: torch.zeros(0, dtype=torch.int32, device="cuda"), ValueError, "empty"),
    (lambda: torch.zeros(2, 2, dtype=torch.int32, device="cuda"), ValueError, "one-dimensional"),
    (lambda: torch.zeros(8, dtype=torch.int32, device="cuda")[::2], ValueError, "contiguous"),
    (lambda: [0, 1], TypeError, "torch.Tensor"),
])
def test_bad_seed_refused(seed, exc, words):
    with pytest.raises(exc, match=words):
        bk.smem_bank_read(seed(), 1, "plain")


# ---------------------------------------------------------------- registration

@pytest.mark.op("smem_bank_stride")
def test_ceiling_is_registered_once():
    assert "smem" in CEILINGS and CEILING_MEASURES["smem"] is bk.measure_smem_ceiling
    assert bk.smem_bank_stride.ceiling == "smem" and bk.smem_bank_stride.kind == "micro"
    assert "v0" not in bk.smem_bank_stride.impls
    # The sweep's rows must be distinct benchmark sizes, and the headline the last of them.
    keys = [tuple(sorted(s.items())) for s in bk.smem_bank_stride.sweep]
    assert len(set(keys)) == len(keys) and bk.smem_bank_stride.headline == bk.smem_bank_stride.sweep[-1]


@pytest.mark.op("smem_bank_stride")
def test_cost_model():
    assert bk.smem_bank_stride.bytes_moved({"blocks": 3}, torch.int32) == 3 * 256 * 64 * 32 * 4


# ---------------------------------------------------------------- the CUDA kernel (GPU only)

GPU_PATTERNS = [(s, "plain") for s in (1, 2, 3, 4, 5, 8, 16, 31, 32, 33, 64, 65)] + \
               [(s, "padded") for s in (1, 8, 32, 64)] + [(32, "swizzled"), (64, "swizzled")]


@pytest.mark.gpu
@pytest.mark.op("smem_bank_stride")
@pytest.mark.parametrize("stride, layout", GPU_PATTERNS)
@pytest.mark.parametrize("blocks", [1, 5, 1000])
def test_checksums(stride, layout, blocks):
    gen = torch.Generator().manual_seed(stride * 31 + blocks)
    seed = torch.randint(0, 2**20, (blocks,), generator=gen, dtype=torch.int32).cuda()
    poison_allocator(4 * blocks * bk.THREADS, "cuda")
    out = bk.smem_bank_read(seed, stride, layout)
    assert out.shape == (blocks * bk.THREADS,) and out.dtype == torch.int32
    assert torch.equal(out.cpu(), bk.smem_bank_read_ref(seed.cpu(), stride, layout))


@pytest.mark.gpu
@pytest.mark.op("smem_bank_stride")
def test_checksums_with_negative_seeds():
    """The kernel reads seeds as unsigned: the reference must agree for any int32, not only small ones."""
    seed = torch.tensor([-1, -2**31, 2**31 - 1, 0], dtype=torch.int32, device="cuda")
    for stride, layout in [(1, "plain"), (32, "swizzled")]:
        assert torch.equal(bk.smem_bank_read(seed, stride, layout).cpu(),
                           bk.smem_bank_read_ref(seed.cpu(), stride, layout))


@pytest.mark.gpu
@pytest.mark.op("smem_bank_stride")
def test_ceiling_measures():
    c = bk.measure_smem_ceiling(quick=True)
    assert c["unit"] == "GB/s" and c["value"] > 0 and "stride 1" in c["how"]
