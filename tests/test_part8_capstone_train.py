"""capstone_train: the capstone's loss and gradients (snippets.part8.capstone_train).

On a CPU (Triton's interpreter, float32): the book's step (Part 5's RMSNorm, RoPE, SwiGLU and
FlashAttention backward passes, the fused linear cross-entropy) and the eager step against float64,
every weight's gradient; the five weights the op returns are the ones it names; the fused loss does
not go through F.cross_entropy; a few steps of AdamW on one batch make its loss fall, on both backends; bad input is
refused. On a GPU: bf16 at the small model's widths against float64 (v0, v2, v3), and v3's CUDA graphs
following a new batch and in-place optimiser updates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE
from snippets.part8 import capstone as cp
from snippets.part8 import capstone_train as ct

pytestmark = pytest.mark.op("capstone_train")


def _batch(cfg, b, s, seed=0, device=DEVICE):
    seq = torch.randint(cfg.vocab, (b, s + 1), generator=torch.Generator().manual_seed(seed))
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _all_grads_ref(model, tokens, targets):
    """Every weight's gradient in float64 through plain autograd on the torch backend's ops."""
    ws = [w.detach().double().requires_grad_() for w in ct.weight_list(model)]
    hs = ct.hidden_states(ct.Tables(model, torch.float64), ws, tokens, cp.OPS["torch"])
    loss = F.cross_entropy((hs @ ws[-1].T).flatten(0, 1), targets.flatten())
    return (loss.detach(), *torch.autograd.grad(loss, ws))


@pytest.mark.parametrize("b, s", [(2, 5), (1, 37)])
@pytest.mark.parametrize("loss_fn", [ct.loss_book, ct.loss_torch], ids=["book", "torch"])
def test_every_gradient_matches_float64(b, s, loss_fn):
    model = cp.Llama(cp.TINY, seed=b + s, device=DEVICE)
    tokens, targets = _batch(cp.TINY, b, s, seed=s, device=DEVICE)
    loss, *grads = ct.loss_and_grads(model, tokens, targets, loss_fn)
    ref_loss, *ref = _all_grads_ref(model, tokens, targets)
    assert len(grads) == len(ref) == 3 + 9 * cp.TINY.n_layers
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * float(ref_loss)
    for i, (g, r) in enumerate(zip(grads, ref)):
        assert g.dtype == torch.float32 and g.shape == r.shape
        assert _rel(g, r) < 1e-5, f"weight {i}: relative error {_rel(g, r):.2e}"


def test_the_op_returns_the_weights_it_names():
    model = cp.Llama(cp.TINY, seed=3, device=DEVICE)
    ws = ct.weight_list(model)
    by_name = dict(zip(ct.CHECKED, (ws[i] for i in ct.checked_indices(cp.TINY.n_layers))))
    assert by_name["embed"] is model.embed and by_name["lm_head"] is model.lm_head
    assert by_name["norm"] is model.norm
    assert by_name["layers.0.wq"] is model.layers[0].wq
    assert by_name["layers.-1.wd"] is model.layers[-1].wd
    tokens, targets = _batch(cp.TINY, 2, 5, device=DEVICE)
    out = ct.train_torch(model, tokens, targets, model.embed)
    _, *grads = ct.loss_and_grads(model, tokens, targets, ct.loss_torch)
    assert len(out) == 1 + len(ct.CHECKED)
    for o, i in zip(out[1:], ct.checked_indices(cp.TINY.n_layers)):
        assert torch.allclose(o, grads[i], rtol=0, atol=0)


def test_the_fused_loss_does_not_go_through_f_cross_entropy(monkeypatch):
    """loss_book reaches the loss without F.cross_entropy (the fp32 log-probabilities the eager
    step saves for its backward): it is made to fail, and loss_book still gives the eager loss."""
    model = cp.Llama(cp.TINY, seed=4, device=DEVICE)
    tokens, targets = _batch(cp.TINY, 2, 9, device=DEVICE)
    eager = ct.loss_torch(model, ct.weight_list(model), tokens, targets)

    def refuse(*a, **k):
        raise AssertionError("F.cross_entropy called: the logits were built")
    monkeypatch.setattr(F, "cross_entropy", refuse)
    fused = ct.loss_book(model, ct.weight_list(model), tokens, targets)
    assert abs(float(fused) - float(eager)) < 1e-5 * float(eager)


@pytest.mark.parametrize("backend, steps", [("torch", 10), ("book", 3)])
def test_a_few_steps_on_one_batch_make_the_loss_fall(backend, steps):
    model = cp.Llama(cp.TINY, seed=1, device=DEVICE)
    tokens, targets = _batch(cp.TINY, 2, 8, seed=3, device=DEVICE)
    before = [w.detach().clone() for w in ct.weight_list(model)]
    losses = ct.train(model, tokens, targets, steps=steps, lr=3e-2, backend=backend)
    assert len(losses) == steps
    first = losses[:5]   # the first steps each lower it (later, Adam may overshoot near zero)
    assert all(b < a for a, b in zip(first, first[1:])), losses
    assert losses[-1] < losses[0] / (5 if steps >= 10 else 1.5), losses
    # the weights were updated in place, every one of them
    assert all(not torch.equal(b, w) for b, w in zip(before, ct.weight_list(model)))


def test_bad_input_is_refused():
    model = cp.Llama(cp.TINY, seed=0, device=DEVICE)
    tokens, targets = _batch(cp.TINY, 2, 5, device=DEVICE)
    embed = model.embed

    def step(m, t, y, e=embed):
        return ct.train_torch(m, t, y, e)
    with pytest.raises(TypeError, match="capstone Llama"):
        step(object(), tokens, targets)
    with pytest.raises(TypeError, match="int64"):
        step(model, tokens.float(), targets)
    with pytest.raises(TypeError, match=r"\(B, S\)"):
        step(model, tokens[0], targets[0])
    with pytest.raises(ValueError, match="one non-empty"):
        step(model, tokens, targets[:, :4])
    with pytest.raises(ValueError, match="token ids"):
        step(model, tokens, targets + cp.TINY.vocab)
    with pytest.raises(ValueError, match="max_seq"):
        long = torch.zeros(1, cp.TINY.max_seq + 1, dtype=torch.int64, device=DEVICE)
        step(model, long, long)
    with pytest.raises(ValueError, match="own embedding"):
        step(model, tokens, targets, embed.clone())
    # the step returns gradients itself: a weight autograd tracks would have them dropped
    model.layers[0].wq.requires_grad_(True)
    with pytest.raises(RuntimeError, match="grad"):
        step(model, tokens, targets)
    model.layers[0].wq.requires_grad_(False)
    with pytest.raises(ValueError, match="steps"):
        ct.train(model, tokens, targets, steps=0)
    with pytest.raises(ValueError, match="backend"):
        ct.train(model, tokens, targets, steps=1, backend="jax")
    with pytest.raises(ValueError, match="n_layers"):
        ct.checked_indices(0)


def test_the_check_catches_a_wrong_gradient():
    """check_train (the harness's check of this op) fails an output whose one gradient is off."""
    model = cp.Llama(cp.TINY, seed=5, device=DEVICE)
    op_args = (model, *_batch(cp.TINY, 2, 5, device=DEVICE), model.embed)
    out = list(ct.train_torch(*op_args))
    ct.check_train(tuple(out), op_args, torch.float32)
    out[3] = out[3] * 1.001
    with pytest.raises(AssertionError, match="layers.-1.wd"):
        ct.check_train(tuple(out), op_args, torch.float32)


def test_flops_count_three_passes():
    from snippets.part8 import decode_model as dm
    size = {"config": "small", "b": 4, "s": 1024}
    one = dm.prefill_flops(cp.decoder_config(size, torch.bfloat16), 1024)
    assert ct.capstone_train.flops(size, torch.bfloat16) == 3 * 4 * one


def test_the_graphed_step_refuses_a_cpu_model():
    model = cp.Llama(cp.TINY, seed=1)
    tokens, targets = _batch(cp.TINY, 1, 5, device="cpu")
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA GPU"):
        ct.train(model, tokens, targets, steps=1, backend="graph")
    with pytest.raises(ValueError, match="CUDA graphs"):
        ct.train_book_graphed(model, tokens, targets, model.embed)


@pytest.mark.gpu
def test_the_graphed_step_follows_new_batches_and_updated_weights():
    """v3 replays graphs captured on the first call: a second batch of the same shape, and the
    weights after an optimiser step, must give v2's loss and gradients (fp32, the same kernels),
    and the caller's first tokens must not be overwritten by the second batch."""
    model = cp.Llama(cp.SMALL, seed=5, device="cuda")
    first = _batch(cp.SMALL, 2, 64, seed=1, device="cuda")
    kept = first[0].clone()

    def same(a, b):
        for i, (x, y) in enumerate(zip(a, b)):
            assert _rel(x, y) < 1e-5, f"output {i}: {_rel(x, y):.2e}"

    same(ct.train_book_graphed(model, *first, model.embed), ct.train_book(model, *first, model.embed))
    second = _batch(cp.SMALL, 2, 64, seed=2, device="cuda")
    g3 = [g.clone() for g in ct.train_book_graphed(model, *second, model.embed)]
    same(g3, ct.train_book(model, *second, model.embed))
    assert torch.equal(first[0], kept)
    ct.train(model, *first, steps=2, lr=1e-3, backend="graph")   # in-place AdamW updates
    same(ct.train_book_graphed(model, *second, model.embed), ct.train_book(model, *second, model.embed))


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v0", "v2", "v3"])
def test_bf16_at_the_small_models_widths(version):
    """Every block of the 125M model in bf16, 512 tokens: the loss and the five gradients within the
    op's bf16 tolerance of float64."""
    op = ct.capstone_train
    args = op.make_inputs({"config": "small", "b": 1, "s": 512}, torch.bfloat16, "cuda",
                          torch.Generator().manual_seed(7))
    ct.check_train(op.impls[version].fn(*args), args, torch.bfloat16)
