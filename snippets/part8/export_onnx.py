"""Leaving Python: the capstone's model exported to ONNX and run by onnxruntime, without PyTorch.

``torch.onnx.export`` records the model's forward for one input shape (here a fixed batch and
sequence length: the whole-sequence forward of :class:`snippets.part8.capstone.Llama`, torch
backend, no cache) as an ONNX graph: operators (Gather, MatMul, Softmax, ...) and the weights as
initializers, in one file. onnxruntime loads that file and runs it with its own kernels; nothing
of Python's model code is needed any more.

Two exporters ship with torch. The TorchScript-based one (``dynamo=False``) traces the forward
with example inputs and needs only the ``onnx`` package; torch 2.9 made the torch.export-based one
(``dynamo=True``) the default, and it also needs ``onnxscript``. This module uses the traced
exporter, which the installed packages can run (torch warns that it is deprecated), and says so
where it calls it.

``onnx`` and ``onnxruntime`` are imported inside the functions: importing this module needs
neither, and :func:`missing` says which one a machine lacks.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import torch

from snippets._checks import check_int
from snippets.part8.capstone import Llama

OPSET = 17   # an opset every onnxruntime of the last years runs; LayerNorm-era ops suffice here


def missing() -> str | None:
    """None if onnx and onnxruntime can be imported, else which package is missing."""
    for name in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(name) is None:
            return f"the {name} package is not installed (pip install onnx onnxruntime)"
    return None


# --8<-- [start:export]
def export(model: Llama, path: str | Path, batch: int = 1, seq_len: int = 8,
           opset: int = OPSET) -> Path:
    """Write ``model``'s forward (tokens (batch, seq_len) int64 -> logits (batch, seq_len, vocab))
    to ``path`` as ONNX. The shapes are fixed: the trace records this batch and length, and the
    causal mask and RoPE rows as constants of that length."""
    if not isinstance(model, Llama):
        raise TypeError(f"export: model must be a Llama, got {type(model).__name__}")
    check_int("export: batch", batch, 1)
    check_int("export: seq_len", seq_len, 1)
    check_int("export: opset", opset, 7)
    if seq_len > model.cfg.max_seq:
        raise ValueError(f"export: seq_len {seq_len} exceeds max_seq {model.cfg.max_seq}")
    if model.embed.device.type != "cpu":
        raise ValueError(f"export: the model must be on the CPU, got {model.embed.device}")
    path = Path(path)
    example = torch.zeros(batch, seq_len, dtype=torch.long)
    with warnings.catch_warnings(), torch.no_grad():
        # the traced exporter: torch >= 2.9 marks it deprecated, but the torch.export-based one
        # (dynamo=True) needs onnxscript, which this environment does not install
        warnings.simplefilter("ignore", DeprecationWarning)
        # shapes read as Python numbers (the head dim in 1/sqrt(D)) become constants: intended,
        # the graph is for this one shape
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(model.eval(), (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=["tokens"], output_names=["logits"])
    return path
# --8<-- [end:export]


# --8<-- [start:run]
def run_onnxruntime(path: str | Path, tokens: torch.Tensor) -> np.ndarray:
    """The exported graph run by onnxruntime on the CPU: logits as a NumPy array."""
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path))            # a well-formed graph before running it
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = tuple(session.get_inputs()[0].shape)
    if tuple(tokens.shape) != want:
        raise ValueError(f"run_onnxruntime: the graph was exported for tokens of shape {want}, "
                         f"got {tuple(tokens.shape)}")
    return session.run(["logits"], {"tokens": tokens.numpy()})[0]


def compare(model: Llama, path: str | Path, tokens: torch.Tensor) -> float:
    """Largest absolute difference between onnxruntime's logits and PyTorch's for ``tokens``."""
    with torch.no_grad():
        want = model(tokens).numpy()
    got = run_onnxruntime(path, tokens)
    return float(np.abs(got - want).max())
# --8<-- [end:run]


def graph_ops(path: str | Path) -> dict[str, int]:
    """How many nodes of each operator type the exported graph holds."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
