"""The capstone, trained: the decoder's next-token loss and its gradients on the book's kernels.

The inference chapters run the capstone's decoder forward only. Training it asks three more things
of every kernel: a backward pass, the activations that backward needs kept from the forward, and a
loss. At a 128256-token vocabulary the loss is where memory goes: the logits of a 2048-token
sequence are 2048 x 128256 values, a GiB in fp32, and their gradient is as large again. Part 5's
fused linear cross-entropy computes the loss and both gradients a chunk of tokens at a time, in the
model's dtype, writing each chunk's gradient over its logits.

The weights are the capstone's (``capstone.Llama``: seeded random values, nothing downloaded); the
forward is the capstone's prefill with every position's logits; the gradients are of the mean
cross-entropy of each position's next token. Versions of ``capstone_train`` (never renumbered):

- v0  PyTorch, eager: the torch backend's ops (``rmsnorm_ref``, ``rope_ref``, ``swiglu_ref``, the
      masked-softmax attention), the logits upcast to fp32 and ``F.cross_entropy``, autograd.
- v1  v0's loss through ``torch.compile`` (default mode), then autograd.
- v2  the book's kernels, each with its own backward: Part 5's RMSNorm, RoPE and SwiGLU autograd
      Functions, FlashAttention (causal, forward and backward; each kv head repeated for its query
      heads, as in the capstone's prefill) and the fused linear cross-entropy
      (``LinearCrossEntropyFunction``: at most ``CHUNK_TOKENS`` rows of logits at a time, no fp32
      copy, their gradient written over them). The products are cuBLAS's in every version.
- v3  v2 with the blocks' forward and backward each captured once in a CUDA graph
      (``torch.cuda.make_graphed_callables``) and replayed: v2's kernels, launched by two graph
      replays instead of Python. The loss stays outside the graphs (its target check reads a count
      back to the host). The graphs keep their activations between steps, and the gradients v3
      returns are the backward graph's buffers, overwritten by the next step.

Each version returns the loss and the gradients of five weights (``CHECKED``): the embedding, the
first block's query projection, the last block's down projection, the final norm and the LM head;
it computes the gradients of all of them, as a training step must.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from snippets._checks import GRADS_ONLY, check_int, refuse_grad, triton_interpreting
from snippets.common.baselines import compiled, grads_through, needs_gpu
from snippets.part5 import cross_entropy as ce
from snippets.part8 import capstone as cp
from snippets.part8 import decode_model as dm
from snippets.registry import Impl, Op, register

LAYER = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "wg", "wu", "wd")  # a block's weights


# --8<-- [start:weights]
def weight_list(model: cp.Llama) -> list[torch.Tensor]:
    """The model's weights in the order the functional forward reads them: the embedding, each
    block's ``LAYER`` weights, the final norm, the LM head."""
    if not _is_model(model):
        raise TypeError(f"weight_list: model must be a capstone Llama, got {type(model).__name__}")
    out = [model.embed]
    for layer in model.layers:
        out += [getattr(layer, name) for name in LAYER]
    return out + [model.norm, model.lm_head]


def checked_indices(n_layers: int) -> tuple[int, ...]:
    """Where ``CHECKED``'s five weights sit in ``weight_list``: the embedding, block 0's wq, the
    last block's wd, the final norm, the LM head."""
    check_int("checked_indices: n_layers", n_layers, 1)
    last = 1 + (n_layers - 1) * len(LAYER)
    return (0, 1 + LAYER.index("wq"), last + LAYER.index("wd"), 1 + n_layers * len(LAYER),
            2 + n_layers * len(LAYER))


CHECKED = ("embed", "layers.0.wq", "layers.-1.wd", "norm", "lm_head")
# --8<-- [end:weights]


class Tables:
    """What ``hidden_states`` reads of a model besides the weights: its config and RoPE tables
    (cast to ``dtype`` if given), without a reference to the model itself."""

    def __init__(self, model: cp.Llama, dtype: torch.dtype | None = None) -> None:
        self.cfg = model.cfg
        self.cos, self.sin = (t if dtype is None else t.to(dtype) for t in (model.cos, model.sin))


