"""Skinny GEMM ("GEMV") for decode: y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) with M <= 256.

At batch-1..16 decode a linear layer is a pure weight read (M * N * K FMAs over N * K weights), so the
kernel is built for memory bandwidth, not FLOPs (at M = 64..256 it also has to keep the tensor cores
busy; there it is only used for the shapes where the bench measured it beating cuBLAS, see TUNED):

  grid (cdiv(N, BLOCK_N), num_splits): program (n, s) streams the rows W[n*BLOCK_N : (n+1)*BLOCK_N]
  over its K range [s * k_per_split, (s+1) * k_per_split) in BLOCK_K chunks. Rows are contiguous, so a
  chunk is BLOCK_N coalesced runs of 16-byte vector loads; x (M x K, a few KB) stays in L1/L2.

Two inner products, chosen by `SkinnyConfig.use_dot`:
  - reduce (M of 1..2, maybe 4): the classic CUDA-core GEMV. x and W chunks are loaded as tensors of
    one shape [BM, BN, BK] (so Triton gives both, and the products, the load's coalesced layout and
    moves nothing through shared memory in the loop), multiplied in fp32 into per-thread partial
    sums, and reduced over K once after the loop. At M > 1 each W element is loaded by BM threads
    (L1 hits; HBM still reads it once);
  - dot (M of 4..256): swap A and B, acc[BN, BM] += W[BN, BK] @ x^T[BK, BM] with
    BM = max(16, next_pow2(M)) (x padded by repeating its last row), so the weight block is the dot's
    M side (64-row wgmma instructions on Hopper, BM their N side, up to 256) and Triton's software
    pipeline keeps `num_stages` chunks of W and x in flight through shared memory:
    num_stages * (BM + BN) * BK * itemsize bytes (`shared_memory_bytes`). M <= 16 gives BM = 16.

Split-K (for the small matrices, N = 3584..4608, which give too few row blocks to fill 132 SMs) writes
fp32 partials [S, M, N] to a workspace. With `serial_reduce` (default) the last program of each row
block to arrive, found with an arrival counter, sums the S partials in split order, adds the bias and
writes y: one launch, and deterministic because the summation order does not depend on which program
arrives last ("serial split-K" fix-up, as in CUTLASS's split-K serial mode and the semaphore pattern of
the CUDA threadFenceReduction sample). The counter is reset by that program, so a workspace stays
reusable. Otherwise a second small kernel does the same sum (the cuBLAS way).

All launch parameters depend only on shapes (CUDA-graph safe: no host sync; the only allocations are
the output and, when none is passed, a workspace whose size depends only on shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, check, dot_precision, next_pow2
from .pdl import gdc_enter, launch_options, use_pdl

MAX_M = 16  # rows routed by default (skinny_linear_supported) and the reduce path's limit
MAX_M_DOT = 256  # rows the dot path takes; M > MAX_M is routed only for shapes TUNED lists
_SMEM_PER_SM = 228 * 1024  # H100/H200 shared memory per SM (bytes; at most 227 KB per program)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch parameters of skinny_linear (bench/kernels/bench_gemv.py sweeps them).

    Raises ValueError when a size is < 1, block_n or block_k is not a power of two, block_k < 16, or
    use_dot with block_n < 16. The dot path's tile is [block_n, BM] with BM = max(16, next_pow2(M)):
    keep num_stages * (BM + block_n) * block_k * itemsize within the GPU's shared memory (227 KB on
    an H100/H200) and the fp32 accumulator, block_n * BM / (32 * num_warps) registers per thread,
    at <= 128, or the compile fails (triton OutOfResources) or spills.
    """

    block_n: int  # output columns (= weight rows) per program, power of two (>= 16 with use_dot)
    block_k: int  # K chunk per loop step, power of two >= 16
    split_k: int = 1  # requested K splits (the launcher drops splits that would be empty)
    num_warps: int = 4
    num_stages: int = 2
    use_dot: bool = False  # tl.dot with x padded to max(16, next_pow2(M)) rows, else broadcast-multiply + sum
    serial_reduce: bool = True  # split-K fix-up by the last program (one launch) vs a second kernel
    # FP8 weights on the dot path: the dot in fp16 (W widened by one packed e4m3 -> f16 cvt per two
    # values, x rounded to fp16, clamped to its range; M = 1 loads and converts one x row) instead of
    # in x's dtype (e4m3 -> bf16: three cvts per two values). Ignored for other weights.
    f16_dot: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "split_k", "num_warps", "num_stages"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        check(next_pow2(self.block_n) == self.block_n and next_pow2(self.block_k) == self.block_k,
              f"block_n {self.block_n} and block_k {self.block_k} must be powers of two")
        check(self.block_k >= 16, f"block_k must be >= 16, got {self.block_k}")
        check(not self.use_dot or self.block_n >= 16, f"use_dot needs block_n >= 16, got {self.block_n}")
        check(self.use_dot or not self.f16_dot, "f16_dot needs use_dot")


