"""part6.hopper-gemm.9: The quad transpose of store_acc16

Chapter: docs/part6/hopper-gemm.md, exercise 9. Difficulty 2 of 4 (write a few lines).

Write quad_transpose(w): v9's two rounds of __shfl_xor_sync over the four lanes of a quad, as
hopper_gemm.cu's quad_transpose does them. w[q][i] is lane q's word of group 4g + i (two bf16 of
row r at columns 2q, 2q + 1 of that group of 8); afterwards lane q's slot p must hold lane p's word
of group 4g + q, so that lane q has all 8 columns of one group for one 16-byte store. A lane sees
only its own four words: words move between lanes only through shfl_xor_sync(send, mask), one
__shfl_xor_sync of the whole quad (send[q] is what lane q passes; lane q gets lane q ^ mask's).
Round 1 trades with lane q ^ 1, round 2 with lane q ^ 2, one shuffle per pair of slots
(s, s ^ k) with s & k == 0: four shuffles in all, masks 1, 1, 2, 2. Work out which slot of
the pair each lane sends, and which one it receives into.

Check it:  python -m snippets exercise check part6.hopper-gemm.9
"""

Word = int  # a 4-byte register: two bf16 values (pack_bf16x2)


def shfl_xor_sync(send: list[Word], mask: int) -> list[Word]:
    """One __shfl_xor_sync(0xffffffff, send, mask) of the quad: every lane takes part; lane q passes
    send[q] and gets what lane q ^ mask passed."""
    return [send[q ^ mask] for q in range(4)]


def quad_transpose(w: list[list[Word]], shfl_xor_sync=shfl_xor_sync) -> list[list[Word]]:
    """The four lanes' words after the two rounds: w[q][i] is lane q's word of group 4g + i before,
    and lane q's slot p holds lane p's word of group 4g + q after (w is not changed). Words move
    between lanes only through shfl_xor_sync (the check passes one that records every shuffle)."""
    raise NotImplementedError("YOUR CODE HERE")
