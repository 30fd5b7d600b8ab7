"""Sharding the optimizer state, the gradients and the weights over the data-parallel ranks, from
scratch: ZeRO's stages 1, 2 and 3 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", 2020).

- ``zero_memory`` is the paper's accounting of the bytes per rank, stage by stage.
- ``ZeroOptimizer`` (stages 1 and 2) keeps every rank's full parameters, as data parallelism does,
  but each rank owns one contiguous shard of the flattened parameters and keeps optimizer state
  for that shard only. Stage 1 all-reduces the full gradients; stage 2 reduce-scatters them, so a
  rank keeps only its shard of the averaged gradient. After the step the updated shards are
  all-gathered into every rank's parameters.
- ``Zero3Module`` (stage 3) keeps only a shard of each unit's (top-level block's) parameters. A
  unit's full parameters are all-gathered just before its forward and dropped after it, gathered
  again in the backward, and the unit's gradients are reduce-scattered into the shard.
- ``measured_bytes`` counts what a rank actually holds, to check the accounting.

Everything here is meant to be read and tested on a CPU with gloo; it is correct rather than fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from snippets.part7.collectives import all_gather_tensor, reduce_scatter_tensor


def _count(name: str, value, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"zero_memory: {name} must be an int >= {least}, got {value!r}")
    return value


# --8<-- [start:memory]
def zero_memory(n_params: int, world_size: int, stage: int, param_bytes: int = 2,
                grad_bytes: int = 2, optim_bytes: int = 12) -> dict[str, int]:
    """Bytes per rank of the parameters, the gradients and the optimizer state when ``n_params``
    parameters are trained on ``world_size`` data-parallel ranks with ZeRO stage ``stage``.

    The defaults are the paper's mixed-precision Adam: fp16/bf16 parameters and gradients (2 bytes
    each) and K = 12 bytes of optimizer state per parameter (fp32 master weights, momentum and
    variance). With Psi = ``n_params``, Nd = ``world_size`` and a shard of ceil(Psi / Nd):

    - stage 0 (data parallelism): everything replicated: (2 + 2 + K) Psi;
    - stage 1 (optimizer state sharded): 2 Psi + 2 Psi + K Psi / Nd;
    - stage 2 (and the gradients): 2 Psi + (2 + K) Psi / Nd;
    - stage 3 (and the parameters): (2 + 2 + K) Psi / Nd.

    Activations, temporary buffers and the full parameters of the unit being computed (stage 3)
    are not counted. Returns ``{"params", "grads", "optimizer", "total"}``.
    """
    n = _count("n_params", n_params, 0)
    p = _count("world_size", world_size, 1)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise ValueError(f"zero_memory: stage must be 0, 1, 2 or 3, got {stage!r}")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                        ("optim_bytes", optim_bytes)):
        _count(name, value, 0)
    shard = -(-n // p)
    out = {"params": (shard if stage >= 3 else n) * param_bytes,
           "grads": (shard if stage >= 2 else n) * grad_bytes,
           "optimizer": (shard if stage >= 1 else n) * optim_bytes}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
# --8<-- [end:memory]


def measured_bytes(params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor | None],
                   optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes a rank holds, counted as numel * element_size: the given parameter and gradient
    tensors (None gradients count nothing) and every tensor of ``optimizer.state`` with at least
    one dimension (a 0-d ``step`` counter is a few bytes per tensor, not per parameter, and is left
    out, as the accounting leaves it out). Returns ``{"params", "grads", "optimizer", "total"}``."""
    def size(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    state = [t for s in optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor) and t.dim() >= 1]
    out = {"params": size(params), "grads": size(grads), "optimizer": size(state)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def _need_group(name: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{name}: no process group: call dist.init_process_group first "
                           "(or run under snippets.part7.launch.run_world)")


class ZeroOptimizer:
    """ZeRO stage 1 or 2 around ``module`` (a replica on every rank, broadcast from rank 0) and
    ``make_optimizer(params) -> torch.optim.Optimizer``, which is given one parameter: this rank's
    shard of the flattened parameters. Use it as an optimizer: ``zero_grad()``, ``backward()`` on
    the module's loss, ``step()``. At the end of every backward the gradients are averaged over
    the ranks (stage 1: all-reduce, each ``.grad`` keeps the full average; stage 2: reduce-scatter,
    the module's ``.grad`` are freed and only the shard's average is kept)."""

    def __init__(self, module: nn.Module, make_optimizer: Callable, stage: int = 1, group=None):
        _need_group("ZeroOptimizer")
        if stage not in (1, 2) or isinstance(stage, bool):
            raise ValueError(f"ZeroOptimizer: stage must be 1 or 2 (Zero3Module is stage 3), "
                             f"got {stage!r}")
        self.module, self.stage, self.group = module, stage, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        if len({p.dtype for p in self.params}) != 1:
            raise TypeError("ZeroOptimizer: every parameter must have one dtype (one flat buffer)")
        # --8<-- [start:zero1]
        # one flat buffer, padded to a multiple of p; every parameter becomes a view into it
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.world_size)
        ref = self.params[0]
        self.flat = torch.zeros(self.shard_numel * self.world_size, dtype=ref.dtype,
                                device=ref.device)
        self.offsets, start = [], 0
        with torch.no_grad():
            for p in self.params:
                view = self.flat[start:start + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view
                self.offsets.append(start)
                start += p.numel()
            dist.broadcast(self.flat, group=group, group_src=0)
        lo = self.rank * self.shard_numel
        # this rank's shard, a Parameter that shares the flat buffer's memory: the optimizer's
        # step writes straight into the module's parameters, and keeps state for the shard only
        self.shard = nn.Parameter(self.flat[lo:lo + self.shard_numel])
        self.optimizer = make_optimizer([self.shard])
        self.flat_grad: torch.Tensor | None = None
        self._pending = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def _on_grad(self, _param) -> None:
        if not self._pending:           # the first gradient of this backward
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _flat_grads(self) -> torch.Tensor:
        flat = torch.zeros_like(self.flat)          # padding, and unused parameters, add zeros
        for p, start in zip(self.params, self.offsets):
            if p.grad is not None:
                flat[start:start + p.numel()].copy_(p.grad.reshape(-1))
        return flat

    def _reduce(self) -> None:
        """After the backward: average the gradients; stage 1 keeps them all."""
        self._pending = False
        if self.stage == 2:
            self._reduce_scatter()
            return
        flat = self._flat_grads()
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        for p, start in zip(self.params, self.offsets):
            p.grad = flat[start:start + p.numel()].view_as(p)
        lo = self.rank * self.shard_numel
        self.shard.grad = flat[lo:lo + self.shard_numel]          # a view: no extra memory
        self.flat_grad = flat

    def step(self) -> None:
        """Step this rank's shard, then all-gather every rank's updated shard into the module."""
        self.optimizer.step()
        with torch.no_grad():
            all_gather_tensor(self.flat, self.shard.detach().clone(), group=self.group)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.shard.grad = None
        self.flat_grad = None
    # --8<-- [end:zero1]

    # --8<-- [start:zero2]
    def _reduce_scatter(self) -> None:
        """Stage 2: reduce-scatter the gradients so that this rank receives only the sum of its
        shard, then free the module's full gradients. (Here the full flat gradient exists for the
        length of one reduce-scatter; DeepSpeed reduce-scatters bucket by bucket during the
        backward, so at most a bucket of it exists at a time.)"""
        flat = self._flat_grads()
        for p in self.params:
            p.grad = None
        mine = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        reduce_scatter_tensor(mine, flat, group=self.group)
        self.shard.grad = mine.div_(self.world_size)
    # --8<-- [end:zero2]

    def memory(self) -> dict[str, int]:
        """``measured_bytes`` of this rank: the module's (full) parameters, the gradients it
        holds (stage 1: the module's full ``.grad``; stage 2: the shard's) and the optimizer's
        state."""
        grads = [p.grad for p in self.params] if self.stage == 1 else [self.shard.grad]
        return measured_bytes(self.params, grads, self.optimizer)


def _units(module: nn.Module) -> list[nn.Module]:
    """The module's children, with the children of a ``Sequential`` or ``ModuleList`` taken one by
    one: for TinyLM the embedding, each block, the final norm and the head."""
    out = []
    for child in module.children():
        if isinstance(child, (nn.Sequential, nn.ModuleList)):
            out.extend(_units(child))
        else:
            out.append(child)
    return out


# --8<-- [start:zero3]
class _GatheredForward(torch.autograd.Function):
    """Run unit ``i`` of a ``Zero3Module`` on ``x``: all-gather its parameters, run the forward
    without recording it, drop them. The backward all-gathers them again, recomputes the unit's
    forward with autograd on, backpropagates through it, and reduce-scatters the gradient of the
    full parameters into the gradient of this rank's shard (averaged over the ranks)."""

    @staticmethod
    def forward(ctx, x, shard, owner, i):
        full = owner.gather(i)
        with torch.no_grad():
            out = owner.run_unit(i, full, x)
        del full                                     # the unit's full parameters are freed here
        ctx.save_for_backward(x, shard)
        ctx.owner, ctx.i = owner, i
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, _ = ctx.saved_tensors
        owner, i = ctx.owner, ctx.i
        full = owner.gather(i).requires_grad_()      # gathered again for the backward
        x_in = x.detach().requires_grad_(x.is_floating_point() and ctx.needs_input_grad[0])
        with torch.enable_grad():
            out = owner.run_unit(i, full, x_in)
            inputs = [full, x_in] if x_in.requires_grad else [full]
            grads = torch.autograd.grad(out, inputs, grad_out)
        grad_shard = torch.empty_like(owner.shards[i])
        reduce_scatter_tensor(grad_shard, grads[0], group=owner.group)
        grad_shard.div_(owner.world_size)
        return (grads[1] if x_in.requires_grad else None), grad_shard, None, None


class Zero3Module(nn.Module):
    """ZeRO stage 3 around ``module``: the parameters of each unit (a child of the module, or of
    a ``Sequential`` child) are flattened, padded to a multiple of p and cut into p shards; this
    rank keeps only its shard, as a Parameter of this wrapper (give ``self.parameters()`` to the
    optimizer, which then keeps state for the shards only). The module's own parameters are
    removed. Each unit's forward is replaced by ``_GatheredForward``."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        _need_group("Zero3Module")
        self.module, self.group = module, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.units = _units(module)
        self.names: list[list[tuple[nn.Module, str, torch.Size]]] = []
        self.shards = nn.ParameterList()
        covered = set()
        for i, unit in enumerate(self.units):
            slots = [(mod, name, p) for mod in unit.modules()
                     for name, p in mod.named_parameters(recurse=False)]
            covered |= {id(p) for _, _, p in slots}
            flat = torch.cat([p.detach().reshape(-1) for _, _, p in slots])
            shard_numel = -(-flat.numel() // self.world_size)
            flat = torch.cat([flat, flat.new_zeros(shard_numel * self.world_size - flat.numel())])
            dist.broadcast(flat, group=group, group_src=0)
            lo = self.rank * shard_numel
            self.shards.append(nn.Parameter(flat[lo:lo + shard_numel].clone()))
            self.names.append([(mod, name, p.shape) for mod, name, p in slots])
            for mod, name, _ in slots:
                mod._parameters[name] = None              # the full parameter is gone
            unit.forward = lambda x, i=i: _GatheredForward.apply(x, self.shards[i], self, i)
        missing = [n for n, p in module.named_parameters() if id(p) not in covered]
        if missing:
            raise ValueError(f"Zero3Module: parameters outside every unit: {missing}")

    def gather(self, i: int) -> torch.Tensor:
        """Unit i's full flat parameters (padded), all-gathered from every rank's shard."""
        shard = self.shards[i].detach()
        full = shard.new_empty(shard.numel() * self.world_size)
        all_gather_tensor(full, shard, group=self.group)
        return full

    def run_unit(self, i: int, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Unit i's own forward with its parameters set to views of ``full``, then removed."""
        unit, start = self.units[i], 0
        for mod, name, shape in self.names[i]:
            mod._parameters[name] = full[start:start + shape.numel()].view(shape)
            start += shape.numel()
        try:
            return type(unit).forward(unit, x)
        finally:
            for mod, name, _ in self.names[i]:
                mod._parameters[name] = None

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
    # --8<-- [end:zero3]

    def full_parameters(self) -> list[torch.Tensor]:
        """Every parameter of the module, gathered, in the order of the module's own
        ``parameters()`` before it was wrapped (a collective: every rank must call it)."""
        out = []
        with torch.no_grad():
            for i in range(len(self.units)):
                full, start = self.gather(i), 0
                for _, _, shape in self.names[i]:
                    out.append(full[start:start + shape.numel()].view(shape).clone())
                    start += shape.numel()
        return out

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """``measured_bytes`` of this rank: its parameter shards, their gradients and the state
        ``optimizer`` keeps for them."""
        return measured_bytes(self.shards, [s.grad for s in self.shards], optimizer)
