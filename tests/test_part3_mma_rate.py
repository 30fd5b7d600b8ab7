"""mma_rate (csrc/wmma/mma_rate.cu): mma.sync's own rate, the tensor-cores chapter's measure of how much of
the instruction's speed wmma_gemm v7 reaches.

On the CPU: both kernels' index arithmetic, run with the PTX ISA's semantics of ldmatrix and mma.sync (the
helpers of test_part3_wmma.py), gives exactly the sums that the torch reference computes; v1's fragment
formulas load what v2's ldmatrix reads; v2's reads are free of bank conflicts; bad arguments are refused
before any launch. On the GPU, test_ops.py runs both versions against the reference at the test sizes
(equality: the sums are small integers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_part3_wmma import _ldmatrix, _mma

from snippets.part3 import mma_rate as r

pytestmark = pytest.mark.op("mma_rate")


def _operands(steps=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return r._make_inputs({"blocks": 1, "steps": steps}, torch.float16, "cpu", gen)


def _smem_tiles(a, b):
    """v2's shared-memory image: tile q (A[q], then B's columns 16(q - 4) ..), as 32 chunks of 8 values,
    chunk 16 h + row holding row `row`, columns 8h .. 8h + 7."""
    tiles = []
    for q in range(2 * r.MI):
        t = a[q] if q < r.MI else b[:, 16 * (q - r.MI):16 * (q - r.MI + 1)]
        t = t.double().numpy()
        tiles.append(np.stack([t[row, 8 * h:8 * h + 8] for h in range(2) for row in range(16)]))
    return tiles


def _v2_fragments(a, b):
    """v2's ldmatrix reads: lane l addresses chunk l of each tile (x4 for A, x4.trans for B)."""
    tiles = _smem_tiles(a, b)
    lanes = list(range(32))
    fa = [_ldmatrix(tiles[i], lanes, trans=False) for i in range(r.MI)]
    fb = [_ldmatrix(tiles[r.MI + q], lanes, trans=True) for q in range(r.NI // 2)]
    return fa, fb


def _v1_fragments(a, b):
    """v1's loads, with the kernel's formulas: a[i][reg] from row g + 8 (reg % 2), columns
    2t + 8 (reg // 2) + e; B's column tile j from rows 2t + 8 reg + e, column 8j + g."""
    a, b = a.double().numpy(), b.double().numpy()
    g, t = np.arange(32) // 4, np.arange(32) % 4
    fa = []
    for i in range(r.MI):
        regs = np.empty((32, 4, 2))
        for reg in range(4):
            for e in range(2):
                regs[:, reg, e] = a[i, g + 8 * (reg % 2), 2 * t + 8 * (reg // 2) + e]
        fa.append(regs)
    fb = []
    for q in range(r.NI // 2):
        regs = np.empty((32, 4, 2))
        for j in (2 * q, 2 * q + 1):
            for reg in range(2):
                for e in range(2):
                    regs[:, 2 * (j % 2) + reg, e] = b[2 * t + 8 * reg + e, 8 * j + g]
        fb.append(regs)
    return fa, fb


def _run(fa, fb, steps):
    """steps x the 32 MMAs of mma_all, as the kernels issue them: acc[lane, i, j, e]."""
    acc = np.zeros((32, r.MI, r.NI, 4))
    for _ in range(steps):
        for i in range(r.MI):
            for j in range(r.NI):
                _mma(acc[:, i, j], fa[i], fb[j // 2][:, [2 * (j % 2), 2 * (j % 2) + 1]])
    return acc.reshape(-1)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_ldmatrix_path_gives_the_reference(steps):
    a, b, blocks, _ = _operands(steps)
    fa, fb = _v2_fragments(a, b)
    np.testing.assert_array_equal(_run(fa, fb, steps), r.mma_rate_ref(a, b, blocks, steps).double().numpy())


def test_register_fragments_are_the_ldmatrix_fragments():
    a, b, _, _ = _operands()
    for mine, theirs in zip(_v1_fragments(a, b), _v2_fragments(a, b)):
        for x, y in zip(mine, theirs):
            np.testing.assert_array_equal(x, y)


def test_reference_layout_by_hand():
    """Lane 5 (g = 1, t = 1), tile (i, j) = (2, 3): e = 0..3 are rows 1, 1, 9, 9 and columns 2, 3, 2, 3 of
    steps * A[2] @ B[:, 24:32]."""
    a, b, blocks, steps = _operands(steps=4)
    out = r.mma_rate_ref(a, b, blocks, steps).reshape(32, r.MI, r.NI, 4)
    tile = steps * (a[2].double() @ b[:, 24:32].double())
    expected = torch.stack([tile[1, 2], tile[1, 3], tile[9, 2], tile[9, 3]]).float()
    assert torch.equal(out[5, 2, 3], expected)
    assert not torch.equal(out[5, 2, 3], tile.T[:4, 0].float())  # a transposed layout would differ


def test_reads_are_free_of_bank_conflicts():
    """Each ldmatrix phase (8 lanes, 16 bytes each) reads 128 consecutive bytes: all 32 banks once."""
    for q in range(2 * r.MI):
        for phase in range(4):
            lanes = np.arange(8 * phase, 8 * phase + 8)
            words = (512 * q + 16 * lanes)[:, None] // 4 + np.arange(4)[None, :]
            assert len(set((words % 32).ravel())) == 32


def test_flops_count_every_warp():
    assert r.mma_flops({"blocks": 3, "steps": 5}) == 3 * 4 * 5 * 32 * 4096


def _bad(kind):
    a = torch.zeros(r.MI, 16, 16, dtype=torch.float16)
    b = torch.zeros(16, 64, dtype=torch.float16)
    return {"cpu": (a, b, 1, 1), "dtype": (a.float(), b, 1, 1), "shape": (a[:2], b, 1, 1),
            "b_shape": (a, b[:, :32], 1, 1), "steps0": (a, b, 1, 0), "steps_big": (a, b, 1, r.MAX_STEPS + 1),
            "blocks_bool": (a, b, True, 1)}[kind]


@pytest.mark.parametrize("kind, error, match", [
    ("cpu", ValueError, "cuda device"), ("dtype", TypeError, "float16"), ("shape", ValueError, "tiles of 16"),
    ("b_shape", ValueError, "K x N"), ("steps0", ValueError, "steps must be >= 1"),
    ("steps_big", ValueError, "exact"), ("blocks_bool", TypeError, "blocks")])
@pytest.mark.parametrize("fn", [r.mma_rate_registers, r.mma_rate_ldmatrix])
def test_refuses_bad_arguments_before_launch(fn, kind, error, match):
    with pytest.raises(error, match=match):
        fn(*_bad(kind))


# scripts/capture_mma_power.py: what it reads from nvidia-smi, checked on the CPU
def test_power_samples_parse_and_settle():
    from helpers import load_script

    power = load_script("capture_mma_power")
    text = "clocks.sm [MHz], power.draw [W], clocks_event_reasons.active\n" \
           "1980, 350.5, 0x0000000000000000\n1980, 690.1, 0x0000000000000004\n[N/A], 1, 0x0\n" \
           "1500, 695.0, 0x0000000000000004\n1470, 692.0, 0x0000000000000004\n"
    samples = power.parse_samples(text)
    assert samples == [(1980.0, 350.5, 0), (1980.0, 690.1, 4), (1500.0, 695.0, 4), (1470.0, 692.0, 4)]
    mhz, watts, why = power.settled(samples)
    assert (mhz, watts, why) == (1485.0, 693.5, "software power cap")
    with pytest.raises(ValueError, match="no nvidia-smi samples"):
        power.settled([])


def test_power_capture_runs_what_its_producer_hashes():
    from helpers import load_script

    from snippets.bench import captures

    power = load_script("capture_mma_power")
    assert captures.PRODUCERS["mma_power"].impls({}) == [(op, v) for _, op, v, _ in power.KERNELS]


def test_line_count_of_a_named_kernel_stays_in_its_file():
    """The chapter's versus table names each version's kernel: counted in mma_rate.cu, which defines it,
    not looked for in the headers that file includes."""
    from snippets.bench.loc import impl_lines

    for version, kernel in r.KERNELS.items():
        count = impl_lines(r.mma_rate.impls[version], [kernel])
        assert count.what == f"{kernel} in csrc/wmma/mma_rate.cu with what they use there"
        assert 20 < count.kernel < 100
