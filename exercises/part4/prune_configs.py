"""part4.autotuning.7: Prune the search space before anything compiles

Chapter: docs/part4/autotuning.md, exercise 7. Difficulty 2 of 4 (write a few lines).

Write the chapter's pruning rule in the form triton.autotune calls it,
early_config_prune(configs, named_args, **kwargs): keep, in their order, the triton.Config objects
whose shared-memory estimate num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K x itemsize fits in
SMEM_LIMIT (itemsize: the element size of the tensor a_ptr), then drop among those a block larger
than its dimension rounded up to a power of two (at least 16), and more stages than the K loop has
iterations, except that the smallest BLOCK_M, BLOCK_N, BLOCK_K and num_stages of the configurations
that fit always pass the shape rule. Raise ValueError when nothing fits. smem_bytes(cfg, itemsize)
is the estimate. The tuner at the bottom of the file calls your function.

Check it:  python -m snippets exercise check part4.autotuning.7
(--solution checks the reference solution; exercise show part4.autotuning.7 gives the hint)
"""

import torch
import triton
import triton.language as tl

SMEM_LIMIT = 227 * 1024  # bytes one block may use on compute capability 9.0, after opting in


def smem_bytes(cfg: triton.Config, itemsize: int) -> int:
    """The pipeline's shared memory: num_stages buffers, each holding a BLOCK_M x BLOCK_K tile of A
    and a BLOCK_K x BLOCK_N tile of B, of itemsize bytes an element."""
    raise NotImplementedError("YOUR CODE HERE")


def early_config_prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The configurations worth compiling for this call, the same Config objects in their order.
    named_args holds the kernel's arguments by name: the tensor named_args["a_ptr"], the sizes
    named_args["M"], ["N"], ["K"]."""
    # YOUR CODE HERE: the resource rule, then the shape rule (the smallest values of what fits survive it)
    raise NotImplementedError("YOUR CODE HERE")


# ---------------------------------------------------------------------------------------------------
# Given: a tuner that calls early_config_prune. Its kernel does no GEMM; it writes the tile it was
# compiled with, so that the check sees which configuration the autotuner launched.
@triton.jit
def which_config_kernel(a_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tl.store(out_ptr + 0, BLOCK_M)
    tl.store(out_ptr + 1, BLOCK_N)
    tl.store(out_ptr + 2, BLOCK_K)


def make_tuner(configs: list[triton.Config]):
    return triton.autotune(configs=configs, key=["M", "N", "K"],
                           prune_configs_by={"early_config_prune": early_config_prune})(which_config_kernel)


def launched_tile(tuner, a: torch.Tensor, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) of the configuration the tuner launched for an (m, n, k) call."""
    out = torch.zeros(3, dtype=torch.int32, device=a.device)
    tuner[(1,)](a, out, m, n, k)
    return tuple(int(v) for v in out.tolist())
