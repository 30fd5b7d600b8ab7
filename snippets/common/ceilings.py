"""Ceilings that ops of more than one chapter are compared against, registered with
:func:`snippets.registry.register_ceiling` when this module is imported (the harness measures a
ceiling in the same run as the kernels that use it).

- ``host_link``: pinned host<->device copy bandwidth, the faster direction (Part 2's host
  transfers, Part 3's stream pipeline).
"""

from __future__ import annotations

import torch

from snippets.registry import register_ceiling

MiB = 1 << 20


# --8<-- [start:ceiling]
def _measure_host_link(quick: bool) -> dict:
    """Pinned copies in both directions, timed with events; the faster direction is the ceiling: the
    most that this host link delivered in this run."""
    from snippets.bench.timing import time_device

    nbytes = (64 if quick else 256) * MiB
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    host.fill_(1.0)
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    rates = {}
    for name, dst, src in (("H2D", dev, host), ("D2H", host, dev)):
        t = time_device(lambda dst=dst, src=src: dst.copy_(src, non_blocking=True), [()],
                        budget_ms=300)
        rates[name] = nbytes / (t.median * 1e-3) / 1e9
    torch.cuda.synchronize()
    best = max(rates, key=rates.get)
    return {"value": rates[best], "unit": "GB/s",
            "how": f"pinned {nbytes // MiB} MiB copies, events: H2D {rates['H2D']:.1f} GB/s, "
                   f"D2H {rates['D2H']:.1f} GB/s; the faster ({best})"}


register_ceiling("host_link", "pinned host<->device copy bandwidth, the faster direction",
                 _measure_host_link)
# --8<-- [end:ceiling]
