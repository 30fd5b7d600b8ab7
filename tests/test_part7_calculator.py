"""The calculator (snippets/part7/calculator.py) against what it describes: its parameter counts
against real modules (the book's TinyTransformer, Llama-like and tensor-parallel shards of it built
on the meta device), its bytes per rank and its collectives against what BucketedDDP,
ZeroOptimizer and Zero3Module hold and send on 2 gloo ranks, its times against cost.py, and
published figures (Llama 3 8B, Mixtral 8x7B, the ZeRO paper's 7.5B model, Korthikanti et al.'s
activation formulas).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import snippets.part7.zero as zero_module
from snippets.part7 import cost
from snippets.part7.calculator import (
    Collective,
    Layout,
    Link,
    Machine,
    ModelConfig,
    activation_bytes,
    active_params,
    check,
    communication,
    flops_per_token,
    group_ranks,
    layer_activations,
    link_of,
    mfu,
    model_params,
    optim_bytes_per_param,
    plan,
    stage_params,
    state_bytes,
)
from snippets.part7.ddp import BucketedDDP
from snippets.part7.launch import run_world
from snippets.part7.models import lm_loss, tiny_batch, tiny_transformer
from snippets.part7.zero import Zero3Module, ZeroOptimizer, measured_bytes, zero_memory

SEED = 3
GLOBAL_BATCH = 8
SEQ_LEN = 8
WORLD = 2
DTYPE_NAMES = {torch.float32: "fp32", torch.float64: "fp64"}


def tiny_config(dtype=torch.float32, micro: int = 1, **kw) -> ModelConfig:
    """The calculator's description of tiny_transformer(SEED, dtype, **kw) trained on GLOBAL_BATCH
    sequences of SEQ_LEN tokens over WORLD ranks, each in ``micro`` micro-batches, with AdamW (two
    moments, no master copy)."""
    args = dict(vocab=64, dim=32, heads=4, blocks=2, max_seq=64) | kw
    name = DTYPE_NAMES[dtype]
    return ModelConfig(layers=args["blocks"], hidden=args["dim"], heads=args["heads"],
                       ffn=4 * args["dim"], vocab=args["vocab"], seq=SEQ_LEN,
                       max_positions=args["max_seq"], arch="gpt",
                       micro_batch=GLOBAL_BATCH // (WORLD * micro), global_batch=GLOBAL_BATCH,
                       param_dtype=name, grad_dtype=name, optim_dtype=name, act_dtype=name)


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("kw", [{}, dict(dim=48, heads=6, blocks=3), dict(vocab=17, dim=20,
                                heads=5, blocks=1, max_seq=9), dict(dim=64, heads=1, blocks=4)],
                         ids=str)
def test_gpt_count_equals_tiny_transformer(kw):
    model = tiny_transformer(0, **kw)
    counted = model_params(tiny_config(**kw))
    assert counted["total"] == sum(p.numel() for p in model.parameters())
    assert counted["blocks"] == sum(p.numel() for p in model.blocks.parameters())
    h = kw.get("dim", 32)
    assert counted["blocks"] == kw.get("blocks", 2) * (12 * h * h + 13 * h)


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv, head_dim, ffn):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
        self.q = nn.Linear(h, heads * head_dim, bias=False)
        self.k = nn.Linear(h, kv * head_dim, bias=False)
        self.v = nn.Linear(h, kv * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, h, bias=False)
        self.gate = nn.Linear(h, ffn, bias=False)
        self.up = nn.Linear(h, ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)


class LlamaLike(nn.Module):
    """A Llama-style model's parameters (no forward needed to count them); with heads, kv, ffn and
    vocab divided by t it is the parameters of one tensor-parallel rank."""

    def __init__(self, layers, h, heads, kv, head_dim, ffn, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, heads, kv, head_dim, ffn)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)


LLAMA3_8B = ModelConfig(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                        seq=8192, micro_batch=1, global_batch=64)


def meta_count(cfg: ModelConfig, tp: int = 1) -> int:
    with torch.device("meta"):
        model = LlamaLike(cfg.layers, cfg.hidden, cfg.heads // tp, cfg.kv // tp, cfg.head_dim,
                          cfg.ffn // tp, cfg.vocab // tp)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("cfg", [
    LLAMA3_8B,
    ModelConfig(layers=3, hidden=96, heads=12, kv_heads=4, ffn=256, vocab=1000, seq=16),
    ModelConfig(layers=2, hidden=64, heads=4, ffn=176, vocab=96, seq=16),    # no grouping
], ids=["llama3-8b", "small-gqa", "small-mha"])
def test_llama_count_equals_a_meta_model(cfg):
    assert model_params(cfg)["total"] == meta_count(cfg)
    for tp in (2, 4):                              # one tensor-parallel rank's share
        assert stage_params(cfg, Layout(tp=tp), 0)["total"] == meta_count(cfg, tp)


def test_published_counts():
    """Llama 3 8B: 8.03B parameters (Meta's model card). Mixtral 8x7B (the Llama shape with 8
    experts, top 2, vocabulary 32000): 46.7B in all, 12.9B used per token (Mistral AI)."""
    assert model_params(LLAMA3_8B)["total"] == 8_030_261_248
    mixtral = dataclasses.replace(LLAMA3_8B, vocab=32000, experts=8, top_k=2, seq=4096)
    assert round(model_params(mixtral)["total"] / 1e9, 1) == 46.7
    assert round(active_params(mixtral) / 1e9, 1) == 12.9
    assert active_params(LLAMA3_8B) == model_params(LLAMA3_8B)["total"]


def test_stages_and_ranks_partition_the_parameters():
    total = model_params(LLAMA3_8B)["total"]
    for pp in (2, 4, 8):
        layout = Layout(pp=pp)
        assert sum(stage_params(LLAMA3_8B, layout, s)["total"] for s in range(pp)) == total
    # gpt: t ranks together hold the model once, plus t - 1 extra copies of what is replicated
    cfg = tiny_config(dim=48, heads=6)
    h, t = 48, 2
    replicated = 2 * (4 * h + 2 * h) + 64 * h + 2 * h   # per block: norms, 2 row biases; pos; norm
    share = stage_params(cfg, Layout(tp=t), 0)["total"]
    assert t * share - (t - 1) * replicated == model_params(cfg)["total"]
    # tied embeddings: the last stage holds a copy of the embedding when pp > 1
    tied = dataclasses.replace(LLAMA3_8B, tied_embeddings=True)
    v_h = 128256 * 4096
    assert model_params(tied)["total"] == model_params(LLAMA3_8B)["total"] - v_h
    two = [stage_params(tied, Layout(pp=2), s)["total"] for s in range(2)]
    assert sum(two) == model_params(tied)["total"] + v_h
    # experts: ep ranks hold 1/ep of them each
    moe = dataclasses.replace(LLAMA3_8B, experts=8, top_k=2)
    full = stage_params(moe, Layout(dp=4), 0)
    quarter = stage_params(moe, Layout(dp=4, ep=4), 0)
    assert quarter["dense"] == full["dense"] and quarter["expert"] * 4 == full["expert"]


# ---------------------------------------------------------------- model state


def test_state_is_the_zero_papers_accounting():
    """Psi parameters in bf16 with fp32 Adam: 16 Psi bytes per rank at stage 0, 4 Psi + 12 Psi/Nd
    at stage 1, 2 Psi + 14 Psi/Nd at stage 2, 16 Psi/Nd at stage 3; the paper's 7.5B model on 64
    ranks: 120, 31.4, 16.6 and 1.9 GB."""
    assert optim_bytes_per_param(LLAMA3_8B) == 12
    psi, nd = model_params(LLAMA3_8B)["total"], 64
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=64)
    expected = [16 * psi, 4 * psi + 12 * -(-psi // nd), 2 * psi + 14 * -(-psi // nd),
                16 * -(-psi // nd)]
    assert [state_bytes(cfg, Layout(dp=nd, zero=s))["total"] for s in range(4)] == expected
    k = optim_bytes_per_param(cfg)
    gb = [round(zero_memory(7_500_000_000, 64, s, 2, 2, k)["total"] / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    # fp32 parameters are their own master copy: 8 bytes of state; fp16 with fp32 state: 12
    assert optim_bytes_per_param(tiny_config()) == 8
    assert optim_bytes_per_param(dataclasses.replace(LLAMA3_8B, param_dtype="fp16")) == 12


# ---------------------------------------------------------------- against the real code


def _recording():
    """Wrap the collectives that ddp.py and zero.py call, to record (op, bytes of n)."""
    log = []

    def wrap(fn, op, which):
        def recorded(*args, **kwargs):
            t = args[which]
            log.append((op, t.numel() * t.element_size()))
            return fn(*args, **kwargs)
        return recorded

    patches = [(dist, "all_reduce", wrap(dist.all_reduce, "all_reduce", 0)),
               (zero_module, "all_gather_tensor",
                wrap(zero_module.all_gather_tensor, "all_gather", 0)),      # n: the output
               (zero_module, "reduce_scatter_tensor",
                wrap(zero_module.reduce_scatter_tensor, "reduce_scatter", 1))]   # n: the input
    return log, patches


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)


def run_stage(rank: int, world: int, stage: int, dtype, micro: int = 1) -> dict:
    """Two steps of tiny_transformer(SEED) on this rank's shard with ZeRO stage ``stage`` (0:
    BucketedDDP, one bucket), the shard cut into ``micro`` micro-batches whose gradients
    accumulate (stage 0: under no_sync but the last; ZeroOptimizer replaces its gradients at each
    backward, so stages 1 and 2 take micro=1); the bytes held after the second step's backward and
    the collectives of the second step."""
    model = tiny_transformer(SEED, dtype)
    if stage == 0:
        wrapped = BucketedDDP(model, bucket_bytes=2**30)
        opt = adamw(model.parameters())
    elif stage in (1, 2):
        wrapped, opt = model, ZeroOptimizer(model, adamw, stage)
    else:
        wrapped = Zero3Module(model)
        opt = adamw(wrapped.parameters())
    log, patches = _recording()
    for step in range(2):
        tokens, targets = (t.tensor_split(world)[rank]
                           for t in tiny_batch(step, GLOBAL_BATCH, SEQ_LEN))
        if step == 1:
            saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
            for obj, name, fn in patches:
                setattr(obj, name, fn)
        try:
            opt.zero_grad()
            for i, (x, y) in enumerate(zip(tokens.tensor_split(micro),
                                           targets.tensor_split(micro))):
                sync = stage != 0 or i == micro - 1
                with contextlib.nullcontext() if sync else wrapped.no_sync():
                    (lm_loss(wrapped, x, y) / micro).backward()
            if step == 1:
                memory = (wrapped.memory(opt) if stage == 3 else opt.memory() if stage else
                          measured_bytes(model.parameters(), [p.grad for p in model.parameters()],
                                         opt))
            opt.step()
        finally:
            if step == 1:
                for obj, name, fn in saved:
                    setattr(obj, name, fn)
    return {"memory": memory, "log": log}


def calculator_world(rank: int, world: int) -> dict:
    out = {(stage, dtype): run_stage(rank, world, stage, dtype)
           for stage in range(4) for dtype in DTYPE_NAMES}
    for stage in (0, 3):
        out[stage, "accumulate"] = run_stage(rank, world, stage, torch.float32, micro=2)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def measured():
    return run_world(calculator_world, WORLD, backend="gloo", timeout_s=180)


@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=str)
@pytest.mark.parametrize("stage", range(4))
def test_state_bytes_equal_what_the_ranks_hold(measured, stage, dtype):
    cfg = tiny_config(dtype)
    expected = state_bytes(cfg, Layout(dp=WORLD, zero=stage))
    for r in measured:
        assert r[stage, dtype]["memory"] == expected
    one = state_bytes(cfg, Layout(dp=WORLD, zero=0))
    assert stage == 0 or expected["optimizer"] * WORLD == one["optimizer"]


@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=str)
@pytest.mark.parametrize("stage", range(4))
def test_collectives_equal_what_the_ranks_call(measured, stage, dtype):
    """For every op: as many calls, and as many bytes in all, as the calculator lists."""
    cfg = tiny_config(dtype)
    predicted = communication(cfg, Layout(dp=WORLD, zero=stage), gpus_per_node=8)
    assert {c.dim for c in predicted} == {"dp"}
    for r in measured:
        log = r[stage, dtype]["log"]
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            calls = [n for o, n in log if o == op]
            mine = [c for c in predicted if c.op == op]
            assert len(calls) == sum(c.count for c in mine), op
            assert sum(calls) == sum(c.count * c.nbytes for c in mine), op


@pytest.mark.parametrize("stage", [0, 3])
def test_collectives_with_gradient_accumulation(measured, stage):
    """Two micro-batches per step: data parallelism still all-reduces once (no_sync), ZeRO-3
    gathers and reduce-scatters every unit for each micro-batch."""
    cfg = tiny_config(micro=2)
    assert check(cfg, Layout(dp=WORLD)) == 2
    predicted = communication(cfg, Layout(dp=WORLD, zero=stage), gpus_per_node=8)
    for r in measured:
        log = r[stage, "accumulate"]["log"]
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            calls = [n for o, n in log if o == op]
            mine = [c for c in predicted if c.op == op]
            assert len(calls) == sum(c.count for c in mine), op
            assert sum(calls) == sum(c.count * c.nbytes for c in mine), op
    single = communication(tiny_config(), Layout(dp=WORLD, zero=stage), gpus_per_node=8)
    ratio = sum(c.bytes_sent for c in predicted) / sum(c.bytes_sent for c in single)
    assert ratio == (2 if stage == 3 else 1)


def test_the_comparison_can_fail(measured):
    """A calculator that forgot the backward's second all-gather of ZeRO-3 would be caught."""
    predicted = communication(tiny_config(), Layout(dp=WORLD, zero=3), gpus_per_node=8)
    gathers = [c for c in predicted if c.op == "all_gather"]
    calls = [n for o, n in measured[0][3, torch.float32]["log"] if o == "all_gather"]
    assert sum(calls) == sum(c.count * c.nbytes for c in gathers)
    assert sum(calls) != sum(c.count // 2 * c.nbytes for c in gathers)


# ---------------------------------------------------------------- communication and cost.py

MACHINE = Machine(gpus_per_node=8, intra=Link(1e-5, 4e11), inter=Link(3e-5, 5e10))   # nominal


def test_times_and_bytes_are_cost_pys():
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=32, recompute="selective")
    layout = Layout(dp=4, tp=8, pp=2, zero=1, sequence_parallel=True)   # 64 ranks
    comm = communication(cfg, layout, 8, stage=0)
    funcs = {"all_reduce": cost.ring_all_reduce_time, "all_gather": cost.ring_all_gather_time,
             "reduce_scatter": cost.ring_reduce_scatter_time, "all_to_all": cost.all_to_all_time}
    assert {c.op for c in comm} == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    for c in comm:
        alpha, beta = MACHINE.intra if c.link == "intra" else MACHINE.inter
        one = (cost.send_time(c.nbytes, alpha, beta) if c.op == "send_recv"
               else funcs[c.op](c.nbytes, c.group, alpha, beta))
        assert c.seconds(MACHINE) == pytest.approx(c.count * one, rel=1e-12)
        assert c.bytes_sent == pytest.approx(c.count * cost.BUS_FACTORS[c.op](c.group) * c.nbytes)
    links = {c.dim: c.link for c in comm}
    assert links == {"tp": "intra", "dp": "inter", "pp": "inter"}


