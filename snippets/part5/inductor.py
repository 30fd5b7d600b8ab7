"""What torch.compile fuses: compile a small block of the book, capture the code Inductor writes for
it, and list the kernels and the calls that code makes.

``capture(fn, *args)`` compiles ``fn`` (static shapes, like the book's ``compiled`` baselines), runs
it once and returns the generated Python module of every graph it compiled (one per graph: a graph
break makes two). ``schedule(code)`` reads one module: the kernels Inductor generated (Triton on a
GPU, C++ on a CPU) and, in the order the wrapper runs them, every kernel launch, every call of an
external kernel (cuBLAS through ``extern_kernels.mm`` / ``addmm`` / ``bmm``) and every op it could
not compile and calls as it is (a custom op, an ATen fallback). A generated kernel's name says what
it is: ``triton_poi_fused_add_gelu_0`` is a pointwise kernel that fused add and gelu; ``per`` is a
persistent reduction (the whole row in registers), ``red`` a looped reduction, ``tem`` a template (a
matmul written by Inductor, with its epilogue fused), ``cpp`` the CPU backend's C++.

The fusion decisions (which nodes go in one kernel) are made on the graph, before code generation,
by the same scheduler for both backends; a CPU run therefore shows them too, with C++ in place of
Triton. What the chapter shows of the Triton code is captured on the GPU by
``scripts/capture_inductor.py`` from the blocks in ``BLOCKS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

# --8<-- [start:names]
# Inductor's kernel names: backend, category, the ATen ops fused (joined by "_", in the order
# Inductor lists them), a running index. "fused_" is there even for a kernel of one op; names
# without it occur when descriptive names are turned off
# (torch._inductor.config.triton.descriptive_names = False).
KERNEL_DEF = re.compile(
    r"^(?P<name>\w+) = async_compile\.(?P<how>triton|cpp_pybinding|cpp|cuda|halide)\(", re.M)
KERNEL_NAME = re.compile(
    r"^(?P<backend>triton|cpp|cuda|halide)_(?:(?P<kind>poi|red|per|tem|for|mm|bmm)_)?"
    r"(?:fused_(?P<ops>\w*?)_)?(?P<index>\d+)$")
KINDS = {"poi": "pointwise", "red": "reduction (looped)", "per": "reduction (persistent)",
         "tem": "template", "for": "foreach", "mm": "matmul", "bmm": "batched matmul", None: ""}
EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
OP_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\.(\w+)\(")
ATEN_COMMENT = re.compile(r"Original ATen: \[([^\]]*)\]")
# --8<-- [end:names]


@dataclass(frozen=True)
class Kernel:
    """One generated kernel: its name, backend ("triton", "cpp"), kind ("pointwise", "reduction
    (persistent)", "template", ...), the fused ops as its name lists them ("add_gelu"), and the ATen
    ops of the comment above its definition where the wrapper has one (Triton does; C++
    does not)."""

    name: str
    backend: str
    kind: str
    ops: str
    aten: tuple[str, ...] = ()
    source: str = ""


@dataclass
class Schedule:
    """What one generated module does: its kernels, and the steps of its ``call`` in order, each
    ("kernel", name), ("extern", "addmm") or ("op", "namespace.name")."""

    kernels: dict[str, Kernel] = field(default_factory=dict)
    steps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def launches(self) -> int:
        """Device work the wrapper issues: generated kernels, external kernels and called ops."""
        return len(self.steps)

    def externs(self) -> list[str]:
        return [what for kind, what in self.steps if kind == "extern"]

    def ops_called(self) -> list[str]:
        return [what for kind, what in self.steps if kind == "op"]

    def describe(self) -> str:
        """One line per step: kernel name, kind and fused ops; external kernels and called ops
        by name."""
        lines = []
        for kind, what in self.steps:
            if kind == "kernel":
                k = self.kernels[what]
                aten = f"  (ATen: {', '.join(k.aten)})" if k.aten else ""
                lines.append(f"  kernel  {k.name:<44} {k.kind:<24}{aten}".rstrip())
            else:
                lines.append(f"  {kind:<7} {what}")
        return "\n".join(lines)


# --8<-- [start:parse]
def parse_name(name: str) -> tuple[str, str, str]:
    """(backend, kind, fused ops) of a generated kernel's name; ("", "", "") for a name of
    another form."""
    m = KERNEL_NAME.match(name)
    if not m:
        return "", "", ""
    return m["backend"], KINDS[m["kind"]], m["ops"] or ""


def _kernel_source(code: str, start: int) -> str:
    """The kernel's own text: the string literal after its definition (from ``@triton.jit`` on,
    for Triton)."""
    open_at = code.find("'''", start)
    close_at = code.find("'''", open_at + 3)
    body = code[open_at + 3:close_at] if open_at >= 0 and close_at > open_at else ""
    jit = body.find("@triton.jit")
    return (body[jit:] if jit >= 0 else body).strip("\n")


def _aten_above(code: str, start: int) -> tuple[str, ...]:
    """The ATen ops in the comment block right above a kernel's definition (the GPU wrapper
    writes one)."""
    block = []
    for line in reversed(code[:start].splitlines()):
        if not line.startswith("#"):
            break
        block.append(line)
    for line in block:
        m = ATEN_COMMENT.search(line)
        if m:
            return tuple(s.strip() for s in m[1].split(",") if s.strip())
    return ()


def _call_body(code: str) -> list[str]:
    """The lines of the wrapper's ``call`` function (a method of a Runner class in newer torch)."""
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*def call\(", line):
            indent = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            return body
    return []


def schedule(code: str) -> Schedule:
    """Read one generated module: its kernels and the steps of its ``call``, in order."""
    out = Schedule()
    for m in KERNEL_DEF.finditer(code):
        backend, kind, ops = parse_name(m["name"])
        out.kernels[m["name"]] = Kernel(m["name"], backend or m["how"], kind, ops,
                                        _aten_above(code, m.start()), _kernel_source(code, m.end()))
    for line in _call_body(code):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        call = re.match(r"(\w+)(?:\.run)?\(", stripped)
        if call and call[1] in out.kernels:
            out.steps.append(("kernel", call[1]))
        elif EXTERN.search(stripped):
            out.steps.append(("extern", EXTERN.search(stripped)[1]))
        elif OP_CALL.search(stripped) and not stripped.startswith("assert"):
            m = OP_CALL.search(stripped)
            out.steps.append(("op", f"{m[1]}.{m[2]}"))
    return out
# --8<-- [end:parse]


# --8<-- [start:capture]
@dataclass
class Capture:
    """The output of one compiled call and the generated module of each graph compiled for it."""

    output: Any
    code: list[str]

    @property
    def schedules(self) -> list[Schedule]:
        return [schedule(c) for c in self.code]

    def kernels(self) -> list[Kernel]:
        return [k for s in self.schedules for k in s.kernels.values()]


def capture(fn: Callable, *args, **compile_kwargs) -> Capture:
    """Compile ``fn`` with torch.compile (``dynamic=False`` unless given) and run it on ``args``,
    keeping the code Inductor generates. Dynamo's caches are reset first, so that ``fn`` is compiled
    again even if an earlier call compiled it (a cached graph would generate no code to capture)."""
    from torch._inductor.utils import run_and_get_code

    compile_kwargs.setdefault("dynamic", False)
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(fn, **compile_kwargs), *args)
    return Capture(out, list(code))
