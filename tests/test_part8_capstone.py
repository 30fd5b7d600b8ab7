"""The capstone decoder: the book backend (Part 5's kernels, Part 8's paged decode attention, under
Triton's interpreter on a CPU) generates the torch backend's tokens in float32 with logits within
fp32 rounding; the cached decode (paged or contiguous) gives the logits of the whole sequence run
again without a cache, at every position; seeded sampling is reproducible; bad configurations and
arguments raise before any work. On a GPU, a ~125M configuration in bf16: the book backend's
logits are as close to an fp32 reference as the torch backend's, and their greedy tokens agree."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_reference

from conftest import DEVICE
from snippets.part8 import capstone as cp
from snippets.part8.kv_cache import PagedKVCache

NEW = 8


@pytest.fixture(scope="module")
def tiny():
    model = cp.Llama(cp.TINY, seed=0, device=DEVICE)
    prompt = torch.randint(cp.TINY.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, prompt.to(DEVICE)


@pytest.fixture(scope="module")
def torch_run(tiny):
    model, prompt = tiny
    return cp.generate(model, prompt, NEW, "torch")


def _close(got, want, atol, what):
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=atol, msg=f"{what}, step {i}")


def test_book_backend_generates_the_torch_tokens(tiny, torch_run):
    """Greedy, float32: the same 8 tokens for both sequences, logits within fp32 rounding. The
    smallest top-1 margin is asserted too, so that equal tokens are not an accident of ties."""
    model, prompt = tiny
    want_tokens, want_logits = torch_run
    tokens, logits = cp.generate(model, prompt, NEW, "book")
    assert torch.equal(tokens, want_tokens)
    _close(logits, want_logits, 2e-5, "book vs torch")
    margin = min(float((lg.topk(2).values[:, 0] - lg.topk(2).values[:, 1]).min())
                 for lg in want_logits)
    assert margin > 1e-3


def test_cached_decode_equals_the_whole_sequence_without_a_cache(tiny, torch_run):
    """Each decode step's logits equal those of the model run on the prompt and the tokens so far
    with no cache (a RoPE position or a cache write off by one breaks this); the contiguous cache
    gives the paged cache's tokens and logits."""
    model, prompt = tiny
    tokens, logits = torch_run
    with torch.no_grad():
        full = model(torch.cat([prompt, tokens], dim=1))
    s = prompt.shape[1]
    _close(logits, [full[:, s - 1 + i] for i in range(NEW)], 1e-5, "cached vs uncached")
    c_tokens, c_logits = cp.generate(model, prompt, NEW, "torch", cache="contiguous")
    assert torch.equal(c_tokens, tokens)
    _close(c_logits, logits, 1e-6, "contiguous vs paged")


def test_paged_decode_kernel_matches_the_contiguous_cache(tiny):
    """The book backend (paged kernel) scored on a given continuation (teacher forcing) against the
    torch backend on a contiguous cache: the same logits at every step."""
    model, prompt = tiny
    forced = torch.randint(cp.TINY.vocab, (2, NEW), generator=torch.Generator().manual_seed(5))
    forced = forced.to(DEVICE)
    got = cp.generate(model, prompt, NEW, "book", forced=forced)
    want = cp.generate(model, prompt, NEW, "torch", cache="contiguous", forced=forced)
    assert torch.equal(got[0], forced) and torch.equal(want[0], forced)
    _close(got[1], want[1], 2e-5, "paged kernel vs contiguous")


def test_layers_allocate_in_lockstep(tiny):
    """One copy of the block tables serves every layer: the layers' tables are equal."""
    model, prompt = tiny
    kv = cp.ModelCache(model, 2)
    with torch.no_grad():
        cp.prefill(model, torch.cat([prompt] * 4, dim=1), "torch", kv)   # 20 tokens: 2 blocks
    tables = [c.tables for c in kv.layers]
    assert all(t == tables[0] for t in tables) and len(tables[0][0]) == 2
    assert kv.length == 20


def test_bulk_append_is_paged_kv_caches_append(tiny):
    """ModelCache writes a batch's new tokens with one indexed copy; PagedKVCache.append, token by
    token, gives the same blocks, tables, lengths and storage: a 20-token prompt, then 13 single
    tokens (crossing two block boundaries). Past its room, a clear error and nothing written."""
    model, _ = tiny
    cfg = model.cfg
    kv = cp.ModelCache(model, 2, max_len=40)
    c = kv.layers[0]
    ref = PagedKVCache(c.allocator.num_blocks, c.block_size, cfg.n_kv_heads, cfg.head_dim,
                       c.max_blocks_per_seq, device=DEVICE)
    for s in range(2):
        ref.add_sequence(s)
    gen = torch.Generator().manual_seed(0)
    for t in [20] + [1] * 13:
        k, v = (torch.randn(2, t, cfg.n_kv_heads, cfg.head_dim, generator=gen).to(DEVICE)
                for _ in range(2))
        kv.append(0, k, v)
        for b in range(2):
            for i in range(t):
                ref.append(b, k[b, i], v[b, i])
    assert c.tables == ref.tables and c.length == ref.length == {0: 33, 1: 33}
    assert torch.equal(c.k, ref.k) and torch.equal(c.v, ref.v)
    k = torch.zeros(2, 16, cfg.n_kv_heads, cfg.head_dim, device=DEVICE)
    with pytest.raises(ValueError, match="would pass its 3 blocks of 16"):
        kv.append(0, k, k)
    assert c.length == {0: 33, 1: 33}