# Tuned configs, keyed by (m_bucket, N, K) with m_bucket = next_pow2(M): edit from the bench's
# "best config" column (bench/kernels/bench_gemv.py prints these lines ready to paste). Shapes not
# listed fall back to default_config's rules. An entry with m_bucket > MAX_M (a dot config) also
# routes M in (m_bucket / 2, m_bucket] of that shape to the kernel (skinny_linear_supported): add
# one only where the bench measured skinny_linear beating F.linear.
# Best configs per (m bucket, N, K), from bench/kernels/bench_gemv.py on an H200 (2026-11-30,
# docs/benchmarks.md): the Qwen2.5-7B decode linears.
TUNED: dict[tuple[int, int, int], SkinnyConfig] = {
    (1, 4608, 3584): SkinnyConfig(8, 512, 1, 4, 1, use_dot=False),
    (1, 3584, 3584): SkinnyConfig(8, 512, 1, 4, 1, use_dot=False),
    (1, 37888, 3584): SkinnyConfig(16, 256, 1, 4, 1, use_dot=False),
    (1, 3584, 18944): SkinnyConfig(8, 512, 2, 4, 1, use_dot=False),
    (1, 152064, 3584): SkinnyConfig(8, 512, 1, 4, 1, use_dot=False),
    (4, 37888, 3584): SkinnyConfig(64, 128, 1, 4, 4, use_dot=True),
    (4, 3584, 18944): SkinnyConfig(64, 128, 4, 4, 4, use_dot=True),
    (8, 37888, 3584): SkinnyConfig(64, 128, 1, 4, 4, use_dot=True),
    (8, 3584, 18944): SkinnyConfig(64, 128, 4, 4, 4, use_dot=True),
}


def shared_memory_bytes(cfg: SkinnyConfig, m: int, itemsize: int = 2) -> int:
    """Estimated shared memory (bytes) of one program of `cfg` at M rows with itemsize-byte inputs
    (2: fp16/bf16, 4: fp32): the dot path's pipeline buffers, num_stages chunks of W [block_n,
    block_k] and x [BM, block_k] with BM = max(16, next_pow2(M)); 0 for the reduce path (no shared
    memory in its loop). Triton may add a few KB (layout conversions of the epilogue)."""
    if not cfg.use_dot:
        return 0
    return cfg.num_stages * (max(16, next_pow2(m)) + cfg.block_n) * cfg.block_k * itemsize


