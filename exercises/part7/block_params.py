"""part7.putting-it-together.8: The parameters of a block, whole and on one tensor-parallel rank

Chapter: docs/part7/putting-it-together.md, exercise 8. Difficulty 2 of 4 (write a few lines).

Count exactly, with h the width, f the MLP's width and kv_dim = n_kv * h / a the width of K and V:
gpt_block_params (LayerNorms with a bias, a bias on every Linear, q, k, v and the output
projection, a GELU MLP of two matrices), llama_block_params (two RMSNorms with a weight only, no
biases, a SwiGLU MLP of three matrices), and tp_block_params(h, f, kv_dim, t, arch): what one rank
of t-way tensor parallelism holds of a block, Megatron's split (q, k, v and the MLP's first
matrices by columns, with their biases; the output projections by rows, their biases whole on every
rank; the norms whole).

Check it:  python -m snippets exercise check part7.putting-it-together.8
"""


def gpt_block_params(h: int, f: int, kv_dim: int) -> int:
    """A GPT-style block: attention, MLP and two LayerNorms, biases everywhere."""
    raise NotImplementedError("YOUR CODE HERE")


def llama_block_params(h: int, f: int, kv_dim: int) -> int:
    """A Llama-style block: no biases, RMSNorm weights only, gate, up and down matrices."""
    raise NotImplementedError("YOUR CODE HERE")


def tp_block_params(h: int, f: int, kv_dim: int, t: int, arch: str) -> int:
    """One rank's share of a block under t-way tensor parallelism (t divides h, f and kv_dim)."""
    raise NotImplementedError("YOUR CODE HERE")
