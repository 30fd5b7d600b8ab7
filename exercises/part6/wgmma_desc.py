"""part6.hopper.3: The wgmma shared-memory descriptor

Chapter: docs/part6/hopper.md, exercise 3. Difficulty 1 of 4 (fill one line).

Write descriptor(smem_addr, lbo, sbo, layout_type, base_offset): the 64-bit matrix descriptor of
a wgmma operand. The start address, the leading byte offset and the stride byte offset are byte
counts kept in 16-byte units, 14 bits each (encode() does that), at bits 0, 16 and 32; the base
offset takes bits 49-51 and the layout type (0 none, 1 128B, 2 64B, 3 32B) bits 62-63.

Check it:  python -m snippets exercise check part6.hopper.3
"""


def encode(x: int) -> int:
    """A byte address or offset in the descriptor's form: 18 bits of bytes in 16-byte units."""
    return (x & 0x3FFFF) >> 4


def descriptor(smem_addr: int, lbo: int, sbo: int, layout_type: int, base_offset: int = 0) -> int:
    """The 64-bit wgmma descriptor of an operand tile at ``smem_addr``."""
    raise NotImplementedError("YOUR CODE HERE")
