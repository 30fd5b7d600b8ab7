"""FlashAttention's forward on Hopper, steps 1 to 3 (csrc/hopper_attn/flash_fwd.cu,
snippets/part6/hopper_attention.py).

On a CPU: the file compiles for sm_90a with the launcher's own nvcc command, without spills and
without ptxas serialising the wgmmas (C7515); its SASS holds HGMMA (the PV one with a register A
and a transposed B), UTMALDG and SYNCS; it compiles for sm_80 and plain sm_90 (bodies trap); its
constants are the launcher's; its descriptors are snippets/part6/hopper.py's; the register
fragments it relies on (the accumulator of S is the A operand of P V) agree with CuTe's layouts; a
transcription of its online softmax matches the float64 reference; bad inputs are refused before
a launch. On an H100 / H200 (marked ``gpu``): o and lse against the float64 reference, within twice
SDPA's own error; every element written; the same bits on every call. Step 2 (ping-pong): its
kernels use named barriers 1 and 2 (BAR.SYNC / BAR.ARV over 256 threads) and hand the turn on
after issuing a turn's HGMMAs and before waiting for them; a model of the turn protocol runs every
interleaving up to 64 key tiles (no deadlock, strict alternation, no pending arrival); on a GPU
its output is v1's, bit for bit. Step 3 (softmax under the GEMMs): its loop waits with
wgmma.wait_group 1 (WARPGROUP.DEPBAR.LE gsb0, 0x1, in no other step) after issuing S_t and then
P_{t-1} V_{t-1}, and every exp2 of the softmax lies between that wait and wait_group 0; the
protocol model also tracks the wgmma groups in flight (no stage refilled, no register written,
while a group still reads it); a float32 transcription of its order equals v1's; on a GPU its
output is v1's, bit for bit. Step 4 (fewer instructions per tile): step 2's consumer with a lean
softmax; its SASS has step 2's barriers, products and waits in step 2's order; on every path
through a middle turn's softmax it has the same MUFU.EX2s (64 + 2), no exp2f range fix-up, one
FFMA per score, no mask, and O's D / 2 FMULs only behind a warp vote; its mask and its arithmetic
(transcribed in float32) match the float64 reference, negative and zero scales included; on a GPU
it is held to the float64 reference like the other steps, not to v1's bits."""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import nvcc_with_report, sass_by_function
from test_cuda_compile import parse_ptxas, spilling_functions

from conftest import poison_allocator
from snippets.part6 import hopper_attention as ha
from snippets.part6.hopper import kmajor_offsets, wgmma_descriptor

pytestmark = pytest.mark.op("hopper_attention_fwd")

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / ha.CU_FILE
ALL_KERNELS = {**{f"v1 d{d}": k for d, k in ha.KERNELS.items()},
               **{f"v2 d{d}": k for d, k in ha.PINGPONG_KERNELS.items()},
               **{f"v3 d{d}": k for d, k in ha.OVERLAP_KERNELS.items()},
               **{f"v4 d{d}": k for d, k in ha.LEAN_KERNELS.items()},
               **{f"v5 d{d}": k for d, k in ha.PERSIST_KERNELS.items()}}
ENTRY_POINTS = [ha.flash_fwd_hopper, ha.flash_fwd_hopper_pingpong, ha.flash_fwd_hopper_overlap,
                ha.flash_fwd_hopper_lean, ha.flash_fwd_hopper_persistent]
