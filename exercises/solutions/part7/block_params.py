"""part7.putting-it-together.8: The parameters of a block, whole and on one tensor-parallel rank

The reference solution.

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
    attention = 2 * h * h + 2 * h * kv_dim + 2 * h + 2 * kv_dim  # q and out are h x h, k and v h x kv_dim
    mlp = 2 * h * f + f + h
    norms = 2 * 2 * h  # a weight and a bias each
    return attention + mlp + norms


def llama_block_params(h: int, f: int, kv_dim: int) -> int:
    """A Llama-style block: no biases, RMSNorm weights only, gate, up and down matrices."""
    return 2 * h * h + 2 * h * kv_dim + 3 * h * f + 2 * h


def tp_block_params(h: int, f: int, kv_dim: int, t: int, arch: str) -> int:
    """One rank's share of a block under t-way tensor parallelism (t divides h, f and kv_dim)."""
    if arch == "gpt":
        column = (h * h + 2 * h * kv_dim + h * f) // t + (h + 2 * kv_dim + f) // t  # q, k, v, fc1: split
        row = (h * h + f * h) // t + 2 * h  # out and fc2: the weights split, their biases whole
        return column + row + 4 * h  # two LayerNorms, whole
    if arch == "llama":
        return (2 * h * h + 2 * h * kv_dim + 3 * h * f) // t + 2 * h  # every matrix split, the norms whole
    raise ValueError(f"arch must be 'gpt' or 'llama', got {arch!r}")
