"""Helpers shared by the test modules: running an implementation against the float64 reference."""

from __future__ import annotations

import os

import pytest
import torch
import triton

from conftest import poison_allocator
from snippets.bench.harness import compare_outputs
from snippets.registry import Impl, Op

TRITON_VERSION = tuple(int(v) for v in triton.__version__.split(".")[:2])


def read_on_triton(versions, why: str, env: str | None = None) -> pytest.MarkDecorator:
    """A skipif for tests that assert what the compiler emitted (TTGIR, PTX, instruction counts):
    they hold for the Triton ``versions`` (major, minor) they were read on. Any other version skips,
    with ``why``, unless the environment variable ``env`` (if given) is set."""
    checked = set(versions)
    listed = " and ".join(".".join(map(str, v)) for v in sorted(checked))
    skip = TRITON_VERSION not in checked and not (env and os.environ.get(env))
    reason = f"{why}: read on Triton {listed}, this is {triton.__version__}"
    if env:
        reason += f"; set {env}=1 to run it here"
    return pytest.mark.skipif(skip, reason=reason)


def assert_matches_reference(op: Op, impl: Impl, args: tuple, dtype: torch.dtype, size=None):
    """Run ``impl`` on ``args`` and compare with the float64 reference through the harness's own
    comparison (``compare_outputs``: parts, dtype, shape, unwritten elements, values within the
    op's tolerance at ``size``, the size ``args`` were made for). Returns the output."""
    # The reference first: some versions (Liger) write their results over their inputs. float64 copies.
    refs = op.reference_fp64(args) if op.check is None else ()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    nbytes = max(t.numel() * t.element_size() for t in tensors)
    poison_allocator(nbytes, str(tensors[0].device.type))
    out = impl.fn(*args)
    if op.check is not None:  # a random output (dropout): the op's own check of what is a valid output
        op.check(out, args, dtype)
        return out
    compare_outputs(op, impl.name, out, refs, dtype, size, check_dtype=True)
    return out


def assert_refuses(fn, case, *more) -> None:
    """A bad input is refused with a clear Python exception: ``case`` is (label, args, the exception
    type, a regex its message must match), as the test modules' ``_bad_inputs`` lists give them;
    ``fn`` and each of ``more`` (an autograd.Function's apply, another version) must raise it."""
    label, args, exc, words = case
    args = args if isinstance(args, tuple) else (args,)
    for f in (fn, *more):
        with pytest.raises(exc, match=words):
            f(*args)


def assert_close_within(out: torch.Tensor, ref: torch.Tensor, tolerances: dict, dtype: torch.dtype, what: str,
                        same_dtype: bool = True) -> None:
    """``out`` against a (float64) reference within ``tolerances[dtype]`` (an op's (rtol, atol) table): its
    dtype (unless ``same_dtype`` is False) and shape first, then no NaN (outputs are poisoned with NaN, so a
    NaN is an element never written), then the values. ``what`` names the case in every message."""
    rtol, atol = tolerances[dtype]
    if same_dtype:
        assert out.dtype == dtype and out.shape == ref.shape, f"{what}: {out.dtype} {tuple(out.shape)}"
    else:
        assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert not out.isnan().any(), f"{what}: NaN (an unwritten element)"
    torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def compile_script_results(script: str) -> list:
    """Run ``script`` (Python that compiles kernels for sm_90 and prints a JSON list as its last line) in a
    process without TRITON_INTERPRET, where kernels are compilable objects, and return that list. A failure of
    the script fails the test with the end of its stderr."""
    import json
    import os
    import subprocess
    import sys

    from snippets.registry import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_script(name: str):
    """The module of ``scripts/<name>.py`` (tooling that lives outside the package: capture and
    profiling commands), imported under the name ``scripts_<name>``; its ``__main__`` block does
    not run."""
    import importlib.util
    import sys

    from snippets.registry import REPO_ROOT

    key = f"scripts_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO_ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def cancelling_operands(m: int, n: int, k: int, dtype: torch.dtype, device: str, offset: float = 400.0,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """GEMM operands whose running sums over K are far larger than the product: A = [X, X], B = [Y + offset;
    Z - Y - offset] (K even, X, Y, Z standard normal), so C = X Z (of size ~sqrt(K/2)) while halfway along K
    every sum is about offset * sqrt(K/2). A kernel that sums in fp32 keeps C within tolerance_for(K); one
    that rounds its running sums to fp16 or bf16 (an accumulator of the input dtype) loses about
    offset * sqrt(K/2) * 2^-11 of it, many times that tolerance."""
    g = torch.Generator().manual_seed(seed)
    x, y, z = (torch.randn(r, c, generator=g) for r, c in ((m, k // 2), (k // 2, n), (k // 2, n)))
    a = torch.cat([x, x], dim=1)
    b = torch.cat([y + offset, z - y - offset], dim=0)
    return a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)


def nvcc_with_report(command: list[str], cwd) -> str:
    """Run an nvcc command with ptxas's verbose report (``-Xptxas -v``) added; assert it succeeded
    and return the report (ptxas writes it to stderr)."""
    import subprocess

    cmd = [*command, "-Xptxas", "-v"]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}{proc.stdout}"
    return proc.stderr + proc.stdout


def cuobjdump() -> str | None:
    """cuobjdump from the toolkit, else the copy that ships with Triton's NVIDIA backend."""
    import shutil
    from pathlib import Path

    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.is_file() else None


