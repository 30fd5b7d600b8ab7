"""Load latency by pointer chasing: how long one load takes when its data sits in L1, in L2 or
in DRAM.

A single thread follows a chain through a buffer of ``bytes`` bytes: ``cur = buf[cur]``, ``iters``
times. Each load's address is the previous load's value, so the loads cannot overlap, and the time
per step is the latency of one load (plus the few cycles of address arithmetic between them). The
chain visits one word per 128-byte line, in a random order that forms a single cycle through every
line of the buffer: no two consecutive steps share a line, and no prefetcher can guess the next one.
Sweeping ``bytes`` from a few KiB to 1 GiB moves the chain from L1 to L2 to DRAM, and the time per
step rises in steps.

Versions (no library baseline: ``kind="micro"``), both in ``csrc/part2/pointer_chase.cu``:

- v1  CUDA, plain loads (``ld.global``): cached in L1 and L2.
- v2  CUDA, like v1 but ``__ldcg`` loads (``ld.global.cg``): cached in L2 only, so the L1
  step disappears.

Each call first checks the whole buffer in one grid-wide pass (which also leaves what fits of it in
L2), then launches the chase; both are inside the timed call, and the pass costs a small fraction of
the chase (it streams the buffer at full bandwidth, where the chase pays a whole latency per
4 bytes).
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import check_int as _int
from snippets._checks import check_tensors
from snippets.registry import Impl, Op, register

CU_FILE = "part2/pointer_chase.cu"
SLOT_BYTES = 128  # one cache line of L1 and L2: each step of the chain lands on a line of its own
SLOT_WORDS = SLOT_BYTES // 4
CU_OPTIONS = cuda.defines(CU_FILE, SLOT_WORDS=SLOT_WORDS)  # the kernels' warm-up stride, -D option
# The chase kernel's warm-up reads the first WARM_BYTES of the chain, one word per line, into its
# SM's L1: 256 KB is the whole L1 + shared-memory array of an H100 SM (Hopper whitepaper), so any
# chain that can fit in L1 is warm before the first timed step.
WARM_BYTES = 256 * 1024
CHECK_THREADS = 256
CHASE_THREADS = 256  # only thread 0 chases; the others help with the warm-up


# --8<-- [start:chain]
def make_chain(nbytes: int, gen: torch.Generator | None = None,
               device: str = "cpu") -> torch.Tensor:
    """An int32 buffer of ``nbytes`` bytes holding one random cycle through all of its
    128-byte slots.

    The first word of slot ``s`` holds the word index of the next slot's first word; every other
    word is 0. Visiting the slots in the order of a random permutation, and linking the last back to
    the first, gives a single cycle through every slot (a cycle of length ``slots``, not several
    short ones)."""
    nbytes = _int("nbytes", nbytes, SLOT_BYTES)
    if nbytes % SLOT_BYTES:
        raise ValueError(f"nbytes must be a multiple of {SLOT_BYTES} (one slot per cache line), "
                         f"got {nbytes}")
    slots = nbytes // SLOT_BYTES
    order = torch.randperm(slots, generator=gen)  # the order in which the chase visits the slots
    nxt = torch.empty(slots, dtype=torch.int64)
    # slot order[k] points to order[k + 1]; the last one back to order[0]
    nxt[order] = order.roll(-1)
    buf = torch.zeros(nbytes // 4, dtype=torch.int32, device=device)
    buf[::SLOT_WORDS] = (nxt * SLOT_WORDS).to(device=device, dtype=torch.int32)
    return buf
# --8<-- [end:chain]


# --8<-- [start:reference]
def pointer_chase_ref(buf: torch.Tensor, iters: int) -> torch.Tensor:
    """Start at word 0 and follow cur = buf[cur] for ``iters`` steps; return the word reached, as a
    (1,) int32 tensor. ``iters`` dependent 4-byte loads: the cost is latency, not bytes."""
    table = buf.cpu().numpy()
    cur = 0
    for _ in range(iters):
        cur = int(table[cur])
    return torch.tensor([cur], dtype=torch.int32, device=buf.device)
# --8<-- [end:reference]


# --8<-- [start:launch]
def _chase(kernel_name: str, buf: torch.Tensor, iters: int) -> torch.Tensor:
    """The launcher of both versions: a grid-wide check of buf, then the one-block chase."""
    iters = _int("iters", iters, 1)
    check_tensors(("buf",), (buf,), dtypes=(torch.int32,), device="cuda", allow_empty=False)
    if buf.dim() != 1:
        raise ValueError(f"buf must be one-dimensional, got shape {tuple(buf.shape)}")
    words = buf.numel()
    # 0: chain valid so far; -1: rejected
    out = torch.zeros(1, dtype=torch.int32, device=buf.device)
    check = cuda.kernel(CU_FILE, "chain_check", CU_OPTIONS)
    sms = torch.cuda.get_device_properties(buf.device).multi_processor_count
    blocks = min(triton.cdiv(words, CHECK_THREADS),
                 sms * cuda.resident_blocks(check, CHECK_THREADS))
    cuda.launch(check, blocks, CHECK_THREADS, (buf, np.int64(words), out))
    warm_words = min(words, WARM_BYTES // 4)
    cuda.launch(cuda.kernel(CU_FILE, kernel_name, CU_OPTIONS), 1, CHASE_THREADS,
                (buf, np.int64(warm_words), np.int64(iters), out))
    return out
# --8<-- [end:launch]


def pointer_chase_cuda(buf: torch.Tensor, iters: int) -> torch.Tensor:
    """v1: plain loads, cached in L1 and L2. Returns the word index reached after ``iters`` steps
    from word 0, as a (1,) int32 tensor, or -1 if some entry of buf is not a valid index into buf
    (then nothing is chased: the check runs on the GPU, and raising would need a synchronization
    inside the timed call)."""
    return _chase("chase_ca", buf, iters)


def pointer_chase_cuda_cg(buf: torch.Tensor, iters: int) -> torch.Tensor:
    """v2: like v1, but __ldcg loads, cached in L2 only: every step that v1 serves from L1 goes
    to L2."""
    return _chase("chase_cg", buf, iters)


def _make_inputs(size, dtype, device, gen):
    return make_chain(size["bytes"], gen, device), size["iters"]


# 2^15 dependent loads per call: about a millisecond from L1, tens of milliseconds from DRAM.
# Working sets from 4 KiB (L1) through the L2 (60 MB on an H200) to 1 GiB (DRAM, and many pages, so
# TLB misses too).
ITERS = 2**15
SWEEP = [{"bytes": 2**k, "iters": ITERS} for k in range(12, 31)]

pointer_chase = register(Op(
    name="pointer_chase", part=2, chapter="part2/memory-spaces.md",
    title="Pointer chase (load latency)", reference=pointer_chase_ref, make_inputs=_make_inputs,
    # Bytes: the check pass reads the buffer once, the chase reads 4 bytes per step. The harness
    # sizes its input rotation by this; the metric is ns per dependent access.
    bytes_moved=lambda s, d: s["bytes"] + 4 * s["iters"], flops=lambda s, d: 0,
    metric="ns/access", ceiling=None, accesses=lambda s, d: s["iters"], kind="micro",
    headline=SWEEP[-1], sweep=SWEEP, sweep_axis="bytes", dtypes=(torch.int32,),
    test_sizes=[{"bytes": b, "iters": k} for b in (128, 31 * 128, 4096, 2**20 + 3 * 128)
                for k in (1, 7, 1000)],
    tolerances={torch.int32: (0.0, 0.0)}))  # an index: exact
_SOURCES = (cuda.source_path(CU_FILE), _chase)
pointer_chase.add(Impl("v1", pointer_chase_cuda, "CUDA", "ld.global loads: L1 and L2", _SOURCES))
pointer_chase.add(Impl("v2", pointer_chase_cuda_cg, "CUDA", "ld.global.cg loads: L2 only",
                       _SOURCES))
