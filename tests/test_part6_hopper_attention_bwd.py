"""FlashAttention's backward on Hopper, steps 1 to 3 (csrc/hopper_attn/flash_bwd.cu,
snippets/part6/hopper_attention_bwd.py).

On a CPU: the file compiles for sm_90a with the launcher's own nvcc command into exactly the entry
kernels the launcher names (plus the forward's, which the included flash_fwd.cu defines), without
spills, warnings or serialised wgmmas, within the registers __launch_bounds__(384, 1) leaves; step
1 names its dS barrier from a register (ptxas counts all 16 barriers), steps 2 and 3 use the
immediate barriers 3 and 4 (at most 5 counted). In the SASS, step 1 adds dQ with D / 4 float2
atomics a tile and no bulk reduction, steps 2 and 3 with one UBLKRED and no atomic; every step has
the products the design calls for (S^T and dP^T from shared memory, dV and dK with a register A,
dQ N = D in step 1 and D / 2 in steps 2 and 3); step 3 stores dS with 4 transposed STSM and no
16-bit STS. The launcher's constants are the .cu file's namespace hb constants, its kernel
tables name the file's kernels with the right template arguments, and smem_bytes is BwdSmem's
layout, recomputed by hand and evaluated from the struct's text, aligned and under 227 KB.
padded_rows rounds S up to whole query tiles. Bad input (dtypes, shapes, strides, D = 96, a
non-bool causal, lse of the wrong dtype, shape or strides) is refused with a message naming the
argument, before any device check; good CPU tensors get a clear RuntimeError; inputs that require
grad under grad mode are refused. A float32 transcription of the main kernel's arithmetic (key
blocks of 128 split between two consumers, query tiles of 64 from the causal start tile, lse2
+inf on the padding rows, P^T and dS^T rounded to bf16 before the products, dK and dQ scaled at
the end) matches the float64 reference within the op's tolerance on ragged shapes, both masks,
both head dims, the default, a small (0.05) and a negative (-0.1) scale; two planted mask bugs
(the diagonal dropped, the per-consumer mask flag off by a tile) do not.

On an H100 / H200 (marked ``gpu``): each step against the float64 reference at the op's test sizes
and two longer sequences (every element written, finite, bf16 of q's shape); steps 2 and 3 give
step 1's dk and dv bit for bit and its dq within a few bf16 ulps; ``flash_attention_hopper``
trains (gradients of sum(o^2) / 2 and of o.sum(), whose upstream gradient is a broadcast view, as
float64 autograd gives them, also with scales 0.05 and -0.1); bad input on the GPU
(D = 96, lse of the wrong shape or strides or device) is refused before any launch."""

from __future__ import annotations

import ast
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import assert_close_within, nvcc_with_report, sass_by_function
from test_cuda_compile import parse_ptxas, spilling_functions

from conftest import poison_allocator
from snippets.common.attention import attention_bwd_ref
from snippets.part6 import hopper_attention as ha
from snippets.part6 import hopper_attention_bwd as hb
from snippets.part6.hopper import SMEM_LIMIT_SM90

pytestmark = pytest.mark.op("hopper_attention_bwd")

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / hb.CU_FILE
FWD_CU = REPO_ROOT / "csrc" / ha.CU_FILE
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")

STEP_FNS = {1: hb.flash_bwd_hopper, 2: hb.flash_bwd_hopper_bulk, 3: hb.flash_bwd_hopper_frag}
ENTRY_POINTS = list(STEP_FNS.values())
# every table of kernels the launcher names, and the template call each kernel's body makes
KERNEL_TABLES = {
    "KERNELS": (hb.KERNELS, "hb::flash_bwd<{d}>("),
    "BULK_KERNELS": (hb.BULK_KERNELS, "hb::flash_bwd<{d}, true>("),
    "FRAG_KERNELS": (hb.FRAG_KERNELS, "hb::flash_bwd<{d}, true, true>("),
    "PREP_KERNELS": (hb.PREP_KERNELS, "flash_bwd_prep<{d}>("),
    "DQ_KERNELS": (hb.DQ_KERNELS, "flash_bwd_dq<{d}>("),
    "DQ_FRAG_KERNELS": (hb.DQ_FRAG_KERNELS, "flash_bwd_dq_frag<{d}>("),
}
BWD_KERNELS = {name for table, _ in KERNEL_TABLES.values() for name in table.values()}
MAIN_KERNELS = hb.STEPS  # step -> {d: its main kernel}
FWD_KERNELS = {name for table in (ha.KERNELS, ha.PINGPONG_KERNELS, ha.OVERLAP_KERNELS,
                                  ha.LEAN_KERNELS, ha.PERSIST_KERNELS) for name in table.values()}
