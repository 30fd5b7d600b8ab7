"""Expert parallelism: a mixture-of-experts MLP whose experts live on different ranks, from
scratch.

A mixture-of-experts layer replaces one MLP by E of them (the *experts*) and a *router*, a linear
map from a token to E scores. Each token goes to the k experts of highest softmax probability
(k = 1: the Switch Transformer, Fedus et al. 2021; k = 2: GShard, Lepikhin et al. 2020), and the
layer's output for the token is the gate-weighted sum of those experts' outputs. The parameters
grow with E; the work per token does not.

- ``route`` is the router's decision, shared by both layers below: top-k, softmax gates, a
  capacity of ceil(capacity_factor * k * T / E) tokens per expert (assignments beyond it are
  dropped and counted: a dropped token's output is zero, and the residual connection carries it),
  and Switch's load-balancing loss.
- ``MoE`` is the single-process layer. Capacity is decided per *group* of tokens: its ``groups``
  cut the tokens into that many equal groups, as GShard does per device.
- ``ExpertParallelMoE`` keeps E / p experts on each of the p ranks and the router on all of them.
  Each rank routes its own tokens (one group), sends each kept token to the rank of its expert with
  one ``all_to_all_single`` of variable split sizes (the counts go first, so that every rank knows
  what it will receive), runs its experts, and sends the results back with a second one.

With the same weights, ``ExpertParallelMoE`` on p ranks gives what ``MoE(groups=p)`` gives on the
concatenation of their tokens: the same outputs and the same gradients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7.collectives import agree
from snippets.part7.launch import device_for
from snippets.part7.models import DIM, VOCAB, lm_loss, tiny_batch


def _positive_int(name: str, value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}")
    return value


# --8<-- [start:route]
class Routing(NamedTuple):
    token: torch.Tensor    # (N,) the token of each kept assignment, sorted by expert
    expert: torch.Tensor   # (N,) its expert (ascending)
    gate: torch.Tensor     # (N,) its gate, differentiable with respect to the router
    counts: torch.Tensor   # (E,) kept assignments per expert
    dropped: int           # assignments beyond an expert's capacity
    aux: torch.Tensor      # Switch's load-balancing loss, a scalar


def expert_capacity(tokens: int, experts: int, k: int, capacity_factor: float | None) -> int:
    """Slots per expert: ceil(capacity_factor * k * tokens / experts), the even share times the
    factor; no limit (``tokens``: an expert sees a token at most once) when the factor is None."""
    if capacity_factor is None:
        return tokens
    return math.ceil(capacity_factor * k * tokens / experts)


def route(logits: torch.Tensor, k: int, capacity_factor: float | None) -> Routing:
    """The router's decision for T tokens from their (T, E) scores.

    Gates: the softmax probabilities of the top k experts; for k > 1 renormalised to sum to 1 over
    the k. Priority: every token's first choice before any token's second, in token order, so a
    full expert turns away second choices first. Load balance: E * sum_e f_e P_e with f_e the
    fraction of the k T assignments that chose expert e (before dropping) and P_e the mean router
    probability of e; it is 1 when both are uniform, and its gradient (through P) pushes the
    probabilities of overloaded experts down."""
    tokens, experts = logits.shape
    probs = logits.softmax(-1)
    top_p, top_e = probs.topk(k, dim=-1)                                   # (T, k)
    gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    expert = top_e.t().reshape(-1)                      # (k T,): all first choices, then seconds
    token = torch.arange(tokens, device=logits.device).repeat(k)
    gate = gates.t().reshape(-1)
    chose = F.one_hot(expert, experts)                                     # (k T, E)
    slot = (chose.cumsum(0) * chose).sum(1) - 1         # how many came to this expert before
    keep = slot < expert_capacity(tokens, experts, k, capacity_factor)
    kept = keep.nonzero().squeeze(1)
    kept = kept[torch.sort(expert[kept], stable=True).indices]   # by expert, priority kept
    f = chose.sum(0).to(probs.dtype) / (k * tokens)
    aux = experts * (f * probs.mean(0)).sum()
    return Routing(token[kept], expert[kept], gate[kept],
                   torch.bincount(expert[kept], minlength=experts), int((~keep).sum()), aux)


def combine(tokens: int, routing: Routing, y: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over t's kept assignments of gate * expert output; rows of ``y`` in the
    order of ``routing``. A token whose every assignment was dropped gets zeros."""
    weighted = routing.gate.unsqueeze(1) * y
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, weighted)
# --8<-- [end:route]


