"""Training a transformer of about a billion parameters on 1 to p GPUs: step time, tokens per
second, weak-scaling efficiency of data parallelism (the book's ``BucketedDDP`` and torch's DDP)
and model-FLOPs utilisation of FSDP2, for Part 7's multi-GPU measurements.

Weak scaling keeps the batch per GPU fixed: p GPUs should do p times the work in the time one does
it, and the efficiency is (tokens/s on p GPUs) / (p x tokens/s on one). Model-FLOPs utilisation
(MFU) is the model's arithmetic per second, 6 N per token for N parameters plus the attention's
12 L s d, over the GPUs' peak rate: here the peak is a rate the caller passes (``--peak-tflops``,
per GPU) or, by default, the cuBLAS bf16 GEMM rate measured on that GPU by the harness (the
committed results' ``gemm_bf16`` ceiling), which is stricter than a datasheet peak.

    torchrun --nproc-per-node 1 -m snippets.part7.scaling --mode single --out s1.json
    torchrun --nproc-per-node 4 -m snippets.part7.scaling --mode ddp_torch --out d4.json
    python -m snippets.part7.scaling --world 2 --config tiny --mode ddp_book --out c.json   # CPU

The model is ``TinyTransformer``'s architecture at another size, with its attention computed by
``F.scaled_dot_product_attention`` (the same function, a fused kernel on GPUs), under bf16 autocast
on GPUs with fp32 master weights, trained with AdamW.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.ddp import BucketedDDP
from snippets.part7.launch import device_for
from snippets.part7.models import Attention, TinyTransformer, TransformerBlock
from snippets.part7.sweep import slowest_time

# name -> (vocab, dim, heads, blocks, seq); "1b": about 1.1e9 parameters
CONFIGS = {"tiny": (64, 32, 4, 2, 16), "125m": (32000, 768, 12, 12, 1024),
           "1b": (32000, 2048, 16, 20, 2048)}
MODES = ("single", "ddp_book", "ddp_torch", "fsdp2")


class SdpaAttention(Attention):
    """``Attention`` with its causal softmax computed by ``F.scaled_dot_product_attention``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(f(x)) for f in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, h, s, hd = o.shape
        return self.proj(o.transpose(1, 2).reshape(b, s, h * hd))


def build(config: str, seed: int = 0) -> TinyTransformer:
    if config not in CONFIGS:
        raise ValueError(f"build: config must be one of {sorted(CONFIGS)}, got {config!r}")
    vocab, dim, heads, blocks, seq = CONFIGS[config]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformer(vocab, dim, heads, blocks, max_seq=seq)
    for block in model.blocks:
        assert isinstance(block, TransformerBlock)
        fast = SdpaAttention(dim, heads)
        fast.load_state_dict(block.attn.state_dict())
        block.attn = fast
    return model


def model_flops_per_token(model: TinyTransformer, seq: int) -> float:
    """6 N (the forward's 2 N and the backward's 4 N over the parameters N, the embeddings' table
    lookups excluded) plus the causal attention's 12 L s d / 2 (half the score matrix)."""
    n = sum(p.numel() for name, p in model.named_parameters()
            if not name.startswith(("embed.", "pos.")))
    layers = len(model.blocks)
    dim = model.embed.embedding_dim
    return 6 * n + 12 * layers * seq * dim / 2