def sass_by_function(binary) -> dict[str, str]:
    """``cuobjdump -sass`` of a cubin or shared library, split by function name (skips without
    cuobjdump)."""
    import re
    import subprocess

    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's NVIDIA backend)")
    proc = subprocess.run([tool, "-sass", str(binary)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    parts = re.split(r"Function : (\w+)", proc.stdout)
    return dict(zip(parts[1::2], parts[2::2]))


def sass_loop(code: str, marker: str) -> list[str]:
    """The instructions of the innermost loop of one function's SASS that holds every instruction
    containing ``marker`` (a kernel's K loop, for ``marker`` its MMA opcode): from the target of a
    backward branch to that branch, the shortest such span around all of them (an inner wait's
    retry path included, the epilogue and a persistent kernel's tile loop not)."""
    import re

    ins = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", code)]
    marks = [a for a, text in ins if marker in text]
    assert marks, f"no {marker} in the SASS"
    loops = []
    for a, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) <= marks[0] and a >= marks[-1]:
            loops.append([t for x, t in ins if int(target.group(1), 16) <= x <= a])
    assert loops, f"no loop around the {marker}s"
    return min(loops, key=len)


def gemm_operands(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 A (m, k) and K-major B (n, k) of standard normal values on the GPU, from ``seed``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
    return a, b


def assert_gemm_matches_float64(fn, m: int, n: int, k: int) -> None:
    """C = fn(A, B) is (m, n) bf16 and the float64 product A @ B^T within the bf16 tolerance for K
    (operands seeded from the shape, so every shape draws its own)."""
    from snippets.common.gemm import tolerance_for

    a, b = gemm_operands(m, n, k, seed=m * 7 + n * 3 + k)
    c = fn(a, b)
    torch.cuda.synchronize()
    assert c.shape == (m, n) and c.dtype == torch.bfloat16
    rtol, atol = tolerance_for(k, torch.bfloat16)
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=rtol, atol=atol)


def assert_gemm_fully_written_and_repeatable(fn, m: int, n: int, k: int) -> None:
    """C = fn(A, B^T-major B) for bf16 A (m, k), B (n, k): C starts as NaN (a tile the epilogue
    skipped would show), two calls give identical bits (no race), and C is the float64 product
    within the bf16 tolerance for K."""
    from snippets.common.gemm import tolerance_for

    a, b = gemm_operands(m, n, k, seed=1)
    poison_allocator(m * n * 2, "cuda")
    c1, c2 = fn(a, b), fn(a, b)
    torch.cuda.synchronize()
    assert not c1.isnan().any()
    assert torch.equal(c1, c2)
    torch.testing.assert_close(c1.double(), a.double() @ b.double().T,
                               **dict(zip(("rtol", "atol"), tolerance_for(k, torch.bfloat16))))


def int4_operands(m: int, n: int, k: int, g: int, dtype: torch.dtype, device: str,
                  zero_point: bool = False, seed: int = 0) -> tuple:
    """x (M x K) and a weight of N x K quantised to int4 by round-to-nearest with groups of G
    (packed codes, scales in x's dtype, zeros or None), on ``device``: the W4A16 GEMM tests'
    operands."""
    from snippets.part8.quant import pack_int4, rtn_int4

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen) * 0.5 + (0.3 if zero_point else 0.0)
    codes, scales, zeros = rtn_int4(w, g, zero_point)
    args = (x, pack_int4(codes), scales.to(dtype), zeros)
    return tuple(None if a is None else a.to(device) for a in args)


def assert_int4_matches(y, x, packed, scales, zeros, label: str) -> None:
    """A W4A16 GEMM's output: its shape and dtype, every element written, and within the GEMM
    tolerance of K products of the reference computed in float64."""
    from snippets.common.gemm import tolerance_for
    from snippets.part8.int4_gemm import int4_gemm_ref

    m, k = x.shape
    assert y.shape == (m, packed.shape[0]) and y.dtype == x.dtype, label
    assert not y.isnan().any(), f"{label}: unwritten (NaN) outputs"
    ref = int4_gemm_ref(x.double(), packed, scales.double(), zeros)
    rtol, atol = tolerance_for(k, x.dtype)
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol, msg=lambda s: f"{label}: {s}")


