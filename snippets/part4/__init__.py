"""Part 4: Triton, from the programming model to cuBLAS-class matmul."""
