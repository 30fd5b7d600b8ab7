"""A Hopper GEMM: C = A @ B^T in bf16 with fp32 sums, built up from TMA, mbarriers and ``wgmma``.

A is M x K and B is N x K, both row-major: both operands are K-major, the layout ``wgmma`` reads
without a transpose (``torch.nn.Linear`` keeps its weight this way). C is M x N, bf16. The kernels
are in ``csrc/part6/hopper_gemm.cu``; this module validates the operands, builds the two TMA tensor
maps on the host (``cuTensorMapEncodeTiled``) and launches.

Versions of ``hopper_gemm`` (never renumbered):

- v0  cuBLAS through ``torch.matmul(a, b.T)``: the baseline.
- v1  TMA loads of one A and one B tile per 64-wide K-slice (128-byte swizzle), one mbarrier with
  the expected transaction bytes, one warpgroup issuing ``wgmma.mma_async`` m64n128k16 from
  shared-memory descriptors; a 128 x 128 tile of C per block, stored from registers.
- v2  like v1 with ``STAGES_V2`` stages and full/empty mbarriers: TMA fills later stages while the
  tensor cores work on the current one.
- v3  warp specialisation: a producer warpgroup (TMA, ``setmaxnreg.dec``) and two consumer
  warpgroups (``setmaxnreg.inc``), a 128 x 256 tile, m64n256k16 per consumer.
- v4  like v3, persistent: one block per SM walks the tiles in grouped order for L2 reuse.
- v5  like v4 in clusters of two blocks along M: each block loads half of the B tile the two
  share and TMA multicasts it into both blocks' shared memory.
- v6  like v4 with 3 stages and a TMA-store epilogue: the consumers write C to shared memory and
  one thread stores each 64 x 256 tile with ``cp.async.bulk.tensor``.
- v7  v5's clusters and B multicast with v6's TMA-store epilogue (3 stages).
- v9  v5 with 16-byte stores of C: the four lanes of a quad, which hold the same two rows, swap
  values with shuffles so that each stores 8 adjacent columns at once (``store_acc16``).
- v10 v9's kernel on a balanced persistent grid: as few clusters as still give the same number of
  rounds of tiles, so every cluster computes the same number of tiles.

(v8, the CuTe C++ version, is registered by ``snippets.part6.cute_gemm``.)

The persistent cluster kernels (v5, v7) launch only as many clusters as the GPU can hold at once
(:func:`max_active_clusters`, the driver's occupancy query): a cluster of two needs two free SMs in
one GPC, and a persistent grid with more clusters than fit leaves the rest to run after the
others, a second wave of the whole loop.

How the kernels are built: ``wgmma`` and ``setmaxnreg`` exist only for the arch-specific target
``sm_90a``, which CuPy's NVRTC path (``snippets.cuda``, which compiles for the device's plain
``sm_90``) cannot ask for. So this module compiles the file once with ``nvcc -cubin -arch=sm_90a``
(:func:`build_cubin`, cached under ``build/``), loads the cubin with CuPy and launches it on
torch's stream through ``snippets.cuda.launch``, like every other CUDA kernel of the book. The
tensor maps are encoded through the driver (``libcuda``, with ctypes) and copied to the GPU; the
kernels read them from global memory.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.gemm import gemm_flops, tolerance_for
from snippets.part6.hopper import GemmOperands, TensorMapSpec, check_gemm_operands
from snippets.registry import REPO_ROOT, Impl, Op, device_generator, register

CU_FILE = "part6/hopper_gemm.cu"
BUILD_DIR = REPO_ROOT / "build" / "hopper_gemm"
NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", "-arch=sm_90a")

# --8<-- [start:configs]
BLOCK_K = 64  # bf16 elements: one 128-byte row of the 128B swizzle per tile row and stage
SWIZZLE = "128B"
SWIZZLE_REPEAT = 1024  # the kernels round shared memory up to this boundary
GRID_Y_MAX = 65535


@dataclass(frozen=True)
class HopperConfig:
    """How one version is launched: a block of ``threads`` computes ``block_m`` x ``block_n`` of C
    with ``stages`` K-slices in shared memory; ``persistent``: one block per SM loops over the
    tiles; ``cluster``: blocks per cluster (along M), which share B's tiles, each loading
    ``b_box_rows`` of them. These numbers are the constants of hopper_gemm.cu
    (tests/test_part6_gemm.py compares)."""

    kernel: str
    block_m: int
    block_n: int
    stages: int
    threads: int
    persistent: bool = False
    cluster: int = 1
    tma_store: bool = False  # C leaves through shared memory and a TMA store
    balanced: bool = False  # persistent: the fewest clusters that take the same rounds of tiles

    @property
    def b_box_rows(self) -> int:
        """Rows of B one block's TMA box covers: all of its tile, or its share in a cluster."""
        return self.block_n // self.cluster

    @property
    def stage_bytes(self) -> int:
        return (self.block_m + self.block_n) * BLOCK_K * 2

    @property
    def barrier_bytes(self) -> int:
        return 2 * 8 * self.stages  # a full and an empty mbarrier (8 bytes each) per stage

    @property
    def c_tile_bytes(self) -> int:
        """The bf16 tile of C staged in shared memory for a TMA store (0 without one)."""
        return self.block_m * self.block_n * 2 if self.tma_store else 0

    @property
    def reserved_bytes(self) -> int:
        """Shared memory besides the stages: alignment slack, barriers, C's tile."""
        return SWIZZLE_REPEAT + self.barrier_bytes + self.c_tile_bytes

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory the launch asks for."""
        return self.stages * self.stage_bytes + self.reserved_bytes


CONFIGS = {
    "v1": HopperConfig("hopper_gemm_v1", 128, 128, stages=1, threads=128),
    "v2": HopperConfig("hopper_gemm_v2", 128, 128, stages=4, threads=128),
    "v3": HopperConfig("hopper_gemm_v3", 128, 256, stages=4, threads=384),
    "v4": HopperConfig("hopper_gemm_v4", 128, 256, stages=4, threads=384, persistent=True),
    "v5": HopperConfig("hopper_gemm_v5", 128, 256, stages=4, threads=384, persistent=True,
                       cluster=2),
    "v6": HopperConfig("hopper_gemm_v6", 128, 256, stages=3, threads=384, persistent=True,
                       tma_store=True),
    "v7": HopperConfig("hopper_gemm_v7", 128, 256, stages=3, threads=384, persistent=True,
                       cluster=2, tma_store=True),
    "v9": HopperConfig("hopper_gemm_v9", 128, 256, stages=4, threads=384, persistent=True,
                       cluster=2),
    "v10": HopperConfig("hopper_gemm_v9", 128, 256, stages=4, threads=384, persistent=True,
                        cluster=2, balanced=True),
}
C_BOX_ROWS = 64  # v6 and v7 store C per consumer warpgroup: boxes of 64 rows x block_n columns
GROUP_M = 8  # v4's grouped tile order
# --8<-- [end:configs]


# --8<-- [start:reference]
def hopper_gemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What every version computes: C = A @ B^T with B stored N x K. The products of bf16 numbers
    are exact in fp32, the K of them per output are summed in fp32, C is rounded to bf16 once.
    2 * M * N * K FLOPs on at least (M*K + N*K + M*N) * 2 bytes."""
    return torch.matmul(a.float(), b.float().T).to(a.dtype)
