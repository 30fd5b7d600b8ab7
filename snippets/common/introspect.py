"""What the Triton compiler made of a kernel: compile for a GPU target without a GPU, and read
the result.

``triton.compile`` needs no GPU when it is given a target: it runs the whole pipeline (Python AST ->
TTIR -> TTGIR -> LLVM IR -> PTX -> cubin) on the host, so the intermediate forms, the shared memory
a program needs and, through ``ptxas -v``, the registers and spills of each thread can be read on
any machine. On a GPU the same facts come from a launch: ``compiled = kernel[grid](...)`` returns
the compiled kernel, with ``n_regs``, ``n_spills``, ``metadata.shared`` and ``asm["ptx"]``
(``scripts/capture_triton.py`` prints them for the book's kernels).

- :func:`signature_of` turns example arguments into the signature and the divisibility facts that
  Triton's JIT would specialise a launch on;
- :func:`compile_for` compiles a kernel for one target and configuration and returns
  a :class:`Compiled`;
- :func:`load_store_widths`, :func:`tensor_core_ops`, :func:`async_copies`,
  :func:`shared_memory_ops` and :func:`layouts` find in the PTX and TTGIR what a reader looks
  for first.

Under ``TRITON_INTERPRET=1`` every ``@triton.jit`` function in the process, Triton's own ``tl.cdiv``
and ``tl.sum`` included, is an interpreted function that the compiler cannot use, so
:func:`compile_for` then compiles in a fresh Python process without the variable (a couple of
seconds more), importing the kernel from its module.

The Triton programming model chapter (Part 4) explains these tools; Parts 4 and 5 use them to
check that their kernels compile for sm_90 without a Hopper GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]

# Triton's names for the element types of pointer arguments.
TRITON_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv",
}
# what the JIT checks: a pointer whose address, or an integer whose value, is a multiple of 16
DIVISIBILITY = 16


class CompileError(Exception):
    """A kernel that Triton refused to compile. ``kind`` is the name of Triton's exception class
    (``CompilationError``, ``CompileTimeAssertionFailure``, ...) and ``str(error)`` its message,
    with the source line it points at."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# --8<-- [start:compiled]
@dataclass(frozen=True)
class Compiled:
    """One compiled variant of a kernel: its intermediate forms and the resources one program
    (CTA) needs."""

    name: str
    arch: int
    num_warps: int
    num_stages: int
    # bytes of shared memory per program (metadata.shared): the compiler's buffers
    shared: int
    ttir: str                   # Triton IR: the kernel as block operations, no layouts yet
    # TritonGPU IR: every block has a layout over threads, warps and shared memory
    ttgir: str
    llir: str                   # LLVM IR
    ptx: str                    # the virtual assembly that ptxas turns into the cubin
    registers: int | None       # per thread, from ptxas -v
    spill_stores: int | None    # bytes per thread spilled to local memory (0 is what you want)
    spill_loads: int | None
    ptxas_report: str           # the raw ptxas -v output

    @property
    def threads(self) -> int:
        """Threads per program: num_warps warps of 32."""
        return self.num_warps * 32
# --8<-- [end:compiled]


# --8<-- [start:launched]
def launched_resources(compiled) -> dict[str, int]:
    """What the GPU path reports for the object a launch returns (``compiled = kernel[grid](...)``):
    registers and spills per thread as the driver loaded the cubin, shared memory per program, and
    the launch options."""
    # loads the cubin if the launch has not already (it has, after a launch)
    compiled._init_handles()
    md = compiled.metadata
    return dict(n_regs=compiled.n_regs, n_spills=compiled.n_spills, shared=md.shared,
                num_warps=md.num_warps, num_stages=md.num_stages)
# --8<-- [end:launched]


# --------------------------------------------------------------------------------------------------
# From example arguments to a signature: the JIT's specialisation rules
# --------------------------------------------------------------------------------------------------

