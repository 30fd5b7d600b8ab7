"""Putting it together: how many bytes each rank holds, and how many it sends, when a transformer
is trained with a given parallel layout, and what the alpha-beta model of ``cost.py`` says that
talking costs.

The calculator is arithmetic only; every formula is stated where it is computed:

- parameters: the exact count of a GPT-style block (LayerNorms, biases, a GELU MLP: the book's
  ``TinyTransformer``) or a Llama-style block (RMSNorms, no biases, grouped K/V heads, a SwiGLU
  MLP), optionally with a mixture of experts in place of the MLP; the share each rank holds under
  tensor (Megatron's column/row split), pipeline (a stage's layers; the embedding on the first
  stage, the head on the last) and expert parallelism;
- model state: ``zero.zero_memory`` applied to that share over the data-parallel group;
- activations: the term-by-term accounting of Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (2022): sbh(34 + 5as/h) bytes per layer for their GPT
  with 16-bit activations, divided as tensor and sequence parallelism divide it, times the
  micro-batches a pipeline stage holds at once under 1F1B;
- communication: every collective a rank takes part in during one step, its size in ``cost.py``'s
  convention, the bytes the rank sends for it (``cost.BUS_FACTORS``) and its time by ``cost.py``'s
  ring formulas on the link (inside a node or between nodes) that its group crosses;
- FLOPs per token (6N + 12 L s d_attn) and model FLOPs utilisation.

Rank order, as Megatron-LM's default: tensor-parallel ranks are adjacent, then context, then data,
then pipeline (rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank))); expert parallelism is
carved out of the data-parallel ranks. A group lies inside one node when all its ranks do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from snippets.part7.cost import (
    BUS_FACTORS,
    all_to_all_time,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_reduce_scatter_time,
    send_time,
)
from snippets.part7.zero import zero_memory

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
RECOMPUTE = ("none", "selective", "full")
MASK_BYTES = 1        # a dropout mask: one byte per element, as Korthikanti et al. count it
LOGIT_BYTES = 4       # the cross-entropy's logits in fp32 (the paper's 4sbv)


def _positive(fn: str, name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{fn}: {name} must be an int >= 1, got {value!r}")
    return value


# --8<-- [start:config]
@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer and its batch. ``arch`` is ``"gpt"`` (LayerNorm with bias, biases
    on every Linear, learned positions, GELU MLP of ``ffn``) or ``"llama"`` (RMSNorm, no biases,
    rotary positions, SwiGLU MLP of ``ffn``). ``experts`` > 0 replaces each MLP by that many experts
    of the same shape and a router, ``top_k`` of them per token. Dtypes are names of
    ``DTYPE_BYTES``; ``master_weights`` None means an fp32 (optimizer-dtype) master copy exactly
    when the parameters are narrower than the optimizer state. ``recompute``: ``"none"``,
    ``"selective"`` (the attention scores are recomputed, not stored: Korthikanti et al.'s
    selective recomputation, and what a flash-attention kernel does anyway) or ``"full"`` (only each
    layer's input is stored)."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    micro_batch: int = 1
    global_batch: int = 1
    kv_heads: int | None = None           # None: as many as ``heads`` (no grouping)
    arch: str = "llama"
    max_positions: int | None = None      # gpt: rows of the position table (None: ``seq``)
    tied_embeddings: bool = False
    experts: int = 0
    top_k: int = 1
    param_dtype: str = "bf16"
    grad_dtype: str = "bf16"
    optim_dtype: str = "fp32"
    master_weights: bool | None = None
    act_dtype: str = "bf16"
    dropout: bool | None = None           # None: gpt has dropout, llama has none
    recompute: str = "none"

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def has_dropout(self) -> bool:
        return self.arch == "gpt" if self.dropout is None else self.dropout


@dataclass(frozen=True)
class Layout:
    """Degrees of data (``dp``), tensor (``tp``), pipeline (``pp``), context (``cp``) and expert
    (``ep``, dividing ``dp``) parallelism; the world is dp * tp * pp * cp ranks. ``zero`` is the
    ZeRO stage over the data-parallel group; ``microbatches``, if given, must equal what the batch
    implies: global_batch / (dp * micro_batch)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    microbatches: int | None = None

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