TOLERANCES = hb.hopper_attention_bwd.tolerances  # {bf16: (rtol, atol)}, as the registry tests use
LOG2E = 1.4426950408889634


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> tuple[Path, str]:
    """The cubin built by the launcher's own nvcc command (plus ptxas's report), and that
    report: one compile for the whole module."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("hopper_attn_bwd") / "flash_bwd.cubin"
    return out, nvcc_with_report(hb.nvcc_command(out), REPO_ROOT)


# --------------------------------------------------------------------------------------------------
# The .cu file's constants, read from its text
# --------------------------------------------------------------------------------------------------

def _evaluate(expr: str, env: dict[str, int]) -> int:
    """A C integer expression of the constants (+ - * /, parentheses, ``a ? b : c``), with
    ``ha::NAME`` read as the forward's constant NAME."""
    expr = expr.replace("ha::", "ha__")
    expr = re.sub(r"\((\w+) \? ([^:()]+) : ([^()]+)\)", r"((\2) if \1 else (\3))", expr)

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.IfExp):
            return walk(node.body) if walk(node.test) else walk(node.orelse)
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):  # C's int division of non-negative values
                assert a >= 0 and b > 0, expr
                return a // b
        raise AssertionError(f"cannot evaluate {expr!r}")

    return walk(ast.parse(expr.strip(), mode="eval"))


def _namespace(text: str, ns: str) -> str:
    """The first ``namespace ns { ... }  // namespace ns`` block of a file."""
    start = text.index(f"namespace {ns} {{")
    return text[start:text.index(f"}}  // namespace {ns}", start)]


def _constexprs(block: str, env: dict[str, int]) -> dict[str, int]:
    """Every namespace-level ``constexpr int A = expr[, B = expr];`` of a block, evaluated in
    order (each may use the ones before it and ``env``)."""
    found: dict[str, int] = {}
    for decl in re.findall(r"^constexpr int ([^;]+);", block, flags=re.M):
        for part in decl.split(","):
            name, expr = (x.strip() for x in part.split("=", 1))
            found[name] = _evaluate(expr, {**env, **found})
    return found


def _ha_constants() -> dict[str, int]:
    return _constexprs(_namespace(FWD_CU.read_text(), "ha"), {})


def _hb_constants() -> dict[str, int]:
    """flash_bwd.cu's namespace hb constants (ha:: names resolved from flash_fwd.cu)."""
    env = {f"ha__{k}": v for k, v in _ha_constants().items()}
    return _constexprs(_namespace(CU.read_text(), "hb"), env)


def _bwd_smem_struct(d: int, bulk: bool) -> dict[str, int]:
    """BwdSmem<D, BULK>'s offsets, evaluated from the struct's text."""
    text = CU.read_text()
    body = text[text.index("struct BwdSmem {"):]
    body = body[:body.index("};")]
    ha_c, hb_c = _ha_constants(), _hb_constants()
    env = {**{f"ha__{k}": v for k, v in ha_c.items()}, **hb_c, "D": d, "BULK": int(bulk)}
    out: dict[str, int] = {}
    for name, expr in re.findall(r"static constexpr int (\w+) = ([^;]+);", body):
        out[name] = env[name] = _evaluate(expr, env)
    return out


def _kernel_body(text: str, name: str) -> str:
    """The text of extern "C" kernel ``name``, from its name to the next kernel."""
    start = text.index(f"\n{name}(")
    nxt = text.find('extern "C"', start)
    return text[start:nxt if nxt >= 0 else len(text)]


# --------------------------------------------------------------------------------------------------
# The compiled kernels
# --------------------------------------------------------------------------------------------------

@requires_nvcc
def test_compiles_for_sm90a_without_spills(cubin):
    """The launcher's cubin holds exactly the backward kernels its tables name (and the forward's
    kernels, which flash_fwd.cu, included for its device helpers, defines too); nothing spills;
    ptxas neither serialises a wgmma (C7512, C7515) nor warns; the main kernels fit the 170
    registers __launch_bounds__(384, 1) leaves. ptxas counts the named barriers: step 1 passes
    its dS barrier's id in a register (DS_BAR + c), so ptxas must reserve all 16; steps 2 and 3
    name barriers 3 and 4 as immediates, and count at most BULK_DQ_BAR + 1 = 5."""
    _, report = cubin
    functions = parse_ptxas(report)
    kernels = {name for name, f in functions.items() if f["entry"]}
    bwd = {name for name in kernels if name.startswith("hopper_flash_bwd")}
    assert bwd == BWD_KERNELS, sorted(bwd ^ BWD_KERNELS)
    assert kernels - bwd == FWD_KERNELS, sorted((kernels - bwd) ^ FWD_KERNELS)
    assert not spilling_functions(functions), report
    for code in ("C7512", "C7515"):
        assert code not in report, f"ptxas serialises the wgmmas of a kernel ({code}):\n{report}"
    assert "warning" not in report.lower(), report
    c = _hb_constants()
    for step, table in MAIN_KERNELS.items():
        for name in table.values():
            assert functions[name]["registers"] <= 65536 // ha.THREADS, (name, functions[name])
            if step == 1:
                assert functions[name]["barriers"] == 16, (name, functions[name])
            else:
                assert functions[name]["barriers"] <= c["BULK_DQ_BAR"] + 1 == 5, (
                    name, functions[name])
    for table in (hb.PREP_KERNELS, hb.DQ_KERNELS, hb.DQ_FRAG_KERNELS):
        for name in table.values():  # no __syncthreads, no named barrier
            assert functions[name]["barriers"] == 0, (name, functions[name])


def _instructions(code: str) -> list[str]:
    """The instructions of a cuobjdump listing, in order, without addresses and encodings."""
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", code)


def _count(code: list[str], pattern: str) -> int:
    return sum(re.search(pattern, i) is not None for i in code)


@pytest.fixture(scope="module")
def sass(cubin) -> dict[str, str]:
    """cuobjdump -sass of the cubin, by function: one disassembly for the module."""
    return sass_by_function(cubin[0])