def measured_peak(device_name: str) -> float | None:
    """The cuBLAS bf16 GEMM rate (FLOP/s) the harness measured on this GPU model, if committed."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    for path in results.glob("*.json"):
        data = json.loads(path.read_text())
        if data.get("gpu") == device_name:
            ceiling = data.get("ceilings", {}).get("gemm_bf16")
            if ceiling:
                return float(ceiling["value"]) * 1e12
    return None


def train_steps(mode: str, config: str, batch: int, steps: int, warmup: int) -> dict[str, Any]:
    """Time ``steps`` training steps (after ``warmup``) of ``build(config)`` in ``mode`` on this
    rank; ``batch`` sequences per rank. Returns seconds per step (the slowest rank's), tokens per
    second over all ranks, and the model FLOPs per token."""
    if mode not in MODES:
        raise ValueError(f"train_steps: mode must be one of {MODES}, got {mode!r}")
    distributed = dist.is_available() and dist.is_initialized()
    if mode != "single" and not distributed:
        raise RuntimeError(f"train_steps: mode {mode!r} needs a process group (torchrun)")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = device_for(rank) if distributed else ("cuda" if torch.cuda.is_available() else "cpu")
    model = build(config).to(device)
    seq = CONFIGS[config][4]
    if mode == "ddp_book":
        wrapped = BucketedDDP(model)
    elif mode == "ddp_torch":
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.device(device).index] if device != "cpu" else None)
    elif mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = init_device_mesh(torch.device(device).type, (world,))  # gloo ranks: a CPU mesh
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        wrapped = fully_shard(model, mesh=mesh, mp_policy=policy)
    else:
        wrapped = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    vocab = CONFIGS[config][0]
    text = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    tokens, targets = text[:, :-1], text[:, 1:]
    cuda = torch.device(device).type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and mode != "fsdp2")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            logits = wrapped(tokens)
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
        loss.backward()
        opt.step()

    seconds = slowest_time(step, torch.device(device), steps, warmup)
    tokens_per_s = world * batch * seq / seconds
    return {"mode": mode, "config": config, "world_size": world, "batch_per_rank": batch,
            "seq": seq, "seconds_per_step": seconds, "tokens_per_s": tokens_per_s,
            "params": sum(p.numel() for p in model.parameters()),
            "flops_per_token": model_flops_per_token(model, seq),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None}


def mfu(record: dict[str, Any], peak_per_gpu: float) -> float:
    """Model FLOPs per second over ``world_size`` x ``peak_per_gpu``."""
    return (record["tokens_per_s"] * record["flops_per_token"]
            / (record["world_size"] * peak_per_gpu))


def weak_scaling(single: dict[str, Any], many: dict[str, Any]) -> float:
    """(tokens/s on p ranks) / (p x tokens/s on one), at the same batch per rank."""
    if single["batch_per_rank"] != many["batch_per_rank"] or single["config"] != many["config"]:
        raise ValueError("weak_scaling: the two runs must have the same config and batch per rank")
    return many["tokens_per_s"] / (many["world_size"] * single["tokens_per_s"])


def _rank_main(rank: int, world: int, mode: str, config: str, batch: int, steps: int,
               warmup: int) -> dict[str, Any]:
    return train_steps(mode, config, batch, steps, warmup)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--world", type=int, help="spawn this many processes here (without torchrun)")
    ap.add_argument("--peak-tflops", type=float, help="per GPU; default: the measured cuBLAS bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.world:
        from snippets.part7.launch import run_world

        record = run_world(_rank_main, args.world, args.mode, args.config, args.batch,
                           args.steps, args.warmup, timeout_s=3600)[0]
    else:
        from snippets.part7.launch import init_from_env

        if args.mode == "single":
            record = train_steps("single", args.config, args.batch, args.steps, args.warmup)
            rank = 0
        else:
            rank, _ = init_from_env(timeout_s=3600)
            record = train_steps(args.mode, args.config, args.batch, args.steps, args.warmup)
            dist.destroy_process_group()
        if rank != 0:
            return 0
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
        peak = args.peak_tflops * 1e12 if args.peak_tflops else measured_peak(record["gpu"])
        record["peak_per_gpu"] = peak
        record["peak_from"] = "--peak-tflops" if args.peak_tflops else "measured cuBLAS bf16"
        record["mfu"] = mfu(record, peak) if peak else None
    record["torch"] = torch.__version__
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ("mode", "world_size", "seconds_per_step",
                                             "tokens_per_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