BIT_EQUAL_TO_V1 = [ha.flash_fwd_hopper_pingpong, ha.flash_fwd_hopper_overlap]  # steps 2 and 3
TURN_KERNELS = [*ha.PINGPONG_KERNELS.values(), *ha.OVERLAP_KERNELS.values(),
                *ha.LEAN_KERNELS.values(), *ha.PERSIST_KERNELS.values()]  # steps 2 to 5
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> tuple[Path, str]:
    """The cubin built by the launcher's own nvcc command (plus ptxas's report), and that report."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("hopper_attn") / "flash_fwd.cubin"
    return out, nvcc_with_report(ha.nvcc_command(out), REPO_ROOT)


# --------------------------------------------------------------------------------------------------
# The compiled kernels
# --------------------------------------------------------------------------------------------------

@requires_nvcc
def test_compiles_for_sm90a_without_spills(cubin):
    _, report = cubin
    functions = parse_ptxas(report)
    kernels = {name for name, f in functions.items() if f["entry"]}
    assert kernels == set(ALL_KERNELS.values())
    assert not spilling_functions(functions), report
    assert "C7515" not in report, f"ptxas serialises the wgmmas of a kernel:\n{report}"
    assert "warning" not in report.lower(), report
    for name in ALL_KERNELS.values():  # __launch_bounds__(384, 1) caps 65536 / 384
        assert functions[name]["registers"] <= min(255, 65536 // ha.THREADS)
    # ptxas counts the named barriers a kernel uses: 0 (__syncthreads) alone for step 1, and
    # step 2's two turn barriers on top
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?used (\d+) barriers", report,
                           flags=re.S))
    for name in ha.KERNELS.values():
        assert used[name] == "1", report
    for name in TURN_KERNELS:  # steps 2 and 3
        assert used[name] == str(1 + len(ha.PINGPONG_BARRIERS)), report


@requires_nvcc
def test_sass_uses_wgmma_tma_and_mbarriers(cubin):
    """S = Q K^T is an HGMMA 64x128x16 with both operands from descriptors; O += P V is an HGMMA
    64xDx16 whose A is a register and whose B descriptor is transposed (tnspB); the tiles come by
    UTMALDG; the waits are SYNCS; setmaxnreg is USETMAXREG; nothing falls back to mma.sync."""
    sass = sass_by_function(cubin[0])
    assert set(sass) == set(ALL_KERNELS.values())
    for d, name in [*ha.KERNELS.items(), *ha.PINGPONG_KERNELS.items(),
                    *ha.OVERLAP_KERNELS.items(), *ha.LEAN_KERNELS.items(),
                    *ha.PERSIST_KERNELS.items()]:
        code = sass[name]
        qk = re.findall(r"HGMMA\.64x128x16\.F32\.BF16 R\d+, gdesc\[UR\d+\]", code)
        pv = re.findall(rf"HGMMA\.64x{d}x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", code)
        assert qk, f"{name}: no shared-memory HGMMA for Q K^T"
        # steps 2 to 4 issue the P V of tiles 0 .. n-2 in the loop and the last one's after it
        copies = 2 if name in TURN_KERNELS else 1
        assert len(pv) == copies * ha.BLOCK_N // 16, f"{name}: {len(pv)} register-A HGMMAs"
        assert "UTMALDG.3D" in code, f"{name}: no 3-D TMA load (one head per box)"
        assert "SYNCS.PHASECHK" in code, f"{name}: no mbarrier wait"
        assert "USETMAXREG" in code, f"{name}: no setmaxnreg"
        assert "HMMA" not in code.replace("HGMMA", ""), f"{name}: falls back to mma.sync"


def _instructions(code: str) -> list[str]:
    """The instructions of a cuobjdump listing, in order, without addresses and encodings."""
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", code)


@requires_nvcc
def test_sass_pingpong_barriers(cubin):
    """Step 2's turns in the SASS: BAR.SYNC and BAR.ARV on barriers 1 and 2 over 0x100 (256)
    threads, never on barrier 0 other than __syncthreads; each BAR.ARV that ends a turn comes after
    that turn's HGMMAs and before the wait for them (WARPGROUP.DEPBAR): the turn is handed on
    once the products are issued, not once they are done. Step 1 has no named barrier but 0."""
    sass = sass_by_function(cubin[0])
    ids = "|".join(f"0x{b:x}" for b in ha.PINGPONG_BARRIERS)
    count = f"0x{ha.PINGPONG_THREADS:x}"
    for name in ha.KERNELS.values():
        code = _instructions(sass[name])
        assert not any("BAR.ARV" in i for i in code), name
        assert [i for i in code if "BAR.SYNC" in i] == ["BAR.SYNC.DEFER_BLOCKING 0x0"], name
    for name in TURN_KERNELS:  # step 3 takes step 2's turns
        code = _instructions(sass[name])
        bars = [i for i in code if re.search(r"\bBAR\.(SYNC|ARV)", i)]
        assert bars[0] == "BAR.SYNC.DEFER_BLOCKING 0x0", name  # __syncthreads, once
        for i in bars[1:]:
            assert re.fullmatch(rf"(@!?P\d+ )?BAR\.(SYNC\.DEFER_BLOCKING|ARV) ({ids}), {count}",
                                i), f"{name}: {i}"
        for b in ha.PINGPONG_BARRIERS:
            assert any(f"BAR.ARV 0x{b:x}, {count}" in i for i in bars), f"{name}: no arrive {b}"
            assert any(f"BAR.SYNC.DEFER_BLOCKING 0x{b:x}, {count}" in i for i in bars), name
        # walk the code: after a turn's BAR.SYNC, HGMMAs, then BAR.ARV before any DEPBAR
        handed, in_turn, hgmma, waited = 0, False, 0, False
        for i in code:
            if "BAR.SYNC" in i and "0x0" not in i.split()[-1]:
                in_turn, hgmma, waited = True, 0, False
            elif "HGMMA" in i and in_turn:
                hgmma += 1
            elif "WARPGROUP.DEPBAR" in i and in_turn:
                waited = True
            elif "BAR.ARV" in i and in_turn:
                assert hgmma > 0 and not waited, f"{name}: a turn hands on at {i!r} after " \
                    f"{hgmma} HGMMAs, waited {waited}"
                handed += 1
        assert handed >= 3, f"{name}: {handed} turn hand-overs (turn 0, the loop, the last)"


@requires_nvcc
def test_sass_overlap_waits_once_under_the_softmax(cubin):
    """Step 3's loop in the SASS: a turn's D / 16 HGMMAs of S_t (both operands from shared memory),
    then the 8 register-A HGMMAs of P_{t-1} V_{t-1}, the hand-over (BAR.ARV), then
    WARPGROUP.DEPBAR.LE gsb0, 0x1 (wgmma.wait_group 1: S_t is done, P V may run), and only then
    the softmax: between that wait and the next (wait_group 0) lie every MUFU.EX2 of the tile
    (BLOCK_N / 2 for P, 2 for alpha), the 4 shuffles of the row maxima, no HGMMA and no F2FP (P is
    packed into p after wait_group 0, since P V reads p's registers), and the one STS of
    pin_softmax. Steps 1 and 2 wait only with count 0. The highest register any step's code
    names fits the consumers' setmaxnreg budget."""
    sass = sass_by_function(cubin[0])
    budget = _cu_constants()["CONSUMER_REGS"]
    for name in ALL_KERNELS.values():
        regs = {int(r) for r in re.findall(r"\bR(\d+)\b", sass[name])}
        assert max(regs) < budget, f"{name}: R{max(regs)} past setmaxnreg's {budget}"
    for name in [*ha.KERNELS.values(), *ha.PINGPONG_KERNELS.values(), *ha.LEAN_KERNELS.values()]:
        deps = [i for i in _instructions(sass[name]) if "WARPGROUP.DEPBAR" in i]
        assert deps and all(i == "WARPGROUP.DEPBAR.LE gsb0, 0x0" for i in deps), name
    for d, name in ha.OVERLAP_KERNELS.items():
        code = _instructions(sass[name])
        deps = [k for k, i in enumerate(code) if "WARPGROUP.DEPBAR" in i]
        ones = [k for k in deps if code[k] == "WARPGROUP.DEPBAR.LE gsb0, 0x1"]
        assert len(ones) == 1, f"{name}: {len(ones)} waits with count 1"
        a = ones[0]
        before, b = max(k for k in deps if k < a), min(k for k in deps if k > a)
        assert code[b] == "WARPGROUP.DEPBAR.LE gsb0, 0x0", code[b]
        hgmma = [i for i in code[before:a] if "HGMMA" in i]
        assert len(hgmma) == d // 16 + ha.BLOCK_N // 16, f"{name}: {hgmma}"
        assert all("tnspB" not in i for i in hgmma[:d // 16]), "S_t must be issued first"
        assert all("tnspB" in i for i in hgmma[d // 16:]), "then P_{t-1} V_{t-1}"
        last = max(k for k in range(before, a) if "HGMMA" in code[k])
        assert any("BAR.ARV" in i for i in code[last:a]), f"{name}: no hand-over before the wait"
        between = code[a:b]
        exps = sum("MUFU.EX2" in i for i in between)
        assert exps == ha.BLOCK_N // 2 + 2, f"{name}: {exps} exp2 under P V"
        assert sum("SHFL.BFLY" in i for i in between) == 4, name
        assert not any("HGMMA" in i or "F2FP" in i for i in between), name
        assert sum(re.match(r"(@!?P\d+ )?STS\b", i) is not None for i in between) == 1, name
        nxt = min(k for k in range(b, len(code)) if "HGMMA" in code[k])
        assert sum("F2FP" in i for i in code[b:nxt]) == ha.BLOCK_N // 4, f"{name}: P's packing"


def _listing(code: str) -> list[tuple[int, str]]:
    """(address, instruction) of a cuobjdump listing, in order."""
    return [(int(a, 16), i) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", code)]


def _loop_turn_paths(code: str) -> tuple[int, list[list[str]]]:
    """A turn kernel's middle turn: the number of instructions from its BAR.SYNC to the wait for
    its products (the WARPGROUP.DEPBAR after the turn that issues P V and then S), and every path
    from that wait to the next turn's BAR.SYNC that goes round the loop (it waits for the next
    K / V tile, a TRYWAIT). Both sides of every conditional branch are followed, except that an
    mbarrier try-wait succeeds at once (its retry loop is left out)."""
    ins = _listing(code)
    at = {a: k for k, (a, _) in enumerate(ins)}
    sync, wait, pv, s = None, None, False, False
    for k, (_, i) in enumerate(ins):
        if re.search(r"BAR\.SYNC\S* 0x[12],", i):
            sync, pv, s = k, False, False
        elif "HGMMA" in i:
            pv, s = pv or "tnspB" in i, s or (pv and "tnspB" not in i)
        elif "WARPGROUP.DEPBAR" in i and pv and s:
            wait = k
            break
    assert wait is not None, "no turn issues P V and then S"
    paths = []

    def walk(k: int, path: list[str], tried: bool, depth: int) -> None:
        while True:
            i = ins[k][1]
            if re.search(r"BAR\.SYNC\S* 0x[12],", i):
                if any("TRYWAIT" in x for x in path):
                    paths.append(path)
                return
            if re.fullmatch(r"EXIT", i):
                return
            path = [*path, i]
            branch = re.match(r"(@!?U?P\d+ )?BRA (0x[0-9a-f]+)", i)
            if branch is None:
                tried = tried or "TRYWAIT" in i
                k += 1
            elif branch.group(1) is None or tried:  # unconditional, or the try-wait succeeded
                k, tried = at[int(branch.group(2), 16)], False
            else:
                assert depth < 16, "too many branches"
                walk(at[int(branch.group(2), 16)], path, False, depth + 1)
                k += 1

    walk(wait, [], False, 0)
    return wait - sync, paths


def _opcodes(path: list[str]) -> dict[str, int]:
    """How many of each opcode (modifiers kept, predicate dropped) a path issues."""
    counts: dict[str, int] = {}
    for i in path:
        op = re.sub(r"^@!?U?P\w+ ", "", i).split()[0]
        counts[op] = counts.get(op, 0) + 1
    return counts


def _mask_selects(path: list[str]) -> int:
    return sum(re.search(r"\bFSEL R\d+, R\d+, -INF\b", i) is not None for i in path)


@requires_nvcc
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_sass_lean_turn_issues_fewer_instructions(cubin, d):
    """A middle turn of step 2 and of step 4, counted in the compiled code (issued instructions,
    a count and not a time): step 2's softmax is one straight path whose exp2f is MUFU.EX2 plus a
    range fix-up (an FSETP against -126 per exponential) and whose mask is predicated, so its
    BLOCK_N / 2 selects issue on every tile. Step 4's has two paths round the loop without the
    mask (the mask is the last tile's copy), O's rescale skipped or applied after a VOTE.ANY; on
    both the same 64 + 2 MUFU.EX2 (P and the two alphas), no fix-up, at least one FFMA per score,
    P packed in BLOCK_N / 4 F2FP pairs as in step 2, and a D / 2 FMUL difference between them:
    the rescale. With the rescale applied, its softmax is under half of step 2's, and its whole
    turn (from the BAR.SYNC) at most 0.55 of step 2's."""
    sass = sass_by_function(cubin[0])
    scores = ha.BLOCK_N // 2  # a thread's scores of a tile: 2 rows x 32
    exps = scores + 2  # P's, and alpha of the thread's 2 rows
    head2, step2 = _loop_turn_paths(sass[ha.PINGPONG_KERNELS[d]])
    head4, step4 = _loop_turn_paths(sass[ha.LEAN_KERNELS[d]])
    assert len(step2) == 1, f"step 2: {len(step2)} paths"
    c2 = _opcodes(step2[0])
    assert c2["MUFU.EX2"] == exps
    assert sum("-126" in i for i in step2[0]) == exps  # exp2f's range check, per exponential
    assert _mask_selects(step2[0]) == scores  # the mask, predicated off, issued on every tile
    unmasked = [p for p in step4 if _mask_selects(p) == 0]
    assert len(unmasked) == 2, [len(p) for p in step4]
    skipped, applied = sorted(unmasked, key=len)
    for path in unmasked:
        c = _opcodes(path)
        assert c["MUFU.EX2"] == exps, c
        assert not any("-126" in i for i in path)
        assert c.get("FFMA", 0) >= scores and c.get("FADD", 0) < c2["FADD"]
        assert c["F2FP.BF16.F32.PACK_AB"] == c2["F2FP.BF16.F32.PACK_AB"] == scores // 2
        assert c["VOTE.ANY"] == 1
    assert _opcodes(applied)["FMUL"] - _opcodes(skipped)["FMUL"] == d // 2
    assert _opcodes(applied)["FMUL"] < c2["FMUL"] - scores  # at least the scale's FMULs gone
    assert len(applied) < len(step2[0]) / 2, (len(applied), len(step2[0]))
    turn2, turn4 = head2 + len(step2[0]), head4 + len(applied)  # from the turn's BAR.SYNC
    assert turn4 <= 0.55 * turn2, (turn4, turn2)
    # exp2f's fix-up appears nowhere in step 4
    assert not any("-126" in i for i in _instructions(sass[ha.LEAN_KERNELS[d]]))


@requires_nvcc
def test_sass_lean_keeps_step2s_turns(cubin):
    """Step 4 changes the softmax only: its SASS has step 2's barrier, mbarrier, TMA, HGMMA and
    wgmma-wait instructions in step 2's order (registers and predicates aside), so the protocol
    model and step 2's barrier tests speak for it too."""
    sass = sass_by_function(cubin[0])

    def skeleton(name: str) -> list[str]:
        keep = r"BAR\.|HGMMA|WARPGROUP|SYNCS|USETMAXREG|UTMALDG"
        return [re.sub(r"\bU?R\d+|\bU?P\d+", "", i) for i in _instructions(sass[name])
                if re.search(keep, i)]

    for d in ha.HEAD_DIMS:
        lean = skeleton(ha.LEAN_KERNELS[d])
        assert sum("HGMMA" in i for i in lean) > 0
        assert lean == skeleton(ha.PINGPONG_KERNELS[d]), d


@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_other_targets_compile_to_traps(arch, tmp_path):
    """Without sm_90a's features every kernel body is a trap, so the file still builds for the
    book's other targets (tests/test_cuda_compile.py builds every csrc file for them)."""
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", str(CU), "-o", str(tmp_path / "f.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in (proc.stderr + proc.stdout).lower(), proc.stderr


def _cu_constants() -> dict[str, int]:
    text = CU.read_text()
    return {name: int(value) for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+);", text)}


def test_constants_match_the_launcher():
    c = _cu_constants()
    assert (c["BLOCK_M"], c["BLOCK_N"], c["STAGES"]) == (ha.BLOCK_M, ha.BLOCK_N, ha.STAGES)
    assert c["PINGPONG_STAGES"] == ha.PINGPONG_STAGES == ha.STEPS[2][1] == ha.STEPS[3][1]
    assert ha.STEPS[4] == (ha.LEAN_KERNELS, ha.PINGPONG_STAGES, 0)  # step 2's stages, no scratch
    # step 5: step 4's stages and one more mbarrier (q_empty) after the others
    assert ha.STEPS[5] == (ha.PERSIST_KERNELS, ha.PINGPONG_STAGES, ha.PERSIST_SCRATCH)
    assert ha.PERSIST_SCRATCH == c["PERSIST_SCRATCH"] and ha.PERSISTENT_STEPS == (5,)
    assert set(ha.RAW_MAX_STEPS) == {4, 5}  # step 5's consumers are step 4's
    assert ha.OVERLAP_SCRATCH == c["CONSUMERS"] * c["WG_THREADS"] * 4 == ha.STEPS[3][2]
    assert (c["PANEL_COLS"], c["BOX_ROWS"], c["SWIZZLE_REPEAT"]) == (ha.PANEL_COLS, ha.BOX_ROWS,
                                                                     ha.SWIZZLE_REPEAT)
    assert (1 + c["CONSUMERS"]) * c["WG_THREADS"] == ha.THREADS
    text = CU.read_text()
    for d, name in ha.KERNELS.items():
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{name}\(", text)
        assert f"ha::flash_fwd<{d}>" in text
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{ha.PINGPONG_KERNELS[d]}\(",
                         text)
        assert f"ha::flash_fwd<{d}, true>" in text
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{ha.OVERLAP_KERNELS[d]}\(",
                         text)
        assert f"ha::flash_fwd<{d}, true, true>" in text
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{ha.LEAN_KERNELS[d]}\(", text)
        assert f"ha::flash_fwd<{d}, true, false, true>" in text  # PINGPONG and LEAN
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{ha.PERSIST_KERNELS[d]}\(",
                         text)
        assert f"ha::flash_fwd_persistent<{d}>" in text
        # Smem<D, NS>::LAUNCH_BYTES: Q + NS x (K + V) + the barriers + the alignment slack
        tile = c["BOX_ROWS"] * d * 2
        for stages in (c["STAGES"], c["PINGPONG_STAGES"]):
            assert ha.smem_bytes(d, stages) == (tile * (1 + 2 * stages) + (1 + 2 * stages) * 8
                                                + c["SWIZZLE_REPEAT"])
            assert ha.smem_bytes(d, stages) <= 227 * 1024
        # step 3: OVERLAP_SCRATCH = CONSUMERS * WG_THREADS * 4 bytes after the barriers
        assert "OVERLAP_SCRATCH = CONSUMERS * WG_THREADS * 4;" in text
        scratch = c["CONSUMERS"] * c["WG_THREADS"] * 4
        assert ha.smem_bytes(d, c["PINGPONG_STAGES"], scratch) == (
            ha.smem_bytes(d, c["PINGPONG_STAGES"]) + scratch) <= 227 * 1024


def _function_body(text: str, signature: str) -> list[str]:
    """The statements of a device function of flash_fwd.cu (its braces matched), stripped."""
    start = text.index("{", text.index(signature))
    depth, end = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
        end += 1
    return [line.strip() for line in text[start + 1:end].splitlines() if line.strip()]


def test_softmax_scores_is_online_softmax_without_the_rescale():
    """Step 3's softmax_scores is step 1's online_softmax, statement by statement, with alpha kept
    per row (alpha[h]) and without the loop that rescales o, which rescale_o is, line for line:
    the three copies cannot drift apart (and online_softmax stays as steps 1 and 2 compiled it)."""
    text = CU.read_text()
    whole = _function_body(text, "void online_softmax(")
    scores = _function_body(text, "void softmax_scores(")
    rescale = _function_body(text, "void rescale_o(")
    cut = whole.index("m[h] = mx;") + 1
    rescale_loop = whole[cut:-1]  # the o loop, then the h loop's closing brace
    assert rescale_loop[0] == "#pragma unroll" and "D / 8" in rescale_loop[1], rescale_loop
    assert [s.replace("const float alpha =", "alpha[h] =").replace("* alpha +", "* alpha[h] +")
            for s in whole[:cut]] + ["}"] == scores[:cut] + ["}"]
    assert scores[cut:] == ["}"]  # the h loop closes: nothing after m[h] = mx
    assert [s.replace("*= alpha;", "*= alpha[h];") for s in rescale_loop] == rescale[2:-1]


# --------------------------------------------------------------------------------------------------
# Descriptors and register fragments, on paper# --------------------------------------------------------------------------------------------------
# Descriptors and register fragments, on paper
# --------------------------------------------------------------------------------------------------

def _enc(x: int) -> int:
    return (x & 0x3FFFF) >> 4


def _c_desc(addr: int, lbo: int, sbo: int) -> int:
    """make_desc of flash_fwd.cu, transcribed."""
    return _enc(addr) | _enc(lbo) << 16 | _enc(sbo) << 32 | 1 << 62


@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_descriptors_are_hopper_py_descriptors(d):
    """Q's and K's descriptors (K-major: LBO 16, SBO 1024, + 32 bytes per 16 of D inside a panel,
    + a panel of 16 KB per 64 of D) are those hopper.py encodes for a 128B-swizzled K-major tile;
    V's (MN-major) use LBO = one panel (the next 64 columns of D) and SBO = 1024 (the next 8 keys),
    + 2048 bytes per 16 keys."""
    lbo, sbo = kmajor_offsets(ha.BOX_ROWS, ha.PANEL_COLS * 2, "128B")
    assert (lbo, sbo) == (16, 1024)
    panel = ha.BOX_ROWS * ha.PANEL_COLS * 2
    for base in (0, 1024, 32 * 1024, 160 * 1024):
        for kk in range(d // 16):
            for half in (0, 64 * 128):  # consumer 1's rows of Q
                addr = base + half + (kk // 4) * panel + (kk % 4) * 32
                assert _c_desc(addr, 16, 1024) == wgmma_descriptor(addr, lbo, sbo, "128B")
        for kk in range(ha.BLOCK_N // 16):
            addr = base + kk * 16 * 128
            assert addr % 1024 == 0  # base offset 0 stays right
            assert _c_desc(addr, panel, 1024) == wgmma_descriptor(addr, panel, 1024, "128B")


def _cute(shape, stride, t: int, v: int) -> int:
    """A CuTe layout ((4, 8, 4), (v0, v1, v2)) : ((...), (...)) at thread t, value v (column-major
    coordinates, as CuTe flattens them)."""
    (ts, vs), (tst, vst) = shape, stride
    out = 0
    for sizes, strides, idx in ((ts, tst, t), (vs, vst, v)):
        for n, st in zip(sizes, strides):
            out += (idx % n) * st
            idx //= n
    return out


def _acc_coord(n: int, t: int, i: int) -> tuple[int, int]:
    """(row, column) of accumulator register i of thread t, as flash_fwd.cu reads it (the
    fragments comment): the GEMM's store_acc layout."""
    warp, lane = divmod(t, 32)
    j, h, e = i // 4, (i // 2) % 2, i % 2
    return warp * 16 + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e


@pytest.mark.parametrize("n", [64, 128])
def test_accumulator_layout_is_cutes(n):
    """The kernel's reading of the accumulators is CuTe's CLayout_64xN (index = row + 64 * col)."""
    shape, stride = ((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512))
    for t in range(128):
        for i in range(n // 2):
            r, c = _acc_coord(n, t, i)
            assert _cute(shape, stride, t, i) == r + 64 * c


def test_p_fragment_is_the_register_a_operand():
    """P's A fragment for keys 16kk..16kk+15 is accumulator registers 8kk..8kk+7, paired in order:
    value v of the A operand (CuTe's ALayout_64x16: 8 bf16 values a thread, 4 b32 registers) is
    accumulator register 8kk + v, at the same row and at column 16kk + (its column)."""
    a_shape, a_stride = ((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512))
    for t in range(128):
        for kk in range(ha.BLOCK_N // 16):
            for v in range(8):
                idx = _cute(a_shape, a_stride, t, v)
                row, col = idx % 64, idx // 64
                assert _acc_coord(ha.BLOCK_N, t, 8 * kk + v) == (row, 16 * kk + col)


def _kernel_transcription(q, k, v, causal, scale, deferred=False, order="v1"):
    """flash_fwd.cu's arithmetic in float32 on one (S, D) head: tiles of 128 keys, scores in log2
    units, the last tile masked (keys >= S, keys right of the diagonal), m = -inf guarded, p
    rounded to bf16 before P V, l summed from the unrounded p, lse = (m + log2 l) ln 2.
    ``deferred`` (or ``order="v2"``): step 2's order, P_t V_t added in the next turn (before tile
    t + 1's softmax rescales O) or after the loop, instead of right after tile t's softmax.
    ``order="v3"``: step 3's, the softmax of tile t + 1 (its m, alpha, p and l) first, then
    P_t V_t added (wait_group 0), then O rescaled by tile t + 1's alpha. ``order="v3_bug"``: a
    planted bug, O rescaled before P_t V_t is added."""
    deferred = deferred or order == "v2"
    overlap = order in ("v3", "v3_bug")
    s, d = q.shape
    q, k, v = q.float(), k.float(), v.float()
    o = torch.empty(s, d)
    lse = torch.empty(s)
    for m0 in range(0, s, ha.BLOCK_M):
        rows = torch.arange(m0, min(m0 + ha.BLOCK_M, s))
        acc = torch.zeros(len(rows), d)
        m = torch.full((len(rows),), float("-inf"))
        l_sum = torch.zeros(len(rows))
        pending = None  # step 2: (P_{t-1}, V_{t-1}), issued in turn t
        key_tiles = -(-s // ha.BLOCK_N)
        n_tiles = min(key_tiles, m0 // ha.BLOCK_M + 1) if causal else key_tiles
        for t in range(n_tiles):
            if pending is not None and not overlap:  # turn t: O += P_{t-1} V_{t-1}, then softmax
                acc = acc + pending[0] @ pending[1]
            keys = torch.arange(t * ha.BLOCK_N, min((t + 1) * ha.BLOCK_N, s))
            sc = (q[rows] @ k[keys].T) * (scale * ha.LOG2E)
            if t == n_tiles - 1 and causal:
                sc = sc.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
            mx = torch.maximum(m, sc.max(dim=1).values)
            m_use = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
            alpha = torch.exp2(m - m_use)
            p = torch.exp2(sc - m_use[:, None])
            l_sum = l_sum * alpha + p.sum(dim=1)
            m = mx
            if overlap:  # step 3: P_{t-1} V_{t-1} lands (wait_group 0) after the softmax of t
                if pending is not None and order == "v3":
                    acc = acc + pending[0] @ pending[1]
                acc = acc * alpha[:, None]
                if pending is not None and order == "v3_bug":
                    acc = acc + pending[0] @ pending[1]
                pending = (p.bfloat16().float(), v[keys])
            elif deferred:
                acc = acc * alpha[:, None]
                pending = (p.bfloat16().float(), v[keys])
            else:
                acc = acc * alpha[:, None] + p.bfloat16().float() @ v[keys]
        if pending is not None:  # the last turn
            acc = acc + pending[0] @ pending[1]
        o[rows] = acc / l_sum[:, None]
        lse[rows] = (m + torch.log2(l_sum)) * math.log(2)
    return o.bfloat16(), lse


@pytest.mark.cpu_only
@pytest.mark.parametrize("s, d, causal", [(1, 64, False), (77, 64, True), (300, 128, False),
                                          (300, 128, True), (256, 64, True)])
def test_kernel_arithmetic_matches_reference(s, d, causal):
    """The online softmax as the kernel does it (a CPU transcription) against the float64
    reference: within bf16's rounding of P and of o."""
    gen = torch.Generator().manual_seed(s + d)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen).bfloat16() for _ in range(3))
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    o, lse = _kernel_transcription(q[0, 0], k[0, 0], v[0, 0], causal, 1 / math.sqrt(d))
    torch.testing.assert_close(o.double(), o_ref[0, 0], rtol=0, atol=2e-2)
    torch.testing.assert_close(lse.double(), lse_ref[0, 0], rtol=0, atol=1e-4)


@pytest.mark.cpu_only
@pytest.mark.parametrize("s, d, causal", [(1, 64, False), (77, 64, True), (300, 128, False),
                                          (300, 128, True), (640, 64, True), (640, 128, False)])
def test_pingpong_order_is_v1s_arithmetic(s, d, causal):
    """Step 2 adds P_t V_t a turn later, after the wait of turn t + 1, but still after O was
    rescaled by tile t's alpha and before tile t + 1's rescale: the same float32 operations in the
    same order, so the transcriptions agree bit for bit (what the GPU test asks of the kernels)."""
    gen = torch.Generator().manual_seed(s * 3 + d)
    q, k, v = (torch.randn(s, d, generator=gen).bfloat16() for _ in range(3))
    o1, lse1 = _kernel_transcription(q, k, v, causal, 1 / math.sqrt(d))
    o2, lse2 = _kernel_transcription(q, k, v, causal, 1 / math.sqrt(d), deferred=True)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)


@pytest.mark.cpu_only
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("s", [1, 77, 128, 129, 300, 1000, 2049])
def test_overlap_order_is_v1s_arithmetic(s, d, causal):
    """Step 3 computes the softmax of tile t + 1 before P_t V_t is added to O, but O still sees
    v1's sequence (+ P_t V_t, then * alpha_{t+1}): the transcriptions agree bit for bit, from 1
    to 17 key tiles, ragged, both masks. The planted bug (O rescaled before P_t V_t is added)
    does not, from three key tiles on: the comparison can fail."""
    gen = torch.Generator().manual_seed(s * 5 + d + causal)
    q, k, v = (torch.randn(s, d, generator=gen).bfloat16() for _ in range(3))
    o1, lse1 = _kernel_transcription(q, k, v, causal, 1 / math.sqrt(d))
    o3, lse3 = _kernel_transcription(q, k, v, causal, 1 / math.sqrt(d), order="v3")
    assert torch.equal(o1, o3) and torch.equal(lse1, lse3)
    if s >= 300:  # a few full key tiles: some row's max grows after its first tile (alpha < 1)
        bug, _ = _kernel_transcription(q, k, v, causal, 1 / math.sqrt(d), order="v3_bug")
        assert not torch.equal(o1, bug)


def _lean_mask(lane: int, q0: int, key0: int, s: int, causal: bool, see: int = 1) -> set[int]:
    """mask_raw_scores of flash_fwd.cu, transcribed: the registers of thread ``lane`` (row 0 at
    query q0) that are set to -inf on the tile of keys from key0. ``see=0`` plants an off-by-one
    (min(S, q) for min(S, q + 1))."""
    col0 = key0 + 2 * (lane % 4)
    masked = set()
    for h in (0, 1):
        q = q0 + 8 * h
        limit = (min(s, q + see) if causal else s) - col0
        masked |= {4 * j + 2 * h + e for j in range(ha.BLOCK_N // 8) for e in (0, 1)
                   if 8 * j + e >= limit}
    return masked


def test_lean_mask_is_the_mask():
    """Step 4's mask (one compare per score against a column limit per row, key >= min(S, q + 1))
    sets exactly the registers online_softmax's rule does (key >= S, or causal and key > q), for
    every lane of every consumer warp, on the last tile of ragged and whole S, both masks. The
    transcription is the kernel's two lines; a planted off-by-one (min(S, q)) is caught."""
    text = CU.read_text()
    assert "const int limit = (causal ? min(S, q + 1) : S) - col0;" in text
    assert "if (8 * j + e >= limit) sc[4 * j + 2 * h + e] = -INFINITY;" in text
    assert "const int col0 = key0 + 2 * (lane % 4);" in text
    planted = 0
    for s in (1, 7, 77, 128, 129, 255, 256, 300):
        key_tiles = -(-s // ha.BLOCK_N)
        for causal in (False, True):
            for block in range(key_tiles):
                n = min(key_tiles, block + 1) if causal else key_tiles
                key0 = (n - 1) * ha.BLOCK_N  # the last tile, the only one masked
                for warp_row in range(0, ha.BLOCK_M, 16):  # 64 c + 16 w: a warp's 16 rows
                    for lane in range(32):
                        q0 = block * ha.BLOCK_M + warp_row + lane // 4
                        want = set()
                        for i in range(ha.BLOCK_N // 2):
                            key = key0 + 8 * (i // 4) + 2 * (lane % 4) + (i & 1)
                            q = q0 + 8 * ((i // 2) & 1)
                            if key >= s or (causal and key > q):
                                want.add(i)
                        assert _lean_mask(lane, q0, key0, s, causal) == want, (s, causal, q0)
                        planted += _lean_mask(lane, q0, key0, s, causal, see=0) != want
    assert planted > 0  # the off-by-one is caught


def _lean_transcription(q, k, v, causal, scale, ex2_error=0.0):
    """Step 4's arithmetic in float32 on one (S, D) head, as flash_fwd.cu's lean_softmax and the
    launcher do it: a negative scale runs as -scale on -k; the last tile masked on raw scores;
    the row max on raw scores; p = ex2(fma(s, scale_log2, -m * scale_log2)) (the FFMA rounded
    once: a float64 product of two float32 is exact); alpha = ex2(m_old * sl - m_new * sl), 0 on
    the first tile, and the -inf selects of the kernel for a scale of 0; O's rescale skipped when
    every alpha of a warp's 16 rows is 1; m * scale_log2 for the log-sum-exp. ``ex2_error``
    multiplies every ex2 by 1 + ex2_error or 1 - ex2_error (alternating columns), a stand-in for
    ex2.approx's error."""
    s, d = q.shape
    if scale < 0:
        k, scale = -k, -scale
    sl = torch.tensor(scale * ha.LOG2E, dtype=torch.float32)
    q, k, v = q.float(), k.float(), v.float()
    inf = float("-inf")

    def ex2(x: torch.Tensor) -> torch.Tensor:  # ex2.approx of 0 is exactly 1 (the PTX ISA)
        wobble = torch.ones(x.shape[-1], dtype=torch.float64)
        wobble[0::2], wobble[1::2] = 1 + ex2_error, 1 - ex2_error
        return torch.where(x == 0, 1.0, torch.exp2(x.double()) * wobble).float()

    o = torch.empty(s, d)
    lse = torch.empty(s)
    for m0 in range(0, s, ha.BLOCK_M):
        rows = torch.arange(m0, min(m0 + ha.BLOCK_M, s))
        acc = torch.zeros(len(rows), d)
        m = torch.full((len(rows),), inf)
        l_sum = torch.zeros(len(rows))
        key_tiles = -(-s // ha.BLOCK_N)
        n_tiles = min(key_tiles, m0 // ha.BLOCK_M + 1) if causal else key_tiles
        for t in range(n_tiles):
            keys = torch.arange(t * ha.BLOCK_N, min((t + 1) * ha.BLOCK_N, s))
            sc = q[rows] @ k[keys].T  # raw scores
            last = t == n_tiles - 1
            if last and causal:
                sc = sc.masked_fill(keys[None, :] > rows[:, None], inf)
            mx = torch.maximum(m, sc.max(dim=1).values)
            neg_m = torch.where(mx == inf, torch.zeros_like(mx), -(mx * sl))
            alpha = torch.where(m == inf, torch.zeros_like(m),
                                ex2(((m * sl) + neg_m)[None, :])[0])
            p = ex2((sc.double() * sl.double() + neg_m.double()[:, None]).float())
            if last:
                p = torch.where(sc == inf, torch.zeros_like(p), p)
            l_sum = l_sum * alpha + p.sum(dim=1)
            m = mx
            for w in range(0, len(rows), 16):  # a warp's 16 rows vote
                if not bool((alpha[w:w + 16] == 1).all()):
                    acc[w:w + 16] = acc[w:w + 16] * alpha[w:w + 16, None]
            acc = acc + p.bfloat16().float() @ v[keys]
        o[rows] = acc / l_sum[:, None]
        lse[rows] = ((m * sl) + torch.log2(l_sum)) * math.log(2)
    return o.bfloat16(), lse


@pytest.mark.cpu_only
@pytest.mark.parametrize("scale", [None, 0.3, -0.3, 0.0])
@pytest.mark.parametrize("s, d, causal", [(1, 64, False), (77, 64, True), (300, 128, False),
                                          (300, 128, True), (640, 64, True), (1000, 128, False)])
def test_lean_arithmetic_matches_reference(s, d, causal, scale):
    """Step 4's arithmetic (a float32 transcription, with ex2.approx's documented error of about
    2^-22 relative played as +-2^-21 on every exponential) against the float64 reference, within
    the tolerance step 1's transcription meets: o to 2e-2 (P and o are rounded to bf16), lse to
    1e-4. Not step 1's bits: FFMA rounds once where FMUL and FADD rounded twice. Scales: the
    default, a positive one, a negative one (run as -scale on -k) and 0 (every exponent 0: the
    kernel's selects keep -inf * 0 out)."""
    gen = torch.Generator().manual_seed(s * 11 + d + causal)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen).bfloat16() for _ in range(3))
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal, scale)
    scale = 1 / math.sqrt(d) if scale is None else scale
    for err in (0.0, 2.0**-21):
        o, lse = _lean_transcription(q[0, 0], k[0, 0], v[0, 0], causal, scale, ex2_error=err)
        torch.testing.assert_close(o.double(), o_ref[0, 0], rtol=0, atol=2e-2)
        torch.testing.assert_close(lse.double(), lse_ref[0, 0], rtol=0, atol=1e-4)
    if s >= 300 and scale > 0:  # not step 1's bits, but as close as rounding allows
        o1, _ = _kernel_transcription(q[0, 0], k[0, 0], v[0, 0], causal, scale)
        assert (o.double() - o1.double()).abs().max() <= 2 * 2.0**-8 * o1.double().abs().max()


def test_lean_scale_fold_needs_a_positive_scale():
    """Why the launcher negates k for a negative scale: the row max taken on raw scores is the
    max of the scaled scores only when the scale is >= 0. Without the negation a negative scale
    would subtract each row's smallest scaled score instead: every p up to 2 to the power of the
    row's range, which overflows float32 once that range passes 128 (the softmax, shift
    invariant, hides it below). With it, -scale on -k gives the scaled scores' max exactly."""
    assert ha.RAW_MAX_STEPS == (4, 5)  # step 5 runs step 4's consumers
    gen = torch.Generator().manual_seed(1)
    sc = torch.randn(8, 128, generator=gen, dtype=torch.float64)
    for scale in (0.7, -0.7):
        want = (sc * scale).max(dim=1).values
        assert torch.equal(sc.max(dim=1).values * scale, want) == (scale > 0)
        if scale < 0:  # what the launcher runs: -scale on -k
            assert torch.equal((-sc).max(dim=1).values * -scale, want)


def test_reference_is_the_common_one():
    """attention_ref's o is the shared attention_ref of snippets.common.attention (Part 5's, in
    float64); its lse is each row's logsumexp."""
    from snippets.common.attention import attention_ref as part5_ref
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 37, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        o, lse = ha.attention_ref(q, k, v, causal)
        torch.testing.assert_close(o, part5_ref(q, k, v, causal))
        scores = q @ k.transpose(-1, -2) / 8.0
        if causal:
            scores = scores.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), -math.inf)
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1))



@pytest.mark.parametrize("module", ["hopper_attention", "fp8_attention"])
def test_reference_a_few_heads_at_a_time(module, monkeypatch):
    """The references take heads in groups (so that S = 16384 fits in a GPU's memory beside the
    inputs): with room for 1 and for 3 of 7 heads' scores, o (and lse) equal the all-at-once
    formula's, the last, partial group included."""
    import importlib
    mod = importlib.import_module(f"snippets.part6.{module}")
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 7, 24, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        scores = q @ k.transpose(-1, -2) / 4.0
        if causal:
            scores = scores.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), -math.inf)
        for heads in (1, 3):
            monkeypatch.setattr(mod, "REFERENCE_SCORES", heads * 24 * 24)
            got = mod.attention_ref(q, k, v, causal)
            o = got[0] if module == "hopper_attention" else got
            torch.testing.assert_close(o, torch.softmax(scores, -1) @ v, rtol=1e-12, atol=1e-12)
            if module == "hopper_attention":
                torch.testing.assert_close(got[1], torch.logsumexp(scores, -1), rtol=1e-12, atol=1e-12)

# --------------------------------------------------------------------------------------------------
# Step 2's turns, on paper: the named-barrier protocol, run over every interleaving
# --------------------------------------------------------------------------------------------------

def _pingpong_program(c: int, n_tiles: int, first: int, plant: str = "",
                      step: int = 2) -> list[tuple]:
    """consume_pingpong's (step 2) or consume_overlap's (step 3) operations for consumer c,
    transcribed in order: ("arrive", barrier), ("sync", barrier), ("full", tile) (the mbarrier
    wait for a K / V tile), ("turn", t) (turn t begins), ("issue", (product, tile)) (a wgmma group
    reading the tile's K, product "S", or its V, "PV"), ("wait", n) (wgmma.wait_group n),
    ("softmax", tile) (reads S of the tile), ("write", "o" or "p") (O's rescale, P's packing:
    registers an in-flight P V writes or reads) and ("release", tile). Consumer c waits on
    PINGPONG_BARRIERS[c]. ``plant`` plants a bug: "last_arrive", the last consumer hands on its
    last turn; "double_start", the first turn is handed over twice; step 3's "early_release",
    tile t - 1 released after wait_group 1 (P_{t-1} V_{t-1} may still read its V); "pv_first",
    P V issued before S (wait_group 1 then leaves S in flight); "early_pack", P_t packed into p
    before wait_group 0."""
    own, other = ha.PINGPONG_BARRIERS[c], ha.PINGPONG_BARRIERS[1 - c]
    ops: list[tuple] = []
    if c != first:
        ops.append(("arrive", ha.PINGPONG_BARRIERS[first]))  # the first turn is the other's
        if plant == "double_start":
            ops.append(("arrive", ha.PINGPONG_BARRIERS[first]))
    for t in range(n_tiles + 1):  # turn t: P_{t-1} V_{t-1} (t >= 1), S_t (t < n_tiles)
        if t < n_tiles:
            ops.append(("full", t))
        ops += [("sync", own), ("turn", t)]
        products = ([("PV", t - 1)] if t > 0 else []) + ([("S", t)] if t < n_tiles else [])
        if step == 3 and plant != "pv_first":
            products.reverse()  # S_t first, so that wait_group 1 leaves only P V in flight
        ops += [("issue", g) for g in products]
        # the last consumer's last turn hands nothing on
        if t < n_tiles or c == first or plant == "last_arrive":
            ops.append(("arrive", other))
        if step == 3 and 0 < t < n_tiles:  # the softmax of t under P_{t-1} V_{t-1}
            ops += [("wait", 1), ("softmax", t)]
            ops += {"early_pack": [("write", "p")],
                    "early_release": [("release", t - 1)]}.get(plant, [])
            ops.append(("wait", 0))
            ops += [] if plant == "early_release" else [("release", t - 1)]
            ops += [("write", "o")] + ([] if plant == "early_pack" else [("write", "p")])
        else:
            ops.append(("wait", 0))
            if t > 0:
                ops.append(("release", t - 1))
            if t < n_tiles:
                ops += [("softmax", t), ("write", "o"), ("write", "p")]
    return ops


def _in_flight(program: list[tuple]) -> list[tuple]:
    """The wgmma groups in flight before each operation of a program (and after the last): an
    issue adds its group, wait_group n keeps the newest n."""
    groups: tuple = ()
    out = [groups]
    for op, arg in program:
        if op == "issue":
            groups += (arg,)
        elif op == "wait":
            groups = groups[len(groups) - arg:] if arg else ()
        out.append(groups)
    return out


def _block_tiles(block: int, key_tiles: int, causal: bool) -> tuple[int, int]:
    """The key tiles consumers 0 and 1 of block ``block`` walk, as flash_fwd computes n_tiles:
    one count per block, so the same for both (the causal diagonal is masked per row)."""
    n = min(key_tiles, block + 1) if causal else key_tiles
    return n, n


LOCAL = ("turn", "softmax", "write")  # operations on a warp's own registers only


def _check_local(c: int, op: str, arg, groups: tuple, loaded: int) -> None:
    """A consumer's own operation, with the wgmma groups it has in flight before it: an issued
    group reads a tile in shared memory; the softmax reads scores no longer in flight; O and p
    are written with no P V in flight."""
    if op == "issue":
        assert loaded - ha.PINGPONG_STAGES <= arg[1] < loaded, (
            f"consumer {c} issues {arg} with tiles {loaded - ha.PINGPONG_STAGES} .. {loaded - 1} "
            "in shared memory")
    elif op == "softmax":
        assert ("S", arg) not in groups, (
            f"consumer {c} reads S of tile {arg} while {groups} are in flight")
    elif op == "write":
        assert not any(kind == "PV" for kind, _ in groups), (
            f"consumer {c} writes {arg} while {groups} are in flight")


def _run_protocol(tiles: tuple[int, int], first: int, warps: int = 1, plant: str = "",
                  step: int = 2) -> int:
    """Explore every interleaving of the producer and the consumers' warps (``warps`` model warps
    a consumer, each running its consumer's program and standing for 4 / warps hardware warps).
    A named barrier counts arriving warps (sync and arrive alike) and completes at
    PINGPONG_THREADS / 32 warps, releasing the warps blocked in its sync and resetting (PTX ISA,
    bar / barrier). The producer loads tile t once every consumer warp has released tile
    t - PINGPONG_STAGES. In every reachable state, assert: no warp executes a second barrier
    instruction on a barrier before it completes (the PTX ISA calls that unpredictable); no
    deadlock; a consumer's turn t begins only when every warp of the other has issued exactly
    the turns that come before it in the alternation first, other, first, ...; at the end, no
    barrier holds a pending arrival. The wgmma groups: a group reads a tile that is in shared
    memory (loaded, not yet overwritten); the producer never overwrites a tile that a group in
    flight still reads; the softmax never reads scores still in flight; O and p are never
    written while a P V is in flight; no group is left in flight at the end. Returns the number of
    states explored."""
    programs = [_pingpong_program(c, tiles[c], first, plant, step) for c in (0, 1)]
    flights = [_in_flight(prog) for prog in programs]
    procs = [c for c in (0, 1) for _ in range(warps)]
    hw_per_model = (ha.PINGPONG_THREADS // 32) // len(procs)
    turns = [[sum(op == "turn" for op, _ in prog[:k]) for k in range(len(prog) + 1)]
             for prog in programs]
    releases = [[sum(op == "release" for op, _ in prog[:k]) for k in range(len(prog) + 1)]
                for prog in programs]
    index = {b: i for i, b in enumerate(ha.PINGPONG_BARRIERS)}
    n_load = max(tiles)

    # a state: the model warps' pcs, the tiles loaded, and per barrier the warps counted in its
    # current phase and which of them are blocked in a sync
    start = (tuple(0 for _ in procs), 0, ((), ()), ((), ()))
    seen, frontier = {start}, [start]
    while frontier:
        pcs, loaded, counted, blocked = frontier.pop()
        moves = []
        if loaded < n_load and (loaded < ha.PINGPONG_STAGES or all(
                releases[c][pcs[i]] > loaded - ha.PINGPONG_STAGES for i, c in enumerate(procs))):
            gone = loaded - ha.PINGPONG_STAGES  # the tile this load overwrites
            for i, c in enumerate(procs):
                assert all(tile != gone for _, tile in flights[c][pcs[i]]), (
                    f"the producer overwrites tile {gone} while consumer {c}'s wgmma "
                    f"{flights[c][pcs[i]]} reads it (tiles {tiles}, first {first})")
            moves.append((pcs, loaded + 1, counted, blocked))
        waiting = set(blocked[0]) | set(blocked[1])
        for i, c in enumerate(procs):
            if pcs[i] == len(programs[c]) or i in waiting:
                continue
            op, arg = programs[c][pcs[i]]
            new_pcs = list(pcs)
            if op in ("sync", "arrive"):
                b = index[arg]
                assert i not in counted[b], (
                    f"consumer {c} executes a second barrier instruction on barrier {arg} before "
                    f"it completes (tiles {tiles}, first {first})")
                now, blk = counted[b] + (i,), blocked[b] + ((i,) if op == "sync" else ())
                if op == "arrive":
                    new_pcs[i] += 1
                if len(now) * hw_per_model == ha.PINGPONG_THREADS // 32:  # completes, resets
                    for j in blk:
                        new_pcs[j] += 1  # past its sync: the turn begins
                        cj = procs[j]
                        t = turns[cj][new_pcs[j]]  # the turn it begins
                        before = t if cj == first else t + 1  # the other's turns before it
                        for k, ck in enumerate(procs):
                            if ck != cj:
                                assert turns[ck][pcs[k]] == before, (
                                    f"consumer {cj} begins turn {t} while consumer {ck} has "
                                    f"issued {turns[ck][pcs[k]]} turns (tiles {tiles})")
                    now, blk = (), ()
                cnt, bl = list(counted), list(blocked)
                cnt[b], bl[b] = now, blk
                moves.append((tuple(new_pcs), loaded, tuple(cnt), tuple(bl)))
                continue
            if op == "full" and loaded <= arg:
                continue  # its K / V tile has not arrived
            # this op, and the register-only ops after it at once (no other warp or the
            # producer can observe them: they change nothing shared, and what they check, the
            # groups in flight, only issue and wait change)
            while True:
                _check_local(c, op, arg, flights[c][new_pcs[i]], loaded)
                new_pcs[i] += 1
                if new_pcs[i] == len(programs[c]) or programs[c][new_pcs[i]][0] not in LOCAL:
                    break
                op, arg = programs[c][new_pcs[i]]
            moves.append((tuple(new_pcs), loaded, counted, blocked))
        if all(pcs[i] == len(programs[c]) for i, c in enumerate(procs)):
            assert counted == ((), ()), (
                f"barrier arrivals pending at the end: {counted} (tiles {tiles}, first {first})")
            assert all(flights[c][-1] == () for c in (0, 1)), "wgmma groups left in flight"
            continue
        assert moves, f"deadlock: tiles {tiles}, first {first}, pcs {pcs}, loaded {loaded}"
        for m in moves:
            if m not in seen:
                seen.add(m)
                frontier.append(m)
    return len(seen)


@pytest.mark.cpu_only
@pytest.mark.parametrize("step", [2, 3])
def test_pingpong_protocol_has_no_deadlock_and_alternates(step):
    """Every key-tile count up to 64, with and without the causal mask (every block of the
    causal grid), either consumer first: no deadlock, no second barrier instruction before a
    barrier completes, strict alternation, no pending arrival at the end, no stage refilled or
    register written under a wgmma in flight (the model above), for step 2's turns and step 3's."""
    checked = set()
    for key_tiles in range(1, 65):
        for causal in (False, True):
            for block in range(key_tiles):
                for first in (0, 1):
                    case = (_block_tiles(block, key_tiles, causal), first)
                    if case not in checked:
                        checked.add(case)
                        assert _run_protocol(*case, step=step) > 0
    assert len(checked) == 64 * 2


@pytest.mark.cpu_only
@pytest.mark.parametrize("step", [2, 3])
def test_pingpong_protocol_warp_by_warp(step):
    """The same with every consumer split into two model warps (each standing for two hardware
    warps), so a fast warp may run ahead of its warpgroup's others."""
    for n in range(1, 9):
        for first in (0, 1):
            _run_protocol((n, n), first, warps=2, step=step)


@pytest.mark.parametrize("tiles, first, plant, step, match", [
    ((3, 2), 0, "", 2, "deadlock"),  # consumers walking different tile counts
    ((2, 3), 1, "", 2, "deadlock"),
    ((4, 4), 0, "last_arrive", 2, "pending"),  # the last turn handed on: an arrival left behind
    ((4, 4), 1, "double_start", 2, "second barrier instruction"),
    ((3, 2), 0, "", 3, "deadlock"),
    ((4, 4), 0, "last_arrive", 3, "pending"),
    ((4, 4), 0, "early_release", 3, "overwrites tile"),  # V still read by P V in flight
    ((2, 2), 1, "pv_first", 3, "reads S of tile 1"),  # wait_group 1 leaves S_1 in flight
    ((2, 2), 0, "early_pack", 3, "writes p"),  # P packed over the registers P V reads
])
def test_pingpong_model_catches_planted_bugs(tiles, first, plant, step, match):
    """The model can fail: per-consumer tile counts deadlock, an extra arrive is caught; in step
    3, a stage released before the wait for the P V reading it, the products issued in the other
    order, and P packed before that wait are caught."""
    with pytest.raises(AssertionError, match=match):
        _run_protocol(tiles, first, plant=plant, step=step)


# a consumer's turn operations as they appear in flash_fwd.cu, and the model's names for them
TURN_TOKENS = {"turn_pass(c)": "arrive", "turn_wait(c)": "sync", "qk_issue": "S", "pv_issue": "PV",
               "mbar_wait(full": "full", "mbar_arrive(empty": "release", "for (int t = 1": "loop",
               "c != PINGPONG_FIRST) turn_pass": "arrive if not first",
               "c == PINGPONG_FIRST) turn_pass": "arrive if first"}


def _region_code(region: str, entry: str) -> str:
    """Region ``region`` of flash_fwd.cu from ``entry`` on: the code, not the comment above it."""
    text = CU.read_text()
    body = text[text.index(f"[start:{region}]"):text.index(f"[end:{region}]")]
    return body[body.index(entry):]


def _kernel_ops(region: str, entry: str, extra: dict[str, str]) -> list[str]:
    """The operations of :func:`_region_code` in source order, named by TURN_TOKENS and
    ``extra``."""
    tokens = {**TURN_TOKENS, **extra}
    seq = []
    for line in _region_code(region, entry).splitlines():
        for k, v in tokens.items():
            if k in line and not (v == "arrive" and "PINGPONG_FIRST" in line):
                seq.append(v)
    return seq


def test_pingpong_program_is_the_kernels():
    """The transcription's protocol constants are flash_fwd.cu's: barriers PINGPONG_BAR and
    PINGPONG_BAR + 1 counting 256 threads, consumer PINGPONG_FIRST first, the arrive of the
    first turn before the loop and no arrive after the last consumer's last turn."""
    c = _cu_constants()
    assert ha.PINGPONG_BARRIERS == (c["PINGPONG_BAR"], c["PINGPONG_BAR"] + 1)
    assert 0 not in ha.PINGPONG_BARRIERS and max(ha.PINGPONG_BARRIERS) < 16
    assert ha.PINGPONG_FIRST == c["PINGPONG_FIRST"]
    assert ha.PINGPONG_THREADS == c["CONSUMERS"] * c["WG_THREADS"] == 256
    # the kernel's operations in source order: what _pingpong_program unrolls
    seq = _kernel_ops("pingpong", "consume_pingpong(", {})
    assert seq == [
        "arrive if not first",                             # the first turn is handed over
        "full", "sync", "S", "arrive",                     # turn 0
        "loop", "full", "sync", "PV", "S", "arrive", "release",  # turns 1 .. n - 1
        "sync", "PV", "arrive if first", "release",        # turn n
    ], seq
    prog = _pingpong_program(0, 3, first=0)
    assert [op for op, _ in prog].count("sync") == 3 + 1  # n + 1 turns
    # step 4 is this consumer with LEAN (only its softmax differs), so the model is its protocol
    text, body = CU.read_text(), _region_code("pingpong", "consume_pingpong(")
    assert "consume_pingpong<D, LEAN>(" in text
    assert body.count("tile_softmax<D, LEAN>(") == 2 and "online_softmax" not in body
    for d in ha.HEAD_DIMS:
        assert f"ha::flash_fwd<{d}, true, false, true>" in text


def _program_tokens(ops: list[tuple]) -> list[str]:
    """A model program in the words of the kernel's source (as the tests below read it)."""
    words = {"sync": "sync", "arrive": "arrive", "full": "full", "release": "release",
             "softmax": "softmax"}
    out = []
    for op, arg in ops:
        if op == "issue":
            out.append(arg[0])
        elif op == "wait":
            out.append(f"wait{arg}")
        elif op == "write":
            out.append(f"write {arg}")
        elif op != "turn":
            out.append(words[op])
    return out


def test_overlap_program_is_the_kernels():
    """consume_overlap's operations in source order are what the model runs for step 3: the
    prologue and the last turn as in step 2, and in the loop S_t issued before P_{t-1} V_{t-1},
    the hand-over, wait_group 1, the softmax, the pin, wait_group 0, the release of tile t - 1,
    O's rescale and P's packing. (The pin is a scheduling device for ptxas, outside the model.)"""
    seq = _kernel_ops("overlap", "consume_overlap(", {
        "wgmma_wait<1>": "wait1", "wgmma_wait<0>": "wait0", "softmax_scores(": "softmax",
        "online_softmax<": "softmax", "pin_softmax(pin": "pin", "rescale_o<": "write o",
        "pack_p(": "write p"})
    loop = ["full", "sync", "S", "PV", "arrive", "wait1", "softmax", "pin", "wait0", "release",
            "write o", "write p"]
    assert seq == [
        "arrive if not first",
        "full", "sync", "S", "arrive", "wait0", "softmax", "write p",  # turn 0 (the prologue)
        "loop", *loop,                                                 # turns 1 .. n - 1
        "sync", "PV", "arrive if first", "wait0", "release",           # turn n
    ], seq
    # the model's turn 1 of 3 (consumer 0, first) is the loop's body, less the pin
    prog = _pingpong_program(0, 3, first=0, step=3)
    starts = [k for k, (op, _) in enumerate(prog) if op == "full"] + [len(prog)]
    turn1 = _program_tokens(prog[starts[1]:starts[2]])
    assert turn1 == [w for w in loop if w != "pin"], turn1


# --------------------------------------------------------------------------------------------------
# Refusals, before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

def _qkv(*shape, dtype=torch.bfloat16):
    return tuple(torch.randn(*shape).to(dtype) for _ in range(3))


def _misaligned():
    flat = torch.randn(1 * 1 * 8 * 64 + 1).bfloat16()
    q = flat[1:].view(1, 1, 8, 64)
    return q, q.clone(), q.clone()


BAD = [
    (lambda: _qkv(1, 1, 8, 64, dtype=torch.float16), TypeError, "bfloat16"),
    (lambda: ([[1.0]], *_qkv(1, 1, 8, 64)[1:]), TypeError, "torch.Tensor"),
    (lambda: _qkv(1, 8, 64), ValueError, "4-D"),
    (lambda: _qkv(1, 1, 8, 96), ValueError, "head dim D = 96"),
    (lambda: _qkv(1, 1, 8, 32), ValueError, "head dim D = 32"),
    (lambda: _qkv(1, 1, 0, 64), ValueError, "empty"),
    (lambda: (*_qkv(1, 1, 8, 64)[:2], torch.randn(1, 1, 9, 64).bfloat16()), ValueError,
     "one shape"),
    (lambda: tuple(t.transpose(1, 2) for t in _qkv(1, 2, 2, 64)), ValueError, "contiguous"),
    (_misaligned, ValueError, "16-byte aligned"),
]


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("make, error, match", BAD)
def test_bad_input_is_refused_before_launch(fn, make, error, match):
    q, k, v = make()
    with pytest.raises(error, match=match) as info:
        fn(q, k, v)
    assert str(info.value).startswith(f"{fn.__name__}:")


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_bad_flags_are_refused(fn):
    q, k, v = _qkv(1, 1, 8, 64)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fn(q, k, v, causal=1)
    with pytest.raises(ValueError, match="finite"):
        fn(q, k, v, scale=float("inf"))
    with pytest.raises(TypeError, match="scale"):
        fn(q, k, v, scale="0.1")


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_requires_grad_is_refused(fn):
    q, k, v = _qkv(1, 1, 8, 64)
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward-only"):
        fn(q, k, v)


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_cpu_tensors_are_refused(fn):
    """Good CPU tensors: a clear RuntimeError (here, or on a GPU machine), not a crash."""
    q, k, v = _qkv(1, 1, 8, 64)
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        fn(q, k, v)


def test_tensor_maps_are_valid():
    """The three maps: (D, S, B*H) bf16, boxes of 64 x 128 x 1 under the 128B swizzle (a box's
    inner dimension may not pass the 128-byte span: D = 128 is two boxes per tile), 16 KB per box,
    one head per box (rows past S are TMA's zeros, not the next head's)."""
    for d in ha.HEAD_DIMS:
        for heads, s in ((1, 1), (2, 77), (8, 1024), (4 * 32, 4096)):
            spec = ha.tensor_map_spec(heads, s, d, 0)
            assert spec.box_shape == (64, 128, 1) and spec.swizzle.label == "128B"
            assert spec.global_shape == (d, s, heads) and spec.global_strides == (2 * d, 2 * d * s)
            assert spec.expect_tx_bytes() * (d // 64) == 128 * d * 2  # one tile's expect_tx
        assert ha.smem_bytes(d) <= 227 * 1024


# --------------------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------------------

def _skip_unless_sm90():
    reason = ha.needs_sm90()
    if reason:
        pytest.skip(reason)


def _inputs(b, h, s, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
                 for _ in range(3))


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("s", [1, 77, 128, 300, 1024])
@pytest.mark.parametrize("b, h", [(1, 1), (1, 4), (2, 1), (2, 4)])
def test_matches_float64_reference(b, h, s, d, causal, fn):
    """o within twice the error of torch's SDPA (same bf16 inputs, same float64 reference) plus
    1e-3; lse within 1e-3 of the float64 logsumexp."""
    _skip_unless_sm90()
    q, k, v = _inputs(b, h, s, d, seed=b * 1000 + h * 100 + s + d + causal)
    o, lse = fn(q, k, v, causal)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == torch.bfloat16
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    # lse first: it depends on Q K^T and the softmax only, so a right lse with a wrong o points at
    # P V (P's register fragment, V's transposed descriptor)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-3)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    sdpa_err = (sdpa.double() - o_ref).abs().max().item()
    err = (o.double() - o_ref).abs().max().item()
    assert err <= 2 * sdpa_err + 1e-3, f"max error {err:.3g}, SDPA's {sdpa_err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("s", [1, 77, 128, 129, 300, 1024, 2000, 2049])
@pytest.mark.parametrize("fn", BIT_EQUAL_TO_V1, ids=lambda f: f.__name__)
def test_later_steps_are_v1_bit_for_bit(fn, s, d, causal):
    """Steps 2 and 3 reorder when work is issued, not what is computed. Step 2 takes turns between
    the consumers; step 3 moves the softmax of tile t + 1 under P_t V_t. Per consumer, every
    operation on O, m and l is step 1's, in step 1's order (O gets + P_t V_t, then * alpha_{t+1}:
    the transcription tests above), with the same wgmma shapes and operands, so o and lse must be
    step 1's exactly. Ragged S, 1 to 17 key tiles, both masks."""
    _skip_unless_sm90()
    q, k, v = _inputs(2, 3, s, d, seed=s * 7 + d + causal)
    o1, lse1 = ha.flash_fwd_hopper(q, k, v, causal)
    o, lse = fn(q, k, v, causal)
    torch.cuda.synchronize()
    torch.testing.assert_close(o, o1, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("b, h, s", [(2, 3, 1), (2, 3, 129), (2, 3, 2049), (4, 32, 300),
                                     (3, 70, 1030), (1, 1, 16384)])
def test_persistent_is_step4_bit_for_bit(b, h, s, d, causal):
    """Step 5 runs step 4's consumer on every tile, only in another grid: o and lse must be step
    4's exactly. The sizes give the blocks one tile (B * H * blocks of S under the SMs) to several
    (4 x 32 x 3 = 384 tiles; 3 x 70 x 9 = 1890 of ragged S, causal ones of 1 to 9 key tiles), so
    the K / V ring's phases and Q's reload run on across tiles."""
    _skip_unless_sm90()
    q, k, v = _inputs(b, h, s, d, seed=b * 31 + h + s + d + causal)
    o4, lse4 = ha.flash_fwd_hopper_lean(q, k, v, causal)
    o, lse = ha.flash_fwd_hopper_persistent(q, k, v, causal)
    torch.cuda.synchronize()
    torch.testing.assert_close(o, o4, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse4, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_pv_operand_layout(d, fn):
    """P V alone, with exact numbers: q = 0 makes every score 0 and every p exactly 1. With
    v[j, c] = c each output row is 0, 1, ..., D-1 (V's columns: the panels, LBO); causal with
    v[j, c] = j, row i is the mean of keys 0..i, i / 2 (V's rows: SBO, the 16-key steps, and the
    key order of P's fragment)."""
    _skip_unless_sm90()
    s = 128
    q = torch.zeros(1, 1, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, s, d, device="cuda").bfloat16()
    cols = torch.arange(d, device="cuda", dtype=torch.float32).expand(s, d)
    o, _ = fn(q, k, cols.bfloat16().view(1, 1, s, d).contiguous())
    torch.testing.assert_close(o[0, 0].float(), cols, rtol=0, atol=0)
    keys = torch.arange(s, device="cuda", dtype=torch.float32)[:, None].expand(s, d)
    o, _ = fn(q, k, keys.bfloat16().view(1, 1, s, d).contiguous(), causal=True)
    torch.testing.assert_close(o[0, 0].float(), keys / 2, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_scale_is_applied(d, fn):
    _skip_unless_sm90()
    q, k, v = _inputs(1, 2, 200, d, seed=7)
    for causal in (False, True):
        o, lse = fn(q, k, v, causal, scale=0.3)
        o_ref, lse_ref = ha.attention_ref(q, k, v, causal, scale=0.3)
        torch.testing.assert_close(o.double(), o_ref, rtol=0, atol=2e-2)
        torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("scale", [-0.3, 0.0])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_negative_and_zero_scale(d, scale, fn):
    """A negative scale (step 4 takes the row max on raw scores: its launcher runs -scale on -k)
    and a scale of 0 (every score 0: step 4's selects keep -inf * 0 out of the masked scores and
    the first alpha), against the float64 reference, both masks, ragged S."""
    _skip_unless_sm90()
    q, k, v = _inputs(1, 2, 300, d, seed=13)
    for causal in (False, True):
        o, lse = fn(q, k, v, causal, scale=scale)
        o_ref, lse_ref = ha.attention_ref(q, k, v, causal, scale=scale)
        torch.testing.assert_close(o.double(), o_ref, rtol=0, atol=2e-2)
        torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_every_element_is_written_and_repeatable(d, causal, fn):
    """o starts as NaN (a stale row would show; lse, whose block the allocator may not hand back,
    is checked against the reference instead); two calls give identical bits."""
    _skip_unless_sm90()
    b, h, s = 2, 3, 333
    q, k, v = _inputs(b, h, s, d, seed=11)
    poison_allocator(b * h * s * d * 2, "cuda")
    o1, lse1 = fn(q, k, v, causal)
    poison_allocator(b * h * s * d * 2, "cuda")
    o2, lse2 = fn(q, k, v, causal)
    torch.cuda.synchronize()
    assert not o1.isnan().any() and not lse1.isnan().any()
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    torch.testing.assert_close(o1.double(), o_ref, rtol=0, atol=2e-2)
    torch.testing.assert_close(lse1.double(), lse_ref, rtol=0, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_misaligned_view_is_refused_on_gpu(fn):
    _skip_unless_sm90()
    flat = torch.randn(64 * 64 + 1, device="cuda").bfloat16()
    q = flat[1:].view(1, 1, 64, 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fn(q, q.clone(), q.clone())


def _work_tile(w: int, m_blocks: int, causal: bool) -> tuple[int, int]:
    """flash_fwd.cu's work_tile, transcribed: (query block, plane) of tile w."""
    r = w % m_blocks
    return (m_blocks - 1 - r if causal else r), w // m_blocks


def test_persistent_work_list_covers_every_tile_once():
    """The transcribed work list and scheduler: block i starts with tile i and then takes
    gridDim.x + atomicAdd(next, 1) until that passes the last tile (then -1: stop). Whatever order
    the blocks ask in (random here), every (query block, plane) is computed exactly once and every
    block stops; consecutive tiles, which run at the same time, span few planes (K and V stay in
    L2, as with steps 1-4's grid); with the mask, each plane's longest block comes first."""
    text = CU.read_text()
    assert "const int r = w % m_blocks;" in text and "mb = causal ? m_blocks - 1 - r : r;" in text
    assert "plane = w / m_blocks;" in text and "int w = blockIdx.x;" in text
    assert "w = gridDim.x + atomicAdd(next, 1);" in text
    assert "const int tile = w < n_work ? w : -1;" in text
    rng = random.Random(0)
    for s, planes, sms in ((1, 1, 132), (300, 2 * 3, 132), (4096, 4 * 32, 132), (1030, 210, 78)):
        m_blocks = -(-s // ha.BLOCK_M)
        tiles = m_blocks * planes
        grid = min(tiles, sms)
        for causal in (False, True):
            counter, seen, stopped = 0, [], set()
            nxt = list(range(grid))  # each block's next tile
            while len(stopped) < grid:
                blk = rng.choice([i for i in range(grid) if i not in stopped])
                if nxt[blk] >= tiles:
                    stopped.add(blk)
                    continue
                seen.append(_work_tile(nxt[blk], m_blocks, causal))
                nxt[blk], counter = grid + counter, counter + 1
            assert sorted(seen) == [(mb, p) for mb in range(m_blocks) for p in range(planes)]
            first = [_work_tile(w, m_blocks, causal)[0] for w in range(0, tiles, m_blocks)]
            assert set(first) == {m_blocks - 1 if causal else 0}
            for start in range(0, tiles, grid):  # a window of as many tiles as blocks
                now = {_work_tile(w, m_blocks, causal)[1] for w in range(start,
                                                                          min(start + grid, tiles))}
                assert len(now) <= -(-grid // m_blocks) + 1
