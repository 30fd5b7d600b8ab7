#!/usr/bin/env python3
"""What the compiler gave each of the book's Triton kernels on this GPU, read after real launches.

For every Triton version registered by the Part 1 vector add, the Part 3 reduction and GEMMs and the Part 4 ops,
one call at its op's headline size (first benchmarked dtype), then for each kernel it compiled: registers and
spills per thread (``n_regs``, ``n_spills``, from the driver), shared memory per program (``metadata.shared``),
``num_warps``, ``num_stages`` and the constexprs. Then the launch of a GEMM config too big for shared memory,
and the OutOfResources message it raises. Run on the GPU runner (the chapters show the file with
``<!-- bench:output triton_metadata -->``):

    python scripts/capture_triton.py benchmarks/results/outputs/<gpu>/triton_metadata.txt

A module that does not import, or a version that fails, is reported in the file and skipped.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

MODULES = {  # module -> ops of it to report (None: all of its ops, the Part 4 ones)
    "snippets.part1.elementwise": ("vector_add",),
    "snippets.part3.reduce": ("reduce_sum",),
    "snippets.part3.wmma": ("wmma_gemm", "tf32_gemm"),
    "snippets.part4.softmax": None,
    "snippets.part4.layernorm": None,
    "snippets.part4.matmul": None,
    "snippets.part4.dropout": None,
}


def _kernels(sources) -> list:
    """The JITFunctions among an Impl's sources (an autotuner is reported through the function it tunes)."""
    from triton.runtime.jit import JITFunction
    found = []
    for s in sources:
        fn = s if isinstance(s, JITFunction) else getattr(s, "fn", None)
        if isinstance(fn, JITFunction) and fn not in found:
            found.append(fn)
    return found


def _launched(call) -> set | None:
    """The driver handles of the kernels that ``call()`` launches, caught with Triton's launch hook; None where
    this Triton has no such hook. An autotuned version compiles every config it tries, but launches one."""
    try:
        from triton import knobs
        saved = knobs.runtime.launch_enter_hook
    except (ImportError, AttributeError):
        return None
    handles: set = set()

    def hook(metadata):
        data = getattr(metadata, "data", metadata)
        handles.add(data.get("function") if isinstance(data, dict) else None)

    knobs.runtime.launch_enter_hook = hook
    try:
        call()
        torch.cuda.synchronize()
    finally:
        knobs.runtime.launch_enter_hook = saved
    return handles - {None} or None


def _compiled(fn) -> list:
    """Every compiled variant in a JITFunction's cache, for every device (the cache's layout changed across
    Triton versions: a dict per device whose first entry maps keys to CompiledKernels)."""
    out = []
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            out += [k for k in cache.values() if hasattr(k, "metadata")]
    return out


def _constexprs(fn, ck) -> str:
    consts = getattr(getattr(ck, "src", None), "constants", {}) or {}
    names = list(fn.arg_names)
    parts = []
    for key, value in consts.items():
        idx = key[0] if isinstance(key, tuple) else key
        name = names[idx] if isinstance(idx, int) and idx < len(names) else str(key)
        if name.isupper():  # tile sizes and switches; lower-case ones are ints specialised to 1
            parts.append(f"{name}={value}")
    return " ".join(parts)


def _row(op: str, version: str, fn, ck) -> str:
    from snippets.common.introspect import launched_resources
    r = launched_resources(ck)
    return (f"{op:<18} {version:<4} {fn.__name__:<28} {r['n_regs']:>5} {r['n_spills']:>7} {r['shared']:>9} "
            f"{r['num_warps']:>6} {r['num_stages']:>7}  {_constexprs(fn, ck)}")


def report() -> list[str]:
    from snippets.registry import REGISTRY, dtype_name
    lines = [f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
             f"triton {importlib.import_module('triton').__version__}",
             "registers and spills per thread (n_regs, n_spills), shared memory per program in bytes",
             "",
             f"{'op':<18} {'ver':<4} {'kernel':<28} {'regs':>5} {'spills':>7} {'shared':>9} {'warps':>6} "
             f"{'stages':>7}  constexprs"]
    for mod in MODULES:
        try:
            importlib.import_module(mod)
        except Exception as e:  # a module being written, or one that needs a missing package
            lines.append(f"{mod}: not imported ({type(e).__name__}: {e})")
    seen: set[int] = set()  # a kernel shared by two versions is reported under the first that compiled it
    named = {name for names in MODULES.values() if names for name in names}
    for op in REGISTRY.values():
        if op.name not in named and op.part != 4:
            continue
        for impl in op.impls.values():
            if impl.lang != "Triton" or not impl.runs_on("cuda") or impl.unavailable():
                continue
            dtype = next((d for d in (*op.timed_dtypes(), *op.dtypes) if impl.supports(d)), None)
            if dtype is None:
                continue
            try:
                args = op.make_inputs(op.headline, dtype, "cuda", torch.Generator().manual_seed(0))
                impl.fn(*args)  # compiles (and autotunes)
                torch.cuda.synchronize()
                launched = _launched(lambda: impl.fn(*args))  # launches only what it chose  # noqa: F821
                del args
            except Exception as e:
                last = (str(e).strip().splitlines() or [""])[-1]  # a CompilationError ends with its reason
                lines.append(f"{op.name:<18} {impl.name:<4} failed: {type(e).__name__}: {last}")
                continue
            for fn in _kernels(impl.sources):
                for ck in _compiled(fn):
                    if launched is not None and getattr(ck, "function", None) not in launched:
                        continue
                    if id(ck) in seen:
                        continue
                    seen.add(id(ck))
                    lines.append(_row(op.name, impl.name, fn, ck) + f"  [{dtype_name(dtype)}]")
            torch.cuda.empty_cache()
    return lines


def out_of_resources() -> list[str]:
    """Launch the Part 3 GEMM with a config whose pipeline needs more shared memory than an SM has."""
    from snippets.common.gemm import matmul_kernel
    from snippets.part4.debugging import oversized_gemm_config
    cfg = oversized_gemm_config()
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    lines = ["", f"matmul_kernel with {cfg}:"]
    try:
        matmul_kernel[(1,)](a, a, c, 256, 256, 256, 256, 256, 256, **cfg)
        torch.cuda.synchronize()
        lines.append("launched without error")
    except Exception as e:
        lines.append(f"{type(e).__module__}.{type(e).__name__}: {e}")
    return lines


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    lines = report()
    try:
        lines += out_of_resources()
    except Exception:
        lines += ["", "out-of-resources demonstration failed:", traceback.format_exc()]
    text = "\n".join(lines) + "\n"
    out = Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    from snippets.bench.captures import record
    record(out)  # triton_metadata.meta.json: the hash of the code that produced it
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
