"""Decode-batch GEMM for Hopper (sm_90) as a warp-specialized Gluon kernel: y[M, N] = x[M, K] @ W[N, K]^T
(+ bias[N]) for 16 < M <= 128 rows, bf16 / fp16.

At a batch-128 decode pass a linear is still mostly a weight read (128 FMAs per weight element, below
the H200's ~200 FLOP per byte of DRAM), and cuBLAS reads the 7B shapes at 2.4-3.8 TB/s (qkv / o are
latency-bound, down goes through a split-K reduce kernel; docs/benchmarks.md, "the `shared-prefix`
decode pass, kernel by kernel"). The Triton "dot" path of kernels/gemv.py, the same swap-AB tiling
under Triton's software pipeline, was slower than cuBLAS there. This kernel keeps that tiling and
moves the loads to a TMA producer warp, as the warp-specialized attention kernels do
(kernels/extend_attention_ws.py; FlashAttention-3's producer / consumer split, Shah et al., 2024):

- grid (cdiv(N, BN), splits): program (n, s) owns weight rows [n * BN, (n + 1) * BN) and the K steps
  [s * steps_per_split, ...) of BK columns;
- the producer warp copies one [BN, BK] weight box and one [MP, BK] box of x per step into a ring of
  STAGES shared-memory stages (x's rows past M arrive as zeros: TMA's out-of-bounds fill), with
  ready (TMA byte count) and empty (consumer arrival) barriers;
- the consumer warpgroup (the default partition, 4 warps) computes acc[BN, MP] += W x^T with wgmma
  (swap-AB: the weight rows are the instruction's M side, 64 per instruction, the batch its N side,
  MP = max(32, next_pow2(M)) <= 128), one product in flight while the next stage is waited for;
- split-K without a second launch or a CTA-wide barrier: each thread stores its own rows' fp32
  partial, then counts itself in at a counter of its own (one per (row, thread chunk) of the tile,
  `atomic_add` with acq_rel at GPU scope); the thread that arrives last for its rows sums every
  split's partial of those rows in split order (deterministic), adds the bias, writes y and resets
  its counter. The release / acquire pairs are per thread, on the same counter as the stores they
  publish (the serial split-K fix-up of kernels/gemv.py, CUTLASS's "serial split-K", made per
  thread).

Workspace: fp32 partials >= tiles * splits * BN * MP, int32 counters >= tiles * 32 * warps
(zero between calls; each call that completes leaves them zero: a launch that did not finish, e.g.
one killed with its process's context, leaves counts behind and the next split calls on that
workspace would sum too early, so a workspace is not reused after a failed launch). `supported`
says when a call can take the kernel; radixrt.models.linear routes decode-graph calls of the shapes
in TUNED here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import switches
from ._checks import check, next_pow2
from .extend_attention_ws import _is_hopper, _smem_layout

# rows this kernel takes (fewer: kernels/gemv.py's reduce / dot paths). At 129..256 rows (MP 256, a
# [64, 256] accumulator) the sm_90 compile spilled 542-572 bytes inside the loops: not taken (cuBLAS)
MIN_M, MAX_M = 17, 128
NUM_WARPS = 4  # the consumer warpgroup (two at block_n 256: config_warps); plus one producer warp
SMEM_LIMIT = 227 * 1024  # bytes per program on an H100 / H200
# the epilogue's accumulator layout change goes through shared memory in rounds, beside the ring
# (sm_90 compiles, barriers included: 2,116 bytes at block_n 128 x MP 128; ~4 KiB with two
# warpgroups at block_n 256, 196.1 KiB against a 192 KiB ring). Not a bound for the SwiGLU form,
# which takes ~8.2 KiB at block_n 64 / 128 and ~16.1 KiB at block_n 256 (MP 128); compiled for
# sm_90, every config that `fits` admits stayed within SMEM_LIMIT all the same (the largest,
# block_n 256, MP 32, 6 stages, SwiGLU: 229,476 of 232,448 bytes).
EPILOGUE_SMEM = 8 * 1024


@dataclass(frozen=True)
class GemmWsConfig:
    """Launch parameters of gemm_ws. block_n: weight rows per program (64, 128, or 256 with two
    consumer warpgroups); block_k: K per step (64 or 128); stages: ring depth; splits: K splits
    (>= 1; fewer are used when the K steps do not divide among them). Raises ValueError on other
    values."""

    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    splits: int = 1

    def __post_init__(self):
        if self.block_n not in (64, 128, 256) or self.block_k not in (64, 128):
            raise ValueError(f"block_n must be 64, 128 or 256 and block_k 64 or 128, got {self.block_n}, "
                             f"{self.block_k}")
        if self.stages < 2 or self.splits < 1:
            raise ValueError(f"stages must be >= 2 and splits >= 1, got {self.stages}, {self.splits}")


# Measured configs per (MP, N, K) on an H200 (bench/lab/gemm_ws.py prints these lines); a shape routes
# to this kernel only where its entry beat F.linear there (H200, 2026-12-05, Qwen2.5-7B's decode linears
# at 64 and 128 rows: none by the lab's margin; its time 0.994-1.43x F.linear's). TUNED_GATED: the
# SwiGLU form's (gemm_silu_ws, one split) configs per (MP, 2I, K), where the lab measured it faster
# than the gate_up GEMM followed by the SiLU kernel; `Linear.silu_and_mul` takes it only there.
# TUNED_ENV names a JSON file of more entries, {"MP,N,K": [block_n, block_k, stages, splits]} and
# {"MP,N,K,silu": [...]} for TUNED_GATED (the lab writes one), added at import: a benchmark can route
# its measured winners without a code change. A malformed file raises ValueError at import (a typo
# must not silently route nothing).
TUNED: dict[tuple[int, int, int], GemmWsConfig] = {}
TUNED_GATED: dict[tuple[int, int, int], GemmWsConfig] = {
    # H200, 2026-12-05: 71.4 us against 75.0 us for F.linear + silu_and_mul (Qwen2.5-7B gate_up, 64 rows;
    # decode graphs of 33-64 requests pad to it; Engine: the 64-request step 0.984x cuBLAS's, 48: 0.990x)
    (64, 37888, 3584): GemmWsConfig(128, 128, 4, 1),
}
TUNED_ENV = "RADIXRT_GEMM_WS_TUNED"


def load_tuned(path: str | Path) -> tuple[dict[tuple[int, int, int], GemmWsConfig],
                                          dict[tuple[int, int, int], GemmWsConfig]]:
    """(TUNED entries, TUNED_GATED entries) of a TUNED file (TUNED_ENV). Raises ValueError on a
    malformed file or entry (a gated entry must have one split)."""
    try:
        plain, gated = {}, {}
        for key, cfg in json.loads(Path(path).read_text()).items():
            parts = key.split(",")
            is_gated = len(parts) == 4 and parts[3] == "silu"
            shape = tuple(int(v) for v in parts[:3])
            if len(parts) != (4 if is_gated else 3) or len(cfg) != 4:
                raise ValueError(f"entry {key!r}: {cfg!r}")
            config = GemmWsConfig(*(int(v) for v in cfg))
            if is_gated and config.splits != 1:
                raise ValueError(f"entry {key!r}: the SwiGLU form takes one split, got {config.splits}")
            (gated if is_gated else plain)[shape] = config
        return plain, gated
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{TUNED_ENV}={path}: not a file of {{\"MP,N,K\": [block_n, block_k, stages, "
                         f"splits]}} (\"MP,N,K,silu\" for the SwiGLU form): {e}") from e


if switches.gemm_ws_tuned_file():
    _plain, _gated = load_tuned(switches.gemm_ws_tuned_file())
    TUNED.update(_plain)
    TUNED_GATED.update(_gated)


def rows_padded(m: int) -> int:
    """MP, the batch side of the product: max(32, next_pow2(m)) for m in MIN_M..MAX_M."""
    return max(32, next_pow2(m))


def shared_memory_bytes(cfg: GemmWsConfig, mp: int, itemsize: int = 2) -> int:
    """The ring, stages x ([block_n, block_k] + [mp, block_k]) elements, plus EPILOGUE_SMEM for the
    epilogue's layout change of the accumulator and the barriers, in bytes."""
    return cfg.stages * (cfg.block_n + mp) * cfg.block_k * itemsize + EPILOGUE_SMEM