# --8<-- [end:reference]


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The registered reference: the exact product (the tests call it in float64)."""
    return a @ b.T


# --8<-- [start:checks]
def check_hopper_gemm(name: str, a: object, b: object,
                      cfg: HopperConfig | None = None) -> tuple[int, int, int, GemmOperands | None]:
    """Refuse, before any launch and without needing a GPU, what the kernels cannot take: A (M x K)
    and B (N x K) bf16, 2-D, contiguous, non-empty, on one device; N a multiple of 8 (the epilogue
    stores pairs of columns and checks only whole groups of 8); and everything TMA and ``wgmma``
    need (check_gemm_operands of snippets/part6/hopper.py: K a multiple of 8 for 16-byte rows,
    16-byte aligned data, tiles and stages that fit). Returns (M, N, K) and the checked operands
    (None without ``cfg``, for cuBLAS)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: {arg} must be bfloat16, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name}: {arg} must be 2-D, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name}: {arg} is empty (shape {tuple(t.shape)})")
        if not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be contiguous (row-major, K innermost); "
                             "call .contiguous() first")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"{name}: a is {m} x {k} and b is {n} x {kb}: both must have K columns "
                         "(b is stored N x K; pass w, not w.T)")
    if a.device != b.device:
        raise ValueError(f"{name}: a is on {a.device}, b on {b.device}")
    if max(m, n, k) >= 2**31:
        raise ValueError(f"{name}: M, N, K = {m}, {n}, {k}: the kernels index with 32-bit ints")
    if cfg is None:
        return m, n, k, None
    if n % 8:
        raise ValueError(f"{name}: N = {n} is not a multiple of 8 (the epilogue stores C in pairs "
                         "of columns, 8 to a group)")
    # B's box is the block's share of the B tile; the rest of the tile (the peer's share in a
    # cluster) still takes shared memory in every stage
    peer_bytes = cfg.stages * (cfg.block_n - cfg.b_box_rows) * BLOCK_K * 2
    try:
        ops = check_gemm_operands(m, n, k, 2, cfg.block_m, cfg.b_box_rows, BLOCK_K, SWIZZLE,
                                  stages=cfg.stages,
                                  reserved_bytes=cfg.reserved_bytes + peer_bytes,
                                  a_address=a.data_ptr(), b_address=b.data_ptr())
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not cfg.persistent and -(-m // cfg.block_m) > GRID_Y_MAX:
        raise ValueError(f"{name}: {-(-m // cfg.block_m)} row tiles exceed gridDim.y's "
                         f"{GRID_Y_MAX} (M = {m})")
    return m, n, k, ops
# --8<-- [end:checks]


# --8<-- [start:tile_order]
def tile_order(tiles_m: int, tiles_n: int, group_m: int = GROUP_M) -> list[tuple[int, int]]:
    """v4's order of the output tiles (tile_coords in hopper_gemm.cu): groups of ``group_m`` tile
    rows, each walked column by column, so that the tiles in flight at once share rows of A and
    columns of B in L2. Tile t goes to block t % grid."""
    out = []
    for t in range(tiles_m * tiles_n):
        per_group = group_m * tiles_n
        first_m = (t // per_group) * group_m
        rows = min(tiles_m - first_m, group_m)
        out.append((first_m + (t % per_group) % rows, (t % per_group) // rows))
    return out
# --8<-- [end:tile_order]


# --------------------------------------------------------------------------------------------------
# Building and loading the kernels (sm_90a), encoding the tensor maps
# --------------------------------------------------------------------------------------------------

# --8<-- [start:build]
def nvcc_command(out: Path) -> list[str]:
    """The command that compiles hopper_gemm.cu to a cubin for sm_90a (the tests run it too)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("hopper_gemm needs nvcc (the CUDA toolkit) on PATH to compile its "
                           "sm_90a kernels: NVRTC through CuPy targets plain sm_90, which has no "
                           "wgmma")
    src = cuda.source_path(CU_FILE)
    return [nvcc, *NVCC_FLAGS, f"-I{REPO_ROOT / 'csrc' / 'common'}", str(src), "-o", str(out)]


@functools.lru_cache(maxsize=None)
def build_cubin() -> Path:
    """Compile hopper_gemm.cu for sm_90a, once per source text and nvcc (the file name holds a hash
    of both), and return the cubin's path."""
    src = cuda.source_path(CU_FILE)
    probe = nvcc_command(Path(os.devnull))
    version = subprocess.run([probe[0], "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256((src.read_text() + version + " ".join(NVCC_FLAGS)).encode())
    out = BUILD_DIR / f"hopper_gemm.{key.hexdigest()[:16]}.cubin"
    if not out.is_file():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run(nvcc_command(tmp), capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nvcc failed on {src}:\n{proc.stderr}{proc.stdout}")
        tmp.replace(out)  # atomic: a concurrent process sees the whole file or none
    return out


@functools.lru_cache(maxsize=None)
def _module(device_index: int):
    cupy = cuda.cupy_module()
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(path=str(build_cubin()))


@functools.lru_cache(maxsize=None)
def kernel(name: str, device_index: int):
    """The ``__global__`` function ``name`` of the sm_90a cubin, loaded on this device by CuPy."""
    cupy = cuda.cupy_module()
    with cupy.cuda.Device(device_index):
        return _module(device_index).get_function(name)
# --8<-- [end:build]


# --8<-- [start:tensor_map]
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9  # CUtensorMapDataType (cuda.h)
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # out-of-bounds elements arrive as zeros


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError("hopper_gemm encodes TMA tensor maps through the CUDA driver, and "
                           f"libcuda.so.1 cannot be loaded: {exc}") from None
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_tensor_map(spec: TensorMapSpec) -> bytes:
    """The 128-byte CUtensorMap of a bf16 operand, from the spec that check_gemm_operands validated
    (dimensions innermost first: (K, rows); a box of (BLOCK_K, block rows); the 128B swizzle)."""
    spec.validate()
    rank = spec.rank
    raw = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is declared 64-byte aligned
    addr = (ctypes.addressof(raw) + 63) & ~63
    dims = (ctypes.c_uint64 * rank)(*spec.global_shape)
    strides = (ctypes.c_uint64 * max(1, rank - 1))(*spec.global_strides)
    box = (ctypes.c_uint32 * rank)(*spec.box_shape)
    elem = (ctypes.c_uint32 * rank)(*spec.element_strides)
    err = _encode_tiled()(addr, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, spec.global_address, dims,
                          strides, box, elem, spec.interleave.tensor_map_interleave,
                          spec.swizzle.tensor_map_swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled returned CUresult {err} for {spec}")
    return ctypes.string_at(addr, 128)
# --8<-- [end:tensor_map]


# (device, the maps' specs) -> the maps on that device. A map depends only on what
# its spec holds (address, shape, strides, box, swizzle), so a hit is right even where a tensor was
# freed and another allocated at the same address; nothing writes the copies once they are made.
_MAPS: dict[tuple, torch.Tensor] = {}


def device_tensor_maps(specs: tuple[TensorMapSpec, ...], device: torch.device) -> torch.Tensor:
    """The tensor maps of ``specs`` (A's, B's, and C's for a TMA store), 128 bytes each, in one
    tensor on ``device``; cached, so a timing loop encodes and copies them once, not every call."""
    key = (str(device), *specs)
    maps = _MAPS.get(key)
    if maps is None:
        host = bytearray(b"".join(encode_tensor_map(spec) for spec in specs))
        # torch allocations are at least 256-byte aligned: the 64 bytes a CUtensorMap needs
        maps = torch.frombuffer(host, dtype=torch.uint8).to(device)
        if len(_MAPS) > 256:
            _MAPS.clear()
        _MAPS[key] = maps
    return maps


def needs_sm90() -> str | None:
    """For ``Impl(requires=...)``: why the book's Hopper kernels cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return (f"wgmma, TMA and setmaxnreg are compiled for sm_90a (H100, H200); this GPU is "
                f"sm_{cap[0]}{cap[1]}")
    if shutil.which("nvcc") is None:
        return "needs nvcc on PATH to compile the sm_90a kernels"
    try:
        cuda.cupy_module()
    except RuntimeError as exc:
        return str(exc)
    return None


# --8<-- [start:clusters]
class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h), no launch attributes
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


_ACTIVE: dict[tuple, int] = {}
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute (cuda.h)


def _driver_function(lib, name: str):
    """The kernel ``name`` of the cubin as a driver CUfunction (its own module load: the query
    needs the handle, which CuPy's loaded kernel does not expose)."""
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    for what, err in (("cuModuleLoad", lib.cuModuleLoad(ctypes.byref(module),
                                                        str(build_cubin()).encode())),
                      ("cuModuleGetFunction", lib.cuModuleGetFunction(
                          ctypes.byref(fn), module, name.encode()))):
        if err:
            raise RuntimeError(f"{name}: {what} returned CUresult {err}")
    return fn


def max_active_clusters(cfg: HopperConfig) -> int:
    """How many blocks (``cfg.cluster == 1``) or clusters of ``cfg.cluster`` blocks of the kernel
    can be resident at once on the current device, so a persistent grid is one wave. For clusters
    this is the driver's ``cuOccupancyMaxActiveClusters``: a cluster's blocks must sit in one GPC,
    and a GPC with an odd number of free SMs leaves one idle, so the answer can be below
    SMs / cluster."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if cfg.cluster == 1:
        return sms  # one block per SM: __launch_bounds__(threads, 1) and the shared memory
    key = (cfg.kernel, torch.cuda.current_device())
    if key not in _ACTIVE:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = _driver_function(lib, cfg.kernel)
        lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               ctypes.c_int(cfg.smem_bytes))
        query = lib.cuOccupancyMaxActiveClusters
        query.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                          ctypes.POINTER(_LaunchConfig)]
        config = _LaunchConfig((cfg.cluster * (sms // cfg.cluster), 1, 1), (cfg.threads, 1, 1),
                               cfg.smem_bytes, None, None, 0)
        count = ctypes.c_int(0)
        err = query(ctypes.byref(count), fn, ctypes.byref(config))
        if err or count.value < 1:
            raise RuntimeError(f"{cfg.kernel}: cuOccupancyMaxActiveClusters returned CUresult "
                               f"{err} and {count.value} clusters")
        _ACTIVE[key] = count.value
    return _ACTIVE[key]
# --8<-- [end:clusters]


# --8<-- [start:balanced]
def balanced_grid(units: int, resident: int) -> int:
    """How many persistent blocks (or clusters) should share ``units`` tiles (or pairs of tiles)
    when ``resident`` fit at once: the fewest that still need only ceil(units / resident) rounds.
    For example, 1024 pairs of tiles (8192^3) over 66 resident clusters is 15.5 rounds: half the
    clusters compute 16 pairs and half 15. 64 clusters compute 16 each, in the same 16 rounds, and
    leave two clusters' SMs idle instead of half-used."""
    if units < 1 or resident < 1:
        raise ValueError(f"balanced_grid needs units and resident >= 1, got {units} and {resident}")
    rounds = -(-units // resident)
    return -(-units // rounds)


def persistent_clusters(cfg: HopperConfig, units: int) -> int:
    """The persistent grid, in clusters (blocks when ``cfg.cluster == 1``): every unit a cluster
    of its own if they all fit, else as many as fit at once, or with ``cfg.balanced`` the fewest
    that take the same number of rounds."""
    fit = min(max_active_clusters(cfg), units)
    return balanced_grid(units, fit) if cfg.balanced else fit
# --8<-- [end:balanced]


def c_map_spec(m: int, n: int, address: int, cfg: HopperConfig) -> TensorMapSpec:
    """The tensor map of C (M x N bf16, row-major) for the TMA store of v6 and v7: dimensions
    innermost first, unswizzled boxes of C_BOX_ROWS rows x block_n columns, one per consumer
    warpgroup. TMA skips the parts of a box outside C, so ragged M and N need no check in the
    kernel."""
    return TensorMapSpec(2, (n, m), (n * 2,), (cfg.block_n, C_BOX_ROWS),
                         global_address=address).validate()


# --8<-- [start:launch]
def _launch(name: str, a: torch.Tensor, b: torch.Tensor, cfg: HopperConfig) -> torch.Tensor:
    """The one launcher of v1..v7, v9 and v10: check, encode the tensor maps, copy them to the
    GPU, launch."""
    m, n, k, ops = check_hopper_gemm(name, a, b, cfg)
    if a.device.type != "cuda":
        raise ValueError(f"{name}: a and b must be CUDA tensors, got {a.device}")
    refuse_grad(name, a, b, instead="a @ b.T")
    reason = needs_sm90()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    specs = (ops.a, ops.b) + ((c_map_spec(m, n, c.data_ptr(), cfg),) if cfg.tma_store else ())
    tmaps = device_tensor_maps(specs, a.device)
    fn = kernel(cfg.kernel, a.device.index if a.device.index is not None else 0)
    if fn.max_dynamic_shared_size_bytes < cfg.smem_bytes:
        fn.max_dynamic_shared_size_bytes = cfg.smem_bytes  # above 48 KB needs the opt-in
    tiles = (-(-m // cfg.block_m), -(-n // cfg.block_n))
    with torch.cuda.device(a.device):
        if cfg.persistent:  # a whole number of clusters, all resident at once
            units = -(-m // (cfg.block_m * cfg.cluster)) * tiles[1]  # tiles, or pairs of tiles
            grid: tuple[int, ...] = (cfg.cluster * persistent_clusters(cfg, units),)
        else:
            grid = (tiles[1], tiles[0])
        cuda.launch(fn, grid, cfg.threads, (tmaps, c, np.int32(m), np.int32(n), np.int32(k)),
                    shared_mem=cfg.smem_bytes)
    return c
# --8<-- [end:launch]


def hopper_cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through torch.matmul on B^T (a view: cuBLAS reads B as it is stored)."""
    check_hopper_gemm("hopper_cublas", a, b)
    return torch.matmul(a, b.T)


def hopper_gemm_v1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one stage; TMA, one mbarrier, one warpgroup of m64n128k16 wgmmas (128 x 128 tile)."""
    return _launch("hopper_gemm_v1", a, b, CONFIGS["v1"])


def hopper_gemm_v2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: like v1 with 4 stages and full/empty mbarriers (TMA runs ahead of the tensor cores)."""
    return _launch("hopper_gemm_v2", a, b, CONFIGS["v2"])


def hopper_gemm_v3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: a producer warpgroup and two consumer warpgroups (setmaxnreg), 128 x 256 tiles."""
    return _launch("hopper_gemm_v3", a, b, CONFIGS["v3"])


def hopper_gemm_v4(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: like v3, persistent over the tiles in grouped order (grid = number of SMs)."""
    return _launch("hopper_gemm_v4", a, b, CONFIGS["v4"])


def hopper_gemm_v5(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v5: like v4 in clusters of 2 along M; each block loads half of the shared B tile and TMA
    multicasts it to both blocks."""
    return _launch("hopper_gemm_v5", a, b, CONFIGS["v5"])


def hopper_gemm_v6(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v6: like v4 with 3 stages and a TMA-store epilogue (registers -> shared -> global)."""
    return _launch("hopper_gemm_v6", a, b, CONFIGS["v6"])


def hopper_gemm_v7(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v7: v5's clusters of 2 with B multicast, and v6's TMA-store epilogue (3 stages)."""
    return _launch("hopper_gemm_v7", a, b, CONFIGS["v7"])


def hopper_gemm_v9(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v9: v5 with 16-byte stores of C (a shuffle transpose inside each quad of lanes)."""
    return _launch("hopper_gemm_v9", a, b, CONFIGS["v9"])


def hopper_gemm_v10(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v10: v9's kernel on a balanced grid (the fewest clusters for the same rounds of tiles)."""
    return _launch("hopper_gemm_v10", a, b, CONFIGS["v10"])


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def make_inputs(size, dtype, device, gen):
    """A (m x k) and B (n x k, K-major) of standard normal values rounded to ``dtype``."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device, dtype=torch.float32)
    b = torch.randn((size["n"], size["k"]), generator=dev_gen, device=device, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def _bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    return (m * k + n * k + m * n) * dtype.itemsize


BF16 = (torch.bfloat16,)
def _shape(m: int, n: int, k: int) -> dict:
    """A size with its label: the sweep's axis is the shape (squares, then two LLM projections)."""
    label = f"{m}^3" if m == n == k else f"{m}x{n}x{k}"
    return {"shape": label, "m": m, "n": n, "k": k}


HEADLINE = _shape(8192, 8192, 8192)
# M x N x K of two LLM projections (a 4096 -> 14336 FFN on 16384 tokens, a wide output layer on
# 2048 tokens), where tile quantisation and the last wave differ from the squares
SWEEP = [*(_shape(s, s, s) for s in (2048, 4096, 6144, 8192)),
         _shape(16384, 4096, 14336), _shape(2048, 28672, 4096)]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP])
# Ragged M, N not a multiple of a tile, K not a multiple of 64 (TMA fills the edges with zeros),
# one K-slice, many K-slices (several turns of every stage ring), more tiles than a small grid
TEST_SIZES = [{"m": m, "n": n, "k": k}
              for m, n, k in ((128, 128, 64), (64, 8, 8), (200, 264, 136), (384, 512, 1024),
                              (1000, 776, 520))]
SOURCES = (cuda.source_path(CU_FILE), _launch, check_hopper_gemm, check_gemm_operands,
           encode_tensor_map, device_tensor_maps, c_map_spec, max_active_clusters, _driver_function,
           build_cubin, balanced_grid, persistent_clusters)

hopper_gemm = register(Op(
    name="hopper_gemm", part=6, chapter="part6/hopper-gemm.md",
    title="Hopper GEMM (bf16, TMA + wgmma)", reference=_reference, make_inputs=make_inputs,
    bytes_moved=_bytes, flops=gemm_flops, metric="TFLOP/s", ceiling="gemm_bf16",
    headline=HEADLINE, sweep=SWEEP, dtypes=BF16, bench_dtypes=BF16, test_sizes=TEST_SIZES,
    sweep_axis="shape", tolerances={torch.bfloat16: tolerance_for(MAX_K, torch.bfloat16)},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
hopper_gemm.add(Impl("v0", hopper_cublas, "PyTorch", "cuBLAS via torch.matmul(a, b.T)",
                     (check_hopper_gemm,), origin="library"))
hopper_gemm.add(Impl("v1", hopper_gemm_v1, "CUDA", "TMA + mbarrier + wgmma m64n128, one stage",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v2", hopper_gemm_v2, "CUDA", "like v1, 4 stages, full/empty mbarriers",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v3", hopper_gemm_v3, "CUDA", "producer + 2 consumer warpgroups, 128x256",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v4", hopper_gemm_v4, "CUDA", "like v3, persistent, grouped tile order",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v5", hopper_gemm_v5, "CUDA", "like v4, clusters of 2, B multicast by TMA",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v6", hopper_gemm_v6, "CUDA", "like v4, 3 stages, TMA-store epilogue",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v7", hopper_gemm_v7, "CUDA", "v5's clusters + v6's TMA-store epilogue",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v9", hopper_gemm_v9, "CUDA", "like v5, 16-byte stores of C (quad shuffles)",
                     SOURCES, requires=needs_sm90))
hopper_gemm.add(Impl("v10", hopper_gemm_v10, "CUDA",
                     "v9 on a balanced grid (fewest clusters, same rounds)", SOURCES,
                     requires=needs_sm90))