# --8<-- [start:signature_of]
def signature_of(kernel, *args,
                 **constexprs) -> tuple[dict[str, str], dict[str, Any], tuple[str, ...]]:
    """The signature, constexprs and divisible arguments a launch
    ``kernel[grid](*args, **constexprs)`` is specialised on, by the rules of Triton's JIT: a tensor
    becomes a pointer to its element type, divisible if its address is a multiple of 16 bytes; an
    int becomes i32 (i64 if it does not fit), divisible if its value is a multiple of 16, and an int
    equal to 1 becomes a constant; a float becomes fp32. Each new combination of these facts (and of
    constexpr values) is a new compilation."""
    names = list(kernel.arg_names)
    if len(args) + len(constexprs) > len(names):
        raise TypeError(f"{kernel.__name__} takes {len(names)} arguments, got "
                        f"{len(args) + len(constexprs)}")
    signature, consts, divisible = {}, dict(constexprs), []
    for name, arg in zip(names, args):
        if isinstance(arg, torch.Tensor):
            if arg.dtype not in TRITON_TYPES:
                raise TypeError(f"{name}: no Triton pointer type for dtype {arg.dtype}")
            signature[name] = "*" + TRITON_TYPES[arg.dtype]
            if arg.data_ptr() % DIVISIBILITY == 0:
                divisible.append(name)
        elif isinstance(arg, bool):
            signature[name] = "i1"
        elif isinstance(arg, int):
            if arg == 1:
                # specialised away: the kernel is compiled with the value 1 built in
                consts[name] = 1
                continue
            signature[name] = "i32" if -2**31 <= arg < 2**31 else "i64"
            if arg % DIVISIBILITY == 0:
                divisible.append(name)
        elif isinstance(arg, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{name}: cannot specialise an argument of type {type(arg).__name__}")
    missing = [n for n in names if n not in signature and n not in consts]
    if missing:
        raise TypeError(f"{kernel.__name__}: no value for {', '.join(missing)}")
    return signature, consts, tuple(divisible)
# --8<-- [end:signature_of]


# --------------------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------------------

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _jit_function(kernel):
    """The compilable JITFunction of ``kernel``, which may be an InterpretedFunction (then None)."""
    from triton.runtime.jit import JITFunction
    return kernel if isinstance(kernel, JITFunction) else None


# --8<-- [start:compile_for]
def compile_for(kernel, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                *, arch: int = 90, num_warps: int = 4, num_stages: int = 3,
                divisible: Iterable[str] | None = None, debug: bool = False) -> Compiled:
    """Compile ``kernel`` for NVIDIA compute capability ``arch`` (90: H100/H200) without a GPU.

    ``signature`` maps each runtime argument to its Triton type ("*fp32", "i32", ...);
    ``constexprs`` gives the value of each ``tl.constexpr`` argument; ``divisible`` names the
    arguments the compiler may assume to be multiples of 16 (bytes for pointers, value for
    integers). It defaults to every pointer: torch's allocations always start on such an address, so
    a launch on whole tensors gets the same assumption. ``debug=True`` keeps ``tl.device_assert``
    checks (as ``TRITON_DEBUG=1`` does at launch).
    """
    job = _job(kernel, signature, constexprs or {}, arch, num_warps, num_stages, divisible, debug)
    # interpreted: compile in a process where Triton is not interpreting
    if _jit_function(kernel) is None:
        result = _compile_elsewhere([job])[0]
        if isinstance(result, CompileError):
            raise result
        return result
    return _compile_job(kernel, job)
# --8<-- [end:compile_for]


COMPILE_DEFAULTS = dict(arch=90, num_warps=4, num_stages=3, divisible=None, debug=False)


def compile_many(jobs: Iterable[tuple], raise_errors: bool = True) -> list[Compiled | CompileError]:
    """:func:`compile_for` for several ``(kernel, signature, constexprs, options)`` tuples
    (``options``: a dict of compile_for's keyword arguments). Under the interpreter they share one
    helper process, so five variants cost one start-up instead of five. With ``raise_errors=False``
    a kernel that does not compile gives its :class:`CompileError` in the list instead of
    raising it."""
    jobs = list(jobs)
    built = [_job(k, s, c or {}, **{**COMPILE_DEFAULTS, **o}) for k, s, c, o in jobs]
    if any(_jit_function(k) is None for k, *_ in jobs):
        results = _compile_elsewhere(built)
    else:
        results = []
        for (k, *_), j in zip(jobs, built):
            try:
                results.append(_compile_job(k, j))
            except CompileError as e:
                results.append(e)
    if raise_errors:
        for r in results:
            if isinstance(r, CompileError):
                raise r
    return results


def _job(kernel, signature, constexprs, arch, num_warps, num_stages, divisible, debug) -> dict:
    names = list(kernel.arg_names)
    unknown = [n for n in (*signature, *constexprs) if n not in names]
    if unknown:
        raise TypeError(f"{kernel.__name__} has no argument {', '.join(unknown)}; its arguments "
                        f"are {', '.join(names)}")
    missing = [n for n in names if n not in signature and n not in constexprs]
    if missing:
        raise TypeError(f"{kernel.__name__}: give a type or a constexpr value for "
                        f"{', '.join(missing)}")
    if divisible is None:
        divisible = [n for n, t in signature.items() if t.startswith("*")]
    fn = getattr(kernel, "fn", kernel)
    return dict(module=fn.__module__, name=fn.__name__, signature=dict(signature),
                constexprs=dict(constexprs), arch=arch, num_warps=num_warps, num_stages=num_stages,
                divisible=list(divisible), debug=debug)


def triton_compile(kernel, signature: Mapping[str, str], constexprs: Mapping[str, Any],
                   divisible: Iterable[str], *, arch: int = 90, num_warps: int = 4,
                   num_stages: int = 3, debug: bool = False):
    """Compile a JITFunction in this process (TRITON_INTERPRET unset) and return Triton's own
    CompiledKernel (``.asm`` holds ttir, ttgir, llir, ptx and cubin; ``.metadata.shared`` the shared
    memory). Arguments named in ``constexprs`` are compiled in with their values, whatever
    ``signature`` says of them; ``divisible`` names the arguments the compiler may assume to be
    multiples of 16. Errors from Triton's compiler come out as :class:`CompileError`.
    :func:`compile_for` is the same with a :class:`Compiled` summary and the ptxas report, from
    any process."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(kernel.arg_names)
    full = {n: ("constexpr" if n in constexprs else signature[n]) for n in names}
    # {(argument index,): [["tt.divisibility", 16]]}: the form the JIT builds from
    # its specialisation
    attrs = {(names.index(n),): [["tt.divisibility", DIVISIBILITY]] for n in divisible}
    src = ASTSource(fn=kernel, signature=full, constexprs=dict(constexprs), attrs=attrs)
    try:
        return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages, debug=debug))
    # CompilationError and its subclasses; their module moved between versions
    except Exception as e:
        if type(e).__module__.startswith("triton"):
            raise CompileError(type(e).__name__, str(e)) from e
        raise


def _compile_job(kernel, job: dict) -> Compiled:
    """Compile in this process (``kernel`` is a JITFunction)."""
    ck = triton_compile(kernel, job["signature"], job["constexprs"], job["divisible"],
                        arch=job["arch"], num_warps=job["num_warps"], num_stages=job["num_stages"],
                        debug=job["debug"])
    ptx = ck.asm["ptx"]
    report = ptxas_report(ptx, job["arch"])
    fn = parse_ptxas(report).get(ck.metadata.name, {})
    return Compiled(name=ck.metadata.name, arch=job["arch"], num_warps=ck.metadata.num_warps,
                    num_stages=ck.metadata.num_stages, shared=ck.metadata.shared,
                    ttir=ck.asm["ttir"], ttgir=ck.asm["ttgir"], llir=ck.asm["llir"], ptx=ptx,
                    registers=fn.get("registers"), spill_stores=fn.get("spill_store_bytes"),
                    spill_loads=fn.get("spill_load_bytes"), ptxas_report=report)


def _compile_elsewhere(jobs: list[dict]) -> list[Compiled | CompileError]:
    """Run the jobs in a fresh Python process (:func:`compile_worker`) without TRITON_INTERPRET;
    results as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # the default; set, so Triton 3.9 does not warn about it
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", WORKER],
                          input=json.dumps(jobs), capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the compile process failed:\n{proc.stderr[-4000:]}")
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    out = []
    for r in results:
        out.append(CompileError(**r["error"]) if "error" in r else Compiled(**r))
    return out


WORKER = "from snippets.common.introspect import compile_worker; compile_worker()"


def compile_worker() -> None:
    """The helper process of :func:`_compile_elsewhere`: jobs as JSON on stdin, each kernel
    imported from its module and compiled; results as JSON on stdout."""
    import importlib
    jobs = json.loads(sys.stdin.read())
    results = []
    for job in jobs:
        kernel = getattr(importlib.import_module(job["module"]), job["name"])
        try:
            results.append(asdict(_compile_job(kernel, job)))
        except CompileError as e:
            results.append({"error": {"kind": e.kind, "message": str(e)}})
    print(json.dumps(results))


# --------------------------------------------------------------------------------------------------
# ptxas: registers and spills
# --------------------------------------------------------------------------------------------------

def _ptxas_candidates(arch: int) -> list[str]:
    """ptxas binaries to try, best first: the one Triton itself uses for ``arch`` (bundled with
    Triton; which one, and how it is found, changed between Triton versions), the others Triton
    bundles, then the CUDA toolkit's. PTX declares a version that older ptxas builds refuse, so the
    first that accepts it wins."""
    found = []
    try:
        from triton.backends.nvidia import compiler as nv
        try:
            tool = nv.get_ptxas(arch)
        except TypeError:  # versions whose get_ptxas takes no architecture
            tool = nv.get_ptxas()
        found.append(tool.path)
    except Exception:  # an older or newer layout: fall back to the files
        pass
    try:
        import triton
        bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        found += [str(bindir / "ptxas-blackwell"), str(bindir / "ptxas")]
    except ImportError:
        pass
    if shutil.which("ptxas"):
        found.append(shutil.which("ptxas"))
    return [p for i, p in enumerate(found) if p and os.path.isfile(p) and p not in found[:i]]


# --8<-- [start:ptxas]
def ptxas_report(ptx: str, arch: int = 90) -> str:
    """``ptxas -v`` on ``ptx``: the assembler's report of registers, spills and barriers
    per kernel."""
    target = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M)
    gpu = target.group(1) if target else f"sm_{arch}"  # sm_90a: Hopper with wgmma and setmaxnreg
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        errors = []
        for ptxas in _ptxas_candidates(arch):
            proc = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", str(src), "-o",
                                   str(Path(tmp) / "k.cubin")],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                return proc.stderr + proc.stdout
            errors.append(f"{ptxas}: {proc.stderr.strip()}")
    raise RuntimeError("no ptxas accepted the PTX:\n" + "\n".join(errors or ["no ptxas found"]))


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")


