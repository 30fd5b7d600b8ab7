"""The capstone's decode step with its state on the device (StaticDecoder), and the op
``capstone_decode`` that times it.

On a CPU (Triton's interpreter for the book backend, tiny models, float32): the static step gives
:func:`decode_step`'s logits step after step for both backends; its cache holds the same K and V
as the ModelCache, read through its own (scattered) block tables; a fixed-position step writes
one slot per sequence and layer and can be repeated with the same logits and cache; bad input is
refused before anything changes. On a GPU: a captured graph's replays give the eager static
step's and decode_step's logits, at a tiny config and at Llama 3.2 1B's shapes with random
weights, and the op's graph versions equal its eager ones."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE
from snippets.part8 import capstone as cp
from snippets.part8 import decode_model as dm

# float32, two paths that sum in different orders (the torch backend's attention here and in
# decode_step; the book's against the torch backend's): within a few roundings of logits of order
# one on a CPU; on a GPU, SDPA's and cuBLAS's fp32 kernels add their own orders.
ATOL = 2e-6 if DEVICE == "cpu" else 5e-5


@pytest.fixture(scope="module")
def tiny():
    model = cp.Llama(cp.TINY, seed=0, device=DEVICE)
    prompt = torch.randint(cp.TINY.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, prompt.to(DEVICE)


def _gathered(k: torch.Tensor, tables: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` cached tokens of every sequence, (B, n, Hkv, D), read through ``tables``."""
    at = torch.arange(n)
    rows = tables.long().cpu()[:, at // cp.BLOCK_SIZE] * cp.BLOCK_SIZE + at % cp.BLOCK_SIZE
    return k.flatten(0, 1)[rows.to(k.device)]


@pytest.mark.op("capstone_decode")
@pytest.mark.parametrize("backend", cp.BACKENDS)
def test_static_step_is_decode_step(tiny, backend):
    """Prefill, then greedy steps with the position advanced on the device: every step's logits
    equal decode_step's on a ModelCache (the book backend runs the same kernels on the same
    values: equal to rounding; the torch backend's attention is SDPA here, the reference loop
    there). The steps cross the first block's end (positions 5 .. 22, blocks of 16)."""
    model, prompt = tiny
    n = 18
    kv = cp.ModelCache(model, 2, max_len=prompt.shape[1] + n)
    dec = cp.StaticDecoder(model, 2, prompt.shape[1] + n, backend)
    with torch.no_grad():
        want = cp.prefill(model, prompt, backend, kv, last_only=True)[0][:, -1]
    got = dec.prefill(prompt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    tok = want.argmax(-1)
    for i in range(n):
        with torch.no_grad():
            want = cp.decode_step(model, tok, kv, backend)
        got = dec.step(tok)
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=lambda m: f"step {i}: {m}")
        assert dec.length == kv.length == prompt.shape[1] + i + 1
        assert int(dec.pos) == dec.length
        tok = want.argmax(-1)
    tables = torch.tensor([kv.layers[0].tables[s] for s in kv.seqs], dtype=torch.int32)
    for layer in range(model.cfg.n_layers):
        c = kv.layers[layer]
        for mine, theirs in ((dec.k[layer], c.k), (dec.v[layer], c.v)):
            torch.testing.assert_close(_gathered(mine, dec.tables, kv.length),
                                       _gathered(theirs, tables, kv.length), rtol=0, atol=ATOL)


@pytest.mark.op("capstone_decode")
def test_tables_are_scattered_and_complete(tiny):
    """Every block of the cache belongs to exactly one sequence, reserved up front, and not in
    order (a step that ignored the tables and read blocks in order would fail the test above)."""
    model, _ = tiny
    dec = cp.StaticDecoder(model, 3, 40)
    assert tuple(dec.tables.shape) == (3, 3) and dec.tables.dtype == torch.int32
    assert sorted(dec.tables.flatten().tolist()) == list(range(9))
    assert dec.tables.flatten().tolist() != list(range(9))
    assert tuple(dec.k.shape) == (model.cfg.n_layers, 9, cp.BLOCK_SIZE, 1, 16)


@pytest.mark.op("capstone_decode")
@pytest.mark.parametrize("backend", cp.BACKENDS)
def test_fixed_position_is_idempotent(tiny, backend):
    """Two fixed-position steps: the same logits, the position unchanged, and the cache changed
    only in the new token's row of each sequence in each layer (its slot from the tables), the
    same after the second call as after the first."""
    model, prompt = tiny
    dec = cp.StaticDecoder(model, 2, 24, backend, fixed_position=True)
    dec.prefill(prompt)
    tok = torch.tensor([3, 60], device=DEVICE)
    k0, v0 = dec.k.clone(), dec.v.clone()
    a = dec.step(tok)
    k1, v1 = dec.k.clone(), dec.v.clone()
    b = dec.step(tok)
    assert torch.equal(a, b) and torch.equal(dec.k, k1) and torch.equal(dec.v, v1)
    assert dec.length == int(dec.pos) == prompt.shape[1]
    n = prompt.shape[1]
    rows = (dec.tables.long()[:, n // cp.BLOCK_SIZE] * cp.BLOCK_SIZE + n % cp.BLOCK_SIZE)
    changed = (k1 != k0).any(-1).any(-1).flatten(1, 2)                 # (layers, rows)
    want = torch.zeros_like(changed)
    want[:, rows] = True
    assert torch.equal(changed, want)
    assert torch.equal((v1 != v0).any(-1).any(-1).flatten(1, 2), want)
    # the step at that position of a decoder that advances: the same logits
    moving = cp.StaticDecoder(model, 2, 24, backend)
    moving.prefill(prompt)
    torch.testing.assert_close(moving.step(tok), a, rtol=0, atol=0)


@pytest.mark.op("capstone_decode")
def test_backends_share_one_cache(tiny):
    """with_backend: the book decoder over the torch decoder's cache and position gives the book
    backend's logits; its steps move the shared position."""
    model, prompt = tiny
    dec = cp.StaticDecoder(model, 2, 24, "torch")
    dec.prefill(prompt)
    book = dec.with_backend("book")
    assert book.k is dec.k and book.pos is dec.pos and dec.with_backend("book") is book
    alone = cp.StaticDecoder(model, 2, 24, "book")
    alone.prefill(prompt)
    tok = torch.tensor([7, 11], device=DEVICE)
    torch.testing.assert_close(book.step(tok), alone.step(tok), rtol=0, atol=1e-6)
    assert dec.length == book.length == 6 and int(dec.pos) == 6


@pytest.mark.op("capstone_decode")
def test_torch_step_reads_no_device_value_on_the_host(tiny):
    """What a capture needs, checked without a GPU: under FakeTensorMode (tensors with shapes and
    no values) any read of a value on the host (``.item()``, ``int(t)``, a boolean mask's count)
    raises. The torch backend's static step runs through it; decode_step does not (its token check
    and the cache's bookkeeping read values), which shows the check can fail."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    model, prompt = tiny
    for fixed in (True, False):
        dec = cp.StaticDecoder(model, 2, 24, "torch", fixed_position=fixed)
        dec.prefill(prompt)
        with FakeTensorMode(allow_non_fake_inputs=True):
            out = dec._step(torch.zeros(2, dtype=torch.long, device=DEVICE))
        assert tuple(out.shape) == (2, cp.TINY.vocab)
    kv = cp.ModelCache(model, 2, max_len=10)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        with pytest.raises(DataDependentOutputException):
            cp.decode_step(model, torch.zeros(2, dtype=torch.long, device=DEVICE), kv, "torch")


@pytest.mark.op("capstone_decode")
def test_compiled_step_is_one_graph(tiny):
    """v1's function under torch.compile, checked without Inductor (which needs a GPU here):
    Dynamo traces the whole step as one graph with no break, and AOTAutograd's functionalised
    graph (backend "aot_eager": the cache's in-place writes become copies written back) gives
    the eager step's logits and leaves the same cache."""
    model, prompt = tiny
    tok = torch.tensor([3, 60], device=DEVICE)
    eager, traced = (cp.StaticDecoder(model, 2, 24, "torch", fixed_position=True)
                     for _ in range(2))
    eager.prefill(prompt)
    traced.prefill(prompt)
    want = eager.step(tok)
    with torch.no_grad():
        explained = torch._dynamo.explain(cp._torch_step)(traced, tok)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        got = torch.compile(cp._torch_step, backend="aot_eager", dynamic=False)(traced, tok)
    torch._dynamo.reset()
    assert torch.equal(got, want)
    assert torch.equal(traced.k, eager.k) and torch.equal(traced.v, eager.v)


def _snapshot(dec):
    return dec.k.clone(), dec.v.clone(), dec.pos.clone(), dec.length


def test_bad_input_is_refused(tiny):
    """Refused with a clear error, the cache and the position untouched."""
    model, prompt = tiny
    dec = cp.StaticDecoder(model, 2, 8, "book")
    dec.prefill(prompt)
    before = _snapshot(dec)
    tok = torch.tensor([1, 2], device=DEVICE)
    cases = [
        (lambda: dec.step(tok[:1]), ValueError, "decoder's batch 2"),
        (lambda: dec.step(tok.int()), TypeError, "int64"),
        (lambda: dec.step(tok[:, None]), ValueError, r"shape \(batch,\)"),
        (lambda: dec.step(torch.empty(2, dtype=torch.long, device="meta")), ValueError,
         "tokens are on meta"),
        (lambda: dec.step(tok + 64), ValueError, r"token ids must be in \[0, 64\)"),
        (lambda: dec.prefill(prompt), ValueError, "already holds 5 tokens"),
        (lambda: dec.replay(tok), ValueError, "call capture"),
    ]
    if DEVICE == "cpu":
        cases.append((lambda: dec.capture(), ValueError, "CUDA graphs need the model on a CUDA"))
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    after = _snapshot(dec)
    assert all(torch.equal(x, y) for x, y in zip(before[:3], after[:3])) and after[3] == 5
    for _ in range(3):
        dec.step(tok)
    with pytest.raises(ValueError, match="position 8 is past max_len 8"):
        dec.step(tok)
    with pytest.raises(ValueError, match="max_len 9 exceeds max_seq 8"):
        cp.StaticDecoder(cp.Llama(cp.Config(vocab=16, dim=32, n_layers=1, n_heads=2,
                                            n_kv_heads=1, ffn_dim=16, max_seq=8),
                                  device=DEVICE), 1, 9)
    with pytest.raises(ValueError, match="position 8 is past max_len 6"):
        cp.StaticDecoder(model, 2, 6).prefill(torch.cat([prompt, prompt[:, :4]], 1))
    with pytest.raises(ValueError, match="backend must be one of"):
        cp.StaticDecoder(model, 2, 6, "numpy")
    with pytest.raises(TypeError, match="fixed_position must be a bool"):
        cp.StaticDecoder(model, 2, 6, fixed_position=1)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        cp.StaticDecoder(model, 0, 6)
    with pytest.raises(TypeError, match="draw_on_device must be a bool"):
        cp.Llama(cp.TINY, draw_on_device=1)


@pytest.mark.op("capstone_decode")
def test_op_versions_check_their_inputs():
    """The op's timed calls: a decoder that advances, a cache that is not the decoder's, and
    inputs autograd tracks are refused before anything runs."""
    op = cp.capstone_decode
    dec, tok, k, v = op.make_inputs(op.test_sizes[0], torch.float32, DEVICE,
                                    torch.Generator().manual_seed(0))
    for name in ("v0", "v2"):
        fn = op.impls[name].fn
        with pytest.raises(ValueError, match="k_cache must be the decoder's own"):
            fn(dec, tok, k.clone(), v)
        with pytest.raises(RuntimeError, match="grad"):
            fn(dec, tok, k.detach().requires_grad_(), v)
        moving = cp.StaticDecoder(dec.model, 2, 8)
        with pytest.raises(TypeError, match="fixed_position=True"):
            fn(moving, tok, moving.k, moving.v)
    out = op.impls["v2"].fn(dec, tok, k, v)
    torch.testing.assert_close(out, op.impls["v0"].fn(dec, tok, k, v), rtol=0, atol=ATOL)


@pytest.mark.op("capstone_decode")
def test_registration_and_cost_model():
    """Eight versions, five from the capstone's module, v5 from capstone_fused, v6 and v7 from
    capstone_block (graphs and torch.compile GPU-only, with their reasons); the bytes are
    decode_model's for the capstone's configuration, whose parameter count is the capstone's."""
    from snippets.part8 import capstone_block  # noqa: F401 (registers v5, v6 and v7, whichever ran first)

    op = cp.capstone_decode
    assert list(op.impls) == ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7"]
    assert [op.impls[v].origin for v in op.impls] == ["library", "library", "book", "book",
                                                      "library", "book", "book", "book"]
    assert {v for v in op.impls if op.impls[v].runs_on("cpu")} == {"v0", "v2"}
    if not torch.cuda.is_available():
        assert op.impls["v3"].unavailable() == "CUDA graphs need a CUDA GPU"
        assert op.impls["v5"].unavailable() == "CUDA graphs need a CUDA GPU"
        assert op.impls["v6"].unavailable() == "CUDA graphs need a CUDA GPU"
        assert op.impls["v7"].unavailable() == "CUDA graphs need a CUDA GPU"
    for size in [op.headline, *op.sweep]:
        cfg = cp.decoder_config(size, torch.bfloat16)
        assert dm.param_count(cfg) == cp.CONFIGS[size["config"]].n_params()
        assert op.bytes_moved(size, torch.bfloat16) == dm.decode_step_bytes(cfg, size["b"],
                                                                            size["ctx"])
    # Llama 3.2 1B's shapes, bf16, one sequence of 1024 tokens: the weights dominate the bytes
    b = op.bytes_moved(op.headline, torch.bfloat16)
    kv = 1025 * dm.kv_bytes_per_token(cp.decoder_config(op.headline, torch.bfloat16))
    assert kv < 0.02 * b


# ---------------------------------------------------------------- GPU

def _graph_vs_eager(cfg, batch, prompt_len, steps, dtype, same, other):
    """For both backends: a graph captured after the prefill, replayed ``steps`` times (each
    replay advances the position on the device), against the eager static step of another
    decoder (the same kernels: within ``same``, (rtol, atol)) and decode_step on a ModelCache
    (other ops in places: within ``other``), all fed the eager step's greedy tokens."""
    model = cp.Llama(cfg, seed=0, dtype=dtype, device="cuda")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(cfg.vocab, (batch, prompt_len), generator=gen).cuda()
    max_len = prompt_len + steps
    for backend in cp.BACKENDS:
        kv = cp.ModelCache(model, batch, max_len=max_len)
        eager = cp.StaticDecoder(model, batch, max_len, backend)
        graphed = cp.StaticDecoder(model, batch, max_len, backend)
        with torch.no_grad():
            tok = cp.prefill(model, prompt, backend, kv, last_only=True)[0][:, -1].argmax(-1)
        eager.prefill(prompt)
        graphed.prefill(prompt)
        graphed.capture()
        assert graphed.length == prompt_len and int(graphed.pos) == prompt_len
        for i in range(steps):
            with torch.no_grad():
                want = cp.decode_step(model, tok, kv, backend)
            e = eager.step(tok)
            g = graphed.replay(tok).clone()
            what = f"{backend}, step {i}"
            torch.testing.assert_close(g, e, rtol=same[0], atol=same[1],
                                       msg=lambda m: f"{what}, graph vs eager: {m}")
            torch.testing.assert_close(g, want, rtol=other[0], atol=other[1],
                                       msg=lambda m: f"{what}, graph vs decode_step: {m}")
            tok = e.argmax(-1)
        assert int(graphed.pos) == graphed.length == max_len


@pytest.mark.gpu
def test_gpu_graph_replay_tiny_fp32():
    """Tiny model, float32, 20 steps across a block's end: replays equal the eager static step
    and decode_step to fp32 rounding (a position baked into the graph at capture would rotate
    and write every later token wrongly, far outside this)."""
    _graph_vs_eager(cp.TINY, 2, 5, 20, torch.float32, (0, 1e-5), (0, 1e-4))


@pytest.mark.gpu
def test_gpu_graph_replay_llama_1b_bf16():
    """Llama 3.2 1B's shapes, random weights, bf16, two prompts of 100 tokens, 8 steps: the
    graph replays the eager step's kernels (within a bf16 rounding or two of logits of order
    one, should cuBLAS pick another algorithm on the capture's stream); decode_step differs in
    places (the torch backend's attention is the reference loop there), so it is held to the
    op's bf16 tolerance."""
    tol = cp.capstone_decode.tolerance(torch.bfloat16)
    _graph_vs_eager(cp.LLAMA_1B, 2, 100, 8, torch.bfloat16, (0.02, 0.05), tol)


@pytest.mark.gpu
@pytest.mark.op("capstone_decode")
def test_gpu_op_graphs_equal_eager():
    """The op at a ~125M model in bf16: v3 (book, graph) equals v2 (book, eager) and v4 (torch,
    graph) equals v0, call after call (fixed position); every version within the op's tolerance
    of the float64 reference."""
    op = cp.capstone_decode
    size = {"config": "small", "b": 4, "ctx": 100}
    args = op.make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ref = op.reference_fp64(args)
    outs = {v: op.impls[v].fn(*args).clone() for v in op.impls}
    for _ in range(2):
        torch.testing.assert_close(op.impls["v3"].fn(*args), outs["v2"], rtol=0.02, atol=0.05)
        torch.testing.assert_close(op.impls["v4"].fn(*args), outs["v0"], rtol=0.02, atol=0.05)
    rtol, atol = op.tolerance(torch.bfloat16)
    for v, out in outs.items():
        torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol,
                                   msg=lambda m: f"{v}: {m}")