def config_warps(cfg: GemmWsConfig) -> int:
    """The consumer partition's warps: one warpgroup (4), two at block_n 256 (each 128 weight rows,
    so the accumulator stays at block_n * MP / 256 registers per thread). Halving the programs' x
    reads (one [MP, BK] box per 256 weight rows instead of per 128) is what block_n 256 is for: at
    MP 128 x comes from L2 at the rate the weights come from DRAM."""
    return 8 if cfg.block_n == 256 else NUM_WARPS


def fits(cfg: GemmWsConfig, mp: int) -> bool:
    """Shared memory within SMEM_LIMIT and the accumulator at <= 128 fp32 registers per thread."""
    return shared_memory_bytes(cfg, mp) <= SMEM_LIMIT and cfg.block_n * mp // (32 * config_warps(cfg)) <= 128


def split_plan(k: int, cfg: GemmWsConfig) -> tuple[int, int, int]:
    """(total K steps, steps per split, splits used): no split is empty."""
    total = triton.cdiv(k, cfg.block_k)
    per = triton.cdiv(total, min(cfg.splits, total))
    return total, per, triton.cdiv(total, per)


def default_config(m: int, n: int, k: int, num_sms: int = 132) -> GemmWsConfig:
    """TUNED[(MP, N, K)] if measured, else block_n 128, block_k 64, the deepest ring that fits (<= 4),
    and the split count that brings the programs nearest one wave (at most one per 4 K steps)."""
    mp = rows_padded(m)
    tuned = TUNED.get((mp, n, k))
    if tuned is not None:
        return tuned
    block_n = 128
    stages = 4
    while stages > 2 and not fits(GemmWsConfig(block_n, 64, stages), mp):
        stages -= 1
    tiles = triton.cdiv(n, block_n)
    splits = max(1, min(num_sms // tiles, triton.cdiv(k, 64) // 4)) if tiles < num_sms else 1
    return GemmWsConfig(block_n, 64, stages, splits)


def workspace_need(cfg: GemmWsConfig, m: int, n: int, k: int) -> tuple[int, int]:
    """(fp32 partials, int32 counters) a call of cfg at m rows of an [n, k] weight needs."""
    tiles = triton.cdiv(n, cfg.block_n)
    _, _, splits = split_plan(k, cfg)
    mp = rows_padded(m)
    if splits == 1:
        return 0, 0
    return tiles * splits * cfg.block_n * mp, tiles * cfg.block_n * (32 * config_warps(cfg) // cfg.block_n)


@gluon.jit
def _load_ring(w_desc, x_desc, w_smem, x_smem, ready, empty, n0, step0, n_steps):
    """The producer warp: step i's weight box [BN, BK] at (n0, (step0 + i) * BK) and x box [MP, BK]
    at (0, same) into stage i % STAGES, once the consumer has released that stage."""
    STAGES: gl.constexpr = w_smem.shape[0]
    BK: gl.constexpr = w_smem.shape[2]
    for i in range(n_steps):
        s = i % STAGES
        # the first round passes at once (the parity before a fresh barrier's first phase is complete)
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes + x_desc.block_type.nbytes)
        k = (step0 + i) * BK
        tma.async_copy_global_to_shared(w_desc, [n0, k], ready.index(s), w_smem.index(s))
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), x_smem.index(s))


