"""Why GPUs: the same vector add on the CPU and on the GPU, with and without the cost of moving
the data.

- v0  ``torch.add`` on GPU-resident tensors: the GPU's own speed, the library baseline.
- v1  NumPy on the CPU (one thread).
- v2  ``torch.add`` on CPU tensors (torch's CPU kernels use every core).
- v3  the GPU including the transfers: copy x and y from pinned host memory to the GPU, add, copy
  the sum back.
- v4  ``torch.add`` on GPU-resident tensors like v0, but timed from the host: a launch and a
      synchronize per call, which is what a program that waits for each result pays.

The harness sweeps n from 2**10 to 2**26. At small n the GPU's fixed costs (a launch, a synchronize,
transfer set-up) exceed the whole CPU computation; at large n the GPU's bandwidth wins, unless the
data has to cross PCIe for every operation, which is the lesson of v3: keep data on the GPU and do
many operations there.
"""

from __future__ import annotations

import numpy as np
import torch

from snippets.part1.elementwise import vector_add_ref
from snippets.registry import Impl, Op, register


# --8<-- [start:cpu_gpu]
def add_numpy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v1: NumPy on the CPU. ``.numpy()`` shares memory with the tensor: no copy is timed."""
    return torch.from_numpy(np.add(x.numpy(), y.numpy()))


def add_torch_cpu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v2: torch's multi-threaded CPU kernel."""
    return torch.add(x, y)


def add_gpu_with_transfers(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v3: inputs start in host memory and the result must end there: two uploads, one add,
    one download."""
    if x.device.type != "cpu" or y.device.type != "cpu":
        raise ValueError(
            f"add_gpu_with_transfers takes host tensors, got {x.device} and {y.device}")
    xd = x.to("cuda", non_blocking=True)  # asynchronous only from pinned (page-locked) memory
    yd = y.to("cuda", non_blocking=True)
    # .cpu() waits for the result: the timer sees the whole round trip
    return torch.add(xd, yd).cpu()
# --8<-- [end:cpu_gpu]


def _make_inputs(size, dtype, device, gen):
    x = torch.randn(size["n"], generator=gen, dtype=dtype)
    y = torch.randn(size["n"], generator=gen, dtype=dtype)
    if device == "cpu" and torch.cuda.is_available():
        x, y = x.pin_memory(), y.pin_memory()  # pinned: the fastest host-to-device copies there are
    return x.to(device), y.to(device)


cpu_vs_gpu = register(Op(
    name="cpu_vs_gpu", part=1, chapter="part1/why-gpus.md", title="Vector add: CPU vs GPU",
    reference=vector_add_ref, make_inputs=_make_inputs,
    bytes_moved=lambda s, d: 3 * s["n"] * 4, flops=lambda s, d: s["n"],
    metric="GB/s", ceiling="copy", headline={"n": 2**24},
    sweep=[{"n": 2**k} for k in range(10, 27, 2)], dtypes=(torch.float32,),
    test_sizes=[{"n": n} for n in (1, 1000, 4097)]))
cpu_vs_gpu.add(Impl("v0", torch.add, "PyTorch", "torch.add, data already on the GPU"))
cpu_vs_gpu.add(Impl("v1", add_numpy, "NumPy", "NumPy on the CPU", device="cpu", timer="host",
                    origin="library"))
cpu_vs_gpu.add(Impl("v2", add_torch_cpu, "PyTorch", "torch on the CPU (all cores)", device="cpu",
                    timer="host", origin="library"))
cpu_vs_gpu.add(Impl("v3", add_gpu_with_transfers, "PyTorch", "GPU, counting host-GPU copies",
                    timer="host", inputs_on="cpu", origin="library"))
cpu_vs_gpu.add(Impl("v4", torch.add, "PyTorch", "GPU, data resident, host clock (launch + sync)",
                    timer="host", origin="library"))