class Link(NamedTuple):
    alpha_s: float            # latency of one message, s
    beta_bytes_per_s: float   # bandwidth, bytes/s


@dataclass(frozen=True)
class Machine:
    """Nodes of ``gpus_per_node`` GPUs: ``intra`` is the link inside a node (NVLink), ``inter``
    the link between nodes (the network), each an alpha-beta ``Link``."""

    gpus_per_node: int
    intra: Link
    inter: Link
# --8<-- [end:config]


def check(cfg: ModelConfig, layout: Layout) -> int:
    """Raise ValueError naming the bad value when the layout cannot split the model or the batch;
    return the number of micro-batches per step, m = global_batch / (dp * micro_batch)."""
    fn = "calculator"
    if not isinstance(cfg, ModelConfig) or not isinstance(layout, Layout):
        raise TypeError(f"{fn}: need a ModelConfig and a Layout, got {type(cfg).__name__} and "
                        f"{type(layout).__name__}")
    for name in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "micro_batch",
                 "global_batch", "kv", "top_k"):
        _positive(fn, f"config.{name}", getattr(cfg, name))
    for name in ("dp", "tp", "pp", "cp", "ep"):
        _positive(fn, f"layout.{name}", getattr(layout, name))
    if cfg.arch not in ("gpt", "llama"):
        raise ValueError(f"{fn}: arch must be 'gpt' or 'llama', got {cfg.arch!r}")
    for name in ("param_dtype", "grad_dtype", "optim_dtype", "act_dtype"):
        if getattr(cfg, name) not in DTYPE_BYTES:
            raise ValueError(f"{fn}: {name} must be one of {sorted(DTYPE_BYTES)}, "
                             f"got {getattr(cfg, name)!r}")
    if cfg.recompute not in RECOMPUTE:
        raise ValueError(f"{fn}: recompute must be one of {RECOMPUTE}, got {cfg.recompute!r}")
    if cfg.hidden % cfg.heads:
        raise ValueError(f"{fn}: hidden={cfg.hidden} is not divisible by heads={cfg.heads}")
    if cfg.heads % cfg.kv:
        raise ValueError(f"{fn}: heads={cfg.heads} is not divisible by kv_heads={cfg.kv}")
    if cfg.experts < 0 or (cfg.experts and cfg.top_k > cfg.experts):
        raise ValueError(f"{fn}: need experts >= 0 and top_k <= experts, got experts="
                         f"{cfg.experts}, top_k={cfg.top_k}")
    if cfg.arch == "gpt" and (cfg.max_positions or cfg.seq) < cfg.seq:
        raise ValueError(f"{fn}: max_positions={cfg.max_positions} < seq={cfg.seq}")
    t = layout.tp
    for name, value in (("heads", cfg.heads), ("kv_heads", cfg.kv), ("ffn", cfg.ffn),
                        ("vocab", cfg.vocab)):
        if value % t:
            raise ValueError(f"{fn}: {name}={value} is not divisible by tp={t}")
    if cfg.layers % layout.pp:
        raise ValueError(f"{fn}: layers={cfg.layers} is not divisible by pp={layout.pp}")
    if cfg.seq % layout.cp:
        raise ValueError(f"{fn}: seq={cfg.seq} is not divisible by cp={layout.cp}")
    if layout.sequence_parallel and (cfg.seq // layout.cp) % t:
        raise ValueError(f"{fn}: sequence parallelism needs seq / cp = {cfg.seq // layout.cp} "
                         f"divisible by tp={t}")
    if layout.ep > 1 and not cfg.experts:
        raise ValueError(f"{fn}: ep={layout.ep} needs a model with experts")
    if cfg.experts and cfg.experts % layout.ep:
        raise ValueError(f"{fn}: experts={cfg.experts} is not divisible by ep={layout.ep}")
    if layout.dp % layout.ep:
        raise ValueError(f"{fn}: ep={layout.ep} must divide dp={layout.dp} (experts are "
                         "spread over data-parallel ranks)")
    if layout.zero not in (0, 1, 2, 3) or isinstance(layout.zero, bool):
        raise ValueError(f"{fn}: zero must be 0, 1, 2 or 3, got {layout.zero!r}")
    if layout.zero >= 2 and layout.pp > 1:
        raise ValueError(f"{fn}: zero={layout.zero} with pp={layout.pp}: sharded gradients "
                         "would be reduce-scattered every micro-batch of the pipeline (DeepSpeed "
                         "refuses the combination); use zero <= 1 with pp > 1")
    if cfg.global_batch % (layout.dp * cfg.micro_batch):
        raise ValueError(f"{fn}: global_batch={cfg.global_batch} is not divisible by dp * "
                         f"micro_batch = {layout.dp} * {cfg.micro_batch}")
    m = cfg.global_batch // (layout.dp * cfg.micro_batch)
    if layout.microbatches is not None and layout.microbatches != m:
        raise ValueError(f"{fn}: microbatches={layout.microbatches}, but global_batch / (dp * "
                         f"micro_batch) = {m}")
    return m


# --8<-- [start:params]
def block_params(cfg: ModelConfig, tp: int = 1) -> dict[str, int]:
    """Parameters of one transformer block held by one of ``tp`` tensor-parallel ranks (tp=1: the
    whole block). h = hidden, d_kv = kv_heads * head_dim, f = ffn. Megatron's split: q, k, v and
    the MLP's first matrices are column-parallel (weights and biases split by tp), the attention
    output and the MLP's last matrix are row-parallel (weights split, biases replicated), norms
    replicated.

    - gpt:   attention 2h^2 + 2h d_kv + 2h + 2d_kv, MLP 2hf + f + h, norms 4h (two LayerNorms);
             with f = 4h and no grouping: 12h^2 + 13h per block;
    - llama: attention 2h^2 + 2h d_kv, MLP 3hf (gate, up, down), norms 2h (two RMSNorms).

    With experts the MLP is ``experts`` copies (each split by tp as the MLP) and a router of h *
    experts; ``expert`` counts the copies, ``mlp`` the router."""
    h, f, d_kv, gpt = cfg.hidden, cfg.ffn, cfg.kv * cfg.head_dim, cfg.arch == "gpt"
    attn = (2 * h * h + 2 * h * d_kv) // tp
    if gpt:
        attn += (h + 2 * d_kv) // tp + h          # q, k, v biases split; the output's replicated
    one_mlp = (2 * h * f + f) // tp + h if gpt else 3 * h * f // tp
    norms = 4 * h if gpt else 2 * h
    if cfg.experts:
        mlp, expert = h * cfg.experts, one_mlp * cfg.experts
    else:
        mlp, expert = one_mlp, 0
    return {"attention": attn, "mlp": mlp, "expert": expert, "norms": norms,
            "total": attn + mlp + expert + norms}


def model_params(cfg: ModelConfig) -> dict[str, int]:
    """Every parameter of the model: embedding v h (and gpt's position table), the blocks, the
    final norm, and the head h v (gpt: + v of bias) unless tied to the embedding."""
    h, v, gpt = cfg.hidden, cfg.vocab, cfg.arch == "gpt"
    out = {"embedding": v * h,
           "positions": (cfg.max_positions or cfg.seq) * h if gpt else 0,
           "blocks": cfg.layers * block_params(cfg)["total"],
           "final_norm": 2 * h if gpt else h,
           "head": 0 if cfg.tied_embeddings else h * v + (v if gpt else 0)}
    out["total"] = sum(out.values())
    return out
# --8<-- [end:params]


def stage_params(cfg: ModelConfig, layout: Layout, stage: int) -> dict[str, int]:
    """Parameters one rank of pipeline stage ``stage`` holds: ``dense`` (replicated over the
    data-parallel group) and ``expert`` (its ep-th share of the experts). The embedding and the
    head are split over the vocabulary (vocab-parallel); the position table is replicated. The
    first stage holds the embedding, the last the final norm and the head (tied: a copy of the
    embedding when pp > 1)."""
    t, first, last = layout.tp, stage == 0, stage == layout.pp - 1
    h, v, gpt = cfg.hidden, cfg.vocab, cfg.arch == "gpt"
    block = block_params(cfg, t)
    n_layers = cfg.layers // layout.pp
    dense = n_layers * (block["total"] - block["expert"])
    if first:
        dense += v * h // t + ((cfg.max_positions or cfg.seq) * h if gpt else 0)
    if last:
        dense += 2 * h if gpt else h
        if not cfg.tied_embeddings:
            dense += (h * v + (v if gpt else 0)) // t
        elif not first:
            dense += v * h // t
    expert = n_layers * block["expert"] // layout.ep
    return {"dense": dense, "expert": expert, "total": dense + expert}


def optim_bytes_per_param(cfg: ModelConfig) -> int:
    """Adam's state per parameter: two moments in ``optim_dtype``, and a master copy of the
    weights in that dtype when the parameters are narrower (bf16 + fp32 state: 4 + 4 + 4 = 12, the
    ZeRO paper's K)."""
    o = DTYPE_BYTES[cfg.optim_dtype]
    master = cfg.master_weights
    if master is None:
        master = DTYPE_BYTES[cfg.param_dtype] < o
    return 2 * o + (o if master else 0)


# --8<-- [start:state]
def state_bytes(cfg: ModelConfig, layout: Layout, stage: int = 0) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state on one rank of pipeline stage
    ``stage``: ``zero.zero_memory`` of its dense parameters over the dp * cp ranks that replicate
    them, plus that of its experts over the dp * cp / ep ranks that replicate those."""
    check(cfg, layout)
    n = stage_params(cfg, layout, stage)
    sizes = dict(param_bytes=DTYPE_BYTES[cfg.param_dtype], grad_bytes=DTYPE_BYTES[cfg.grad_dtype],
                 optim_bytes=optim_bytes_per_param(cfg))
    group = layout.dp * layout.cp
    dense = zero_memory(n["dense"], group, layout.zero, **sizes)
    expert = zero_memory(n["expert"], group // layout.ep, layout.zero, **sizes)
    return {k: dense[k] + expert[k] for k in dense}
# --8<-- [end:state]


# --8<-- [start:activations]
def layer_activations(cfg: ModelConfig, layout: Layout) -> dict[str, dict[str, float]]:
    """Bytes one rank stores for the backward of one layer and one micro-batch, term by term, in
    three groups as Korthikanti et al. count them (s = seq / cp on this rank, b = micro_batch, h =
    hidden, a = heads, f = ffn, e = bytes of an activation, masks one byte):

    - attention: the QKV input e sbh, Q and K e sb(h + d_kv), V e sb d_kv, the softmax output
      e a s^2 b, with dropout its mask a s^2 b and output e a s^2 b, the output projection's input
      e sbh, with dropout the mask sbh;
    - mlp: its input e sbh; gpt: the GELU's input and output e sbf each; llama: gate and up
      2e sbf and their product e sbf; with dropout the mask sbh;
    - norms: each norm's input, e sbh twice.

    For their GPT (e = 2, f = 4h, d_kv = h, dropout) the sum is sbh(34 + 5as/h). Tensor parallelism
    divides by tp the terms inside the split regions (24 sbh + 5as^2 b of them); the rest (norms,
    the inputs of the split regions, the dropout masks after them: 10 sbh) are replicated unless
    sequence parallelism splits them too. With context parallelism the scores are (s / cp) x s.
    ``"selective"`` drops the s^2 terms; ``"full"`` keeps only the layer's input ``layer_input``
    (and is the ``"none"`` dictionary again while the layer's backward runs: see
    ``activation_bytes``)."""
    e, b, h, a, f = (DTYPE_BYTES[cfg.act_dtype], cfg.micro_batch, cfg.hidden, cfg.heads,
                     cfg.ffn)
    t, s_full = layout.tp, cfg.seq
    s = cfg.seq // layout.cp
    rep = t if layout.sequence_parallel else 1       # what divides the replicated terms
    d_kv = cfg.kv * cfg.head_dim
    if cfg.recompute == "full":
        return {"layer_input": {"input": e * s * b * h / rep}}
    drop = cfg.has_dropout
    attn = {"qkv_input": e * s * b * h / rep, "q_k": e * s * b * (h + d_kv) / t,
            "v": e * s * b * d_kv / t}
    if cfg.recompute == "none":
        attn["softmax_output"] = e * a * s * s_full * b / t
        if drop:
            attn["softmax_dropout_mask"] = MASK_BYTES * a * s * s_full * b / t
            attn["softmax_dropout_output"] = e * a * s * s_full * b / t
    attn["proj_input"] = e * s * b * h / t
    if drop:
        attn["dropout_mask"] = MASK_BYTES * s * b * h / rep
    routed = cfg.top_k if cfg.experts else 1         # each token's MLP work, top_k times
    mlp = {"input": e * s * b * h / rep}
    if cfg.arch == "gpt":
        mlp["gelu_input"] = routed * e * s * b * f / t
        mlp["gelu_output"] = routed * e * s * b * f / t
    else:
        mlp["gate_up"] = routed * 2 * e * s * b * f / t
        mlp["down_input"] = routed * e * s * b * f / t
    if cfg.experts:
        mlp["router_logits"] = LOGIT_BYTES * s * b * cfg.experts / rep
    if drop:
        mlp["dropout_mask"] = MASK_BYTES * s * b * h / rep
    norms = {"attn_norm_input": e * s * b * h / rep, "mlp_norm_input": e * s * b * h / rep}
    return {"attention": attn, "mlp": mlp, "norms": norms}


def inflight_microbatches(pp: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under 1F1B: it runs
    pp - stage forwards before its first backward, so min(pp - stage, m); the first stage holds
    the most, pp of them."""
    return min(pp - stage, m)
# --8<-- [end:activations]


def _total(terms: dict[str, dict[str, float]]) -> float:
    return sum(sum(group.values()) for group in terms.values())


def activation_bytes(cfg: ModelConfig, layout: Layout, stage: int = 0) -> dict[str, float]:
    """Activation bytes on one rank of pipeline stage ``stage``: the layers of the stage times the
    micro-batches in flight, plus the first stage's embedding dropout mask (sbh, for each
    micro-batch in flight) and the last stage's output layer, the paper's 4sbh/t (1 + v/h) with
    sequence parallelism: the final norm's and the head's inputs and fp32 logits. Under full
    recompute one layer's whole activations exist again during its backward
    (``recompute_working``)."""
    m = check(cfg, layout)
    inflight = inflight_microbatches(layout.pp, m, stage)
    per_layer = _total(layer_activations(cfg, layout))
    layers = cfg.layers // layout.pp
    t, rep = layout.tp, (layout.tp if layout.sequence_parallel else 1)
    s, b, h, e = cfg.seq // layout.cp, cfg.micro_batch, cfg.hidden, DTYPE_BYTES[cfg.act_dtype]
    out = {"layers": layers * inflight * per_layer, "embedding": 0.0, "output": 0.0,
           "recompute_working": 0.0}
    if stage == 0 and cfg.has_dropout:
        out["embedding"] = inflight * MASK_BYTES * s * b * h / rep
    if stage == layout.pp - 1:
        out["output"] = 2 * e * s * b * h / rep + LOGIT_BYTES * s * b * cfg.vocab / t
    if cfg.recompute == "full":
        full = dataclasses.replace(cfg, recompute="none")
        out["recompute_working"] = _total(layer_activations(full, layout))
    out["total"] = sum(out.values())
    return out


# --8<-- [start:comm]
TIME = {"all_reduce": ring_all_reduce_time, "reduce_scatter": ring_reduce_scatter_time,
        "all_gather": ring_all_gather_time, "all_to_all": all_to_all_time,
        "send_recv": lambda n, p, alpha, beta: send_time(n, alpha, beta)}


class Collective(NamedTuple):
    """``count`` collectives ``op`` per step, each of ``nbytes`` (cost.py's n: the data one rank
    holds) over a group of ``group`` ranks, on ``link`` ("intra" or "inter")."""

    dim: str
    what: str
    op: str
    nbytes: float
    group: int
    count: int
    link: str

    @property
    def bytes_sent(self) -> float:
        """What one rank sends: the bus factor of cost.py times n, per collective (a send: n)."""
        return self.count * BUS_FACTORS[self.op](self.group) * self.nbytes

    def seconds(self, machine: Machine) -> float:
        alpha, beta = machine.intra if self.link == "intra" else machine.inter
        return self.count * TIME[self.op](self.nbytes, self.group, alpha, beta)
# --8<-- [end:comm]


def _rank(layout: Layout, tp=0, cp=0, dp=0, pp=0) -> int:
    return tp + layout.tp * (cp + layout.cp * (dp + layout.dp * pp))


def group_ranks(layout: Layout, dim: str) -> list[int]:
    """The ranks of the group of rank 0 along ``dim``: "tp", "cp", "dp", "pp", "dp_cp" (the ranks
    that replicate the dense parameters), "ep" (the first ep ranks of the data-parallel group),
    "edp" (those that replicate an expert: every ep-th data-parallel rank, times cp)."""
    L = layout
    ranges = {"tp": [_rank(L, tp=i) for i in range(L.tp)],
              "cp": [_rank(L, cp=i) for i in range(L.cp)],
              "dp": [_rank(L, dp=i) for i in range(L.dp)],
              "pp": [_rank(L, pp=i) for i in range(L.pp)],
              "dp_cp": [_rank(L, cp=c, dp=d) for d in range(L.dp) for c in range(L.cp)],
              "ep": [_rank(L, dp=i) for i in range(L.ep)],
              "edp": [_rank(L, cp=c, dp=d) for d in range(0, L.dp, L.ep) for c in range(L.cp)]}
    if dim not in ranges:
        raise ValueError(f"group_ranks: dim must be one of {sorted(ranges)}, got {dim!r}")
    return ranges[dim]


def link_of(layout: Layout, dim: str, gpus_per_node: int) -> str:
    """"intra" when every rank of the group is in one node, "inter" otherwise."""
    _positive("link_of", "gpus_per_node", gpus_per_node)
    return "intra" if len({r // gpus_per_node for r in group_ranks(layout, dim)}) == 1 else "inter"


def communication(cfg: ModelConfig, layout: Layout, gpus_per_node: int,
                  stage: int = 0) -> list[Collective]:
    """Every collective a rank of pipeline stage ``stage`` takes part in during one step of m
    micro-batches (groups of one rank talk to nobody and are left out):

    - dp (over dp * cp ranks; experts over dp * cp / ep): stage 0 all-reduces the gradients once
      (gradient accumulation without sync); stage 1, as ``zero.ZeroOptimizer`` does, all-reduces
      them and all-gathers the updated parameters; stage 2 reduce-scatters them every micro-batch
      (so that full gradients never accumulate) and all-gathers the parameters once; stage 3
      all-gathers each unit's parameters for every forward and again for every backward and
      reduce-scatters its gradients every micro-batch (``zero.Zero3Module``: one unit per block,
      embedding, position table, final norm and head);
    - tp, per layer and micro-batch: two all-reduces of e sbh in the forward (after attention,
      after the MLP), two in the backward, two more in a full recompute's second forward; with
      sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter of the same
      n, and once per step the gradients of the norms (and gpt's row-parallel biases), which each
      rank computed on its shard of the sequence only, are all-reduced. The vocab-parallel
      embedding all-reduces its output; the head all-reduces its input's gradient, and the
      cross-entropy three fp32 values per token (max, sum, target logit);
    - pp: each micro-batch's activation e sbh (/ tp with sequence parallelism) sent to the next
      stage, and its gradient to the previous one;
    - cp: the ring passes each rank's K and V (2 e sb d_kv / tp) cp - 1 times per layer in the
      forward, K, V and their gradients in the backward (three passes; four with full recompute);
    - ep: per MoE layer, an all-to-all to dispatch each token's top_k copies (top_k e sbh) and one
      to combine them, in the forward and the backward (and the recompute).
    """
    m = check(cfg, layout)
    L, t, sp = layout, layout.tp, layout.sequence_parallel
    e, s, b, h = DTYPE_BYTES[cfg.act_dtype], cfg.seq // layout.cp, cfg.micro_batch, cfg.hidden
    first, last = stage == 0, stage == layout.pp - 1
    layers = cfg.layers // L.pp
    forwards = 2 if cfg.recompute == "full" else 1
    out: list[Collective] = []

    def add(dim, what, op, nbytes, group, count, link_dim):
        if group > 1 and count > 0:
            out.append(Collective(dim, what, op, float(nbytes), group, count,
                                  link_of(L, link_dim, gpus_per_node)))

    n = stage_params(cfg, layout, stage)
    pb, gb = DTYPE_BYTES[cfg.param_dtype], DTYPE_BYTES[cfg.grad_dtype]
    for kind, group, dim in (("dense", L.dp * L.cp, "dp_cp"),
                             ("expert", L.dp * L.cp // L.ep, "edp")):
        params = n[kind]
        if not params:
            continue
        if L.zero in (0, 1):
            add("dp", f"{kind} gradients", "all_reduce", params * gb, group, 1, dim)
        if L.zero == 1:
            add("dp", f"{kind} parameters", "all_gather", params * pb, group, 1, dim)
        if L.zero == 2:
            add("dp", f"{kind} gradients", "reduce_scatter", params * gb, group, m, dim)
            add("dp", f"{kind} parameters", "all_gather", params * pb, group, 1, dim)
        if L.zero == 3:
            units = layers                            # the experts: one unit per layer
            if kind == "dense":
                head = 0 if cfg.tied_embeddings and first else 1
                units += (2 if cfg.arch == "gpt" else 1) * first + (1 + head) * last
            add("dp", f"{kind} parameters", "all_gather", params * pb / units, group,
                2 * m * units, dim)
            add("dp", f"{kind} gradients", "reduce_scatter", params * gb / units, group,
                m * units, dim)

    act = e * s * b * h                               # one micro-batch's e sbh on this rank
    per_layer = 2 * forwards + 2
    if sp:
        add("tp", "layer activations", "all_gather", act, t, per_layer * layers * m, "tp")
        add("tp", "layer activations", "reduce_scatter", act, t, per_layer * layers * m, "tp")
    else:
        add("tp", "layer activations", "all_reduce", act, t, per_layer * layers * m, "tp")
    if first:
        add("tp", "embedding output", "reduce_scatter" if sp else "all_reduce", act, t,
            forwards * m, "tp")
    if last:
        if sp:
            add("tp", "head input", "all_gather", act, t, m, "tp")
            add("tp", "head input gradient", "reduce_scatter", act, t, m, "tp")
        else:
            add("tp", "head input gradient", "all_reduce", act, t, m, "tp")
        add("tp", "cross-entropy", "all_reduce", 3 * LOGIT_BYTES * s * b, t, m, "tp")
    if sp:
        # norms (and gpt's row-parallel biases) see a sequence shard: their gradients are partial
        norms = block_params(cfg)["norms"] + (2 * h if cfg.arch == "gpt" else 0)
        replicated = layers * norms + ((2 * h if cfg.arch == "gpt" else h) if last else 0)
        add("tp", "sequence-parallel norm gradients", "all_reduce", replicated * gb, t, 1, "tp")

    boundary = act / (t if sp else 1)
    sends = (0 if last else m) + (0 if first else m)
    add("pp", "activations and their gradients", "send_recv", boundary, L.pp, sends, "pp")

    kv_chunk = 2 * e * s * b * cfg.kv * cfg.head_dim / t
    add("cp", "K and V (and their gradients)", "send_recv", kv_chunk, L.cp,
        (L.cp - 1) * (forwards + 2) * layers * m, "cp")

    if cfg.experts:
        add("ep", "token dispatch and combine", "all_to_all", cfg.top_k * act, L.ep,
            2 * (forwards + 1) * layers * m, "ep")
    return out
# --8<-- [end:comm]


# --8<-- [start:flops]
def active_params(cfg: ModelConfig) -> int:
    """The parameters one token's computation uses: all of them but the experts it is not
    routed to (top_k of ``experts`` per layer)."""
    inactive = cfg.layers * block_params(cfg)["expert"] // cfg.experts * (
        cfg.experts - cfg.top_k) if cfg.experts else 0
    return model_params(cfg)["total"] - inactive


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token, 6N + 12 L s d_attn (the form of PaLM's appendix B): 2 per
    parameter and token in the forward, 4 in the backward, N the active parameters that multiply
    an activation (all but the embedding and position lookups; a tied embedding counts once, as
    the head); and the attention scores and their product with V, 2 * 2 s d_attn per layer in the
    forward, d_attn = heads * head_dim, s the whole sequence (no discount for the causal mask)."""
    p = model_params(cfg)
    n = active_params(cfg) - p["positions"] - (0 if cfg.tied_embeddings else p["embedding"])
    return 6 * n + 12 * cfg.layers * cfg.seq * cfg.heads * cfg.head_dim


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops_per_s: float,
        gpus: int = 1) -> float:
    """Model FLOPs utilisation: the useful FLOPs per second (tokens/s x FLOPs per token, counting
    no recomputation) over the peak of the ``gpus`` GPUs."""
    if not (tokens_per_s >= 0 and flops_per_tok > 0 and peak_flops_per_s > 0):
        raise ValueError(f"mfu: need tokens_per_s >= 0, flops_per_tok > 0, peak > 0, got "
                         f"{tokens_per_s!r}, {flops_per_tok!r}, {peak_flops_per_s!r}")
    _positive("mfu", "gpus", gpus)
    return tokens_per_s * flops_per_tok / (peak_flops_per_s * gpus)
# --8<-- [end:flops]


# --8<-- [start:plan]
class Plan(NamedTuple):
    """One layout's verdict, for the rank that needs the most memory (``stage``)."""

    stage: int
    params: int                       # parameters held by that rank
    state: dict[str, int]             # parameters, gradients, optimizer state: bytes
    activations: dict[str, float]     # bytes
    memory: float                     # state + activations, bytes
    comm: list[Collective]            # one step's collectives on that rank
    comm_bytes: dict[str, float]      # bytes sent per step, per parallelism
    comm_seconds: dict[str, float]    # alpha-beta time per step, per parallelism
    microbatches: int
    bubble: float                     # 1F1B's idle fraction: (pp - 1) / (m + pp - 1)


def plan(cfg: ModelConfig, layout: Layout, machine: Machine) -> Plan:
    """Memory and communication of every pipeline stage's rank; returns the fullest one's."""
    m = check(cfg, layout)
    if not isinstance(machine, Machine):
        raise TypeError(f"plan: machine must be a Machine, got {type(machine).__name__}")
    best = None
    for stage in range(layout.pp):
        state = state_bytes(cfg, layout, stage)
        act = activation_bytes(cfg, layout, stage)
        memory = state["total"] + act["total"]
        if best is None or memory > best[0]:
            best = (memory, stage, state, act)
    memory, stage, state, act = best
    comm = communication(cfg, layout, machine.gpus_per_node, stage)
    dims = ("dp", "tp", "pp", "cp", "ep")
    sent = {d: sum(c.bytes_sent for c in comm if c.dim == d) for d in dims}
    secs = {d: sum(c.seconds(machine) for c in comm if c.dim == d) for d in dims}
    return Plan(stage, stage_params(cfg, layout, stage)["total"], state, act, memory, comm,
                sent, secs, m, (layout.pp - 1) / (m + layout.pp - 1))
# --8<-- [end:plan]
