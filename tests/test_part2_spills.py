"""Registers and spills (register_spill): the function, the permutation, what ptxas does with each variant, and
the kernels on the GPU (results and occupancy)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

from snippets.part2 import spills as sp
from snippets.registry import REPO_ROOT

VERSIONS = {"v1": sp.chain_sum_registers, "v2": sp.chain_sum_local, "v3": sp.chain_sum_bounded}


def _by_definition(x: float, slots: int) -> float:
    a = [x]
    for _ in range(1, slots):
        a.append(sp.C * a[-1] + sp.D)
    return sum(a)


# ---------------------------------------------------------------- the function and the permutation (CPU)

@pytest.mark.op("register_spill")
@pytest.mark.parametrize("slots", sp.SLOTS)
def test_reference_is_the_definition(slots):
    x = torch.tensor([-3.0, -0.5, 0.0, 0.25, 1.0, 7.5], dtype=torch.float64)
    expected = torch.tensor([_by_definition(v, slots) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(sp.chain_sum_ref(x, slots), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.op("register_spill")
@pytest.mark.parametrize("slots", sp.SLOTS)
@pytest.mark.parametrize("step, offset", [(1, 0), (sp.STEP, sp.OFFSET), (3, 7), (-5, -1), (65, 130)])
def test_runtime_order_is_a_permutation(slots, step, offset):
    """The kernel's order (k * step' + offset') & (slots - 1), with step' and offset' reduced mod slots by the host
    function as chain_sum_local does, visits every slot exactly once for any odd step."""
    s, o = step % slots, offset % slots
    order = [(k * s + o) & (slots - 1) for k in range(slots)]
    assert sorted(order) == list(range(slots))


def test_even_step_is_not_a_permutation():
    """Why chain_sum_local refuses even steps: they visit some slots twice and others never."""
    assert len({(k * 2 + 1) % 8 for k in range(8)}) < 8


@pytest.mark.op("register_spill")
@pytest.mark.parametrize("slots", sp.SLOTS)
def test_sum_order_does_not_change_the_function(slots):
    """The three versions sum the same values in different orders: equal in exact arithmetic."""
    x = torch.randn(1000, dtype=torch.float64)
    a = [x]
    for _ in range(1, slots):
        a.append(sp.C * a[-1] + sp.D)
    reversed_sum = sum(a[k] for k in range(slots - 1, -1, -1))
    permuted = sum(a[(k * sp.STEP + sp.OFFSET) % slots] for k in range(slots))
    torch.testing.assert_close(reversed_sum, sp.chain_sum_ref(x, slots), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(permuted, sp.chain_sum_ref(x, slots), rtol=1e-12, atol=1e-12)


def test_kernel_names_exist_in_the_source():
    src = (REPO_ROOT / "csrc" / sp.CU_FILE).read_text()
    assert src.startswith("// ptxas: allow-spills")
    assert "#define CHAIN_KERNELS(S)" in src
    for s in sp.SLOTS:
        assert f"CHAIN_KERNELS({s})" in src
    assert sp.kernel_name("v3", 64) == "chain_bounded_64"
    assert f"constexpr float C = {sp.C}f;" in src and f"constexpr float D = {sp.D}f;" in src


def test_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fn in VERSIONS.values():
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
            fn(torch.randn(8), 64)


# ---------------------------------------------------------------- what ptxas does (nvcc, no GPU needed)

@pytest.fixture(scope="module")
def ptxas(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from test_cuda_compile import parse_ptxas

    out = tmp_path_factory.mktemp("spill") / "spill.o"
    cmd = [nvcc, "-std=c++17", "-c", "-arch=sm_90a", "-Xptxas", "-v", "csrc/part2/spill.cu", "-o", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return parse_ptxas(proc.stderr + proc.stdout)


@pytest.mark.op("register_spill")
@pytest.mark.parametrize("slots", sp.SLOTS)
def test_register_version_has_no_local_memory(ptxas, slots):
    f = ptxas[sp.kernel_name("v1", slots)]
    assert f["stack_frame_bytes"] == 0 and f["spill_store_bytes"] == 0, json.dumps(f)
    assert f["registers"] >= slots, "all slots values are alive at once: at least one register each"


@pytest.mark.op("register_spill")
@pytest.mark.parametrize("slots", [32, 64])
def test_runtime_index_puts_the_array_on_the_stack(ptxas, slots):
    f = ptxas[sp.kernel_name("v2", slots)]
    assert f["stack_frame_bytes"] >= 4 * slots, json.dumps(f)  # the whole array: 4 bytes per slot
    assert f["spill_store_bytes"] == 0, "a local array is not a spill: ptxas counts it as stack frame only"


@pytest.mark.op("register_spill")
def test_launch_bounds_force_spills(ptxas):
    big, small = ptxas[sp.kernel_name("v3", 64)], ptxas[sp.kernel_name("v3", 8)]
    assert big["registers"] <= 32, "__launch_bounds__(256, 8): 65536 / (256 * 8) registers per thread"
    assert big["spill_store_bytes"] > 0 and big["spill_load_bytes"] > 0, json.dumps(big)
    assert small["spill_store_bytes"] == 0, "8 values fit in 32 registers: nothing to spill"


# ---------------------------------------------------------------- the kernels (GPU)

@pytest.mark.gpu
@pytest.mark.op("register_spill")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("slots", sp.SLOTS)
@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003])
def test_versions_match_float64(version, slots, n):
    x = torch.randn(n, device="cuda")
    out = VERSIONS[version](x, slots)
    assert out.shape == x.shape and out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(out.double(), sp.chain_sum_ref(x.double(), slots), rtol=1e-5, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.op("register_spill")
@pytest.mark.parametrize("step, offset", [(1, 0), (3, 7), (63, 1), (-5, -2)])
def test_local_version_any_order(step, offset):
    x = torch.randn(10_000, device="cuda")
    ref = sp.chain_sum_ref(x.double(), 64)
    torch.testing.assert_close(sp.chain_sum_local(x, 64, step, offset).double(), ref, rtol=1e-5, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.op("register_spill")
def test_versions_refuse_bad_input():
    x = torch.randn(64, device="cuda")
    for fn in VERSIONS.values():
        with pytest.raises(ValueError, match="not compiled"):
            fn(x, 12)
        with pytest.raises(TypeError, match="slots"):
            fn(x, 64.0)
        with pytest.raises(TypeError, match="dtype"):
            fn(x.double(), 64)
        with pytest.raises(ValueError, match="cuda device"):
            fn(x.cpu(), 64)
        with pytest.raises(ValueError, match="empty"):
            fn(x[:0], 64)
    with pytest.raises(ValueError, match="odd"):
        sp.chain_sum_local(x, 64, step=4)
    with pytest.raises(TypeError, match="offset"):
        sp.chain_sum_local(x, 64, offset=1.5)


@pytest.mark.gpu
@pytest.mark.op("register_spill")
def test_launch_bounds_buy_occupancy():
    """chain_bounded_64 fits 32 registers per thread, so a full SM of 256-thread blocks; chain_registers_64 needs
    at least 64 registers per thread, so fewer blocks fit."""
    from snippets import cuda

    props = torch.cuda.get_device_properties(0)
    full = props.max_threads_per_multi_processor // sp.THREADS
    bounded = cuda.resident_blocks(cuda.kernel(sp.CU_FILE, sp.kernel_name("v3", 64), sp.CU_OPTIONS),
                                   sp.THREADS)
    registers = cuda.resident_blocks(cuda.kernel(sp.CU_FILE, sp.kernel_name("v1", 64), sp.CU_OPTIONS),
                                     sp.THREADS)
    assert bounded == full
    assert registers < bounded
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)  # 64 K 32-bit registers on A100 to H200
    assert registers <= regs_per_sm // (64 * sp.THREADS)
