"""Leaving Python: the capstone's tiny model exported to ONNX (torch.onnx.export, the traced
exporter) and run by onnxruntime on the CPU gives PyTorch's logits within 1e-5 in float32, for
inputs other than the example the trace was taken with; the graph is well formed, holds the
operators the model is made of, and refuses a shape it was not exported for. Skipped, with the
reason, where onnx or onnxruntime is not installed (they are in the ``test`` extra)."""

from __future__ import annotations

import pytest
import torch

from snippets.part8 import capstone as cp
from snippets.part8 import export_onnx as ex

pytestmark = pytest.mark.skipif(ex.missing() is not None, reason=str(ex.missing()))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = cp.Llama(cp.TINY, seed=0)
    path = ex.export(model, tmp_path_factory.mktemp("onnx") / "tiny.onnx", batch=2, seq_len=8)
    return model, path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_onnxruntime_matches_pytorch(exported, seed):
    """Random token ids (the trace saw only zeros): logits within 1e-5 of PyTorch's in fp32."""
    model, path = exported
    tokens = torch.randint(cp.TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(seed))
    got = torch.from_numpy(ex.run_onnxruntime(path, tokens))
    with torch.no_grad():
        want = model(tokens)
    assert got.shape == (2, 8, cp.TINY.vocab)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert ex.compare(model, path, tokens) <= 1e-5


def test_graph_holds_the_model(exported):
    """Per layer: seven weight products, the two attention products, and the LM head's; one
    softmax per layer; the causal mask as a Trilu/Where; the embedding as a Gather."""
    _, path = exported
    ops = ex.graph_ops(path)
    layers = cp.TINY.n_layers
    assert ops["MatMul"] == 9 * layers + 1
    assert ops["Softmax"] == layers
    assert ops.get("Gather", 0) >= 1 and ops.get("Where", 0) == layers


def test_bad_input_raises(exported, tmp_path):
    model, path = exported
    with pytest.raises(ValueError, match="exported for tokens of shape"):
        ex.run_onnxruntime(path, torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds max_seq"):
        ex.export(model, tmp_path / "x.onnx", seq_len=cp.TINY.max_seq + 1)
    with pytest.raises(TypeError, match="must be a Llama"):
        ex.export(torch.nn.Linear(2, 2), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="batch must be >= 1"):
        ex.export(model, tmp_path / "x.onnx", batch=0)