class NoLaunch:
    """Stands in for a Triton kernel in tests of bad input: indexing it (``kernel[grid]``, the
    launch) fails the test, so a refusal must come before any launch."""

    def __getitem__(self, grid):
        raise AssertionError(f"a kernel was launched (grid {grid}) on input that must be refused")


def assert_graph_step_matches_v3(op: Op, version: str, config: str, b: int) -> None:
    """A graphed capstone decode step (``version`` of ``op``, capstone_decode) on the harness's inputs,
    against the reference (float64) and against v3 on one decoder: the later versions change which kernels
    run and where they round, not the step's arithmetic, so they agree to bf16's rounding of the logits;
    replays repeat exactly (a fixed position)."""
    size = {"config": config, "b": b, "ctx": 20}
    inputs = op.make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(3))
    want = op.reference(*inputs[:1], inputs[1], inputs[2].double(), inputs[3].double())
    v3 = op.impls["v3"].fn(*inputs).clone()
    got = op.impls[version].fn(*inputs).clone()
    assert torch.equal(op.impls[version].fn(*inputs), got)
    rtol, atol = op.tolerances[torch.bfloat16]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)
    torch.testing.assert_close(got.float(), v3.float(), rtol=rtol, atol=atol)


def assert_decoder_follows_book(view, steps: int, atol: float) -> None:
    """Prefill, then ``steps`` steps across the first page's end: a decoder made by ``view`` (a class's
    ``over``) on a book StaticDecoder of the tiny model gives the logits of a book decoder over another
    cache, prefilled alike, step after step, and caches the same K and V."""
    from conftest import DEVICE as device
    from snippets.part8 import capstone as cp

    model = cp.Llama(cp.TINY, seed=0, device=device)
    prompt = torch.randint(cp.TINY.vocab, (2, 5), generator=torch.Generator().manual_seed(1)).to(device)
    book = cp.StaticDecoder(model, 2, 5 + steps, "book")
    mine = view(cp.StaticDecoder(model, 2, 5 + steps, "book"))
    assert view(mine) is mine  # made once per family of views
    torch.testing.assert_close(mine.prefill(prompt), book.prefill(prompt), rtol=0, atol=1e-6)
    tok = prompt[:, -1]
    for i in range(steps):
        want = book.step(tok)
        got = mine.step(tok)
        torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=lambda m: f"step {i}: {m}")
        assert mine.length == book.length and int(mine.pos) == mine.length
        tok = want.argmax(-1)
    assert torch.equal(mine.tables, book.tables)  # the same seeded scatter: slots comparable as stored
    torch.testing.assert_close(mine.k, book.k, rtol=0, atol=atol)
    torch.testing.assert_close(mine.v, book.v, rtol=0, atol=atol)


def assert_graph_version_refuses_loose_decoders(fn) -> None:
    """A graphed capstone step ``fn(decoder, tokens, k_cache, v_cache)`` refuses a decoder whose position
    moves (its graph would replay a stale one) and a cache that is not the decoder's own storage, K or V."""
    from conftest import DEVICE as device
    from snippets.part8 import capstone as cp

    model = cp.Llama(cp.TINY, seed=0, device=device)
    dec = cp.StaticDecoder(model, 1, 8)
    tok = torch.zeros(1, dtype=torch.long, device=device)
    with pytest.raises(TypeError, match="fixed_position=True"):
        fn(dec, tok, dec.k, dec.v)
    fixed = cp.StaticDecoder(model, 1, 8, fixed_position=True)
    for k, v in ((fixed.k.clone(), fixed.v), (fixed.k, fixed.v.clone())):
        with pytest.raises(ValueError, match="own cache storage"):
            fn(fixed, tok, k, v)


def run_cute_host_program(src, build_dir) -> str:
    """Build a host-only C++ program against CuTe's headers (unpacked from the nvidia-cutlass wheel
    by the CuTe GEMM's helper) and return what it prints. The binary is cached in ``build_dir`` by
    the hash of the source and of the include path, and published atomically (parallel workers may
    build the same file). Skips when nvcc or the headers are missing."""
    import hashlib
    import shutil
    import subprocess
    from pathlib import Path

    from snippets.part6.cute_gemm import cutlass_include
    from snippets.registry import REPO_ROOT

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(f"nvcc is not on PATH, so {Path(src).name} (CuTe's C++) cannot be built")
    try:
        include = cutlass_include()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    src, build_dir = Path(src), Path(build_dir)
    digest = hashlib.sha256(src.read_bytes() + str(include).encode()).hexdigest()[:12]
    exe = build_dir / f"{src.stem}-{digest}"
    if not exe.is_file():
        build_dir.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(f"{exe.name}.{os.getpid()}")
        cmd = [nvcc, "-std=c++17", f"-I{include}", "-o", str(tmp), str(src.relative_to(REPO_ROOT))]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}"
        os.replace(tmp, exe)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
