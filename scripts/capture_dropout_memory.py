"""Peak GPU memory of training through dropout: torch's dropout (keeps a mask) against SeededDropout (keeps a seed).

    python scripts/capture_dropout_memory.py OUT.txt [--tokens 16384] [--dim 4096] [--layers 4]

Commit the file as ``benchmarks/results/outputs/<gpu>/dropout_memory.txt``; the dropout chapter shows it with
``<!-- bench:output dropout_memory -->``.

The model is ``layers`` blocks of ``h = Linear(dropout(h))`` (p = 0.1, no bias, dim x dim weights), on an input
of ``tokens x dim``, in bf16 and in fp32, run forward, then ``out.sum().backward()``. For each dropout it reports,
in MiB above what was allocated before the forward (the input and the weights, already warmed up):

- ``saved``: the bytes of every distinct tensor autograd saved for the backward (``saved_tensors_hooks``);
- ``after fwd``: memory allocated once the forward has returned (activations and saved tensors held);
- ``peak``: the largest allocation over forward and backward (``torch.cuda.max_memory_allocated``, reset first).

Each dropout is run twice and the second run is reported (the first compiles Triton kernels and lets cuBLAS
allocate its workspace). The gradients of MaskedDropout and SeededDropout are compared: they draw the same
random numbers, so they must be equal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from snippets.bench.captures import record  # noqa: E402
from snippets.part4.dropout import MaskedDropout, SeededDropout  # noqa: E402

P = 0.1
MIB = 2**20
DROPOUTS = {
    "torch F.dropout": lambda h, seed: F.dropout(h, P, training=True),
    "MaskedDropout (v1)": lambda h, seed: MaskedDropout.apply(h, P, seed),
    "SeededDropout (v2)": lambda h, seed: SeededDropout.apply(h, P, seed),
}


def forward(x, weights, dropout):
    h = x
    for i, w in enumerate(weights):
        h = F.linear(dropout(h, 1000 + i), w)  # one seed per layer
    return h


def measure(x, weights, dropout) -> dict:
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # count each storage once
        return t

    x.grad = None
    for w in weights:
        w.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x, weights, dropout)
    torch.cuda.synchronize()
    after_fwd = torch.cuda.memory_allocated() - base
    out.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grads = (x.grad.clone(), weights[0].grad.clone())
    del out
    # storages of the inputs and weights that autograd also saved were allocated before base: not counted
    own = {x.untyped_storage().data_ptr()} | {w.untyped_storage().data_ptr() for w in weights}
    saved_new = sum(b for ptr, b in saved.items() if ptr not in own)
    return {"saved": saved_new / MIB, "after_fwd": after_fwd / MIB, "peak": peak / MIB, "grads": grads}


def table(dtype: torch.dtype, tokens: int, dim: int, layers: int) -> list[str]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, dim, device="cuda", generator=gen).to(dtype).requires_grad_()
    weights = [(torch.randn(dim, dim, device="cuda", generator=gen) / dim**0.5).to(dtype).requires_grad_()
               for _ in range(layers)]
    n = tokens * dim
    lines = [f"{dtype}: {layers} x (dropout p={P} -> Linear {dim}x{dim}, no bias), input {tokens} x {dim} "
             f"({n * x.element_size() / MIB:.0f} MiB); one mask of n bools = {n / MIB:.0f} MiB",
             f"  {'dropout':<22}{'saved MiB':>12}{'after fwd MiB':>16}{'peak MiB':>12}"]
    results = {}
    for name, dropout in DROPOUTS.items():
        measure(x, weights, dropout)  # warm-up: Triton compiles, cuBLAS workspace
        r = results[name] = measure(x, weights, dropout)
        lines.append(f"  {name:<22}{r['saved']:>12.0f}{r['after_fwd']:>16.0f}{r['peak']:>12.0f}")
    seeded, masked, eager = (results[k] for k in ("SeededDropout (v2)", "MaskedDropout (v1)", "torch F.dropout"))
    same = all(torch.equal(a, b) for a, b in zip(seeded["grads"], masked["grads"]))
    lines.append(f"  saved by SeededDropout against torch: {eager['saved'] - seeded['saved']:.0f} MiB of saved "
                 f"tensors, {eager['peak'] - seeded['peak']:.0f} MiB of peak; "
                 f"MaskedDropout and SeededDropout gradients identical: {same}")
    del x, weights
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="text file to write")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("capture_dropout_memory.py needs a CUDA GPU")
    import triton

    props = torch.cuda.get_device_properties(0)
    lines = [f"GPU: {props.name}; torch {torch.__version__}, triton {triton.__version__}",
             "MiB above the memory allocated before the forward (input and weights); second of two runs", ""]
    for dtype in (torch.bfloat16, torch.float32):
        lines += table(dtype, args.tokens, args.dim, args.layers) + [""]
    text = "\n".join(lines).rstrip() + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    record(args.out)  # NAME.meta.json: the hash of the code that produced it
    print(text, end="")


if __name__ == "__main__":
    main()