def test_zero_volumes_against_data_parallelism():
    """One micro-batch: ZeRO-2 sends what data parallelism sends, ZeRO-3 1.5 times as much (the
    sharding chapter's 2 Psi and 3 Psi), ZeRO-1 as the book builds it too."""
    cfg = LLAMA3_8B
    sent = {z: sum(c.bytes_sent for c in communication(cfg, Layout(dp=64, zero=z), 8))
            for z in range(4)}
    assert sent[2] == pytest.approx(sent[0], rel=1e-12)
    assert sent[3] == pytest.approx(1.5 * sent[0], rel=1e-12)
    assert sent[1] == pytest.approx(1.5 * sent[0], rel=1e-12)
    psi = model_params(cfg)["total"]
    assert sent[0] == pytest.approx(2 * 63 / 64 * 2 * psi, rel=1e-12)


def test_tensor_parallel_volumes():
    """Per layer and micro-batch, 4 all-reduces of sbh activations (6 with full recompute);
    sequence parallelism sends the same bytes as all-gathers and reduce-scatters."""
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=1)
    sbh2 = 2 * 8192 * 4096
    for recompute, per_layer in (("none", 4), ("full", 6)):
        c = dataclasses.replace(cfg, recompute=recompute)
        plain = [x for x in communication(c, Layout(tp=8), 8) if x.what == "layer activations"]
        assert [(x.op, x.nbytes, x.count) for x in plain] == [("all_reduce", sbh2, 32 * per_layer)]
        sp = [x for x in communication(c, Layout(tp=8, sequence_parallel=True), 8)
              if x.what == "layer activations"]
        assert sorted(x.op for x in sp) == ["all_gather", "reduce_scatter"]
        assert sum(x.bytes_sent for x in sp) == pytest.approx(plain[0].bytes_sent, rel=1e-12)
    # with sequence parallelism the norms' gradients are partial: one all-reduce per step of the
    # 65 RMSNorm weights (2 per layer and the final one), bf16
    norms = [(x.op, x.nbytes, x.count) for x in communication(
        cfg, Layout(tp=8, sequence_parallel=True), 8) if x.what.startswith("sequence-parallel")]
    assert norms == [("all_reduce", 65 * 4096 * 2, 1)]
    gpt = [x.nbytes for x in communication(tiny_config(), Layout(tp=2, dp=2,
           sequence_parallel=True), 8) if x.what.startswith("sequence-parallel")]
    assert gpt == [(2 * 6 * 32 + 2 * 32) * 4]      # 6h a block (4h of norms, 2 row biases), 2h