@requires_nvcc
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_sass_products_and_dq_adds(sass, d):
    """Each main kernel's query-tile loop, in the SASS (one copy of the loop body): S^T = K Q^T
    and dP^T = V dO^T, 2 D / 16 HGMMA 64x64x16 with both operands from descriptors, untransposed;
    dV += P^T dO and dK += dS^T Q, 2 x 4 HGMMA 64xDx16 with a register A and a transposed B; dQ,
    BLOCK_M / 16 = 4 HGMMA 64xDx16 over the consumer's 64 keys (step 1), BLOCK_N / 16 = 8 HGMMA
    64x(D/2)x16 over the block's 128 keys (steps 2, 3), B transposed. Step 1 adds dQ with D / 4
    float2 atomics (2 rows x D / 8 column groups) and issues no bulk reduction; steps 2 and 3 with
    one UBLKRED.ADD.F32 and no atomic. dS goes to shared memory by 32 16-bit STS (steps 1, 2) or
    4 STSM .trans (step 3); step 2's fp32 dQ tile by D / 8 STS.64, step 3's by D / 16 STS.128
    (fragment order). Step 1 syncs its dS on a register-named barrier of 128 threads, steps 2 and
    3 on barriers 3 and 4 of 256; nothing falls back to mma.sync."""
    c = _hb_constants()
    for step, table in MAIN_KERNELS.items():
        name = table[d]
        code = _instructions(sass[name])
        what = f"{name} (step {step})"
        assert _count(code, r"HGMMA\.64x64x16\.F32\.BF16 R\d+, gdesc\[UR\d+\], ") \
            == 2 * d // 16, what
        assert _count(code, rf"HGMMA\.64x{d}x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\]\.tnspB") \
            == 2 * hb.BLOCK_M // 16, what
        n, k = (d, 64) if step == 1 else (d // 2, hb.BLOCK_N)
        assert _count(code, rf"HGMMA\.64x{n}x16\.F32\.BF16 R\d+, gdesc\[UR\d+\]\.tnspB") \
            == k // 16, what
        assert not any("HMMA" in i.replace("HGMMA", "") for i in code), f"{what}: mma.sync"
        atomics = _count(code, r"\b(ATOMG|RED)\.E\.ADD\.F32x2\b")
        bulk_adds = _count(code, r"\bUBLKRED\.G\.S\.ADD\.F32\b")
        bars = [i for i in code if re.search(r"\bBAR\.SYNC", i)]
        assert bars[0] == "BAR.SYNC.DEFER_BLOCKING 0x0", what  # __syncthreads
        if step == 1:
            assert (atomics, bulk_adds) == (d // 4, 0), what
            assert len(bars) == 2, (what, bars)  # DS_BAR + c: the id in a register, 128 threads
            assert re.fullmatch(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x80", bars[1]), (what, bars)
        else:
            assert (atomics, bulk_adds) == (0, 1), what
            assert bars[1:] == [f"BAR.SYNC.DEFER_BLOCKING 0x{c['BULK_DS_BAR']:x}, 0x100",
                                f"BAR.SYNC.DEFER_BLOCKING 0x{c['BULK_DQ_BAR']:x}, 0x100"], bars
        sts16, stsm = _count(code, r"(^|\s)STS\.U16 "), _count(code, r"(^|\s)STSM\.16\.MT88\.4 ")
        assert (sts16, stsm) == ((0, 4) if step == 3 else (32, 0)), what
        assert _count(code, r"(^|\s)STS\.64 ") == (d // 8 if step == 2 else 0), what
        assert _count(code, r"(^|\s)STS\.128 ") == (d // 16 if step == 3 else 0), what


# --------------------------------------------------------------------------------------------------
# Constants, tables and the shared-memory layout
# --------------------------------------------------------------------------------------------------

def test_constants_match_the_launcher():
    """Every constant the launcher mirrors is the .cu file's hb constant of that name; the 128
    keys of a block are the forward's 128-row K / V boxes, 64 per consumer; the barrier ids are
    distinct, not 0 and below 16; the bulk barriers count both consumer warpgroups."""
    c, a = _hb_constants(), _ha_constants()
    for name in ("BLOCK_N", "BLOCK_M", "STAGES", "Q_BOX_ROWS", "VEC_BYTES", "DS_TILE_BYTES",
                 "PREP_ROWS", "DQ_THREADS"):
        assert getattr(hb, name) == c[name], name
    assert hb.VEC_BYTES == hb.BLOCK_M * 4 and hb.DS_TILE_BYTES == 64 * 64 * 2
    assert hb.BLOCK_N == hb.BOX_ROWS == a["BOX_ROWS"] == a["CONSUMERS"] * 64
    assert (hb.PANEL_COLS, hb.SWIZZLE_REPEAT) == (a["PANEL_COLS"], a["SWIZZLE_REPEAT"])
    assert ha.THREADS == (1 + a["CONSUMERS"]) * a["WG_THREADS"] == 384
    assert c["BULK_THREADS"] == a["CONSUMERS"] * a["WG_THREADS"]
    ids = [c["DS_BAR"] + i for i in range(a["CONSUMERS"])] + [c["BULK_DS_BAR"], c["BULK_DQ_BAR"]]
    assert len(set(ids)) == len(ids) and 0 not in ids and max(ids) < 16, ids
    assert hb.PREP_ROWS * 32 <= 1024 and hb.DQ_THREADS <= 1024


def test_kernel_tables_name_the_files_kernels():
    """Each table of the launcher names, for D = 64 and 128, a kernel of flash_bwd.cu with the
    launch bounds the launcher launches it with, whose body makes its step's template call; every
    kernel the file defines is in a table; STEPS maps steps 1-3 to their main kernels."""
    text = CU.read_text()
    defined = set(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*(\w+)\(',
                             text))
    assert defined == BWD_KERNELS, sorted(defined ^ BWD_KERNELS)
    bounds = {"KERNELS": f"{ha.THREADS}, 1", "BULK_KERNELS": f"{ha.THREADS}, 1",
              "FRAG_KERNELS": f"{ha.THREADS}, 1", "PREP_KERNELS": str(hb.PREP_ROWS * 32),
              "DQ_KERNELS": str(hb.DQ_THREADS), "DQ_FRAG_KERNELS": str(hb.DQ_THREADS)}
    for label, (table, call) in KERNEL_TABLES.items():
        assert set(table) == set(ha.HEAD_DIMS), label
        for d, name in table.items():
            assert name.endswith(f"_d{d}"), (label, name)
            assert re.search(rf"__launch_bounds__\({bounds[label]}\)\s*{name}\(", text), name
            body = _kernel_body(text, name)
            assert call.format(d=d) in body, (name, call.format(d=d))
            other = 128 if d == 64 else 64  # and not the other head dim's
            assert call.format(d=other) not in body, name
    assert hb.STEPS == {1: hb.KERNELS, 2: hb.BULK_KERNELS, 3: hb.FRAG_KERNELS}


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_smem_bytes_is_the_struct_layout(d, bulk):
    """smem_bytes(d, bulk) is BwdSmem<D, BULK>::LAUNCH_BYTES, recomputed here from the constants
    (K and V of BLOCK_N rows, STAGES x (Q, dO) of 64 rows, two 64 x 64 bf16 dS tiles, the 64 x D
    fp32 dQ tile when bulk, STAGES x (lse2, delta) of 64 floats, 1 + 2 STAGES mbarriers, 1024
    bytes of alignment slack) and evaluated from the struct's own text. The swizzled tiles start
    on 1024-byte boundaries, the bulk-copy targets on 16, the mbarriers on 8; it fits 227 KB."""
    c = _hb_constants()
    row = 2 * d  # bytes of a bf16 row of D
    by_hand = (2 * c["BLOCK_N"] * row + c["STAGES"] * 2 * c["Q_BOX_ROWS"] * row
               + 2 * 64 * 64 * 2 + (c["BLOCK_M"] * d * 4 if bulk else 0)
               + c["STAGES"] * 2 * c["BLOCK_M"] * 4 + (1 + 2 * c["STAGES"]) * 8 + 1024)
    s = _bwd_smem_struct(d, bulk)
    assert hb.smem_bytes(d, bulk) == by_hand == s["LAUNCH_BYTES"]
    assert s["LAUNCH_BYTES"] - s["BYTES"] == hb.SWIZZLE_REPEAT
    for tile in ("K", "V", "Q", "DO", "DS"):
        assert s[tile] % 1024 == 0, (tile, s[tile])
    assert s["Q_TILE"] % 1024 == 0 and c["DS_TILE_BYTES"] % 1024 == 0
    assert s["DQ"] % 16 == 0 and s["LSE"] % 16 == 0 and s["DELTA"] % 16 == 0
    assert s["BARRIERS"] % 8 == 0
    # the regions follow one another without overlap
    order = ["K", "V", "Q", "DO", "DS", "DQ", "LSE", "DELTA", "BARRIERS", "BYTES"]
    assert [s[r] for r in order] == sorted(s[r] for r in order)
    assert hb.smem_bytes(d, bulk) <= SMEM_LIMIT_SM90 <= 227 * 1024
    if bulk:
        assert hb.smem_bytes(d, True) - hb.smem_bytes(d, False) == hb.BLOCK_M * d * 4


def test_padded_rows():
    """Rows per head of lse2, delta and the dQ accumulator: the least multiple of 64 >= S."""
    for s in [*range(1, 300), 1000, 1024, 4095, 4096, 16383, 16384]:
        p = hb.padded_rows(s)
        assert p % hb.BLOCK_M == 0 and s <= p < s + hb.BLOCK_M, (s, p)


# --------------------------------------------------------------------------------------------------
# Refusals, before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

def _good(b=1, h=2, s=8, d=64, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q, k, v, o, do = (torch.randn(b, h, s, d, generator=gen).bfloat16() for _ in range(5))
    lse = torch.randn(b, h, s, generator=gen)
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "causal": False, "scale": None}


def _misaligned(shape):
    n = math.prod(shape)
    return torch.randn(n + 1).bfloat16()[1:].view(shape)


BAD = [  # (label, changes to a good set, exception, what the message must say)
    ("q fp16", lambda g: {"q": g["q"].half()}, TypeError, r"q must be bfloat16"),
    ("k fp32", lambda g: {"k": g["k"].float()}, TypeError, r"k must be bfloat16"),
    ("o fp16", lambda g: {"o": g["o"].half()}, ValueError, r"\bo must be bfloat16 of q's shape"),
    ("do fp16", lambda g: {"do": g["do"].half()}, ValueError, r"do must be bfloat16 of q's shape"),
    ("o shape", lambda g: {"o": torch.zeros(1, 2, 9, 64).bfloat16()}, ValueError,
     r"\bo must be bfloat16 of q's shape \(1, 2, 8, 64\)"),
    ("do list", lambda g: {"do": [[0.0]]}, TypeError, r"do must be a torch.Tensor"),
    ("do transposed", lambda g: {"do": torch.zeros(1, 2, 64, 8).bfloat16().transpose(2, 3)},
     ValueError, r"do must be contiguous"),
    ("o misaligned", lambda g: {"o": _misaligned((1, 2, 8, 64))}, ValueError,
     r"\bo must be contiguous and 16-byte aligned"),
    ("lse bf16", lambda g: {"lse": g["lse"].bfloat16()}, ValueError, r"lse must be float32"),
    ("lse fp64", lambda g: {"lse": g["lse"].double()}, ValueError, r"lse must be float32"),
    ("lse short", lambda g: {"lse": g["lse"][..., :7]}, ValueError,
     r"lse must be float32 of shape \(1, 2, 8\)"),
    ("lse 4-D", lambda g: {"lse": g["lse"][..., None]}, ValueError,
     r"lse must be float32 of shape"),
    ("lse (B, S, H)", lambda g: {"lse": torch.zeros(1, 8, 2)}, ValueError,
     r"lse must be float32 of shape"),
    ("lse strided", lambda g: {"lse": torch.zeros(1, 8, 2).transpose(1, 2)}, ValueError,
     r"lse must be contiguous"),
    ("lse list", lambda g: {"lse": [0.0]}, TypeError, r"lse must be a torch.Tensor"),
    ("k shape", lambda g: {"k": torch.zeros(1, 2, 9, 64).bfloat16()}, ValueError, r"one shape"),
    ("D = 96", lambda g: {n: t[..., :48].repeat(1, 1, 1, 2).contiguous()
                          for n, t in g.items() if n in ("q", "k", "v", "o", "do")},
     ValueError, r"head dim D = 96"),
    ("causal int", lambda g: {"causal": 1}, TypeError, r"causal must be a bool"),
    ("scale str", lambda g: {"scale": "0.1"}, TypeError, r"scale must be None or a Python float"),
    ("scale inf", lambda g: {"scale": math.inf}, ValueError, r"scale = inf must be finite"),
]


def _call(fn, args: dict):
    return fn(args["q"], args["k"], args["v"], args["o"], args["lse"], args["do"],
              args["causal"], args["scale"])


@pytest.mark.parametrize("label, change, error, match", BAD, ids=[c[0] for c in BAD])
def test_checks_refuse_bad_input(label, change, error, match):
    """check_hopper_attention_bwd refuses each bad argument with the right exception, a message
    that starts with the caller's name and names the argument; on CPU tensors, so before any
    device check. The D = 96 set is otherwise good (all five tensors D = 96)."""
    args = {**_good(), **change(_good())}
    with pytest.raises(error, match=match) as info:
        hb.check_hopper_attention_bwd("who", args["q"], args["k"], args["v"], args["o"],
                                      args["lse"], args["do"], args["causal"], args["scale"])
    assert str(info.value).startswith("who: ")


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("label, change, error, match", BAD, ids=[c[0] for c in BAD])
def test_entry_points_refuse_bad_input(fn, label, change, error, match):
    """Each step's entry point runs the checks first: the same refusal, under its own name."""
    args = {**_good(), **change(_good())}
    with pytest.raises(error, match=match) as info:
        _call(fn, args)
    assert str(info.value).startswith(f"{fn.__name__}: ")


@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_checks_accept_a_good_set(d):
    """A good set (ragged S, both head dims): (B, H, S, D) and the scale, 1 / sqrt(D) by default,
    else the one given (negative and zero included), as a float."""
    g = _good(b=2, h=3, s=77, d=d)
    got = hb.check_hopper_attention_bwd("who", g["q"], g["k"], g["v"], g["o"], g["lse"], g["do"],
                                        True, None)
    assert got == (2, 3, 77, d, 1 / math.sqrt(d))
    for scale in (0.05, -0.3, 0.0, 2):
        got = hb.check_hopper_attention_bwd("who", g["q"], g["k"], g["v"], g["o"], g["lse"],
                                            g["do"], False, scale)
        assert got[4] == scale and isinstance(got[4], float)


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_cpu_tensors_are_refused(fn):
    """Good CPU tensors: a clear RuntimeError that asks for CUDA tensors (here, or on a GPU
    machine), not a crash."""
    with pytest.raises(RuntimeError, match="must be CUDA tensors") as info:
        _call(fn, _good())
    assert str(info.value).startswith(f"{fn.__name__}: ")


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("arg", ["q", "k", "v", "o", "lse", "do"])
def test_requires_grad_is_refused(fn, arg):
    """Any of q, k, v, o, lse, do requiring grad under grad mode: refused (the kernels' gradients are
    outside autograd's graph) with a message about grad that points to flash_attention_hopper,
    before the device check. Under torch.no_grad() the same inputs pass the grad check and reach
    the device check."""
    args = _good()
    args[arg] = args[arg].requires_grad_(True)
    with pytest.raises(RuntimeError, match="grad") as info:
        _call(fn, args)
    assert "flash_attention_hopper" in str(info.value)
    assert "CUDA" not in str(info.value)
    with torch.no_grad(), pytest.raises(RuntimeError, match="must be CUDA tensors"):
        _call(fn, args)


# --------------------------------------------------------------------------------------------------
# The main kernel's arithmetic, transcribed (CPU)
# --------------------------------------------------------------------------------------------------

def _forward_state(q, k, v, causal, scale):
    """What the forward hands the backward, from float64: o in bf16 and the natural-log lse in
    float32, per (B, H, S)."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = q.shape[-2]
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.softmax(scores, dim=-1) @ v64
    return o.bfloat16(), lse.float()


def _bwd_transcription(q, k, v, o, do, lse, causal, scale, plant=""):
    """flash_bwd.cu's three kernels on one (S, D) head, in float32. Prep: delta = rowsum(dO O) and
    lse2 = lse log2 e per row, rows padded to a multiple of 64 (delta 0, lse2 +inf past S). Main:
    per block of BLOCK_N keys, consumer c owns keys n0 + 64c .. + 63 (rows past S are TMA's
    zeros); per query tile of 64 from tile n0 / 64 (causal) or 0 to the last padded tile: S^T = K
    Q^T, dP^T = V dO^T, P^T = 2^(S^T scale log2 e - lse2) (one FFMA: rounded once), masked to 0
    (keys >= S, causal keys > queries) on the tiles the consumer's flag marks, dS^T = P^T (dP^T -
    delta), P^T and dS^T rounded to bf16, dV += P^T dO, dK += dS^T Q, dQ += dS K (fp32). Last:
    dK = scale dK and dQ = scale dQ, everything rounded to bf16. ``plant`` plants a bug:
    "diagonal", keys >= queries masked (the diagonal dropped); "flag", the consumer's causal flag
    misses the tile whose first query is its first key."""
    s, d = q.shape
    s_pad = hb.padded_rows(s)
    n_pad = -(-s // hb.BLOCK_N) * hb.BLOCK_N

    def pad(t: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat([t.float(), torch.zeros(rows - s, d)])

    qf, dof = pad(q, s_pad), pad(do, s_pad)
    kf, vf = pad(k, n_pad), pad(v, n_pad)
    delta = torch.zeros(s_pad)
    delta[:s] = (do.float() * o.float()).sum(dim=-1)
    lse2 = torch.full((s_pad,), math.inf)
    lse2[:s] = lse.float() * torch.tensor(LOG2E, dtype=torch.float32)
    scale_log2 = float(torch.tensor(scale * LOG2E, dtype=torch.float32))  # np.float32 in launch
    dq_acc = torch.zeros(s_pad, d)
    dk, dv = torch.zeros(n_pad, d), torch.zeros(n_pad, d)
    for n0 in range(0, s, hb.BLOCK_N):
        qt0 = n0 // hb.BLOCK_M if causal else 0
        for c in range(2):
            first = n0 + 64 * c
            keys = torch.arange(first, first + 64)
            kt, vt = kf[keys], vf[keys]
            dk_c, dv_c = torch.zeros(64, d), torch.zeros(64, d)
            for qt in range(qt0, s_pad // hb.BLOCK_M):
                q0 = qt * hb.BLOCK_M
                rows = torch.arange(q0, q0 + hb.BLOCK_M)
                st = kt @ qf[rows].T
                dpt = vt @ dof[rows].T
                pt = torch.exp2((st.double() * scale_log2 - lse2[rows].double()[None, :]).float())
                reach = first + (0 if plant == "flag" else 64)
                if first + 63 >= s or (causal and q0 < reach):
                    later = (keys[:, None] >= rows[None, :]) if plant == "diagonal" else (
                        keys[:, None] > rows[None, :])
                    drop = (keys[:, None] >= s).expand(64, hb.BLOCK_M)
                    pt = pt.masked_fill(drop | later if causal else drop, 0.0)
                dst = pt * (dpt - delta[rows][None, :])
                pt_b, dst_b = pt.bfloat16().float(), dst.bfloat16().float()
                dv_c += pt_b @ dof[rows]
                dk_c += dst_b @ qf[rows]
                dq_acc[rows] += dst_b.T @ kt
            dk[keys], dv[keys] = dk_c, dv_c
    return ((dq_acc[:s] * scale).bfloat16(), (dk[:s] * scale).bfloat16(), dv[:s].bfloat16())


def _attention64(q, k, v, causal, scale):
    """softmax(q k^T scale, masked) v in float64, for autograd. Written out rather than through
    SDPA: torch's math SDPA gives NaN for a negative scale under is_causal (torch 2.13, CPU)."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def _reference(q, k, v, do, causal, scale):
    """(dq, dk, dv) in float64: attention_bwd_ref at the default scale, else float64 autograd
    through the written-out attention with the scale."""
    if scale is None:
        return attention_bwd_ref(q.double(), k.double(), v.double(), do.double(), causal)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    return torch.autograd.grad(_attention64(q64, k64, v64, causal, scale), (q64, k64, v64),
                               do.double())


def _transcribe(q, k, v, do, causal, scale, plant=""):
    """The transcription over every (B, H) head, on the forward state of the same inputs."""
    value = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = _forward_state(q, k, v, causal, value)
    out = [torch.empty_like(q) for _ in range(3)]
    for i in range(q.shape[0]):
        for j in range(q.shape[1]):
            grads = _bwd_transcription(q[i, j], k[i, j], v[i, j], o[i, j], do[i, j],
                                       lse[i, j], causal, value, plant)
            for dst, g in zip(out, grads):
                dst[i, j] = g
    return out


def _bf16_inputs(b, h, s, d, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=gen).bfloat16() for _ in range(4))


TRANSCRIPTION_CASES = [(77, 64, False), (77, 64, True), (130, 128, True), (130, 128, False),
                       (200, 64, True), (200, 128, False), (256, 64, True)]


@pytest.mark.cpu_only
@pytest.mark.parametrize("scale", [None, 0.05, -0.1])
@pytest.mark.parametrize("s, d, causal", TRANSCRIPTION_CASES)
def test_kernel_arithmetic_matches_reference(s, d, causal, scale):
    """The main kernel's arithmetic (the transcription above, B * H = 2 heads, ragged S) against
    the float64 gradients, within the op's bf16 tolerance: the tiling, the causal start tile, the
    per-consumer mask flag, lse2's +inf padding and the bf16 rounding of P^T and dS^T lose no
    more than that. The default scale is compared with attention_bwd_ref, the others with
    float64 autograd through SDPA."""
    q, k, v, do = _bf16_inputs(1, 2, s, d, seed=s * 7 + d + causal)
    got = _transcribe(q, k, v, do, causal, scale)
    for name, out, ref in zip(("dq", "dk", "dv"), got, _reference(q, k, v, do, causal, scale)):
        assert_close_within(out, ref, TOLERANCES, torch.bfloat16, f"{name} S={s} D={d} "
                            f"causal={causal} scale={scale}")


def _violates(out: torch.Tensor, ref: torch.Tensor) -> bool:
    rtol, atol = TOLERANCES[torch.bfloat16]
    return not torch.allclose(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.cpu_only
@pytest.mark.parametrize("plant", ["diagonal", "flag"])
@pytest.mark.parametrize("s, d, causal", [c for c in TRANSCRIPTION_CASES if c[2]])
def test_planted_mask_bugs_are_caught(s, d, causal, plant):
    """The comparison above has teeth: with the diagonal masked too (key >= query instead of key >
    query), or with the consumer's mask flag one tile short (the tile whose first query is the
    consumer's first key left unmasked), the gradients leave the tolerance."""
    q, k, v, do = _bf16_inputs(1, 2, s, d, seed=s * 7 + d + causal)
    got = _transcribe(q, k, v, do, causal, None, plant=plant)
    refs = _reference(q, k, v, do, causal, None)
    assert any(_violates(out, ref) for out, ref in zip(got, refs)), plant


# --------------------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------------------

def _skip_unless_sm90():
    reason = hb.needs_sm90()
    if reason:
        pytest.skip(reason)


def _gpu_inputs(b, h, s, d, seed):
    """bf16 q, k, v, do ~ N(0, 1) on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
                 for _ in range(4))


GPU_SIZES = [*hb.TEST_SIZES, {"b": 1, "h": 2, "s": 1000, "d": 64, "causal": True},
             {"b": 1, "h": 2, "s": 1024, "d": 128, "causal": False}]


def _size_id(size: dict) -> str:
    return "b{b}h{h}s{s}d{d}{c}".format(**size, c="c" if size["causal"] else "")


@pytest.mark.gpu
@pytest.mark.parametrize("step", sorted(STEP_FNS))
@pytest.mark.parametrize("size", GPU_SIZES, ids=_size_id)
def test_steps_match_float64_reference(size, step):
    """dq, dk, dv of each step (from step 4's forward o and lse) against attention_bwd_ref in
    float64, within the op's tolerance: bf16 of q's shape, finite, every element written (the
    outputs' memory is poisoned with NaN first)."""
    _skip_unless_sm90()
    b, h, s, d, causal = (size[n] for n in ("b", "h", "s", "d", "causal"))
    q, k, v, do = _gpu_inputs(b, h, s, d, seed=b * 1000 + h * 100 + s + d + causal)
    o, lse = ha.flash_fwd_hopper_lean(q, k, v, causal)
    poison_allocator(b * h * s * d * 2, "cuda")
    grads = STEP_FNS[step](q, k, v, o, lse, do, causal)
    torch.cuda.synchronize()
    refs = attention_bwd_ref(q.double(), k.double(), v.double(), do.double(), causal)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        what = f"step {step} {name} {_size_id(size)}"
        assert out.shape == q.shape and out.dtype == torch.bfloat16, what
        assert torch.isfinite(out).all(), f"{what}: not finite (NaN: an element never written)"
        assert_close_within(out, ref, TOLERANCES, torch.bfloat16, what)


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 at |x| (8 significant bits), float64."""
    mag = x.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("b, h, s", [(1, 1, 1), (2, 3, 77), (2, 3, 300), (1, 4, 1030)])
def test_later_steps_are_step1(b, h, s, d, causal):
    """Steps 2 and 3 change how dQ reaches the accumulator, not dK and dV: those are step 1's bit
    for bit, and the same on a second call (they are summed in registers, in a fixed order).
    dq sums the same fp32 products in another order (per block in shared memory, then one bulk
    add per tile, instead of an atomic per consumer per tile): within 4 bf16 ulps of step 1's
    (plus a floor of 2^-16 of dq's largest element, for elements that cancel to near 0)."""
    _skip_unless_sm90()
    q, k, v, do = _gpu_inputs(b, h, s, d, seed=b * 31 + h * 7 + s + d + causal)
    o, lse = ha.flash_fwd_hopper_lean(q, k, v, causal)
    dq1, dk1, dv1 = hb.flash_bwd_hopper(q, k, v, o, lse, do, causal)
    floor = 2.0**-16 * dq1.double().abs().max()
    for step in (2, 3):
        for _ in range(2):
            dq, dk, dv = STEP_FNS[step](q, k, v, o, lse, do, causal)
            torch.cuda.synchronize()
            assert torch.equal(dk, dk1) and torch.equal(dv, dv1), f"step {step}: dk / dv"
            diff = (dq.double() - dq1.double()).abs()
            room = 4 * _bf16_ulp(torch.maximum(dq.double().abs(), dq1.double().abs())) + floor
            worst = (diff - room).max().item()
            assert worst <= 0, (f"step {step}: dq off by {diff.max().item():.3g} (over by "
                                f"{worst:.3g})")


def _grads64(q, k, v, causal, scale, loss):
    """Gradients of loss(o) through float64 attention of the same bf16 values: torch's SDPA
    (math backend) at the default scale and at 0.05, the written-out formula for a negative
    scale (SDPA's math backend gives NaN there under is_causal)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    if scale is not None and scale < 0:
        o = _attention64(q64, k64, v64, causal, scale)
    else:
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64,
                                                                 is_causal=causal, scale=scale)
    return torch.autograd.grad(loss(o), (q64, k64, v64))


# a loss on our bf16 o, and the same loss on the float64 reference's o. Half the sum of squares:
# its upstream gradient is o itself, of the size of the N(0, 1) do the other tests use. (With
# sum(o^2), 2 o, a faithful float32 transcription of the kernel comes within 10% of the tolerance
# on dk at D = 128, causal: the first queries' o are large, and delta comes from bf16 o.)
LOSSES = {"half_squares": (lambda o: 0.5 * (o.float() ** 2).sum(), lambda o: 0.5 * (o ** 2).sum()),
          "sum": (lambda o: o.sum(), lambda o: o.sum())}


@pytest.mark.gpu
@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("scale", [None, 0.05, -0.1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_flash_attention_hopper_trains(d, causal, scale, loss):
    """flash_attention_hopper in a loss: o requires grad; backward() fills q.grad, k.grad and
    v.grad (bf16, q's shape) with what float64 autograd through SDPA gives for the same loss,
    within the op's tolerance. The loss is sum(o^2) / 2 (upstream gradient o) or o.sum(), whose
    upstream gradient is an expanded (stride 0) view; scales: the default, 0.05 and a negative
    one (whose forward runs -scale on -k)."""
    _skip_unless_sm90()
    q, k, v, _ = _gpu_inputs(2, 3, 300, d, seed=d + causal * 10 + (scale is None))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    o = hb.flash_attention_hopper(q, k, v, causal, scale)
    assert o.requires_grad and o.dtype == torch.bfloat16 and o.shape == q.shape
    ours, theirs = LOSSES[loss]
    ours(o).backward()
    torch.cuda.synchronize()
    refs = _grads64(q, k, v, causal, scale, theirs)
    for name, t, ref in zip("qkv", (q, k, v), refs):
        assert t.grad is not None, f"d{name}: no gradient"
        assert torch.isfinite(t.grad).all(), f"d{name}: not finite"
        assert_close_within(t.grad, ref, TOLERANCES, torch.bfloat16,
                            f"d{name} D={d} causal={causal} scale={scale} loss={loss}")


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_bad_input_on_gpu_is_refused_before_launch(fn, monkeypatch):
    """CUDA tensors with D = 96, or with an lse of the wrong shape, strides or device (or a do on
    the CPU): a ValueError naming the problem, and no kernel launched (cuda.launch is replaced by a
    failure for the calls)."""
    _skip_unless_sm90()
    q, k, v, do = _gpu_inputs(1, 2, 100, 64, seed=1)
    o, lse = ha.flash_fwd_hopper_lean(q, k, v)
    q96, k96, v96, do96 = _gpu_inputs(1, 2, 100, 96, seed=2)
    torch.cuda.synchronize()

    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched on input that must be refused")

    monkeypatch.setattr(hb.cuda, "launch", no_launch)
    with pytest.raises(ValueError, match="head dim D = 96"):
        fn(q96, k96, v96, torch.empty_like(q96), lse, do96)
    for bad in (lse[..., :-1], lse[..., None], lse.transpose(0, 1).contiguous()):
        with pytest.raises(ValueError, match=r"lse must be float32 of shape \(1, 2, 100\)"):
            fn(q, k, v, o, bad, do)
    strided = torch.zeros(1, 100, 2, device="cuda").transpose(1, 2)
    for bad in (strided, lse.cpu()):
        with pytest.raises(ValueError, match="lse must be contiguous, on q's device"):
            fn(q, k, v, o, bad, do)
    with pytest.raises(ValueError, match="do is on cpu"):
        fn(q, k, v, o, lse, do.cpu())
