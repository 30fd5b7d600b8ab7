"""Part 5: kernel fusion and FlashAttention."""
