"""Root test configuration, for everything pytest collects (tests/, the docs' code blocks, README.md):
without a CUDA GPU, Triton's interpreter runs the kernels on the CPU, and it must be switched on before
anything imports Triton. tests/conftest.py holds the rest."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