def parse_ptxas(report: str) -> dict[str, dict[str, int]]:
    """Per kernel: ``registers`` (per thread) and ``spill_store_bytes`` / ``spill_load_bytes``.
    ptxas prints "Compiling entry function 'k'", then "Function properties for f" followed by "N
    bytes stack frame, S bytes spill stores, L bytes spill loads" (f may be a device function called
    by k), then "Used R registers" for k. Triton inlines every function, so its kernels have one
    entry each; the CUDA reports have more."""
    kernels: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in report.splitlines():
        if m := _ENTRY_RE.search(line):
            entry = m.group(1)
            kernels.setdefault(entry, {})
        elif m := _PROPS_RE.search(line):
            props = m.group(1)
        elif (m := _FRAME_RE.search(line)) and props in kernels:
            _, stores, loads = map(int, m.groups())
            kernels[props].update(spill_store_bytes=stores, spill_load_bytes=loads)
        elif (m := _USED_RE.search(line)) and entry is not None:
            kernels[entry]["registers"] = int(m.group(1))
    return kernels
# --8<-- [end:ptxas]


# --------------------------------------------------------------------------------------------------
# Reading PTX and TTGIR
# --------------------------------------------------------------------------------------------------

# --8<-- [start:finders]
def _ops(ptx: str, pattern: str) -> Counter:
    """How often each instruction matching ``pattern`` (its opcode with all its
    .modifiers) occurs."""
    return Counter(re.findall(rf"(?<![\w.])((?:{pattern})(?:(?:\.|::)\w+)*)", _plain(ptx)))