# --8<-- [start:forward]
def hidden_states(model: cp.Llama, weights, tokens: torch.Tensor, ops: dict) -> torch.Tensor:
    """The final norm's output (B, S, dim) for every position, computed from ``weights`` (a
    ``weight_list``, or leaves standing for it) with ``ops`` (``capstone.OPS["torch"]`` or
    ``["book"]``): the capstone's prefill, less the LM head."""
    cfg = model.cfg
    b, s = tokens.shape
    h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cos, sin = model.cos[:s], model.sin[:s]
    x = weights[0][tokens]                                               # (B, S, dim)
    for i in range(cfg.n_layers):
        an, wq, wk, wv, wo, mn, wg, wu, wd = weights[1 + i * len(LAYER):1 + (i + 1) * len(LAYER)]
        a = ops["norm"](x, an)
        q, k = ops["rope"]((a @ wq.T).view(b, s, h, d), (a @ wk.T).view(b, s, hkv, d), cos, sin)
        v = (a @ wv.T).view(b, s, hkv, d)
        o = ops["prefill_attention"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + o.transpose(1, 2).reshape(b, s, h * d) @ wo.T
        m = ops["norm"](x, mn)
        x = x + ops["glu"](m @ wg.T, m @ wu.T) @ wd.T
    return ops["norm"](x, weights[-2])


def loss_torch(model, weights, tokens, targets):
    """v0's loss: every position's logits, upcast to fp32 (float64 stays float64: the
    reference), then F.cross_entropy (their mean)."""
    hs = hidden_states(model, weights, tokens, cp.OPS["torch"])
    logits = hs @ weights[-1].T                                          # (B, S, vocab)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def loss_book(model, weights, tokens, targets):
    """v2's loss: the book's kernels, and the LM head's product fused with the cross-entropy
    (a chunk of tokens at a time; no fp32 logits, no separate gradient of them)."""
    hs = hidden_states(model, weights, tokens, cp.OPS["book"])
    return ce.LinearCrossEntropyFunction.apply(hs.flatten(0, 1), weights[-1], targets.flatten())
# --8<-- [end:forward]


# --8<-- [start:graphed]
# One captured pair of graphs per model, for its latest batch shape and weights: a graph keeps its
# activations in a memory pool of its own, so a new shape or new weight tensors free the old pair
# before capturing another. Keyed weakly: a model that is dropped drops its graphs.
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graphed_blocks(model: cp.Llama, weights, tokens: torch.Tensor):
    """``hidden_states`` on the book's kernels as a callable of (tokens, *weights less the LM
    head) whose forward and backward each replay one CUDA graph
    (``torch.cuda.make_graphed_callables``: three eager warm-up steps on a side stream, where
    Triton's autotuning runs, then the two captures). The graphs read the weights where they were
    at capture, so an in-place update (an optimiser step) is seen; other weight tensors or another
    batch shape capture anew."""
    blocks = tuple(weights[:-1])  # all but the LM head, which only the loss reads
    key = (tuple(tokens.shape), tuple(w.data_ptr() for w in blocks))
    entry = _GRAPHS.get(model)
    if entry is None or entry[0] != key:
        _GRAPHS.pop(model, None)
        torch.cuda.synchronize()  # the old pair's pool is free before the new one is drawn
        tables, book = Tables(model), cp.OPS["book"]
        # the graph's static inputs are its sample arguments: the tokens a private copy (each
        # replay copies the call's tokens into it), the weights the leaves over the model's own;
        # None stands in for the LM head, so that weights[-2] is still the final norm
        fn = torch.cuda.make_graphed_callables(
            lambda tok, *ws: hidden_states(tables, (*ws, None), tok, book),
            (tokens.clone(), *blocks))
        entry = _GRAPHS[model] = (key, fn)
    return entry[1]


def loss_book_graphed(model, weights, tokens, targets):
    """v3's loss: v2's, with the blocks replayed from their graphs; the loss is v2's fused linear
    cross-entropy, eager."""
    hs = graphed_blocks(model, weights, tokens)(tokens, *weights[:-1])
    return ce.LinearCrossEntropyFunction.apply(hs.flatten(0, 1), weights[-1], targets.flatten())
# --8<-- [end:graphed]


def _is_model(model) -> bool:
    # by its attributes, not its class, as the capstone's ops check: an exported copy of the
    # capstone module has a class of its own
    return all(hasattr(model, a) for a in ("cfg", "embed", "layers", "norm", "lm_head", "cos"))


def _check_batch(name: str, model, tokens, targets, backend: str | None = None) -> None:
    if not _is_model(model):
        raise TypeError(f"{name}: model must be a capstone Llama, got {type(model).__name__}")
    for what, t in (("tokens", tokens), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 2:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name}: {what} must be a (B, S) int64 tensor, got {got}")
        if t.device != model.embed.device:
            raise ValueError(f"{name}: {what} is on {t.device}, the model on {model.embed.device}")
    if tokens.shape != targets.shape or tokens.numel() == 0:
        raise ValueError(f"{name}: tokens {tuple(tokens.shape)} and targets "
                         f"{tuple(targets.shape)} must be one non-empty (B, S)")
    if tokens.shape[1] > model.cfg.max_seq:
        raise ValueError(f"{name}: {tokens.shape[1]} positions, past the model's max_seq "
                         f"{model.cfg.max_seq} (its RoPE tables)")
    lo = min(int(tokens.min()), int(targets.min()))
    hi = max(int(tokens.max()), int(targets.max()))
    if lo < 0 or hi >= model.cfg.vocab:
        raise ValueError(f"{name}: token ids must be in [0, {model.cfg.vocab}), got [{lo}, {hi}]")
    if backend == "book":
        want = "cpu" if triton_interpreting() else "cuda"
        if model.embed.device.type != want:
            raise ValueError(f"{name}: the book's kernels run on {want} here, but the model is "
                             f"on {model.embed.device}")
    if backend == "graph" and (model.embed.device.type != "cuda" or triton_interpreting()):
        raise ValueError(f"{name}: CUDA graphs need the model on a CUDA GPU and Triton compiling "
                         f"(not its interpreter); the model is on {model.embed.device}")


# --8<-- [start:step]
def loss_and_grads(model: cp.Llama, tokens: torch.Tensor, targets: torch.Tensor, loss_fn,
                   name: str = "loss_and_grads") -> tuple:
    """One training step's two passes: the loss of ``loss_fn`` and the gradients of every weight
    (``grads_through``: fresh leaves each call, so nothing accumulates between steps). Returns
    (loss, gradients in ``weight_list`` order). The returned gradients are plain tensors: a
    weight that autograd tracks is refused, since nothing differentiates them."""
    backend = {loss_book: "book", loss_book_graphed: "graph"}.get(loss_fn)
    _check_batch(name, model, tokens, targets, backend)
    refuse_grad(name, *weight_list(model), instead="loss_book or loss_torch on leaves of your own",
                why=GRADS_ONLY)
    return grads_through(lambda *ws: loss_fn(model, ws, tokens, targets),
                         tuple(weight_list(model)), with_output=True)


def _step(name: str, model, tokens, targets, embed, loss_fn) -> tuple:
    """A version's call: ``embed`` must be the model's own table (the op passes it, so that the
    gradient checks can make a weight require grad); the loss and ``CHECKED``'s gradients."""
    if not _is_model(model):
        raise TypeError(f"{name}: model must be a capstone Llama, got {type(model).__name__}")
    if not isinstance(embed, torch.Tensor) or embed.data_ptr() != model.embed.data_ptr():
        raise ValueError(f"{name}: embed must be the model's own embedding table")
    refuse_grad(name, embed, instead="loss_book or loss_torch on leaves of your own",
                why=GRADS_ONLY)
    loss, *grads = loss_and_grads(model, tokens, targets, loss_fn, name)
    return (loss, *(grads[i] for i in checked_indices(model.cfg.n_layers)))


def train_torch(model, tokens, targets, embed):
    """v0: eager PyTorch, autograd."""
    return _step("train_torch", model, tokens, targets, embed, loss_torch)


_loss_torch_compiled = compiled(loss_torch)


def train_torch_compiled(model, tokens, targets, embed):
    """v1: v0's loss through torch.compile, then autograd."""
    return _step("train_torch_compiled", model, tokens, targets, embed, _loss_torch_compiled)


def train_book(model, tokens, targets, embed):
    """v2: the book's kernels and their backward passes, the fused linear cross-entropy."""
    return _step("train_book", model, tokens, targets, embed, loss_book)


def train_book_graphed(model, tokens, targets, embed):
    """v3: v2 with the blocks' forward and backward replayed from CUDA graphs. The gradients
    returned are the graph's buffers: the next call overwrites them."""
    return _step("train_book_graphed", model, tokens, targets, embed, loss_book_graphed)
# --8<-- [end:step]


# --8<-- [start:loop]
def train(model: cp.Llama, tokens: torch.Tensor, targets: torch.Tensor, steps: int,
          lr: float = 1e-2, backend: str = "book") -> list[float]:
    """``steps`` steps of AdamW on one fixed batch (a model memorising it: the loss must fall),
    with ``backend``'s loss (``"torch"``, ``"book"`` or ``"graph"``: v0's, v2's or v3's);
    returns the loss before each step. The model's weights are updated in place."""
    check_int("train: steps", steps, 1)
    losses_by = {"torch": loss_torch, "book": loss_book, "graph": loss_book_graphed}
    if backend not in losses_by:
        raise ValueError(f"train: backend must be one of {sorted(losses_by)}, got {backend!r}")
    loss_fn = losses_by[backend]
    weights = weight_list(model)
    opt = torch.optim.AdamW(weights, lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        loss, *grads = loss_and_grads(model, tokens, targets, loss_fn, "train")
        for w, g in zip(weights, grads):
            w.grad = g
        opt.step()
        losses.append(float(loss))
    return losses
# --8<-- [end:loop]


# --------------------------------------------------------------------------------------------------
# The op
# --------------------------------------------------------------------------------------------------

# --8<-- [start:op]
def _make_inputs(size, dtype, device, gen):
    """A model of ``size["config"]`` (seeded random weights, drawn on ``device``) and a random
    batch of ``b`` sequences of ``s`` tokens with their next tokens as targets."""
    seed = int(torch.randint(2**31, (1,), generator=gen))
    model = cp.Llama(cp.CONFIGS[size["config"]], seed=seed, dtype=dtype, device=device,
                     draw_on_device=True)
    seq = torch.randint(model.cfg.vocab, (size["b"], size["s"] + 1), generator=gen).to(device)
    return model, seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), model.embed


def train_ref(model, tokens, targets, embed=None):
    """v0's loss and gradients in float64 on a float64 copy of the weights (the torch backend's
    ops: no kernel of the book), on the model's device. ``embed``: the op's fourth argument,
    the model's own table, unused."""
    leaves = [w.detach().to(torch.float64) for w in weight_list(model)]
    model64 = Tables(model, torch.float64)
    loss, *grads = grads_through(lambda *ws: loss_torch(model64, ws, tokens, targets),
                                 tuple(leaves), with_output=True)
    return (loss, *(grads[i] for i in checked_indices(model.cfg.n_layers)))


# Relative error of each output in the Frobenius norm, ||out - ref|| / ||ref||. fp32: sums in a
# different order. bf16: every activation and weight rounded to 8 bits through the blocks. The
# eager step's own bf16 error against this reference on the CPU was at most about 3% (the small
# model's 12 blocks at 256 tokens; Llama 3.2 1B's widths at 4 blocks and 512 tokens), with weights
# rounded from fp32; room here for 1B's 16 blocks and a GPU's summation order. A wrong gradient is
# off by its own size; the fp32 tests catch the small errors.
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-1}