class Expert(nn.Module):
    """One expert: the transformer's MLP, W_down gelu(W_up x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def _check_input(x, dim: int, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{where}: x must be a floating-point tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1 or x.shape[-1] != dim:
        raise ValueError(f"{where}: x must be (..., {dim}), got {tuple(x.shape)}")
    return x.reshape(-1, dim)


# --8<-- [start:moe]
class MoE(nn.Module):
    """The single-process mixture-of-experts layer over (..., dim) tokens. ``groups``: the tokens
    are cut into that many equal groups, each routed with its own capacity and load-balancing
    loss (the group a rank holds under expert parallelism). After a forward, ``aux_loss`` is the
    mean of the groups' load-balancing losses and ``dropped`` the number of dropped assignments."""

    def __init__(self, dim: int, hidden: int, experts: int, k: int = 1,
                 capacity_factor: float | None = None, groups: int = 1):
        super().__init__()
        for name, value in (("dim", dim), ("hidden", hidden), ("experts", experts), ("k", k),
                            ("groups", groups)):
            _positive_int(name, value, "MoE")
        if k > experts:
            raise ValueError(f"MoE: k={k} is more than the {experts} experts")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"MoE: capacity_factor must be > 0 or None, got {capacity_factor!r}")
        self.dim, self.k, self.capacity_factor, self.groups = dim, k, capacity_factor, groups
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        self.aux_loss: torch.Tensor | None = None
        self.dropped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _check_input(x, self.dim, "MoE")
        if flat.shape[0] == 0 or flat.shape[0] % self.groups:
            raise ValueError(f"MoE: {flat.shape[0]} tokens do not cut into {self.groups} equal "
                             "non-empty groups")
        outs, auxes, self.dropped = [], [], 0
        for g in flat.chunk(self.groups):
            r = route(self.router(g), self.k, self.capacity_factor)
            per_expert = r.token.split(r.counts.tolist())        # kept tokens, expert by expert
            y = torch.cat([expert(g[t]) for expert, t in zip(self.experts, per_expert)])
            outs.append(combine(g.shape[0], r, y))
            auxes.append(r.aux)
            self.dropped += r.dropped
        self.aux_loss = torch.stack(auxes).mean()
        return torch.cat(outs).view_as(x)
# --8<-- [end:moe]


# --8<-- [start:all_to_all]
class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with variable split sizes, differentiable: row block i of the input
    goes to rank i (``send`` rows), row block j of the output comes from rank j (``recv`` rows).
    The gradient goes back the same way with the two lists swapped."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None
# --8<-- [end:all_to_all]


