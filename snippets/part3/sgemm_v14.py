"""SGEMM v14: v11's warp-tiled loop in a persistent grid with stream-K for the last waves
(``csrc/sgemm/v14_streamk.cu``).

A version of Part 3's ``sgemm`` op, registered from its own module so that v0 to v13's measured
results keep their source hashes (those cover ``snippets/part3/sgemm.py`` and the files of
``csrc/part3/sgemm/`` they include; this module and its kernel file are in v14's hash alone).

- v14 CUDA, as many blocks as the GPU holds at once (S). All but the last two waves of tiles are
      data-parallel, a whole tile a block as in v11; the K-steps of the tiles left (between S + 1
      and 2 S - 1 tiles' worth) are cut into S equal shares, one a block, so that no SM idles
      through a partly empty last wave. A tile split between blocks is summed by the last of them
      to finish, in block order (deterministic). Autotuned over a few of v12's tile
      configurations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.gemm import check_operands
from snippets.part3.sgemm import sgemm
from snippets.registry import Impl

V14_FILE = "sgemm/v14_streamk.cu"
MIN_SHARE = 4   # K-steps a block's share keeps at least, when there are fewer tiles than blocks


# --8<-- [start:plan]
def streamk_plan(tiles: int, steps: int, slots: int) -> tuple[int, int]:
    """(blocks, data-parallel waves) for ``tiles`` tiles of ``steps`` K-steps each on a GPU that
    holds ``slots`` blocks at once. With T = q S + r tiles (0 < r < S) the first q - 1 waves are
    data-parallel and the last S + r tiles are shared out by K-steps; r = 0 is data-parallel
    throughout. With fewer tiles than slots every tile is shared out, among at most one block per
    MIN_SHARE steps. Every share is at least one step (the kernel relies on it)."""
    if tiles < 1 or steps < 1 or slots < 1:
        raise ValueError(f"streamk_plan: tiles, steps and slots must be >= 1, got {tiles}, "
                         f"{steps}, {slots}")
    if tiles >= slots:
        waves, rest = divmod(tiles, slots)
        return slots, waves if rest == 0 else waves - 1
    return max(1, min(slots, tiles * steps // MIN_SHARE)), 0


def share_begin(block: int, steps_total: int, blocks: int) -> int:
    """The first K-step of ``block``'s share (the kernel's share_begin)."""
    return block * steps_total // blocks


def share_owner(g: int, steps_total: int, blocks: int) -> int:
    """The block whose share holds K-step ``g`` (the kernel's share_owner)."""
    return ((g + 1) * blocks + steps_total - 1) // steps_total - 1
# --8<-- [end:plan]


@dataclass(frozen=True)
class StreamKConfig:
    """A configuration of v14_streamk.cu: block tile, BK, warp tile, threads, grouped order, pad."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    threads: int
    group: int
    pad: int

    @property
    def kernel(self) -> str:
        return (f"sgemm_sk_{self.bm}x{self.bn}_k{self.bk}_w{self.wm}x{self.wn}_t{self.threads}"
                f"_g{self.group}_p{self.pad}")


# --8<-- [start:configs]
# v12's configurations with a grouped order, as (bm, bn, bk, wm, wn, threads, group, pad); the
# file instantiates one kernel each (SGEMM_STREAMK_CONFIGS below). The first is the file's default.
STREAMK = (
    (128, 128, 8, 64, 64, 128, 8, 4),
    (128, 128, 16, 64, 32, 256, 8, 4),
    (128, 256, 8, 64, 64, 256, 8, 4),
    (256, 128, 8, 64, 64, 256, 8, 4),
    (128, 256, 16, 64, 64, 256, 8, 0),
    (64, 128, 16, 32, 64, 128, 8, 4),
)
STREAMK_CONFIGS = [StreamKConfig(*c) for c in STREAMK]
V14_OPTIONS = cuda.defines(
    V14_FILE, SGEMM_STREAMK_CONFIGS="".join(f"SGEMM_STREAMK({','.join(map(str, c))})"
                                            for c in STREAMK))
# --8<-- [end:configs]


# --8<-- [start:launch]
def launch_streamk(a: torch.Tensor, b: torch.Tensor, cfg: StreamKConfig,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B by v14's kernel at one configuration: the grid from streamk_plan, a workspace of
    two partial tiles a block and a zeroed counter per shared-out tile."""
    m, n, k = check_operands(a, b)
    cuda.require_gpu()
    c = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
    with torch.cuda.device(a.device):
        fn = cuda.kernel(V14_FILE, cfg.kernel, V14_OPTIONS)
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        tiles = triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn)
        steps = triton.cdiv(k, cfg.bk)
        blocks, dp_waves = streamk_plan(tiles, steps, sms * cuda.resident_blocks(fn, cfg.threads))
        shared_tiles = tiles - dp_waves * blocks
        work = torch.empty(max(1, 2 * blocks * cfg.bm * cfg.bn if shared_tiles else 1),
                           dtype=torch.float32, device=a.device)
        arrived = torch.zeros(max(1, shared_tiles), dtype=torch.int32, device=a.device)
        cuda.launch(fn, blocks, cfg.threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k), work,
                                              arrived, np.int32(dp_waves)))
    return c
# --8<-- [end:launch]


# --8<-- [start:autotune]
_TUNED: dict[tuple, StreamKConfig] = {}  # (device, M, N, K) -> the fastest configuration measured


def autotune_streamk(a: torch.Tensor, b: torch.Tensor, reps: int = 5) -> StreamKConfig:
    """The fastest of STREAMK_CONFIGS for this shape, timed with CUDA events on these operands the
    first time the shape is seen (one untimed call each, then the median of ``reps``), as v12."""
    m, n, k = check_operands(a, b)
    key = (a.device.index, m, n, k)
    if key not in _TUNED:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        times = []
        for cfg in STREAMK_CONFIGS:
            launch_streamk(a, b, cfg, out)
            samples = []
            for _ in range(reps):
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
                start.record()
                launch_streamk(a, b, cfg, out)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times.append(sorted(samples)[reps // 2])
        _TUNED[key] = STREAMK_CONFIGS[times.index(min(times))]
    return _TUNED[key]


def sgemm_streamk(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v14: v11's loop in a grid of exactly the resident blocks, the last waves shared out by
    K-steps (stream-K), at the fastest of STREAMK_CONFIGS for this shape."""
    refuse_grad("sgemm_streamk", a, b, instead="a @ b")
    check_operands(a, b)
    cuda.require_gpu()
    return launch_streamk(a, b, autotune_streamk(a, b))
# --8<-- [end:autotune]


sgemm.add(Impl("v14", sgemm_streamk, "CUDA",
               "persistent grid, last waves split along K (stream-K), autotuned",
               (*cuda.source_files(V14_FILE), streamk_plan, share_begin, share_owner,
                StreamKConfig, launch_streamk, autotune_streamk, check_operands)))