# --8<-- [end:capture]


# --------------------------------------------------------------------------------------------------
# The blocks of the book, written as a model would write them in PyTorch
# --------------------------------------------------------------------------------------------------

# --8<-- [start:blocks]
def bias_gelu_dropout_residual(x, bias, residual):
    """The epilogue chain after a linear layer in a transformer block (p = 0.1, training mode)."""
    return F.dropout(F.gelu(x + bias), p=0.1, training=True) + residual


def softmax(x):
    return torch.softmax(x, dim=-1)


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def rmsnorm(x, w, eps: float = 1e-6):
    """As Llama's RMSNorm computes it: in fp32, then back to the input dtype, times the weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def swiglu(gate, up):
    """The gated activation of Llama's MLP, on the outputs of the gate and up projections."""
    return F.silu(gate) * up


def linear_gelu(x, w, b):
    """A linear layer (nn.Linear's layout) and its activation: can the bias and GELU join
    the matmul?"""
    return F.gelu(F.linear(x, w, b))


def lora(x, w, a, b, scale: float = 2.0):
    """The LoRA layer of this part's LoRA chapter, as eager PyTorch writes it."""
    return F.linear(x, w) + scale * F.linear(F.linear(x, a), b)
# --8<-- [end:blocks]


def _rows(t, n, dtype, device, gen):
    return torch.randn(t, n, generator=gen, device=device).to(dtype)