# --8<-- [start:expert_parallel]
class ExpertParallelMoE(nn.Module):
    """``moe``'s router on every rank and experts [r E/p, (r + 1) E/p) on rank r; every other
    expert is dropped. Each rank's tokens are one group. Call on every rank of ``group``."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ExpertParallelMoE: no process group: call "
                               "dist.init_process_group first (or run under run_world)")
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        if len(moe.experts) % p:
            raise ValueError(f"ExpertParallelMoE: {len(moe.experts)} experts do not split over "
                             f"{p} ranks (experts must be a multiple of the world size)")
        self.group, self.p, self.dim = group, p, moe.dim
        self.k, self.capacity_factor = moe.k, moe.capacity_factor
        self.num_experts, self.local = len(moe.experts), len(moe.experts) // p
        self.first = rank * self.local
        self.router = moe.router
        self.experts = nn.ModuleList(moe.experts[self.first:self.first + self.local])
        self.aux_loss: torch.Tensor | None = None
        self.dropped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _check_input(x, self.dim, "ExpertParallelMoE")
        everyone = agree("ExpertParallelMoE", self.group,
                          (None if flat.shape[0] else "no tokens", str(x.dtype), (self.dim,)))
        if len({d[2] for d in everyone}) > 1:
            raise ValueError("ExpertParallelMoE: every rank must build the layer with one dim, "
                             f"got {[d[2] for d in everyone]}")
        r = route(self.router(flat), self.k, self.capacity_factor)
        self.aux_loss, self.dropped = r.aux, r.dropped
        # 1. counts first: rank s learns how many rows each rank sends to each of its experts
        counts = r.counts.to(flat.device)
        incoming = torch.empty_like(counts)
        dist.all_to_all_single(incoming, counts, group=self.group)    # E / p counts per rank
        send = counts.view(self.p, self.local).sum(1).tolist()
        recv = incoming.view(self.p, self.local).sum(1).tolist()
        # 2. dispatch: the kept tokens, sorted by expert, hence by the rank that owns it
        received = AllToAll.apply(flat[r.token], send, recv, self.group)
        # rows from rank s come expert by expert: regroup them by local expert, run each
        which = torch.arange(self.local, device=flat.device).repeat(self.p)
        expert_of_row = which.repeat_interleave(incoming)
        order = torch.sort(expert_of_row, stable=True).indices
        rows = received[order].split(incoming.view(self.p, self.local).sum(0).tolist())
        y = torch.cat([expert(part) for expert, part in zip(self.experts, rows)])
        y = y[torch.argsort(order)]                      # back to the order they arrived in
        # 3. combine: the results go home, in the order the tokens left
        back = AllToAll.apply(y, recv, send, self.group)
        return combine(flat.shape[0], r, back).view_as(x)
# --8<-- [end:expert_parallel]


def a2a_bytes(tokens: int, dim: int, k: int, itemsize: int, p: int) -> int:
    """Bytes one rank sends in one MoE layer's forward when its ``tokens`` tokens and their k
    choices spread evenly over the experts and nothing is dropped: the dispatch and the combine
    each send k T d elements, all but the 1/p that stays home."""
    return 2 * (p - 1) * k * tokens * dim * itemsize // p


# --------------------------------------------------------------------------------------------------
# A small model with an MoE layer, trained on one process or with expert parallelism
# --------------------------------------------------------------------------------------------------

class MoELM(nn.Module):
    """Embedding, one pre-norm MoE block x + MoE(LayerNorm(x)), a final LayerNorm and a head."""

    def __init__(self, moe: MoE, vocab: int = VOCAB, dim: int = DIM):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.moe = moe
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.moe(self.norm1(x))
        return self.head(self.norm(x))


def moe_lm(seed: int, dtype: torch.dtype = torch.float32, experts: int = 4, k: int = 1,
           capacity_factor: float | None = None, groups: int = 1) -> MoELM:
    """A ``MoELM`` (dim 32, experts of hidden size 64) whose weights depend only on ``seed``."""
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"moe_lm: dtype must be float32 or float64, got {dtype}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MoELM(MoE(DIM, 2 * DIM, experts, k, capacity_factor, groups))
    return model.to(dtype)


def global_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name (CPU copies), an ``ExpertParallelMoE``'s experts under
    their global index, as in the single-process model."""
    out = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if "experts" in parts:
            at = parts.index("experts") + 1
            owner = model.get_submodule(".".join(parts[:at - 1]))
            parts[at] = str(int(parts[at]) + getattr(owner, "first", 0))
        out[".".join(parts)] = p.detach().cpu().clone()
    return out


# --8<-- [start:train_moe]
def train_moe(rank: int, world_size: int, steps: int = 10, dtype: torch.dtype = torch.float64,
              k: int = 1, capacity_factor: float | None = None, experts: int = 4,
              global_batch: int = 8, seq_len: int = 8, aux_weight: float = 0.01,
              lr: float = 0.05, seed: int = 0, groups: int = 1) -> dict:
    """Train ``moe_lm(seed)`` for ``steps`` SGD steps (momentum 0.9) on the loss lm_loss +
    aux_weight * load-balancing loss. With a process group: data parallel over the batch (rank r
    takes its ``tensor_split`` shard) and expert parallel over the experts; each rank's loss is
    divided by p, the replicated parameters' gradients are summed over the ranks, and each expert's
    gradient, which the all-to-all's backward already summed over every rank's tokens, is left
    alone. Without one: ``MoE(groups=groups)`` in one process on the whole batch.

    Returns ``{"loss", "dropped", "params"}``: the global loss and the dropped assignments (summed
    over the ranks) at every step, and ``global_parameters`` of this rank's model."""
    distributed = dist.is_available() and dist.is_initialized()
    if global_batch % world_size:
        raise ValueError(f"train_moe: global_batch={global_batch} must split into {world_size} "
                         "equal shards")
    device = device_for(rank) if distributed else "cpu"
    model = moe_lm(seed, dtype, experts, k, capacity_factor, 1 if distributed else groups)
    if distributed:
        model.moe = ExpertParallelMoE(model.moe)
    model.to(device)
    replicated = [p for n, p in model.named_parameters() if ".experts." not in n]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, dropped = [], []
    for step in range(steps):
        tokens, targets = (t.tensor_split(world_size)[rank].to(device)
                           for t in tiny_batch(step, global_batch, seq_len))
        opt.zero_grad()
        loss = (lm_loss(model, tokens, targets) + aux_weight * model.moe.aux_loss) / world_size
        loss.backward()
        stats = torch.tensor([loss.item(), model.moe.dropped], dtype=torch.float64, device=device)
        if distributed:
            flat = torch.cat([p.grad.reshape(-1) for p in replicated])
            dist.all_reduce(flat)
            for p, summed in zip(replicated, flat.split([p.numel() for p in replicated])):
                p.grad.copy_(summed.view_as(p))
            dist.all_reduce(stats)
        opt.step()
        losses.append(stats[0].item())
        dropped.append(int(stats[1]))
    return {"loss": losses, "dropped": dropped, "params": global_parameters(model)}