def _plain(ptx: str) -> str:
    """PTX with the CTA's own state space written the short way: Triton 3.8 prints
    ``st.shared::cta.b32`` where 3.6 and 3.9 print ``st.shared.b32`` (the same instruction)."""
    return re.sub(r"\.shared::cta\b", ".shared", ptx)


def load_store_widths(ptx: str, space: str = "global") -> dict[str, set[int]]:
    """Bits moved per thread by each ld/st instruction on ``space`` ("global" or "shared"):
    ``{"ld": {128}, "st": {128}}`` means every load and store is a 16-byte
    vector (ld.global.v4.b32)."""
    widths: dict[str, set[int]] = {"ld": set(), "st": set()}
    for op, vec, bits in re.findall(rf"\b(ld|st)\.{space}(?:\.\w+)*?(?:\.v(\d))?\.[bfsu](\d+)\b",
                                    _plain(ptx)):
        widths[op].add(int(vec or 1) * int(bits))
    return widths


def tensor_core_ops(ptx: str) -> Counter:
    """Tensor-core instructions: mma.sync (Ampere's warp-level MMA) and wgmma.mma_async (Hopper's
    warpgroup MMA, which reads its operands from shared memory)."""
    return _ops(ptx, r"mma\.sync|wgmma\.mma_async")