@gluon.jit
def _load_ring_gated(w_desc, x_desc, w_smem, x_smem, ready, empty, n0, step0, n_steps, inter):
    """_load_ring for a fused [gate; up] weight [2 * inter, K]: a stage's first BN / 2 rows are gate
    rows n0.., its last BN / 2 the matching up rows inter + n0.. (two boxes of [BN / 2, BK])."""
    STAGES: gl.constexpr = w_smem.shape[0]
    HALF: gl.constexpr = w_desc.block_type.shape[0]
    BK: gl.constexpr = w_smem.shape[2]
    for i in range(n_steps):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * w_desc.block_type.nbytes + x_desc.block_type.nbytes)
        k = (step0 + i) * BK
        tma.async_copy_global_to_shared(w_desc, [n0, k], ready.index(s), w_smem.index(s).slice(0, HALF))
        tma.async_copy_global_to_shared(w_desc, [inter + n0, k], ready.index(s),
                                        w_smem.index(s).slice(HALF, HALF))
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), x_smem.index(s))


@gluon.jit
def _mma_loop(w_smem, x_smem, ready, empty, n_steps):
    """The consumer warpgroup's main loop: acc[BN, MP] = W_tile x^T over its K steps (fp32, the
    wgmma accumulator layout), releasing each stage once its product is complete."""
    STAGES: gl.constexpr = w_smem.shape[0]
    BN: gl.constexpr = w_smem.shape[1]
    MP: gl.constexpr = x_smem.shape[1]
    NW: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                         instr_shape=[16, MP, 16])
    acc = gl.zeros([BN, MP], gl.float32, layout=acc_layout)
    for i in range(n_steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
        # step i - 1's product is complete once at most one is outstanding: its stage is free
        acc = warpgroup_mma_wait(1, deps=(acc, ))
        if i > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
    return warpgroup_mma_wait(0, deps=(acc, ))


@gluon.jit
def _mma_gated(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters,
               M, N, n0, pid_n, pid_k, splits):
    """The consumer of a SwiGLU tile (_load_ring_gated; one split, no bias): y[m, n0 + r] =
    silu(g) * u for the tile's gate rows g = acc[r] and up rows u = acc[BN / 2 + r], r < BN / 2, from
    the fp32 accumulator (N = the intermediate size). At block_n >= 128 the wgmma layout gives a
    thread gate row r and up row r together (the halves are whole 64-row instructions apart), so the
    product needs no data movement; at block_n 64 they are 32 rows apart, in different warps, which
    tt.split refuses, so the accumulator first moves to a layout with the weight rows on the lanes
    (rows r and r + 32 in one thread; through shared memory, ~8 KiB like the other epilogues)."""
    BN: gl.constexpr = w_smem.shape[1]
    MP: gl.constexpr = x_smem.shape[1]
    NW: gl.constexpr = gl.num_warps()
    HALF: gl.constexpr = BN // 2
    acc = _mma_loop(w_smem, x_smem, ready, empty, n_steps)
    if HALF < 64:  # block_n 64: gate row r (warps 0-1) and up row r (warps 2-3) in different warps
        acc = gl.convert_layout(acc, gl.BlockedLayout([1, 1], [32, 1], [1, NW], [0, 1]))
    gate, up = acc.reshape([2, HALF, MP]).permute((1, 2, 0)).split()
    h = gate / (1.0 + gl.exp(-gate)) * up  # silu(g) * u in fp32
    # lanes along the output's contiguous dimension (its weight rows), warps along the batch rows
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, NW], [0, 1])
    h = gl.convert_layout(h.to(y_ptr.dtype.element_ty), out_layout)
    n = n0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, out_layout))
    m = gl.arange(0, MP, layout=gl.SliceLayout(0, out_layout))
    gl.store(y_ptr + m[None, :].to(gl.int64) * stride_ym + n[:, None], h,
             mask=(n < N)[:, None] & (m < M)[None, :])


