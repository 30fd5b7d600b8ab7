"""part6.cute-gemm.7: The byte offsets behind SmemLayoutA

The reference solution.

Chapter: docs/part6/cute-gemm.md, exercise 7. Difficulty 2 of 4 (write a few lines).

The CuTe kernel declares its shared memory as tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{},
(BLOCK_M, BLOCK_K, STAGES)) and never computes an address by hand. Compute what that type stands
for: smem_offset(m, k, stage, block_m, block_k, itemsize), the byte offset from the buffer's base
(1024-byte aligned) of element (m, k) of a stage. The atom is 8 rows of 128 bytes (128 / itemsize
elements along K, contiguous) under the 128-byte swizzle, Swizzle<3,4,3> on the byte offset
(sw128, given); tile_to_shape repeats the atom down M first, then along K, then over the stages.

Check it:  python -m snippets exercise check part6.cute-gemm.7
"""

ATOM_ROWS = 8  # rows of one Layout_K_SW128_Atom
ROW_BYTES = 128  # bytes of one of its rows: 64 bf16, 128 fp8, 32 fp32
ATOM_BYTES = ATOM_ROWS * ROW_BYTES


def sw128(offset: int) -> int:
    """Swizzle<3,4,3> on a byte offset: bits 7-9 (the row modulo 8) XORed into bits 4-6 (the
    16-byte chunk of the row)."""
    return offset ^ (((offset >> 7) & 7) << 4)


def smem_offset(m: int, k: int, stage: int, block_m: int = 128, block_k: int = 64,
                itemsize: int = 2) -> int:
    """The byte offset of element (m, k) of stage ``stage`` in
    tile_to_shape(Layout_K_SW128_Atom<T>, (block_m, block_k, stages)), T of ``itemsize`` bytes."""
    width = ROW_BYTES // itemsize  # elements along K in one atom
    atoms_m, atoms_k = block_m // ATOM_ROWS, block_k // width
    atom = m // ATOM_ROWS + atoms_m * (k // width) + atoms_m * atoms_k * stage  # M, then K, then stages
    offset = atom * ATOM_BYTES + (m % ATOM_ROWS) * ROW_BYTES + (k % width) * itemsize
    return sw128(offset)  # the swizzle acts on bytes, whatever the element type
