"""part7.data-parallel.7: Gradient buckets for DDP

Chapter: docs/part7/data-parallel.md, exercise 7. Difficulty 2 of 4 (write a few lines).

Write assign_buckets(params, bucket_bytes): the indices of params grouped into buckets, taken in the
reverse of the given order (the order in which the backward produces the gradients, roughly). A new
bucket starts when the next parameter would take the current one past bucket_bytes, or when its
dtype differs from the bucket's; a parameter larger than bucket_bytes gets a bucket of its own.

Check it:  python -m snippets exercise check part7.data-parallel.7
"""

import torch


def assign_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Buckets of indices into params, the first bucket holding the last parameters."""
    raise NotImplementedError("YOUR CODE HERE")
