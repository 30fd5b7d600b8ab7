"""The scaling benchmark of Part 7 (snippets/part7/scaling.py) on a CPU: the model with fused
attention computes what TinyTransformer computes; every mode trains on gloo ranks and reports a
step time; the weak-scaling and MFU arithmetic; bad input refused. The GPU measurements are made
with torchrun by scripts/part7_gpus.sh."""

from __future__ import annotations

import json

import pytest
import torch

from snippets.part7 import scaling
from snippets.part7.launch import run_world
from snippets.part7.models import TinyTransformer


def test_fused_attention_model_computes_what_the_tiny_transformer_does():
    fast = scaling.build("tiny", seed=3).double()
    vocab, dim, heads, blocks, seq = scaling.CONFIGS["tiny"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        plain = TinyTransformer(vocab, dim, heads, blocks, max_seq=seq).double()
    tokens = torch.randint(0, vocab, (2, seq))
    torch.testing.assert_close(fast(tokens), plain(tokens), rtol=1e-12, atol=1e-12)


def _all_modes(rank: int, world: int) -> list[dict]:
    torch.set_num_threads(1)
    return [scaling.train_steps(m, "tiny", 2, 2, 1) for m in scaling.MODES if m != "single"]


def test_every_mode_trains_on_gloo_ranks():
    records = run_world(_all_modes, 2, backend="gloo", timeout_s=180)[0]
    assert [r["mode"] for r in records] == ["ddp_book", "ddp_torch", "fsdp2"]
    for r in records:
        assert r["world_size"] == 2 and r["seconds_per_step"] > 0
        assert r["tokens_per_s"] == pytest.approx(2 * 2 * 16 / r["seconds_per_step"])


def test_weak_scaling_and_mfu_arithmetic():
    one = {"config": "1b", "batch_per_rank": 4, "world_size": 1, "tokens_per_s": 1000.0,
           "flops_per_token": 6e9}
    four = {**one, "world_size": 4, "tokens_per_s": 3600.0}
    assert scaling.weak_scaling(one, four) == pytest.approx(0.9)
    assert scaling.mfu(four, 1e13) == pytest.approx(3600 * 6e9 / 4e13)
    with pytest.raises(ValueError, match="same config"):
        scaling.weak_scaling(one, {**four, "batch_per_rank": 8})


def test_flops_per_token_counts_the_matrices_and_the_attention():
    model = scaling.build("tiny")
    vocab, dim, heads, blocks, seq = scaling.CONFIGS["tiny"]
    matrices = sum(p.numel() for n, p in model.named_parameters()
                   if not n.startswith(("embed.", "pos.")))
    assert scaling.model_flops_per_token(model, seq) == 6 * matrices + 6 * blocks * seq * dim


def test_one_billion_config_is_about_a_billion():
    with torch.device("meta"):
        model = scaling.build("1b")
    n = sum(p.numel() for p in model.parameters())
    assert 1.0e9 < n < 1.3e9


def test_bad_input_refused(tmp_path):
    with pytest.raises(ValueError, match="config"):
        scaling.build("huge")
    with pytest.raises(ValueError, match="mode"):
        scaling.train_steps("zero", "tiny", 1, 1, 0)
    with pytest.raises(RuntimeError, match="process group"):
        scaling.train_steps("ddp_torch", "tiny", 1, 1, 0)


def test_single_process_command_line(tmp_path):
    out = tmp_path / "s.json"
    assert scaling.main(["--mode", "single", "--config", "tiny", "--steps", "1", "--warmup", "0",
                         "--batch", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["world_size"] == 1
