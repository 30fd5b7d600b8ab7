"""part8.quantisation.16: two int4 codes into two floats with one AND-OR

Chapter: docs/part8/quantisation.md, exercise 16. Difficulty 2 of 4 (fill in a function).

A 32-bit word holds eight int4 codes, code i in bits 4i .. 4i + 3. A 32-bit register also holds two
16-bit floats (bf16 or fp16), the first in bits 0-15. ORing a code into the low mantissa bits of a
power of two makes a float worth that power plus the code, with no integer-to-float conversion:
csrc/part8/int4_mma.cu dequantises eight codes this way in nine or eleven instructions. Fill in
TYPES (the magic number, and how the odd codes of each byte go in), registers (the four registers
of one word: (c0, c4), (c1, c5), (c2, c6), (c3, c7), each the magic ORed with the codes' bits) and
values (what the kernel's subtraction and fused multiply-add then leave: code minus zero point).

Check it:  python -m snippets exercise check part8.quantisation.16
"""

import numpy as np

# per type: MAGIC, the register of two copies of a power of two whose last mantissa bit is worth 1;
# BASE, that power; the odd code of each byte (bits 4..7 of the word's bytes) goes in after a shift
# right by HI_SHIFT, masked by HI_MASK, and is then worth HI_FACTOR times the code
TYPES = {
    "bf16": dict(MAGIC=None, BASE=None, HI_SHIFT=None, HI_MASK=None, HI_FACTOR=None),
    "fp16": dict(MAGIC=None, BASE=None, HI_SHIFT=None, HI_MASK=None, HI_FACTOR=None),
}


def decode(half: int, kind: str) -> float:
    """The value of a 16-bit pattern as a bf16 (the top half of a float32) or an fp16 number."""
    if kind == "bf16":
        return float(np.array([half << 16], dtype=np.uint32).view(np.float32)[0])
    return float(np.array([half], dtype=np.uint16).view(np.float16)[0])


def registers(word: int, kind: str) -> list[int]:
    """The four 32-bit registers of a word's eight codes, in the order (c0, c4), (c1, c5), (c2, c6),
    (c3, c7): each the magic number ORed with two codes' bits, no arithmetic."""
    raise NotImplementedError("YOUR CODE HERE")


def values(regs: list[int], zero: int, kind: str) -> list[tuple[float, float]]:
    """What each register holds after the kernel's one packed operation: the two codes minus the
    zero point. Even registers: value - (BASE + zero); odd ones: value / HI_FACTOR - (BASE /
    HI_FACTOR + zero)."""
    raise NotImplementedError("YOUR CODE HERE")
