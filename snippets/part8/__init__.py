"""Part 8: inference. Decoding as a memory-bound loop, the (paged) KV cache, and the kernels of a
decode step."""
