"""The shared support layer: what more than one chapter uses, so that each chapter module stands on
the foundation (``snippets.registry``, ``snippets._checks``, ``snippets.cuda``) and on this package,
never on another chapter.

- :mod:`snippets.common.baselines`: the library baselines (torch.compile, Liger-Kernel) and the
  gradient helper of every forward + backward version;
- :mod:`snippets.common.gemm`: the GEMM helpers of Parts 3 to 5 (operand checks, tolerances, tile
  order, config space and shared-memory pruning, the persistent TMA launcher);
- :mod:`snippets.common.rows`: the row kernels' launch configurations and checks (LayerNorm,
  RMSNorm, SwiGLU, cross-entropy);
- :mod:`snippets.common.dropout`: Philox in NumPy and the seeded dropout of Parts 4 and 5;
- :mod:`snippets.common.introspect`: compiling a Triton kernel for a GPU target without a GPU,
  and reading the result;
- :mod:`snippets.common.ceilings`: ceilings that ops of several chapters are compared against
  (registered with the registry when the module is imported);
- :mod:`snippets.common.inputs`: input patterns shared by several ops.
- :mod:`snippets.common.attention`: attention's reference, inputs, FLOP and byte counts and SDPA
  baselines (Part 5's FlashAttention and Part 6's Hopper and FP8 attention).

Importing any of them only defines things (and registers ceilings with the registry): no global
setting of torch, Triton or the environment changes until a function is called.
"""
