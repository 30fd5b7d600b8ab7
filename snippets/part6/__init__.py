"""Part 6: CuTe-style tiling and Hopper GEMMs."""