def default_config(m: int, n: int, k: int, num_sms: int = 132) -> SkinnyConfig:
    """The config for M rows (1..MAX_M_DOT) of an [N, K] weight: TUNED[(next_pow2(M), N, K)] if
    listed, else these rules (reasoned for the H200, to be confirmed by the bench), assuming 2-byte
    inputs. Raises ValueError for M > MAX_M_DOT.

    M <= 2 uses the reduce path with 16 x 256 chunks (8 KB of bf16 per step and 32 accumulator
    registers per thread at M = 1; up to 16 programs of 4 warps per SM keep ~128 KB of loads in
    flight, as Triton does not pipeline loads that feed no dot), M of 3..16 the dot path with
    64 x 128 chunks in 4 cp.async stages (80 KB of shared memory, 2 programs per SM). Split K in
    powers of two until there are >= 4 programs per SM, keeping >= 4 chunks per split.

    M of 17..256 (BM = next_pow2(M) of 32..256) uses the dot path with block_k = 64, block_n = 64
    at BM = 32 and 128 above (a wider W tile re-reads x, BM * K * 2 bytes per program, from L2 fewer
    times), 8 warps where the fp32 accumulator would otherwise exceed 128 registers per thread
    (block_n * BM > 16384, i.e. BM = 256), and 4 stages if two programs still fit in an SM's 228 KB
    of shared memory, else 3: BM = 32 and 64 get 4 stages (48 and 96 KB), BM = 128 3 (96 KB), BM =
    256 3 (144 KB, one program per SM). Split K as large_m_split_k: in powers of two while the grid
    stays within one wave of resident programs (a partial second wave would idle SMs), each split
    keeps >= 4 chunks and the fp32 partials (splits * BM * N * 4 bytes) stay no larger than the
    weight. E.g. at M = 128: qkv 4608 x 3584 -> 36 row blocks x 4 splits, o_proj 3584 x 3584 -> 28
    x 8, down 3584 x 18944 -> 28 x 8, gate_up 37888 x 3584 -> 296 x 1; at M = 256: qkv 36 x 2,
    o_proj 28 x 4, down 28 x 4."""
    check(m <= MAX_M_DOT, f"skinny_linear takes at most {MAX_M_DOT} rows, got {m}")
    m_bucket = next_pow2(m)
    tuned = TUNED.get((m_bucket, n, k))
    if tuned is not None:
        return tuned
    if m > MAX_M:
        return _large_m_config(m_bucket, n, k, num_sms)
    if m <= 2:
        block_n, block_k, stages, use_dot = 16, 256, 1, False
    else:
        block_n, block_k, stages, use_dot = 64, 128, 4, True
    tiles, split = triton.cdiv(n, block_n), 1
    while tiles * split < 4 * num_sms and k >= 2 * split * 4 * block_k:
        split *= 2
    return SkinnyConfig(block_n, block_k, split, 4, stages, use_dot)


# FP8-weight configs per (m_bucket, N, K), as TUNED: bench/kernels/sweep_fp8.py prints these lines
# (only configs that fit the bf16 workspace, fits_bf16_workspace). Qwen2.5-7B's four linears,
# measured on an H200 on 2026-12-01 (`bash bench/h200_run.sh fp8-sweep`): one layer at M = 1 in
# 86.8 us against bf16's 131.8 and fp8_config_legacy's 93.7 (docs/benchmarks.md).
FP8_TUNED: dict[tuple[int, int, int], SkinnyConfig] = {  # us: this config vs the f16_dot rule
    (1, 4608, 3584): SkinnyConfig(64, 256, 4, 4, 3, use_dot=True, f16_dot=True),  # 10.3 vs 16.0
    (1, 3584, 3584): SkinnyConfig(8, 1024, 1, 4, 1, use_dot=False),  # 7.9 vs 12.0
    (1, 37888, 3584): SkinnyConfig(16, 512, 1, 4, 1, use_dot=False),  # 43.3 vs 78.9
    (1, 3584, 18944): SkinnyConfig(64, 256, 4, 4, 3, use_dot=True, f16_dot=True),  # 25.3 vs 48.8
    (2, 4608, 3584): SkinnyConfig(64, 256, 1, 4, 4, use_dot=True, f16_dot=True),  # 13.3 vs 28.7
    (2, 3584, 3584): SkinnyConfig(16, 256, 2, 4, 1, use_dot=False),  # 9.6 vs 20.8
    (2, 37888, 3584): SkinnyConfig(128, 128, 1, 4, 3, use_dot=True, f16_dot=True),  # 56.5 vs 117.9
    (2, 3584, 18944): SkinnyConfig(64, 256, 2, 4, 4, use_dot=True, f16_dot=True),  # 33.6 vs 67.1
    (4, 3584, 3584): SkinnyConfig(64, 256, 2, 4, 4, use_dot=True, f16_dot=True),  # 10.1 vs 10.9
    (4, 37888, 3584): SkinnyConfig(128, 128, 1, 4, 3, use_dot=True, f16_dot=True),  # 54.3 vs 65.9
    (16, 4608, 3584): SkinnyConfig(64, 256, 1, 4, 4, use_dot=True, f16_dot=True),  # 12.2 vs 12.9
    (16, 3584, 3584): SkinnyConfig(64, 256, 2, 4, 4, use_dot=True, f16_dot=True),  # 9.8 vs 11.0
    (16, 37888, 3584): SkinnyConfig(128, 128, 1, 4, 3, use_dot=True, f16_dot=True),  # 51.8 vs 62.6
    (16, 3584, 18944): SkinnyConfig(64, 256, 2, 4, 4, use_dot=True, f16_dot=True),  # 30.4 vs 38.0
}