def async_copies(ptx: str) -> Counter:
    """Copies that bypass registers: cp.async (Ampere: global -> shared, per thread) and
    cp.async.bulk (Hopper's Tensor Memory Accelerator, TMA: one thread starts a whole
    tile's copy)."""
    return _ops(ptx, r"cp\.async(?:\.bulk)?")


def shared_memory_ops(ptx: str) -> Counter:
    """Instructions that touch shared memory: ld/st.shared, ldmatrix (a warp loads MMA fragments
    from it), and the cp.async copies into it."""
    return _ops(ptx, r"ld\.shared|st\.shared|ldmatrix|stmatrix|cp\.async")


def layouts(ttgir: str) -> dict[str, str]:
    """The layouts the TTGIR defines, by alias: ``#blocked`` (registers: which thread holds which
    elements), ``#shared`` (a swizzled shared-memory buffer), ``#mma`` (the tensor-core
    accumulator), ..."""
    return dict(re.findall(r"^(#(?!loc)\w+) = (#ttg\.\w+<.*>)\s*$", ttgir, re.M))
# --8<-- [end:finders]


def excerpt(text: str, pattern: str, context: int = 0, limit: int = 3) -> str:
    """The first ``limit`` lines of ``text`` matching ``pattern`` (with ``context`` lines after
    each), trimmed of Triton's ``loc(...)`` source locations: a short quote of IR for a chapter."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            for piece in lines[i:i + 1 + context]:
                out.append(re.sub(r"\s*loc\(#?[^)]*\)+$", "", piece.rstrip()))
            if len(out) >= limit * (1 + context):
                break
    return "\n".join(out)
