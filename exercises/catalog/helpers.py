"""Pieces the exercises' checks share: model checks, inputs, and output buffers that catch stray stores."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from exercises import compare
from exercises.engine import Failure, Run

PAD = 256  # elements of NaN after (and around) an output buffer: a store past the end lands there


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, device: str = "cpu") -> torch.Tensor:
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(device)


def model(*functions: tuple[str, Iterable[Any]] | tuple[str, Iterable[Any], str], rel: float = 1e-9,
          abs_: float = 0.0) -> Callable[[Run], None]:
    """A check for a quantitative exercise: each named function of the learner's file is compared with the
    solution's on every parameter set. An entry may carry a hint of its own, as a third item."""

    def check(run: Run) -> None:
        mine, ref = run.module(), run.solution()
        for entry in functions:
            name, cases = entry[0], list(entry[1])
            hint = entry[2] if len(entry) > 2 else None
            with run.case(f"{name}() on {len(cases)} parameter set(s)", hint=hint):
                compare.functions(name, getattr(mine, name, None), getattr(ref, name), cases, rel, abs_)

    return check


def inp(t: torch.Tensor, device: str) -> torch.Tensor:
    """An input tensor for a kernel. On the CPU it is exact, so the interpreter's bounds checks flag a load past
    its end; on a GPU nothing would, so it is a view at the start of a longer buffer whose tail is NaN: a load
    past the end brings a NaN into the result."""
    t = t.contiguous()
    if device == "cpu":
        return t.clone()
    buf = _filled(t.numel() + PAD, t.dtype, device, INPUT_NAN)
    buf[:t.numel()] = t.reshape(-1).to(device)
    return buf[:t.numel()].view(t.shape)


INPUT_NAN, OUTPUT_NAN = 0x7FC0B000, 0x7FC0A000  # quiet NaNs with payloads of their own (fp32 bit patterns)


def _filled(shape, dtype: torch.dtype, device: str, pattern: int) -> torch.Tensor:
    """A tensor of ``shape`` whose every element has the bit pattern ``pattern`` (fp32: a NaN with a payload,
    so that a NaN the kernel stores, or copies from an input's guard elements, is told apart from it)."""
    if dtype == torch.float32:
        return torch.full(shape if isinstance(shape, tuple) else (shape,), pattern, dtype=torch.int32,
                          device=device).view(torch.float32)
    fill = float("nan") if dtype.is_floating_point else -1
    return torch.full(shape if isinstance(shape, tuple) else (shape,), fill, dtype=dtype, device=device)


def _untouched(w: torch.Tensor) -> torch.Tensor:
    if w.dtype == torch.float32:
        return w.view(torch.int32) == OUTPUT_NAN
    return torch.isnan(w) if w.dtype.is_floating_point else w == -1


class Output:
    """An output buffer filled with NaN (so an element the kernel never writes shows up), that is a view into a
    larger NaN-filled buffer: ``row_pad`` extra columns after each row (the output is then a column slice of a
    wider matrix, with a row stride larger than its width), and ``PAD`` elements before and after. ``check``
    fails when anything outside the view was written."""

    def __init__(self, shape: tuple[int, ...], device: str, dtype: torch.dtype = torch.float32, row_pad: int = 0,
                 col_offset: int = 0, name: str = "out"):
        self.shape, self.name, self.row_pad, self.col_offset = tuple(shape), name, row_pad, col_offset
        if row_pad or col_offset:
            m, n = self.shape
            self.wide = _filled((m + 2, n + row_pad), dtype, device, OUTPUT_NAN)
            self.tensor = self.wide[1:m + 1, col_offset:col_offset + n]
            self.inside = torch.zeros(self.wide.shape, dtype=torch.bool)
            self.inside[1:m + 1, col_offset:col_offset + n] = True
        else:
            numel = 1
            for s in self.shape:
                numel *= s
            self.wide = _filled(numel + 2 * PAD, dtype, device, OUTPUT_NAN)
            self.tensor = self.wide[PAD:PAD + numel].view(self.shape)
            self.inside = torch.zeros(self.wide.shape, dtype=torch.bool)
            self.inside[PAD:PAD + numel] = True

    def check(self) -> torch.Tensor:
        """The output, after making sure nothing outside it was written."""
        w = self.wide.detach().cpu()
        stray = ~_untouched(w) & ~self.inside
        if bool(stray.any()):
            idx = stray.nonzero()[0]
            count = int(stray.sum())
            if w.dim() == 1:
                k = int(idx[0])
                n = self.inside.sum().item()
                where = (f"{self.name}[{k - PAD - n}] past the end" if k >= PAD else
                         f"{PAD - k} element(s) before the start")
                raise Failure(f"the kernel wrote {count} element(s) outside {self.name} ({self.name} has "
                              f"{n} elements; first stray store: {where}): a store's mask lets lanes past "
                              f"the end through")
            r, c = int(idx[0]) - 1, int(idx[1]) - self.col_offset
            raise Failure(f"the kernel wrote {count} element(s) outside {self.name}, a {self.shape[0]} x "
                          f"{self.shape[1]} view of a wider matrix (row stride {self.tensor.stride(0)}); first "
                          f"stray store at row {r}, column {c}: a wrong row stride, or a mask that lets columns "
                          f"past the end through")
        return self.tensor.detach().cpu()


def require(mod: Any, *names: str) -> None:
    """Fail, naming it, on the first of ``names`` that the learner's module lacks or that is not a function."""
    for fn in names:
        if not callable(getattr(mod, fn, None)):
            raise Failure(f"{fn} is missing or not a function")


def close(name: str, got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> None:
    compare.tensors(name, got, expected, rtol, atol)


def uses(src_text: str, *names: str) -> bool:
    """Every name appears in the code (comments removed) more often than in its declaration alone."""
    import re

    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", src_text, flags=re.S)
    return all(len(re.findall(rf"\b{re.escape(n)}\s*\[", code)) >= 2 for n in names)