# --8<-- [end:train_moe]


def check_expert_parallel(rank: int, world_size: int, dtype: torch.dtype = torch.float64,
                          k: int = 1, capacity_factor: float | None = None,
                          experts: int = 8) -> dict:
    """The one-process ``MoE(groups=p)`` on every rank's tokens, then ``ExpertParallelMoE`` built
    from it on this rank's 12 tokens, both differentiated through sum(out * do) + aux / 2.
    Returns the largest differences of the output, the input's gradient, the router's gradient
    (summed over the ranks), this rank's experts' gradients and the load-balancing loss (the
    ranks' mean), and (dropped on all ranks, dropped by the reference). Made for ``run_world``
    and ``torchrun``."""
    p, device = world_size, device_for(rank)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        moe = MoE(16, 24, experts, k, capacity_factor, groups=p).to(device, dtype)
    g = torch.Generator().manual_seed(4)
    x, do = (torch.randn(12 * p, 16, generator=g, dtype=dtype).to(device) for _ in range(2))
    x_ref = x.clone().requires_grad_()
    y_ref = moe(x_ref)
    ((y_ref * do).sum() + 0.5 * moe.aux_loss).backward()
    ref_grads = {n: w.grad.clone() for n, w in moe.named_parameters()}
    ref_aux, ref_dropped = moe.aux_loss.item(), moe.dropped
    moe.zero_grad()
    ep = ExpertParallelMoE(moe)
    x_mine = x.tensor_split(p)[rank].clone().requires_grad_()
    y = ep(x_mine)
    ((y * do.tensor_split(p)[rank]).sum() + 0.5 * ep.aux_loss / p).backward()
    dist.all_reduce(ep.router.weight.grad)                # the replicated router: sum the shares
    stats = torch.tensor([ep.aux_loss.item() / p, ep.dropped], dtype=torch.float64,
                         device=device)
    dist.all_reduce(stats)

    def diff(a, b) -> float:
        return float((a.detach() - b.detach()).abs().max())

    return {"y": diff(y, y_ref.tensor_split(p)[rank]),
            "dx": diff(x_mine.grad, x_ref.grad.tensor_split(p)[rank]),
            "router": diff(ep.router.weight.grad, ref_grads["router.weight"]),
            "experts": max(diff(w.grad, ref_grads[f"experts.{ep.first + i}.{n}"])
                           for i, e in enumerate(ep.experts) for n, w in e.named_parameters()),
            "aux": abs(stats[0].item() - ref_aux),
            "dropped": (int(stats[1]), ref_dropped), "local experts": len(ep.experts)}


def main() -> None:
    """``torchrun --nproc-per-node P -m snippets.part7.expert_parallel``: the expert-parallel
    layer against the one-process one, k = 1 and 2, with and without dropping; rank 0 prints."""
    from snippets.part7.launch import init_from_env

    rank, world_size = init_from_env()
    worst = 0.0
    for k in (1, 2):
        for capacity_factor in (None, 0.5):
            out = check_expert_parallel(rank, world_size, torch.float64, k, capacity_factor,
                                        experts=2 * world_size)
            errs = {n: out[n] for n in ("y", "dx", "router", "experts", "aux")}
            worst = max(worst, *errs.values())
            if rank == 0:
                print(f"k={k} capacity={capacity_factor} dropped={out['dropped']} "
                      + " ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    dist.destroy_process_group()
    if worst > 1e-12:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