def block_inputs(name: str, device: str, dtype: torch.dtype, rows: int = 4096,
                 width: int = 4096) -> tuple:
    """Inputs of a block: ``rows`` x ``width`` activations (and weights of the matching width)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = _rows(rows, width, dtype, device, g)
    vec = lambda: torch.randn(width, generator=g, device=device).to(dtype)  # noqa: E731
    if name == "bias_gelu_dropout_residual":
        return x, vec(), _rows(rows, width, dtype, device, g)
    if name == "softmax":
        return (x,)
    if name == "layernorm":
        return x, vec(), vec()
    if name == "rmsnorm":
        return x, vec()
    if name == "swiglu":
        return x, _rows(rows, width, dtype, device, g)
    if name in ("linear_gelu", "linear_gelu_autotune"):
        return x, _rows(width, width, dtype, device, g) / width**0.5, vec()
    if name == "lora":
        return (x, _rows(width, width, dtype, device, g) / width**0.5,
                _rows(16, width, dtype, device, g) / width**0.5,
                _rows(width, 16, dtype, device, g) / 4)
    raise KeyError(f"unknown block {name!r}; known: {', '.join(BLOCKS)}")


# name -> (function, torch.compile keyword arguments). linear_gelu_autotune asks for max-autotune
# with Triton templates as the only GEMM backend: the one way to see Inductor write the matmul
# itself (with cuBLAS also allowed, max-autotune keeps whichever it times faster). Whether the GELU
# joins the template's epilogue is up to its epilogue-fusion benchmark; the capture on the H200
# shows the bias in the template and the GELU apart.
BLOCKS: dict[str, tuple[Callable, dict]] = {
    "bias_gelu_dropout_residual": (bias_gelu_dropout_residual, {}),
    "softmax": (softmax, {}),
    "layernorm": (layernorm, {}),
    "rmsnorm": (rmsnorm, {}),
    "swiglu": (swiglu, {}),
    "linear_gelu": (linear_gelu, {}),
    "linear_gelu_autotune": (linear_gelu, {"options": {"max_autotune": True,
                                                       "max_autotune_gemm_backends": "TRITON"}}),
    "lora": (lora, {}),
}


def report(name: str, cap: Capture, max_source_lines: int = 80) -> str:
    """A text report of one captured block: per graph, the steps of the wrapper, then each generated
    kernel's source (cut to ``max_source_lines`` lines)."""
    lines = [f"block: {name}; torch {torch.__version__}; {len(cap.code)} graph(s)"]
    for i, sched in enumerate(cap.schedules):
        lines.append(f"\ngraph {i}: {len(sched.kernels)} generated kernel(s), "
                     f"{len(sched.externs())} external call(s), {len(sched.ops_called())} op(s) "
                     "called as they are; in order:")
        lines.append(sched.describe())
        for k in sched.kernels.values():
            src = k.source.splitlines()
            cut = src[:max_source_lines] + ([f"    ... ({len(src) - max_source_lines} more lines)"]
                                            if len(src) > max_source_lines else [])
            lines += ["", f"--- {k.name} ---", *cut]
    return "\n".join(lines) + "\n"
