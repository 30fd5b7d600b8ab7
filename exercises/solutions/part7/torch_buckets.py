"""part7.data-parallel.9: torch's bucket rule

The reference solution.

Chapter: docs/part7/data-parallel.md, exercise 9. Difficulty 2 of 4 (write a few lines).

Write torch_buckets(params, bucket_bytes): the indices of params (all of one dtype) grouped into
buckets in the reverse of the given order, by the rule of torch's DDP: a parameter joins the current
bucket, and the bucket is closed once its bytes have reached bucket_bytes, so a bucket may pass the
cap by its last parameter. The check compares it with torch's own assignment function.

Check it:  python -m snippets exercise check part7.data-parallel.9
"""

import torch


def torch_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Buckets of indices into params, the first bucket holding the last parameters."""
    buckets: list[list[int]] = []
    size = bucket_bytes  # "full": the first parameter opens a bucket
    for i in reversed(range(len(params))):
        if size >= bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += params[i].numel() * params[i].element_size()
    return buckets