def fp8_config(cfg: SkinnyConfig, m: int, n: int = 0, k: int = 0) -> SkinnyConfig:
    """The default config for an FP8 [N, K] weight at M rows: FP8_TUNED[(next_pow2(M), N, K)] if
    listed; else at M <= 2 fp8_config_legacy (the sweep of 2026-12-01 ran the rule below at 1.18x /
    1.60x bf16's time at M = 1 / 2, legacy at 0.71x / 0.81x: the tuned configs pick per shape); else
    from the bf16 one `cfg`: the dot path in fp16 (f16_dot: e4m3 -> fp16 is 0.5 conversions per
    weight, -> fp32 1.5, and the H200 converts 16 values per clock per SM) with twice cfg's K chunk
    up to 512 (a 16-byte load is 16 fp8 values), block_n = max(16, cfg.block_n), cfg's split_k,
    warps and (4 with the reduce path) stages. The rule never takes more K splits nor row blocks
    than cfg, so a workspace sized for the bf16 configs (models/linear.py) is large enough
    (FP8_TUNED entries are checked by the sweep)."""
    tuned = FP8_TUNED.get((next_pow2(m), n, k))
    if tuned is not None:
        return tuned
    if m <= 2:  # measured: the rule below ran M = 1 / 2 at 1.18x / 1.60x bf16, legacy 0.71x / 0.81x
        return fp8_config_legacy(cfg, m)
    stages = 4 if not cfg.use_dot else cfg.num_stages
    return SkinnyConfig(max(16, cfg.block_n), min(512, cfg.block_k * 2), cfg.split_k, cfg.num_warps, stages,
                        use_dot=True, serial_reduce=cfg.serial_reduce, f16_dot=True)


def workspace_need(cfg: SkinnyConfig, m: int, n: int, k: int) -> tuple[int, int]:
    """(fp32 partials, int32 counters) of cfg at M rows of an [N, K] weight, counted as
    models/linear.py sizes a workspace: splits * M * N and cdiv(N, block_n), also without split-K
    (which then needs no workspace)."""
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    return triton.cdiv(k, k_per_split) * m * n, triton.cdiv(n, cfg.block_n)


def fits_bf16_workspace(cfg: SkinnyConfig, m: int, n: int, k: int, num_sms: int = 132) -> bool:
    """True when cfg at M rows needs no more workspace than the bf16 default configs of every routed
    row count 1..MAX_M together (what models/linear.py allocates per weight). Never raises."""
    partials = counters = 1
    for rows in range(1, MAX_M + 1):
        p, c = workspace_need(default_config(rows, n, k, num_sms), rows, n, k)
        partials, counters = max(partials, p), max(counters, c)
    p, c = workspace_need(cfg, m, n, k)
    return p <= m * n or (p <= partials and c <= counters)


def fp8_config_legacy(cfg: SkinnyConfig, m: int) -> SkinnyConfig:
    """fp8_config before 2026-12-02 (kept for the sweep's old-against-new rows): the bf16 config,
    with the reduce path at M = 1 doubling block_k while its fp32 partial sums stay at <= 64
    registers per thread; the dot path widens W to x's dtype (no f16_dot)."""
    per_thread = cfg.block_n * cfg.block_k * 2 // (32 * cfg.num_warps)
    if cfg.use_dot or m != 1 or per_thread > 64:
        return cfg
    return SkinnyConfig(cfg.block_n, cfg.block_k * 2, cfg.split_k, cfg.num_warps, cfg.num_stages,
                        use_dot=False, serial_reduce=cfg.serial_reduce)


def programs_per_sm(cfg: SkinnyConfig, m: int, itemsize: int = 2) -> int:
    """Programs of `cfg` at M rows that fit in one SM's shared memory (228 KB on an H100/H200, 1 KB of
    it reserved per program), capped at 2 (1 or 2; registers are not counted)."""
    return 2 if 2 * (shared_memory_bytes(cfg, m, itemsize) + 1024) <= _SMEM_PER_SM else 1