@gluon.jit
def _mma_ring(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters,
              M, N, n0, pid_n, pid_k, splits, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr):
    """The consumer warpgroup: _mma_loop, then the epilogue (the module docstring's per-thread
    split-K fix-up when SPLIT)."""
    BN: gl.constexpr = w_smem.shape[1]
    MP: gl.constexpr = x_smem.shape[1]
    NW: gl.constexpr = gl.num_warps()
    acc = _mma_loop(w_smem, x_smem, ready, empty, n_steps)

    # each thread owns CW consecutive batch rows of one weight row: TPC threads per weight row
    TPC: gl.constexpr = (32 * NW) // BN
    CW: gl.constexpr = MP // TPC
    l2: gl.constexpr = gl.BlockedLayout([1, CW], [32 // TPC, TPC], [NW, 1], [1, 0])
    l3: gl.constexpr = gl.BlockedLayout([1, 1, CW], [32 // TPC, TPC, 1], [NW, 1, 1], [2, 1, 0])
    part = gl.convert_layout(gl.convert_layout(acc, l2).reshape([BN, TPC, CW]), l3)
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, l3)))
    t = gl.arange(0, TPC, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))
    c = gl.arange(0, CW, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))
    n = n0 + r
    m = t[None, :, None] * CW + c[None, None, :]  # [1, TPC, CW]
    mask = (n < N)[:, None, None] & (m < M)
    if SPLIT:
        off = r[:, None, None] * MP + m  # within a [BN, MP] partial
        tile = partials + (pid_n * splits).to(gl.int64) * (BN * MP)
        gl.store(tile + pid_k * (BN * MP) + off, part)
        owner = counters + pid_n * (BN * TPC) + r[:, None] * TPC + t[None, :]  # [BN, TPC]: one per thread
        ones = gl.full([BN, TPC], 1, gl.int32, layout=gl.SliceLayout(2, l3))
        arrived = gl.atomic_add(owner, ones, sem="acq_rel", scope="gpu")
        last = (arrived == splits - 1)[:, :, None]
        total = gl.zeros([BN, TPC, CW], gl.float32, layout=l3)
        for sp in range(splits):
            total += gl.load(tile + sp * (BN * MP) + off, mask=last, other=0.0, cache_modifier=".cg")
        part = total
        mask = mask & last
        gl.atomic_xchg(owner, ones * 0, mask=arrived == splits - 1, sem="relaxed", scope="gpu")
    if HAS_BIAS:
        part += gl.load(bias_ptr + n, mask=n < N, other=0.0).to(gl.float32)[:, None, None]
    y_ptrs = y_ptr + m.to(gl.int64) * stride_ym + n[:, None, None]
    gl.store(y_ptrs, gl.convert_layout(part.to(y_ptr.dtype.element_ty), l3), mask=mask)


