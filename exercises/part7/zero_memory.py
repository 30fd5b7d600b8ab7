"""part7.sharding.7: Memory per rank under ZeRO and FSDP

Chapter: docs/part7/sharding.md, exercise 7. Difficulty 1 of 4 (fill one line).

Write zero_memory(n_params, world_size, stage): the bytes per rank of the parameters, the gradients
and the optimizer state when n_params parameters train on world_size data-parallel ranks with ZeRO
stage 0 (everything replicated), 1 (optimizer state sharded), 2 (and the gradients) or 3 (and the
parameters: FSDP's full sharding). Mixed-precision Adam: 2 bytes per parameter, 2 per gradient and
12 of optimizer state (fp32 master weight, momentum, variance); a shard holds ceil(n / world_size)
elements. Return {"params", "grads", "optimizer", "total"}.

Check it:  python -m snippets exercise check part7.sharding.7
"""


def zero_memory(n_params: int, world_size: int, stage: int, param_bytes: int = 2,
                grad_bytes: int = 2, optim_bytes: int = 12) -> dict:
    """Bytes per rank, by kind, and their total."""
    raise NotImplementedError("YOUR CODE HERE")