def large_m_split_k(m: int, n: int, k: int, block_n: int, block_k: int, num_stages: int,
                    num_sms: int = 132) -> int:
    """default_config's split-K rule for M > MAX_M rows (BM = next_pow2(M)) and a dot tile [block_n,
    block_k] in num_stages stages on an [N, K] weight (2-byte inputs): the largest power of two S with
    cdiv(N, block_n) * S <= programs_per_sm * num_sms programs (one wave; or S = 1), >= 4 block_k
    chunks per split and fp32 partials S * BM * N * 4 bytes no larger than the weight's N * K * 2.
    Returns S >= 1; never raises."""
    bm = next_pow2(m)
    per_sm = programs_per_sm(SkinnyConfig(block_n, block_k, 1, 4, num_stages, use_dot=True), m)
    tiles, split = triton.cdiv(n, block_n), 1
    while (tiles * 2 * split <= per_sm * num_sms and k >= 2 * split * 4 * block_k
           and 2 * split * bm * 4 <= k * 2):
        split *= 2
    return split


def _large_m_config(bm: int, n: int, k: int, num_sms: int) -> SkinnyConfig:
    """default_config's rule for BM = next_pow2(M) > MAX_M (see there)."""
    block_k = 64
    block_n = 64 if bm <= 32 else 128
    num_warps = 8 if block_n * bm > 128 * 32 * 4 else 4
    two_per_sm = programs_per_sm(SkinnyConfig(block_n, block_k, 1, num_warps, 4, use_dot=True), bm) == 2
    stages = 4 if two_per_sm else 3
    split = large_m_split_k(bm, n, k, block_n, block_k, stages, num_sms)
    return SkinnyConfig(block_n, block_k, split, num_warps, stages, use_dot=True)


@dataclass
class SkinnyWorkspace:
    """Split-K scratch, reusable by any sequence of skinny_linear calls on one stream.

    partials: fp32, >= S * M * N elements (overwritten by every split-K call)
    counters: int32, >= cdiv(N, block_n) elements, all zero between calls (each serial split-K call
              leaves them zero again). Not shared by kernels running concurrently on two streams.
    """

    partials: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, num_partials: int, num_counters: int, device: torch.device | str) -> SkinnyWorkspace:
        return cls(torch.empty(num_partials, dtype=torch.float32, device=device),
                   torch.zeros(num_counters, dtype=torch.int32, device=device))