# warp_specialize passes run-time values only (a constexpr argument arrives as a run-time i1 and both
# of its branches are compiled): one partition function per epilogue form
@gluon.jit
def _mma_plain(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
               n0, pid_n, pid_k, splits):
    _mma_ring(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
              n0, pid_n, pid_k, splits, False, False)


@gluon.jit
def _mma_bias(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
              n0, pid_n, pid_k, splits):
    _mma_ring(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
              n0, pid_n, pid_k, splits, True, False)


@gluon.jit
def _mma_split(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
               n0, pid_n, pid_k, splits):
    _mma_ring(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
              n0, pid_n, pid_k, splits, False, True)


@gluon.jit
def _mma_split_bias(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M,
                    N, n0, pid_n, pid_k, splits):
    _mma_ring(w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters, M, N,
              n0, pid_n, pid_k, splits, True, True)


# M (the batch) varies from call to call under one compile per MP bucket; the split plan's scalars too
@gluon.jit(do_not_specialize=["M", "steps_per_split", "total_steps", "splits"])
def _gemm_ws_kernel(w_desc, x_desc, y_ptr, stride_ym, bias_ptr, partials, counters, M, N, steps_per_split,
                    total_steps, splits, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, STAGES: gl.constexpr,
                    GATED: gl.constexpr = False):
    # GATED: a SwiGLU tile, its weight box half the tile's rows (gate rows, then up rows)
    BN: gl.constexpr = w_desc.block_type.shape[0] * (2 if GATED else 1)
    BK: gl.constexpr = w_desc.block_type.shape[1]
    MP: gl.constexpr = x_desc.block_type.shape[0]
    dtype: gl.constexpr = w_desc.dtype
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    step0 = pid_k * steps_per_split
    n_steps = gl.minimum(steps_per_split, total_steps - step0)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], dtype)
    w_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], w_layout)
    x_smem = gl.allocate_shared_memory(dtype, [STAGES, MP, BK], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    if GATED:  # N: the intermediate size; one split, no bias (gemm_ws checks)
        c_args = (w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters,
                  M, N, pid_n * (BN // 2), pid_n, pid_k, splits)
        p_args = (w_desc, x_desc, w_smem, x_smem, ready, empty, pid_n * (BN // 2), step0, n_steps, N)
        gl.warp_specialize([(_mma_gated, c_args), (_load_ring_gated, p_args)], [1], [40])
        return
    c_args = (w_smem, x_smem, ready, empty, n_steps, y_ptr, stride_ym, bias_ptr, partials, counters,
              M, N, pid_n * BN, pid_n, pid_k, splits)
    p_args = (w_desc, x_desc, w_smem, x_smem, ready, empty, pid_n * BN, step0, n_steps)
    if SPLIT:
        if HAS_BIAS:
            gl.warp_specialize([(_mma_split_bias, c_args), (_load_ring, p_args)], [1], [40])
        else:
            gl.warp_specialize([(_mma_split, c_args), (_load_ring, p_args)], [1], [40])
    else:
        if HAS_BIAS:
            gl.warp_specialize([(_mma_bias, c_args), (_load_ring, p_args)], [1], [40])
        else:
            gl.warp_specialize([(_mma_plain, c_args), (_load_ring, p_args)], [1], [40])

def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemm_ws can take this call: CUDA compute capability 9.x, x [M, K] with MIN_M <= M <=
    MAX_M, N and K > 0, bf16 / fp16 x and weight of one dtype, both contiguous, K * itemsize a
    multiple of 16 (TMA's row alignment), 16-byte aligned base addresses."""
    if not (x.is_cuda and weight.is_cuda) or x.dim() != 2 or weight.dim() != 2:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    m, k = x.shape
    if not MIN_M <= m <= MAX_M or weight.shape[1] != k or k == 0 or weight.shape[0] == 0:
        return False
    if (k * x.element_size()) % 16:
        return False
    if not (x.is_contiguous() and weight.is_contiguous()) or x.data_ptr() % 16 or weight.data_ptr() % 16:
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _is_hopper(index)


def gemm_ws(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            out: torch.Tensor | None = None, config: GemmWsConfig | None = None,
            partials: torch.Tensor | None = None, counters: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T (+ bias) for x [M, K], weight [N, K], bias [N] (x's dtype), out [M, N] (a row
    stride of its own allowed, unit column stride); fp32 accumulation, split-K sums in split order.
    Inputs must pass `supported`. config: default_config(M, N, K) if None. partials / counters: the
    split-K workspace (workspace_need; counters zero between calls); allocated for this call when
    None and the config splits. Returns out. Raises ValueError on shape, dtype or workspace errors."""
    m, k = x.shape
    n = weight.shape[0]
    check(weight.shape[1] == k, f"weight {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    check(MIN_M <= m <= MAX_M, f"gemm_ws takes {MIN_M}..{MAX_M} rows, got {m}")
    check(bias is None or (bias.shape == (n,) and bias.dtype == x.dtype and bias.stride(0) == 1),
          "bias must be a contiguous [N] in x's dtype")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    check(out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype,
          "out must be [M, N] in x's dtype with a unit column stride")
    cfg = config or default_config(m, n, k, torch.cuda.get_device_properties(x.device).multi_processor_count)
    mp = rows_padded(m)
    check(fits(cfg, mp), f"{cfg} does not fit at {mp} rows ({shared_memory_bytes(cfg, mp)} B of shared "
          "memory, or an accumulator of more than 128 registers per thread)")
    total, per, splits = split_plan(k, cfg)
    tiles = triton.cdiv(n, cfg.block_n)
    need_p, need_c = workspace_need(cfg, m, n, k)
    if splits > 1:
        if partials is None or counters is None:
            partials = torch.empty(need_p, dtype=torch.float32, device=x.device)
            counters = torch.zeros(need_c, dtype=torch.int32, device=x.device)
        check(partials.numel() >= need_p and counters.numel() >= need_c,
              f"workspace too small: needs {need_p} partials and {need_c} counters")
    else:
        partials = counters = out  # unused
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k],
                                          _smem_layout(cfg.block_n, cfg.block_k, weight.dtype))
    x_desc = TensorDescriptor.from_tensor(x, [mp, cfg.block_k], _smem_layout(mp, cfg.block_k, x.dtype))
    _gemm_ws_kernel[(tiles, splits)](w_desc, x_desc, out, out.stride(0), bias if bias is not None else out,
                                     partials, counters, m, n, per, total, splits, HAS_BIAS=bias is not None,
                                     SPLIT=splits > 1, STAGES=cfg.stages, num_warps=config_warps(cfg))
    return out


def gemm_silu_ws(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                 config: GemmWsConfig | None = None) -> torch.Tensor:
    """SwiGLU of a fused [gate; up] weight in one launch: y = silu(x Wg^T) * (x Wu^T) for x [M, K],
    weight [2I, K] (gate rows first), y [M, I] (out: a row stride of its own allowed), from the fp32
    accumulator (the unfused path rounds x W^T to x's dtype before the SiLU). Each program's tile is
    block_n / 2 gate rows and the matching up rows. Inputs must pass `supported`; the config must
    not split K (a split tile would need its fix-up before the product). config: default_config(M,
    2I, K) with splits 1 if None. Returns out. Raises ValueError on shape, dtype or config errors."""
    m, k = x.shape
    n2 = weight.shape[0]
    check(weight.shape[1] == k and n2 % 2 == 0,
          f"weight {tuple(weight.shape)} is not [2I, K] for x {tuple(x.shape)}")
    check(MIN_M <= m <= MAX_M, f"gemm_silu_ws takes {MIN_M}..{MAX_M} rows, got {m}")
    inter = n2 // 2
    if out is None:
        out = torch.empty(m, inter, dtype=x.dtype, device=x.device)
    check(out.shape == (m, inter) and out.stride(1) == 1 and out.dtype == x.dtype,
          "out must be [M, I] in x's dtype with a unit column stride")
    if config is None:
        base = default_config(m, n2, k, torch.cuda.get_device_properties(x.device).multi_processor_count)
        config = GemmWsConfig(base.block_n, base.block_k, base.stages, 1)
    mp = rows_padded(m)
    check(fits(config, mp), f"{config} does not fit at {mp} rows")
    total, per, splits = split_plan(k, config)
    check(splits == 1, f"gemm_silu_ws does not split K, got {config}")
    half = config.block_n // 2
    bk = config.block_k
    w_desc = TensorDescriptor.from_tensor(weight, [half, bk], _smem_layout(half, bk, weight.dtype))
    x_desc = TensorDescriptor.from_tensor(x, [mp, bk], _smem_layout(mp, bk, x.dtype))
    _gemm_ws_kernel[(triton.cdiv(inter, half), 1)](
        w_desc, x_desc, out, out.stride(0), out, out, out, m, inter, per, total, 1, HAS_BIAS=False,
        SPLIT=False, STAGES=config.stages, GATED=True, num_warps=config_warps(config))
    return out
