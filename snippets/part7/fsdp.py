"""PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on the book's tiny model: sharded
per block, with explicit prefetching of the next block's all-gather, optionally in mixed
precision; trained so that a test can compare it with one process, as the from-scratch ZeRO is.

Under torchrun on GPUs (NCCL) the same function runs unchanged:

    torchrun --nproc-per-node 4 -m snippets.part7.fsdp
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from snippets.part7.launch import device_for, init_from_env
from snippets.part7.models import lm_loss, tiny_batch, tiny_model


# --8<-- [start:shard]
def shard_model(model: nn.Module, prefetch: bool = True, mixed: bool = False,
                reshard_after_forward: bool = True) -> nn.Module:
    """``fully_shard`` each block, then the root (embedding, final norm, head). With ``prefetch``
    each block asks for the next block's all-gather in the forward and the previous block's in
    the backward, so that it is in flight while this block computes. ``mixed``: gather and
    compute in bf16, keep fp32 shards (the master weights) and reduce gradients in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if mixed else MixedPrecisionPolicy())
    # the mesh on the model's own device: left to itself, fully_shard picks CUDA whenever there is a
    # GPU, and would move a CPU model of gloo ranks there
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    blocks = list(model.blocks)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    if prefetch:
        for before, after in zip(blocks, blocks[1:]):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
    return model
# --8<-- [end:shard]


def train_fsdp2(rank: int, world_size: int, steps: int = 10, dtype: torch.dtype = torch.float64,
                prefetch: bool = True, mixed: bool = False, reshard_after_forward: bool = True,
                global_batch: int = 8, seq_len: int = 8, lr: float = 0.1, seed: int = 0) -> dict:
    """``tiny_model(seed)`` sharded with ``shard_model`` and trained for ``steps`` SGD steps
    (momentum 0.9), each rank on its shard of the global batch (the mean loss over it; FSDP2
    averages the gradients over the ranks). Returns the global mean loss of every step, the full
    parameters (gathered from the shards) and the bytes of parameters this rank holds."""
    if global_batch % world_size:
        raise ValueError(f"train_fsdp2: global_batch={global_batch} must split into "
                         f"{world_size} equal shards")
    device = device_for(rank)
    model = shard_model(tiny_model(seed, dtype).to(device), prefetch, mixed,
                        reshard_after_forward)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        tokens, targets = (t.tensor_split(world_size)[rank].to(device)
                           for t in tiny_batch(step, global_batch, seq_len))
        opt.zero_grad()
        loss = lm_loss(model, tokens, targets)
        loss.backward()
        opt.step()
        mean = loss.detach().to(dtype) / world_size
        dist.all_reduce(mean)
        losses.append(mean.item())
    params = [p.full_tensor().detach().cpu() for p in model.parameters()]
    held = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    return {"loss": losses, "params": params, "held_bytes": held,
            "dtypes": sorted({str(p.dtype) for p in model.parameters()})}


def main() -> None:
    """Under torchrun: FSDP2 with and without prefetching against one process on rank 0."""
    rank, world_size = init_from_env()
    runs = {"prefetch": train_fsdp2(rank, world_size, dtype=torch.float32),
            "no prefetch": train_fsdp2(rank, world_size, dtype=torch.float32, prefetch=False)}
    if rank == 0:
        model = tiny_model(0, torch.float32)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(10):
            opt.zero_grad()
            lm_loss(model, *tiny_batch(step, 8, 8)).backward()
            opt.step()
        for name, run in runs.items():
            worst = max((a - b.detach()).abs().max().item()
                        for a, b in zip(run["params"], model.parameters()))
            print(f"FSDP2 {name}: {world_size} ranks, largest parameter difference {worst:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
