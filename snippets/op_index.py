"""Every op of the book: the modules in ``snippets.registry.OP_MODULES`` and the modules of ops
added after them.

Why two lists: every measured result's source hash covers ``snippets/registry.py`` (its ``Op`` and
``Impl`` types are what the harness computes a result with), so a line added to ``OP_MODULES`` there
marks every result on every GPU stale although no measured code changed. Ops added since the last
full re-measurement are listed here instead; the next full re-measurement (which any change to the
registry or the harness forces) moves them into ``OP_MODULES``. This module is in no result's hash:
it is imported by the entry points (the command line, the site, the tests), never by an op.

Use ``load_all`` and ``get_op`` from here wherever every op is wanted.
"""

from __future__ import annotations

import importlib

from snippets import registry
from snippets.registry import Op

NEW_OP_MODULES = (
    "snippets.part6.hopper_attention_bwd",
    "snippets.part8.decode_attention",
    "snippets.part8.decode_baselines",
    "snippets.part8.int4_gemm",
    "snippets.part6.gemm",
    "snippets.part6.cute_gemm",
    "snippets.part6.hopper_attention",
    "snippets.part6.fp8_gemm",
    "snippets.part4.spmv",
    "snippets.part4.conv2d",
    "snippets.part8.capstone",
    "snippets.part8.capstone_fused",
    "snippets.part8.capstone_block",
    "snippets.part6.fp8_attention",
    "snippets.part8.decode_gemv",
    "snippets.part3.scan_v9",
    "snippets.part8.capstone_train",
    "snippets.part3.sgemm_v14",
    "snippets.part4.layernorm_v5",
    "snippets.part5.lora_v4",
    "snippets.part8.decode_fp8",
    "snippets.part3.wmma_v7",
    "snippets.part3.sgemm_v15",
    "snippets.part3.scan_v10",
    "snippets.part3.scan_v11",
    "snippets.part6.fp8_gemm_wide",
    "snippets.part3.mma_rate",
    "snippets.part5.rmsnorm_v4",
)


def load_all() -> dict[str, Op]:
    """Every op of the book, registered (importing a module registers its ops)."""
    for mod in NEW_OP_MODULES:
        importlib.import_module(mod)
    return registry.load_all()


def get_op(name: str) -> Op:
    """``registry.get_op`` once every op is registered."""
    load_all()
    return registry.get_op(name)