def test_sampling_is_seeded(tiny):
    """Temperature 1: the same seed gives the same tokens (and the book backend the torch
    backend's), another seed other tokens."""
    model, prompt = tiny
    a = cp.generate(model, prompt, NEW, "torch", temperature=1.0, seed=3)[0]
    assert torch.equal(a, cp.generate(model, prompt, NEW, "torch", temperature=1.0, seed=3)[0])
    assert not torch.equal(a, cp.generate(model, prompt, NEW, "torch", temperature=1.0,
                                          seed=4)[0])
    assert torch.equal(a, cp.generate(model, prompt, NEW, "book", temperature=1.0, seed=3)[0])


def test_profile_has_every_component(tiny):
    """The profile's structure (on a CPU the times are wall clock and mean nothing for a GPU)."""
    model, _ = tiny
    totals = cp.profile_decode(model, batch=1, context=4, backend="torch", steps=2, warmup=1)
    assert set(totals) == {"embed", "norm", "qkv", "rope", "cache", "attention", "o_proj", "mlp",
                           "swiglu", "lm_head"}
    assert all(v > 0 for v in totals.values())
    table = cp.format_profile(totals)
    assert table.splitlines()[-1].startswith("step") and "attention" in table


def test_config_sizes():
    """The parameter counts the chapter quotes."""
    assert 120e6 < cp.SMALL.n_params() < 130e6
    assert 7.9e9 < cp.LLAMA_8B.n_params() < 8.1e9          # Llama 3 8B: 8.03e9
    assert 1.4e9 < cp.LLAMA_1B.n_params() < 1.6e9          # 1.24e9 with the head tied to embed