def test_pipeline_context_and_expert_volumes():
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=16)
    m, sbh2 = 16, 2 * 8192 * 4096
    pp = Layout(pp=4)
    sends = [[c for c in communication(cfg, pp, 8, s) if c.dim == "pp"] for s in range(4)]
    assert [x[0].count for x in sends] == [m, 2 * m, 2 * m, m]
    assert all(x[0].nbytes == sbh2 for x in sends)
    sp = communication(cfg, Layout(pp=4, tp=2, sequence_parallel=True), 8, 1)
    assert [c.nbytes for c in sp if c.dim == "pp"] == [sbh2 / 2]
    # context parallelism: the K/V chunk (8 kv heads of 128) of 8192 / 4 tokens, 3 times cp - 1
    cp = [c for c in communication(cfg, Layout(cp=4), 8) if c.dim == "cp"]
    assert [(c.nbytes, c.count) for c in cp] == [(2 * 2 * 2048 * 1024, 3 * 3 * 32 * m)]
    moe = dataclasses.replace(cfg, experts=8, top_k=2, global_batch=64)
    ep = [c for c in communication(moe, Layout(dp=4, ep=4), 8) if c.dim == "ep"]
    assert [(c.op, c.nbytes, c.group, c.count) for c in ep] == [
        ("all_to_all", 2 * sbh2, 4, 4 * 32 * 16)]