@triton.jit
def _sum_splits(partials, bias, y, offs_m, offs_n, M, N, num_splits, stride_ym,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y[m, n] = sum_s partials[s, m, n] (+ bias[n]) in split order, for one [BM, BN] tile."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    p_ptrs = partials + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, num_splits):
        # .cg: read from L2, never a stale L1 line (other programs wrote these)
        acc += tl.load(p_ptrs + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
    if HAS_BIAS:
        acc += tl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _last_split_sums(partials, counter, bias, y, offs_m, offs_n, M, N, num_splits, stride_ym,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Serial split-K fix-up, after a program stored its partial tile: count the program in at
    `counter` (the tile's); the last of the tile's num_splits programs sums every split into y
    (_sum_splits) and resets the counter to zero for the next call."""
    tl.debug_barrier()  # every thread's partial stores precede the release below
    arrived = tl.atomic_add(counter, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        tl.debug_barrier()
        _sum_splits(partials, bias, y, offs_m, offs_n, M, N, num_splits, stride_ym,
                    BLOCK_M, BLOCK_N, HAS_BIAS)
        tl.atomic_xchg(counter, 0)  # ready for the next call


@triton.jit
def _skinny_kernel(
    x, w, w_scale, bias, y, partials, counters,
    M, N, K, k_per_split, num_splits,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, SPLIT: tl.constexpr, SERIAL_REDUCE: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_W_SCALE: tl.constexpr,
    F16_DOT: tl.constexpr, ONE_ROW: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows past N (or M) re-read the last row: loads stay unmasked along N and M, results are dropped
    w_rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_rows = tl.minimum(offs_m, M - 1)
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    # masks are all-true constants when EVEN_K (every chunk lies inside K)
    if USE_DOT:
        w_ptrs = w + w_rows[:, None] * stride_wn + offs_k[None, :]  # [BN, BK]
        x_ptrs = x + x_rows[:, None] * stride_xm + offs_k[None, :]  # [BM, BK]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if ONE_ROW:
            x_ptrs = x + offs_k[None, :]  # [1, BK]: M = 1 converts one row, then broadcasts it
        gdc_enter(USE_PDL)  # kernels/pdl.py
        for k0 in range(k_start, k_stop, BLOCK_K):
            k_mask = (k0 + offs_k) < K
            wt = tl.load(w_ptrs + k0, mask=k_mask[None, :] | EVEN_K, other=0.0)
            xt = tl.load(x_ptrs + k0, mask=k_mask[None, :] | EVEN_K, other=0.0)
            if F16_DOT:  # FP8 weights, fp16 dot: one packed cvt per two weights
                xt = tl.clamp(xt.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
                if ONE_ROW:
                    xt = tl.broadcast_to(xt, (BLOCK_M, BLOCK_K))
                acc = tl.dot(wt.to(tl.float16), tl.trans(xt), acc, input_precision=DOT_PRECISION)
            else:  # (FP8 weights are widened to x's dtype in registers: W8A16)
                acc = tl.dot(wt.to(xt.dtype), tl.trans(xt), acc, input_precision=DOT_PRECISION)  # [BN, BM]
        acc = tl.trans(acc)
    else:
        # per-thread fp32 partial sums [BM, BN, BK], reduced over K once at the end
        w_ptrs = w + w_rows[None, :, None] * stride_wn + offs_k[None, None, :]  # [1, BN, BK]
        x_ptrs = x + x_rows[:, None, None] * stride_xm + offs_k[None, None, :]  # [BM, 1, BK]
        # one shape for both loads, so one layout for x, W and the products (no shared-memory shuffles)
        x_ptrs = tl.broadcast_to(x_ptrs, (BLOCK_M, BLOCK_N, BLOCK_K))
        w_ptrs = tl.broadcast_to(w_ptrs, (BLOCK_M, BLOCK_N, BLOCK_K))
        # the first chunk initialises the accumulator (in the load's layout; a split is never empty)
        k_mask = (k_start + offs_k)[None, None, :] < K
        wt = tl.load(w_ptrs + k_start, mask=k_mask | EVEN_K, other=0.0)
        gdc_enter(USE_PDL)  # kernels/pdl.py: the first weight chunk is in flight before the wait
        xt = tl.load(x_ptrs + k_start, mask=k_mask | EVEN_K, other=0.0)
        acc3 = xt.to(tl.float32) * wt.to(tl.float32)
        for k0 in range(k_start + BLOCK_K, k_stop, BLOCK_K):
            k_mask = (k0 + offs_k)[None, None, :] < K
            wt = tl.load(w_ptrs + k0, mask=k_mask | EVEN_K, other=0.0)
            xt = tl.load(x_ptrs + k0, mask=k_mask | EVEN_K, other=0.0)
            acc3 += xt.to(tl.float32) * wt.to(tl.float32)
        acc = tl.sum(acc3, axis=2)  # [BM, BN]
    if HAS_W_SCALE:  # FP8 weights: one scale per output channel (row of W), before split-K sums
        acc = acc * tl.load(w_scale + w_rows)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT:
        # this split's partial sums, then (serial) the last program of the row block sums all splits
        tl.store(partials + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)
        if SERIAL_REDUCE:
            _last_split_sums(partials, counters + pid_n, bias, y, offs_m, offs_n, M, N, num_splits, stride_ym,
                             BLOCK_M, BLOCK_N, HAS_BIAS)
    else:
        if HAS_BIAS:
            acc += tl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_splits_kernel(partials, bias, y, M, N, num_splits, stride_ym,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                          USE_PDL: tl.constexpr = False):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    _sum_splits(partials, bias, y, tl.arange(0, BLOCK_M), offs_n, M, N, num_splits, stride_ym,
                BLOCK_M, BLOCK_N, HAS_BIAS)


def skinny_rows_routed(m: int, n: int, k: int) -> bool:
    """True when M rows against an [N, K] weight go to skinny_linear by shape alone: 1 <= M <= MAX_M
    (16), or MAX_M < M <= MAX_M_DOT (256) with a dot-path TUNED entry for (next_pow2(M), N, K) (a
    shape where the bench measured the kernel beating cuBLAS). Never raises."""
    if m < 1 or m > MAX_M_DOT:
        return False
    if m <= MAX_M:
        return True
    tuned = TUNED.get((next_pow2(m), n, k))
    return tuned is not None and tuned.use_dot


def skinny_linear_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when skinny_linear takes (x [..., K], weight [N, K]) and is expected to beat a GEMM: M rows
    (leading dims of x flattened) with skinny_rows_routed(M, N, K) (M <= 16, or M <= 256 for shapes
    TUNED lists), fp16/bf16/fp32 with matching dtypes and devices, a contiguous [N, K] weight, and K a
    multiple of 16 (aligned 16-byte loads; other K work but run slower). Never raises."""
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        return False
    m = x.numel() // max(1, x.shape[-1])
    n, k = weight.shape
    return (skinny_rows_routed(m, n, k) and x.dtype == weight.dtype and x.dtype in _DTYPES
            and x.device == weight.device and weight.is_contiguous() and k % 16 == 0 and x.stride(-1) == 1)


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                weight_scale: torch.Tensor | None = None) -> None:
    check(weight.dim() == 2, f"weight must be [N, K], got {tuple(weight.shape)}")
    check(weight.shape[1] >= 1, "weight must have K >= 1 columns")
    check(x.dim() >= 1 and x.shape[-1] == weight.shape[1],
          f"x {tuple(x.shape)} must be [..., K] with K = weight.shape[1] = {weight.shape[1]}")
    if weight.dtype == FP8_DTYPE:
        check(weight_scale is not None and weight_scale.shape == (weight.shape[0],)
              and weight_scale.dtype == torch.float32 and weight_scale.stride(0) == 1
              and weight_scale.device == weight.device,
              f"an FP8 weight needs weight_scale, a contiguous float32 [{weight.shape[0]}] tensor")
        check(x.dtype in _DTYPES, f"x must be float16/bfloat16/float32, got {x.dtype}")
    else:
        check(weight_scale is None, "weight_scale is only for FP8 (float8_e4m3fn) weights")
        check(x.dtype in _DTYPES and x.dtype == weight.dtype,
              f"x {x.dtype} and weight {weight.dtype} must be one of float16/bfloat16/float32 and equal")
    check(x.device == weight.device, "x and weight are on different devices")
    check(weight.stride(1) == 1 and weight.stride(0) >= weight.shape[1], "weight rows must be contiguous")
    check(x.stride(-1) == 1, "x must have a contiguous last dim")
    if bias is not None:
        check(bias.shape == (weight.shape[0],), f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
        check(bias.dtype == x.dtype and bias.device == x.device and bias.stride(0) == 1,
              "bias must be contiguous with x's dtype and device")


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: SkinnyConfig | None = None,
                  workspace: SkinnyWorkspace | None = None,
                  weight_scale: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T (+ bias), F.linear for decode-sized batches, fp32 accumulation.

    x        : [..., K] with M = prod(leading dims) in 0..256 (0..16 with a reduce-path config),
               fp16/bf16/fp32, last dim contiguous
    weight   : [N, K] (nn.Linear layout), same dtype, rows contiguous
    bias     : optional [N], same dtype
    out      : optional [..., N] contiguous, x's dtype (written in place and returned)
    config   : launch parameters; default default_config(M, N, K, number of SMs)
    workspace: split-K scratch (SkinnyWorkspace) with >= splits * M * N partials and cdiv(N, block_n)
               counters; when None and the config splits K, one is allocated for this call (its
               counters need a memset). Pass one to reuse it across calls/graphs.
    weight_scale: optional [N] float32 contiguous per-output-channel scales of an FP8
               (float8_e4m3fn) weight: y = x @ (weight * weight_scale[:, None])^T (+ bias), the
               weight widened to x's dtype in registers (W8A16: half the bytes of a bf16 weight
               read); the default config then takes fp8_config's K chunks. Required for an FP8
               weight, refused for others.
    Returns y [..., N] in x's dtype. Raises ValueError on bad shapes, dtypes, devices or strides,
    M > 256, M > 16 with a reduce-path (use_dot=False) config, or a workspace that is too small;
    triton's OutOfResources when a config needs more shared memory than the GPU has (see
    shared_memory_bytes). Whether M > 16 is faster than F.linear depends on the shape: route calls
    with skinny_linear_supported.
    """
    return _run(x, weight, bias, out, config, workspace, compile_only=False, weight_scale=weight_scale)


def skinny_linear_compile(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          out: torch.Tensor | None = None, config: SkinnyConfig | None = None,
                          workspace: SkinnyWorkspace | None = None) -> None:
    """Compile, without launching, the Triton kernel(s) that skinny_linear would run for the same
    arguments (same shapes, dtypes, checks and ValueErrors; nothing is computed, out and the
    workspace are left as they are, a missing out/workspace is allocated and dropped). Tensors may
    be on the CPU: kernels are specialised on dtypes, 16-byte alignment and sizes, and compiled for
    the current device's target. The compiled kernel lands in Triton's in-memory and on-disk caches,
    so a later skinny_linear with these arguments, also in another process on the same kind of GPU,
    launches without compiling (bench/kernels/bench_gemv.py compiles its sweep in worker processes
    this way). Inside `triton.AsyncCompileMode(executor)` the compiles run on that executor. A no-op
    under TRITON_INTERPRET. Raises ValueError as skinny_linear."""
    _run(x, weight, bias, out, config, workspace, compile_only=True)


def _run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
         config: SkinnyConfig | None, workspace: SkinnyWorkspace | None, compile_only: bool,
         weight_scale: torch.Tensor | None = None) -> torch.Tensor:
    _check_args(x, weight, bias, weight_scale)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    check(m <= MAX_M_DOT, f"skinny_linear takes at most {MAX_M_DOT} rows, got {m} (use F.linear)")
    out_shape = (*x.shape[:-1], n)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    check(tuple(out.shape) == out_shape and out.dtype == x.dtype and out.device == x.device
          and out.is_contiguous(), f"out must be a contiguous {out_shape} {x.dtype} tensor")
    y2 = out.view(m, n)
    if m == 0 or n == 0:
        return out
    if config is None:
        num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
        config = default_config(m, n, k, num_sms)
        if weight_scale is not None:
            config = fp8_config(config, m, n, k)
    check(config.use_dot or m <= MAX_M,
          f"the reduce path (use_dot=False) takes at most {MAX_M} rows, got {m}; use a dot config")
    _launch(x2, weight, bias, y2, config, workspace, compile_only, weight_scale)
    return out


def _launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y2: torch.Tensor,
            cfg: SkinnyConfig, workspace: SkinnyWorkspace | None, compile_only: bool = False,
            weight_scale: torch.Tensor | None = None) -> None:
    (m, k), n = x2.shape, weight.shape[0]
    # split ranges are whole chunks; drop the splits that rounding leaves empty
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    num_splits = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, cfg.block_n)
    block_m = max(16, next_pow2(m)) if cfg.use_dot else next_pow2(m)  # 16 on the dot path for M <= 16
    split = num_splits > 1
    if split:
        if workspace is None:
            workspace = SkinnyWorkspace.allocate(num_splits * m * n, tiles, x2.device)
        check(workspace.partials.numel() >= num_splits * m * n and workspace.counters.numel() >= tiles,
              f"workspace too small: needs {num_splits * m * n} partials and {tiles} counters")
        partials, counters = workspace.partials, workspace.counters
    else:
        partials = counters = y2  # unused when SPLIT is False
    bias_arg = bias if bias is not None else y2
    scale_arg = weight_scale if weight_scale is not None else y2
    f16_dot = cfg.f16_dot and cfg.use_dot and weight_scale is not None
    pdl = use_pdl(x2)
    # .run(warmup=True) compiles (JITFunction) or does nothing (interpreter) without launching
    _skinny_kernel.run(
        x2, weight, scale_arg, bias_arg, y2, partials, counters,
        m, n, k, k_per_split, num_splits,
        x2.stride(0), weight.stride(0), y2.stride(0),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
        USE_DOT=cfg.use_dot, SPLIT=split, SERIAL_REDUCE=cfg.serial_reduce, HAS_BIAS=bias is not None,
        DOT_PRECISION=dot_precision(torch.float16 if f16_dot else x2.dtype),
        HAS_W_SCALE=weight_scale is not None, F16_DOT=f16_dot, ONE_ROW=f16_dot and m == 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, USE_PDL=pdl, **launch_options(pdl),
        grid=(tiles, num_splits), warmup=compile_only,
    )
    if split and not cfg.serial_reduce:
        _reduce_splits_kernel.run(
            partials, bias_arg, y2, m, n, num_splits, y2.stride(0),
            BLOCK_M=next_pow2(m), BLOCK_N=256, HAS_BIAS=bias is not None, num_warps=4,
            USE_PDL=pdl, **launch_options(pdl), grid=(triton.cdiv(n, 256),), warmup=compile_only,
        )
