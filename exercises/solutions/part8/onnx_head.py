"""part8.leaving-python.6: The model's head as an ONNX graph, written by hand

The reference solution.

Chapter: docs/part8/leaving-python.md, exercise 6. Difficulty 3 of 4 (write most of it).

The capstone's decode step ends with its head: rmsnorm(x, model.norm) @ model.lm_head.T, from the
last hidden state (B, dim) to the logits (B, vocab). Write that head as an ONNX graph by hand, as
torch.onnx.export would: one input "x", float32 of shape (batch, dim) with the batch a symbolic
dimension (any batch runs), one output "logits" (batch, vocab), the two weights stored in the file
as initializers, opset OPSET (17, the book's), and RMSNorm from the operators the exporter writes
for it: Pow, ReduceMean, Add, Sqrt, Div, Mul. The check runs the graph with onnxruntime, as
written and optimised, and compares its logits with the capstone's within 1e-5.

Check it:  python -m snippets exercise check part8.leaving-python.6
"""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from snippets.part8.export_onnx import OPSET


def const(name: str, value) -> onnx.TensorProto:
    """An initializer: a float32 tensor stored in the file under ``name`` (a tensor, an array or a
    number; a number becomes a 0-d tensor, which broadcasts against anything)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return numpy_helper.from_array(np.array(value, dtype=np.float32, order="C"), name)


def head_graph(norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float) -> onnx.ModelProto:
    """norm_weight (dim,), lm_head (vocab, dim) as in the capstone's Llama. Returns the ONNX model
    of x (batch, dim) -> logits = rmsnorm(x, norm_weight, eps) @ lm_head.T (batch, vocab)."""
    dim, vocab = norm_weight.shape[0], lm_head.shape[0]
    weights = [const("norm_weight", norm_weight),
               const("lm_head_t", lm_head.T),        # MatMul is x @ B: B is (dim, vocab)
               const("two", 2.0), const("eps", eps)]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["x_sq"]),
        # opset 17: the axes are an attribute (opset 18 made them an input); keepdims=1 leaves
        # (batch, 1), which broadcasts against (batch, dim)
        helper.make_node("ReduceMean", ["x_sq"], ["mean_sq"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["mean_sq", "eps"], ["mean_sq_eps"]),
        helper.make_node("Sqrt", ["mean_sq_eps"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["x_normed"]),
        helper.make_node("Mul", ["x_normed", "norm_weight"], ["h"]),
        helper.make_node("MatMul", ["h", "lm_head_t"], ["logits"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", vocab])
    graph = helper.make_graph(nodes, "capstone_head", [x], [logits], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