def check_train(out, args, dtype) -> None:
    """``out`` (the loss and ``CHECKED``'s gradients) against ``train_ref`` in float64, each
    within ``REL_TOL[dtype]`` in the relative norm; AssertionError naming the first one off."""
    ref = train_ref(*args)
    if len(out) != len(ref):
        raise AssertionError(f"capstone_train: {len(out)} outputs, the reference has {len(ref)}")
    for name, o, r in zip(("loss", *CHECKED), out, ref):
        if o.shape != r.shape:
            raise AssertionError(f"capstone_train {name}: shape {tuple(o.shape)}, "
                                 f"reference {tuple(r.shape)}")
        o64 = o.detach().to(device=r.device, dtype=torch.float64)
        if not torch.isfinite(o64).all():
            raise AssertionError(f"capstone_train {name}: non-finite values")
        err = float((o64 - r).norm() / r.norm().clamp_min(1e-300))
        if err > REL_TOL[dtype]:
            raise AssertionError(f"capstone_train {name}: relative error {err:.3g} > "
                                 f"{REL_TOL[dtype]:g} ({dtype})")


def _flops(size, dtype) -> int:
    """Three times the forward's: every position's logits (decode_model.prefill_flops), and a
    backward of twice the forward's products (the gradients of activations and of weights)."""
    return 3 * size["b"] * dm.prefill_flops(cp.decoder_config(size, dtype), size["s"])