BAD_CONFIGS = [
    (dict(n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
    (dict(dim=30, n_heads=4), "multiple of n_heads"),
    (dict(dim=36, n_heads=4, n_kv_heads=2), "must be even"),
    (dict(n_layers=0), "n_layers must be >= 1"),
    (dict(rope_base=1.0), "rope_base"),
]


@pytest.mark.parametrize("change, message", BAD_CONFIGS)
def test_bad_config_raises(change, message):
    base = dict(vocab=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq=64)
    with pytest.raises(ValueError, match=message):
        cp.Config(**{**base, **change})


def test_bad_arguments_raise(tiny, monkeypatch):
    """Refused before any kernel runs: every Triton op of the book backend is replaced by one that
    fails the test if called."""
    model, prompt = tiny

    def boom(*args, **kwargs):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setitem(cp.OPS, "book", dict.fromkeys(cp.OPS["book"], boom))
    with pytest.raises(TypeError, match="n_heads must be a Python int"):
        cp.Config(vocab=64, dim=32, n_layers=2, n_heads=2.0, n_kv_heads=1, ffn_dim=64,
                  max_seq=64)
    odd = cp.Llama(cp.Config(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=16,
                             max_seq=16), device=DEVICE)
    with pytest.raises(ValueError, match="head_dim in"):
        cp.generate(odd, prompt, 2, "book")
    cases = [
        (dict(backend="tritonn"), ValueError, "backend must be one of"),
        (dict(prompt=prompt + 100), ValueError, r"token ids must be in \[0, 64\)"),
        (dict(prompt=prompt.int()), TypeError, "int64"),
        (dict(prompt=prompt[0]), ValueError, "2-D"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
        (dict(max_new_tokens=70), ValueError, "exceed max_seq"),
        (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
        (dict(cache="ring"), ValueError, "kind must be one of"),
        (dict(forced=prompt), ValueError, "forced must have shape"),
    ]
    for change, error, message in cases:
        args = dict(model=model, prompt=prompt, max_new_tokens=4, backend="book")
        with pytest.raises(error, match=message):
            cp.generate(**{**args, **change})
    with pytest.raises(ValueError, match="book backend reads a paged cache"):
        cp.decode_step(model, prompt[:, 0], cp.ModelCache(model, 2, "contiguous"), "book")


# ---------------------------------------------------------------- the prefill as an op

PREFILL = cp.capstone_prefill
CPU_VERSIONS = [v for v, impl in PREFILL.impls.items() if impl.runs_on("cpu")]


def _prefill_args(size, dtype=torch.float32, seed=0):
    return PREFILL.make_inputs(size, dtype, DEVICE, torch.Generator().manual_seed(seed))


@pytest.mark.op("capstone_prefill")
@pytest.mark.parametrize("size", PREFILL.test_sizes, ids=lambda s: f"b{s['b']}-s{s['s']}")
@pytest.mark.parametrize("version", CPU_VERSIONS)
def test_prefill_versions_match_the_reference(version, size):
    """float32: each version's last-position logits (B, 1, vocab) within the op's tolerance of the
    float64 reference, written out independently of the backends (poisoned outputs, shape and
    dtype checked by the harness's comparison)."""
    assert_matches_reference(PREFILL, PREFILL.impls[version], _prefill_args(size), torch.float32,
                             size)


@pytest.mark.op("capstone_prefill")
@pytest.mark.parametrize("size", PREFILL.test_sizes, ids=lambda s: f"b{s['b']}-s{s['s']}")
def test_prefill_book_equals_torch_and_the_whole_forward(size):
    """float32: the book's kernels give the torch backend's logits to fp32 rounding, and both are
    the last column of the whole sequence's logits (the model's forward: every position's head),
    so ``last_only`` drops nothing but the other positions."""
    model, tokens, embed = _prefill_args(size)
    book = cp.prefill_book(model, tokens, embed)
    torch_ = cp.prefill_torch(model, tokens, embed)
    with torch.no_grad():
        whole = model(tokens)[:, -1:]
    assert book.shape == (size["b"], 1, cp.TINY.vocab)
    torch.testing.assert_close(book, torch_, rtol=0, atol=2e-5)
    # 1e-5: the head's product has B rows here and B x S there (cuBLAS may sum in another order)
    torch.testing.assert_close(torch_, whole, rtol=0, atol=1e-5)


def _non_causal(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


@pytest.mark.op("capstone_prefill")
def test_prefill_comparison_catches_a_missing_causal_mask(monkeypatch):
    """The last position attends to every token either way, but the first layer's earlier
    positions feed the second layer's keys and values: attention without its mask must fail the
    comparison with the reference (the test above can fail)."""
    size = PREFILL.test_sizes[1]
    args = _prefill_args(size)
    monkeypatch.setitem(cp.OPS["torch"], "prefill_attention", _non_causal)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_matches_reference(PREFILL, PREFILL.impls["v0"], args, torch.float32, size)


@pytest.mark.op("capstone_prefill")
def test_compiled_prefill_is_one_graph():
    """v1's function under torch.compile, checked without Inductor (which needs a GPU here):
    Dynamo traces the whole pass as one graph with no break, and AOTAutograd's graph (backend
    "aot_eager") gives v0's logits."""
    model, tokens, embed = _prefill_args(PREFILL.test_sizes[1])
    want = cp.prefill_torch(model, tokens, embed)
    with torch.no_grad():
        explained = torch._dynamo.explain(cp._torch_prefill)(model, tokens)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        got = torch.compile(cp._torch_prefill, backend="aot_eager", dynamic=False)(model, tokens)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.op("capstone_prefill")
def test_prefill_cost_model():
    """FLOPs: torch's FlopCounterMode counts the torch backend's products, with attention over the
    whole S x S square (the mask is applied after), and the LM head once per prompt; the model
    counts the causal half (S (S + 1) / 2 pairs), and decode_model counts the norm gains among
    the weights (2 FLOPs per gain per token). Bytes: every weight but the embedding table once,
    each token's embedding row and K and V, in the dtype's bytes."""
    from torch.utils.flop_counter import FlopCounterMode

    size = {"config": "tiny", "b": 3, "s": 9}
    model, tokens, embed = _prefill_args(size)
    c, (b, s) = cp.TINY, (3, 9)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        cp.prefill_torch(model, tokens, embed)
    attention = 4 * c.n_layers * c.dim * b                # q.k and p.v per (query, key) pair
    gains = (2 * c.n_layers + 1) * c.dim
    want = counter.get_total_flops() - attention * s * s + attention * s * (s + 1) // 2
    assert PREFILL.flops(size, torch.float32) == want + 2 * gains * b * s
    kv = c.n_layers * 2 * c.n_kv_heads * c.head_dim      # K and V elements per token
    weights = c.n_params() - c.vocab * c.dim
    want = (weights + b * s * c.dim) * 2 + b * s * kv * 2
    assert PREFILL.bytes_moved(size, torch.bfloat16) == want


@pytest.mark.op("capstone_prefill")
def test_prefill_op_refuses_bad_input(monkeypatch):
    """Refused with a clear exception before any kernel runs (every op of both backends is
    replaced by one that fails the test if called): a prompt past max_seq, int32 ids, a 1-D
    prompt, an embedding table that is not the model's, a head_dim FlashAttention lacks (book);
    with grad mode on, an embedding table or a model weight that requires grad."""
    model, tokens, embed = _prefill_args(PREFILL.test_sizes[0])

    def boom(*args, **kwargs):
        raise AssertionError("a kernel was launched for bad input")

    for backend in cp.BACKENDS:
        monkeypatch.setitem(cp.OPS, backend, dict.fromkeys(cp.OPS[backend], boom))
    long = torch.zeros(1, cp.TINY.max_seq + 1, dtype=torch.long, device=DEVICE)
    odd = cp.Llama(cp.Config(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=16,
                             max_seq=16), device=DEVICE)
    cases = [
        ((model, long, embed), ValueError, "exceeds max_seq"),
        ((model, tokens.int(), embed), TypeError, "int64"),
        ((model, tokens[0], embed), ValueError, "2-D"),
        ((model, tokens, embed.clone()), ValueError, "model's own embedding"),
        ((model, tokens, embed.detach().requires_grad_()), RuntimeError, "grad"),
        (("model", tokens, embed), TypeError, "must be a Llama"),
    ]
    for fn in (cp.prefill_torch, cp.prefill_book):
        for args, error, message in cases:
            with pytest.raises(error, match=message):
                fn(*args)
    with pytest.raises(ValueError, match="head_dim in"):
        cp.prefill_book(odd, tokens[:, :3] % 16, odd.embed)
    model.lm_head.requires_grad_(True)
    try:
        with pytest.raises(RuntimeError, match="grad"):
            cp.prefill_torch(model, tokens, embed)
    finally:
        model.lm_head.requires_grad_(False)


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_small_model_bf16():
    """~125M parameters, bf16, a batch of 4 prompts of 100 tokens, 32 new tokens. The torch
    backend's greedy continuation in fp32 is scored by both backends in bf16 (teacher forcing, so
    one flipped token does not make the rest differ): the book's largest logit error against fp32
    is at most twice the torch backend's bf16 error plus a little; wherever the fp32 top-1 margin
    exceeds twice that error the book picks the fp32 token; and the two bf16 backends pick the
    same token at three steps in four or more. Random logits of 32000 tokens have near-ties (the
    expected gap between the top two of n standard normals is about 1 / sqrt(2 ln n), a fifth of
    a logit here), so a bf16 rounding flips some ties; that is the reason for the last bound."""
    cfg, n = cp.SMALL, 32
    prompt = torch.randint(cfg.vocab, (4, 100), generator=torch.Generator().manual_seed(0))
    prompt = prompt.cuda()
    ref = cp.Llama(cfg, seed=0, dtype=torch.float32, device="cuda")
    tokens, want = cp.generate(ref, prompt, n, "torch")
    del ref
    model = cp.Llama(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    _, book = cp.generate(model, prompt, n, "book", forced=tokens)
    _, torch_bf16 = cp.generate(model, prompt, n, "torch", forced=tokens)
    want, book, torch_bf16 = (torch.stack(x).float() for x in (want, book, torch_bf16))
    assert not book.isnan().any()
    err_book = (book - want).abs().max().item()
    err_torch = (torch_bf16 - want).abs().max().item()
    assert err_book <= 2 * err_torch + 0.05, (err_book, err_torch)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * err_book
    assert torch.equal(book.argmax(-1)[clear], want.argmax(-1)[clear])
    agree = (book.argmax(-1) == torch_bf16.argmax(-1)).float().mean().item()
    assert agree >= 0.75, agree


@pytest.mark.gpu
@pytest.mark.op("capstone_prefill")
def test_gpu_prefill_llama_1b_bf16():
    """The op's headline (Llama 3.2 1B's shapes, random weights, bf16, one prompt of 2048 tokens):
    every version within the op's bf16 tolerance of the float64 reference, and the book's largest
    error at most twice the eager torch backend's plus a little (FlashAttention's rule for a
    kernel against PyTorch at the same precision)."""
    op = PREFILL
    args = op.make_inputs(op.headline, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ref = op.reference_fp64(args)
    rtol, atol = op.tolerance(torch.bfloat16)
    err = {}
    for v, impl in op.impls.items():
        out = impl.fn(*args)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape, (v, out.dtype, out.shape)
        assert not out.isnan().any(), v
        torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol,
                                   msg=lambda m, v=v: f"{v}: {m}")
        err[v] = (out.double() - ref).abs().max().item()
    assert err["v2"] <= 2 * err["v0"] + 0.05, err
