"""Data parallelism from scratch: ``BucketedDDP`` wraps a model so that every rank trains the same
replica on its own share of the batch and all ranks keep identical weights.

The idea fits in a sentence: after each backward, replace every gradient by its average over the
ranks (an all-reduce divided by p), and every rank's optimizer then takes the same step. What makes
it fast is *when* that happens and *in what units*:

- **Buckets.** One all-reduce per parameter would pay the latency alpha once per tensor (hundreds
  of times per step for a transformer); one all-reduce of everything would wait for the whole
  backward. Gradients are grouped into buckets of about ``bucket_bytes``, in the *reverse* order of
  ``module.parameters()``, which is roughly the order in which backward produces them.
- **Hooks.** A post-accumulate-grad hook on every parameter copies its gradient into its bucket as
  soon as autograd has written it; when a bucket is full its all-reduce is launched asynchronously
  (``async_op=True``), and the backward carries on computing the gradients of earlier layers while
  the bucket travels. Buckets are launched in bucket order on every rank, because all ranks must
  call their collectives in the same order.
- **Divide on the way in.** Each gradient is multiplied by 1/p as it is copied into its bucket,
  so the all-reduce's sum is already the average: no pass over the buckets after the backward.
- **Gradients live in the buckets.** Once a gradient has been copied into its bucket, ``.grad``
  becomes a view of that slice of the bucket: the all-reduce averages it in place, and nothing is
  copied back. The tensor autograd produced is freed, so the gradients take no memory beside the
  buckets.
- **The end of backward.** The first hook of a backward queues a callback on autograd's engine,
  which runs once the whole backward has finished: it launches what is left and waits for every
  bucket (on NCCL: makes the current stream wait), so the optimizer reads averages. (torch's DDP
  does all of this from C++.)
- **no_sync.** Inside ``with model.no_sync():`` the hooks do nothing and gradients accumulate
  locally; the first backward outside it all-reduces the accumulated sums. Gradient accumulation
  over k micro-batches thus costs one all-reduce, not k.

A parameter that received no gradient in a backward (unused on this rank) contributes zeros to its
bucket, which is launched at the end of backward; the result is the sum of the other ranks'
gradients divided by p, and it is this parameter's ``.grad`` all the same.

Differences from ``torch.nn.parallel.DistributedDataParallel``: torch's DDP makes its first bucket
small, by default copies every average back into a ``.grad`` of its own after the backward
(``gradient_as_bucket_view=True`` leaves views, as this class always does), rebuilds its buckets
after the first step
in the order in which gradients actually arrived, and handles sparse gradients, buffers, mixed
devices and many more cases.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

# torch's DDP's bucket_cap_mb default: a bucket of 25 MiB
DEFAULT_BUCKET_BYTES = 25 * 2**20


# --8<-- [start:buckets]
def assign_buckets(params: list[torch.Tensor], bucket_bytes: int,
                   close: str = "before") -> list[list[int]]:
    """Indices into ``params`` grouped into buckets, taken in the *reverse* of the given order (the
    order in which backward roughly produces the gradients). A change of dtype starts a new bucket.
    ``close="before"``: a new bucket starts when the next parameter would take the current one past
    ``bucket_bytes`` (a parameter larger than that gets a bucket of its own). ``close="after"``
    (torch's DDP's rule): a bucket is closed once it has reached ``bucket_bytes``, so it can pass
    the cap by its last parameter, and small parameters ride along with the next large one."""
    if bucket_bytes <= 0:
        raise ValueError(f"assign_buckets: bucket_bytes must be positive, got {bucket_bytes}")
    if close not in ("before", "after"):
        raise ValueError(f"assign_buckets: close must be 'before' or 'after', got {close!r}")
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        past = size >= bucket_bytes if close == "after" else size + nbytes > bucket_bytes
        if not buckets or past or params[i].dtype != dtype:
            buckets.append([])
            size, dtype = 0, params[i].dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


@dataclass
class Bucket:
    """Parameters whose gradients travel in one all-reduce, and one flat buffer for them."""
    params: list[nn.Parameter]
    offsets: list[int]                  # where each gradient starts in ``flat``
    flat: torch.Tensor                  # (sum of the parameters' numel,), their dtype
    arrived: list[bool] = field(default_factory=list)
    work: dist.Work | None = None       # the all-reduce in flight

    def full(self) -> bool:
        return all(self.arrived)
# --8<-- [end:buckets]


class BucketedDDP(nn.Module):
    """Data-parallel wrapper built on ``dist.all_reduce``: see the module's docstring.

    ``module``'s parameters and buffers are broadcast from rank 0 of ``group`` at construction, so
    every replica starts equal. ``loss.backward()`` on the wrapper's output leaves in every
    parameter's ``.grad`` the average over ranks of the local gradients, as torch's DDP does.
    ``log`` records, for the last backward, ``("grad", bucket)`` when a gradient arrives,
    ``("launch", bucket)`` when an all-reduce is launched and ``("end", -1)`` when the backward has
    finished: a launch before the last ``grad`` is communication overlapping computation.
    """

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, group=None,
                 close: str = "after"):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("BucketedDDP: no process group: call dist.init_process_group first "
                               "(or run under snippets.part7.launch.run_world)")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, group=group, group_src=0)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [self._bucket([params[i] for i in idx])
                        for idx in assign_buckets(params, bucket_bytes, close)]
        self.require_sync = True
        self.log: list[tuple[str, int]] = []
        self._next = 0              # the next bucket to launch: buckets go in order on every rank
        self._pending = False       # a synced backward is under way
        self._handles = []
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda param, b=b, i=i: self._on_grad(param, b, i)))

    @staticmethod
    def _bucket(params: list[nn.Parameter]) -> Bucket:
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        flat = torch.zeros(offsets[-1], dtype=params[0].dtype, device=params[0].device)
        return Bucket(params, offsets[:-1], flat, [False] * len(params))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # --8<-- [start:hooks]
    def _on_grad(self, param: nn.Parameter, b: int, i: int) -> None:
        """Autograd has just accumulated ``param.grad``: copy it into its bucket, and launch every
        bucket that is now full, in bucket order."""
        if not self.require_sync:
            return
        if not self._pending:       # the first gradient of this backward
            self._pending = True
            self.log = []
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)
        bucket = self.buckets[b]
        start = bucket.offsets[i]
        view = bucket.flat[start:start + param.numel()]
        # divide while copying: the all-reduce's sum is then the average (in place if .grad is
        # already this view: a zero_grad(set_to_none=False) keeps it)
        torch.mul(param.grad.reshape(-1), 1 / self.world_size, out=view)
        param.grad = view.view_as(param)    # the all-reduce will average .grad in place
        bucket.arrived[i] = True
        self.log.append(("grad", b))
        while self._next < len(self.buckets) and self.buckets[self._next].full():
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        bucket = self.buckets[b]
        bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self.log.append(("launch", b))
        self._next = b + 1

    def finish(self) -> None:
        """Runs when the backward has finished (queued by the first hook): launch what is left (a
        parameter that got no gradient gives zeros, and gets the average as its ``.grad`` too) and
        wait for every bucket. Does nothing if no synchronised backward is pending."""
        if not self._pending:
            return
        for b in range(self._next, len(self.buckets)):
            bucket = self.buckets[b]
            for i, p in enumerate(bucket.params):
                if not bucket.arrived[i]:
                    start = bucket.offsets[i]
                    view = bucket.flat[start:start + p.numel()]
                    view.zero_()
                    p.grad = view.view_as(p)
            self._launch(b)
        for bucket in self.buckets:
            bucket.work.wait()      # on NCCL: the current stream (the optimizer's) waits
            bucket.work = None
            bucket.arrived = [False] * len(bucket.params)
        self._next = 0
        self._pending = False
        self.log.append(("end", -1))
    # --8<-- [end:hooks]

    # --8<-- [start:no_sync]
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside the block only accumulate ``.grad`` locally; the first backward
        after it all-reduces the accumulated gradients (gradient accumulation, one all-reduce)."""
        before = self.require_sync
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = before
    # --8<-- [end:no_sync]