def _bytes(size, dtype) -> int:
    """A floor: the weights read in the forward and again in the backward, their gradients
    written once, and the tokens' K and V (decode_model.prefill_bytes covers one pass)."""
    cfg = cp.decoder_config(size, dtype)
    one_pass = dm.prefill_bytes(cfg, size["b"] * size["s"])
    return 2 * one_pass + dm.matmul_params(cfg) * cfg.dtype_bytes


def _compile_is_short(size) -> bool:
    """v1 at the headline only: torch.compile builds the whole step's forward and backward graphs
    for each shape, minutes of a benchmark run per size."""
    return dict(size) == HEADLINE


HEADLINE = {"config": "llama_1b", "b": 1, "s": 2048}                 # as capstone_prefill's
SWEEP = [*({"config": "llama_1b", "b": 1, "s": s} for s in (512, 1024, 2048)),
         {"config": "small", "b": 4, "s": 1024}]
# Tiny, for the CPU: two sequences of 5 tokens (shorter than any attention tile) and one of 37
# (ragged last tiles under the interpreter's FlashAttention, 32 queries by 16 keys).
TEST_SIZES = [{"config": "tiny", "b": 2, "s": 5}, {"config": "tiny", "b": 1, "s": 37}]

capstone_train = register(Op(
    name="capstone_train", part=8, chapter="part8/capstone.md",
    title="Capstone training step (loss and gradients)", reference=train_ref,
    make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops, metric="TFLOP/s",
    ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP, dtypes=(torch.bfloat16, torch.float32),
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, sweep_axis="s", check=check_train,
    measure_memory=True))