def test_links_follow_the_rank_order():
    layout = Layout(dp=4, tp=8, pp=2)
    assert group_ranks(layout, "tp") == list(range(8))
    assert group_ranks(layout, "dp") == [0, 8, 16, 24]
    assert group_ranks(layout, "pp") == [0, 32]
    assert link_of(layout, "tp", 8) == "intra" and link_of(layout, "dp", 8) == "inter"
    assert link_of(Layout(dp=2, tp=4), "dp", 8) == "intra"
    assert link_of(Layout(dp=8, ep=4), "ep", 8) == "intra"
    assert group_ranks(Layout(dp=8, ep=4), "edp") == [0, 4]


# ---------------------------------------------------------------- activations: Korthikanti et al.

GPT3 = ModelConfig(layers=96, hidden=12288, heads=96, ffn=4 * 12288, vocab=51200, seq=2048,
                   arch="gpt", micro_batch=1, global_batch=8)


def test_activations_term_by_term():
    """Their GPT-3 175B (a = 96, h = 12288, s = 2048): attention 11 sbh + 5 as^2 b, MLP 19 sbh,
    norms 4 sbh; in all sbh(34 + 5as/h), with 5as/h = 80."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh, as2b = s * b * h, a * s * s * b
    terms = layer_activations(GPT3, Layout())
    assert terms["attention"] == {"qkv_input": 2 * sbh, "q_k": 4 * sbh, "v": 2 * sbh,
                                  "softmax_output": 2 * as2b, "softmax_dropout_mask": as2b,
                                  "softmax_dropout_output": 2 * as2b, "proj_input": 2 * sbh,
                                  "dropout_mask": sbh}
    assert terms["mlp"] == {"input": 2 * sbh, "gelu_input": 8 * sbh, "gelu_output": 8 * sbh,
                            "dropout_mask": sbh}
    assert terms["norms"] == {"attn_norm_input": 2 * sbh, "mlp_norm_input": 2 * sbh}
    assert 5 * a * s / h == 80
    assert sum(sum(g.values()) for g in terms.values()) == sbh * (34 + 5 * a * s / h)


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for the backward of ``module(x)``: each storage once,
    parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=str)
@pytest.mark.parametrize("dim, heads, b, s", [(32, 4, 4, 8), (48, 6, 3, 20), (40, 5, 1, 33)])
def test_activations_equal_what_autograd_saves(dtype, dim, heads, b, s):
    """A TinyTransformer block (no dropout) saves exactly the paper's terms, at the model's
    element size, plus two that the paper neglects: each LayerNorm's mean and 1/std (2 sb
    elements per norm) and the causal mask (s^2 booleans)."""
    block = tiny_transformer(0, dtype, dim=dim, heads=heads, max_seq=64).blocks[0]
    x = torch.randn(b, s, dim, dtype=dtype, requires_grad=True)
    cfg = dataclasses.replace(tiny_config(dtype, dim=dim, heads=heads), seq=s, micro_batch=b,
                              global_batch=b, dropout=False)
    terms = layer_activations(cfg, Layout())
    formula = sum(sum(g.values()) for g in terms.values())
    e = torch.empty((), dtype=dtype).element_size()
    assert saved_bytes(block, x) == formula + 2 * 2 * s * b * e + s * s


@pytest.mark.parametrize("t", [2, 8])
def test_activations_under_tensor_and_sequence_parallelism(t):
    s, h, a = 2048, 12288, 96
    sbh = s * h

    def per_layer(**kw):
        recompute = kw.pop("recompute", "none")
        cfg = dataclasses.replace(GPT3, recompute=recompute)
        return sum(sum(g.values()) for g in layer_activations(cfg, Layout(tp=t, **kw)).values())

    assert per_layer() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert per_layer(sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h),
                                                              rel=1e-12)
    assert per_layer(sequence_parallel=True, recompute="selective") == pytest.approx(
        34 * sbh / t, rel=1e-12)
    assert per_layer(recompute="full") == 2 * sbh
    assert per_layer(sequence_parallel=True, recompute="full") == 2 * sbh / t


def test_pipeline_first_stage_holds_all_layers_worth():
    """1F1B with m >= p: the first stage holds p micro-batches of its L/p layers, that is L layers'
    worth, whatever p (the paper's point); the last holds one micro-batch, plus the output layer's
    4sbh/t (1 + v/h) with sequence parallelism."""
    s, h, v, t = 2048, 12288, 51200, 8
    sbh = s * h
    per_layer = sbh / t * (34 + 5 * 96 * s / h)
    for p in (2, 4, 8):
        layout = Layout(tp=t, pp=p, sequence_parallel=True)
        first = activation_bytes(GPT3, layout, 0)
        assert first["layers"] == pytest.approx(96 * per_layer, rel=1e-12)
        assert first["embedding"] == pytest.approx(sbh * p / t, rel=1e-12)   # the paper's sbhp/t
        last = activation_bytes(GPT3, layout, p - 1)
        assert last["layers"] == pytest.approx(96 / p * per_layer, rel=1e-12)
        assert last["output"] == pytest.approx(4 * sbh / t * (1 + v / h), rel=1e-12)
    few = dataclasses.replace(GPT3, global_batch=2)          # m = 2 < p = 8: two in flight
    assert activation_bytes(few, Layout(tp=t, pp=8, sequence_parallel=True), 0)["layers"] == (
        pytest.approx(2 * 12 * per_layer, rel=1e-12))


# ---------------------------------------------------------------- FLOPs, plan, validation


def test_flops_and_mfu():
    cfg = LLAMA3_8B
    p = model_params(cfg)
    n = p["total"] - p["embedding"]                    # the head multiplies; the lookup does not
    assert flops_per_token(cfg) == 6 * n + 12 * 32 * 8192 * 4096
    tokens_per_s, peak = 1000.0, 1e15                  # nominal
    assert mfu(tokens_per_s, flops_per_token(cfg), peak, 8) == pytest.approx(
        tokens_per_s * flops_per_token(cfg) / (8 * peak))
    with pytest.raises(ValueError, match="mfu"):
        mfu(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="mfu"):
        mfu(1.0, 1.0, 1.0, gpus=0)


def test_plan_picks_the_fullest_rank():
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=16, recompute="selective")
    layout = Layout(tp=8, pp=4, sequence_parallel=True)
    result = plan(cfg, layout, MACHINE)
    memories = [state_bytes(cfg, layout, s)["total"] + activation_bytes(cfg, layout, s)["total"]
                for s in range(4)]
    assert result.memory == max(memories) and result.stage == memories.index(max(memories))
    assert result.microbatches == 16 and result.bubble == pytest.approx(3 / 19)
    assert result.comm_bytes["tp"] == pytest.approx(
        sum(c.bytes_sent for c in result.comm if c.dim == "tp"))
    assert isinstance(result.comm[0], Collective)


@pytest.mark.parametrize("cfg_kw, layout_kw, message", [
    (dict(heads=30, kv_heads=6, hidden=3840), dict(tp=4), "heads=30 is not divisible by tp=4"),
    (dict(kv_heads=2), dict(tp=4), "kv_heads=2 is not divisible by tp=4"),
    ({}, dict(pp=3), "layers=32 is not divisible by pp=3"),
    (dict(global_batch=10), dict(dp=4), "global_batch=10 is not divisible by dp"),
    (dict(global_batch=8, micro_batch=4), dict(dp=4), "global_batch=8"),
    ({}, dict(cp=3), "seq=8192 is not divisible by cp=3"),
    ({}, dict(zero=2, pp=2), "zero=2 with pp=2"),
    ({}, dict(zero=4), "zero must be"),
    ({}, dict(dp=0), "layout.dp must be an int >= 1"),
    ({}, dict(ep=2, dp=2), "needs a model with experts"),
    (dict(experts=8), dict(ep=4, dp=2), "must divide dp=2"),
    (dict(recompute="some"), {}, "recompute must be"),
    (dict(param_dtype="fp12"), {}, "param_dtype must be"),
    (dict(arch="bert"), {}, "arch must be"),
    (dict(global_batch=64), dict(dp=4, microbatches=3), "microbatches=3"),
])
def test_bad_layouts_raise(cfg_kw, layout_kw, message):
    cfg = dataclasses.replace(LLAMA3_8B, **cfg_kw)
    with pytest.raises(ValueError, match=message):
        check(cfg, Layout(**layout_kw))
    with pytest.raises(ValueError, match=message):
        plan(cfg, Layout(**layout_kw), MACHINE)


def test_wrong_types_raise():
    with pytest.raises(TypeError, match="ModelConfig and a Layout"):
        check(LLAMA3_8B, {"tp": 8})
    with pytest.raises(TypeError, match="machine must be a Machine"):
        plan(LLAMA3_8B, Layout(), (8, 1e-5, 1e11))


def test_checks_pass_and_count_microbatches():
    assert check(dataclasses.replace(LLAMA3_8B, global_batch=64, micro_batch=2),
                 Layout(dp=4, microbatches=8)) == 8


CHAPTER = Path(__file__).resolve().parent.parent / "docs" / "part7" / "putting-it-together.md"
WALK = {   # the chapter's table: its layout column, and the Layout it names
    "DP 8": Layout(dp=8), "DP 8, ZeRO-1": Layout(dp=8, zero=1),
    "DP 8, ZeRO-2": Layout(dp=8, zero=2), "DP 8, ZeRO-3": Layout(dp=8, zero=3),
    "TP 8 + SP": Layout(tp=8, sequence_parallel=True),
    "TP 2 + SP, DP 4, ZeRO-1": Layout(tp=2, dp=4, zero=1, sequence_parallel=True),
    "DP 64, ZeRO-3": Layout(dp=64, zero=3),
    "TP 8 + SP, DP 8, ZeRO-1": Layout(tp=8, dp=8, zero=1, sequence_parallel=True),
    "TP 8 + SP, PP 2, DP 4, ZeRO-1": Layout(tp=8, pp=2, dp=4, zero=1, sequence_parallel=True),
    "TP 2 + SP, DP 32, ZeRO-1": Layout(tp=2, dp=32, zero=1, sequence_parallel=True),
}


def test_the_chapters_table_is_the_calculators():
    """Every row of the 8B walk-through, recomputed: a change to a formula shows up here."""
    cfg = dataclasses.replace(LLAMA3_8B, global_batch=128, recompute="selective")
    rows = [line for line in CHAPTER.read_text().splitlines()
            if line.startswith(("| 8 |", "| 64 |"))]
    assert len(rows) == len(WALK)
    for row in rows:
        gpus, name, *cells = (c.strip() for c in row.strip("|").split("|"))
        layout = WALK[name]
        assert layout.world == int(gpus), name
        p = plan(cfg, layout, MACHINE)
        sent = ", ".join(f"{d} {v / 1e9:.1f}" for d, v in p.comm_bytes.items() if v)
        expected = [f"{p.state['total'] / 1e9:.1f}", f"{p.activations['total'] / 1e9:.1f}",
                    f"{p.memory / 1e9:.1f}", str(p.microbatches), sent]
        assert cells == expected, name