_STEP = (loss_and_grads, hidden_states, _check_batch, _is_model, _step, weight_list,
         checked_indices, cp.causal_gqa_attention)
capstone_train.add(Impl("v0", train_torch, "PyTorch",
                        "eager: torch ops, fp32 logits, F.cross_entropy, autograd",
                        (*_STEP, loss_torch), device="any", origin="library"))
capstone_train.add(Impl("v1", train_torch_compiled, "PyTorch",
                        "v0's loss through torch.compile (default mode), autograd",
                        (*_STEP, loss_torch), requires=needs_gpu, origin="library",
                        bench_if=_compile_is_short))
capstone_train.add(Impl("v2", train_book, "Triton",
                        "the book's kernels and their backwards, fused linear cross-entropy",
                        (*_STEP, loss_book, ce.LinearCrossEntropyFunction,
                         cp.OPS["book"]["prefill_attention"]), device="any"))
capstone_train.add(Impl("v3", train_book_graphed, "Triton",
                        "v2 with the blocks' forward and backward in CUDA graphs",
                        (*_STEP, loss_book, loss_book_graphed, graphed_blocks, Tables,
                         ce.LinearCrossEntropyFunction, cp.OPS["book"]["prefill_attention"]),
                        requires=cp.needs_cuda_graphs))
# --8<-- [end:op]

