"""Skinny GEMM ("GEMV") for decode: y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) with M <= 16.

At batch-1..16 decode a linear layer is a pure weight read (M * N * K FMAs over N * K weights), so the
kernel is built for memory bandwidth, not FLOPs:

  grid (cdiv(N, BLOCK_N), num_splits): program (n, s) streams the rows W[n*BLOCK_N : (n+1)*BLOCK_N]
  over its K range [s * k_per_split, (s+1) * k_per_split) in BLOCK_K chunks. Rows are contiguous, so a
  chunk is BLOCK_N coalesced runs of 16-byte vector loads; x (M x K, a few KB) stays in L1/L2.

Two inner products, chosen by `SkinnyConfig.use_dot`:
  - reduce (M of 1..2, maybe 4): the classic CUDA-core GEMV. x and W chunks are loaded as tensors of
    one shape [BM, BN, BK] (so Triton gives both, and the products, the load's coalesced layout and
    moves nothing through shared memory in the loop), multiplied in fp32 into per-thread partial
    sums, and reduced over K once after the loop. At M > 1 each W element is loaded by BM threads
    (L1 hits; HBM still reads it once);
  - dot (M of 4..16): swap A and B, acc[BN, BM] += W[BN, BK] @ x^T[BK, BM] with BM = 16 (x padded), so
    the weight block is the dot's large M side (a 64-row wgmma on Hopper) and Triton's software
    pipeline keeps `num_stages` chunks of W in flight through shared memory.

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

from ._checks import check, dot_precision, next_pow2

MAX_M = 16
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch parameters of skinny_linear (bench/kernels/bench_gemv.py sweeps them)."""

    block_n: int  # output columns (= weight rows) per program, power of two (>= 16 with use_dot)
    block_k: int  # K chunk per loop step, power of two >= 16
    split_k: int = 1  # requested K splits (the launcher drops splits that would be empty)
    num_warps: int = 4
    num_stages: int = 2
    use_dot: bool = False  # tl.dot with x padded to 16 rows, else broadcast-multiply + sum
    serial_reduce: bool = True  # split-K fix-up by the last program (one launch) vs a second kernel

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "split_k", "num_warps", "num_stages"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        check(next_pow2(self.block_n) == self.block_n and next_pow2(self.block_k) == self.block_k,
              f"block_n {self.block_n} and block_k {self.block_k} must be powers of two")
        check(self.block_k >= 16, f"block_k must be >= 16, got {self.block_k}")
        check(not self.use_dot or self.block_n >= 16, f"use_dot needs block_n >= 16, got {self.block_n}")


# Tuned configs, keyed by (m_bucket, N, K) with m_bucket = next_pow2(M): edit from the bench's
# "best config" column (bench/kernels/bench_gemv.py prints these lines ready to paste). Shapes not
# listed fall back to default_config's rules. Empty until measured on the H200.
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


def default_config(m: int, n: int, k: int, num_sms: int = 132) -> SkinnyConfig:
    """Rules (reasoned for the H200, to be confirmed by the bench): M <= 2 uses the reduce path with
    16 x 256 chunks (8 KB of bf16 per step and 32 accumulator registers per thread at M = 1; up to
    16 programs of 4 warps per SM keep ~128 KB of loads in flight, as Triton does not pipeline loads
    that feed no dot), larger M the dot path with 64 x 128 chunks in 4 cp.async stages (80 KB of
    shared memory, 2 programs per SM). Split K in powers of two until there are >= 4 programs
    per SM, keeping >= 4 chunks per split."""
    m_bucket = next_pow2(m)
    tuned = TUNED.get((m_bucket, n, k))
    if tuned is not None:
        return tuned
    if m <= 2:
        block_n, block_k, stages, use_dot = 16, 256, 1, False
    else:
        block_n, block_k, stages, use_dot = 64, 128, 4, True
    tiles, split = triton.cdiv(n, block_n), 1
    while tiles * split < 4 * num_sms and k >= 2 * split * 4 * block_k:
        split *= 2
    return SkinnyConfig(block_n, block_k, split, 4, stages, use_dot)


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
def _skinny_kernel(
    x, w, bias, y, partials, counters,
    M, N, K, k_per_split, num_splits,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, SPLIT: tl.constexpr, SERIAL_REDUCE: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
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
        for k0 in range(k_start, k_stop, BLOCK_K):
            k_mask = (k0 + offs_k) < K
            wt = tl.load(w_ptrs + k0, mask=k_mask[None, :] | EVEN_K, other=0.0)
            xt = tl.load(x_ptrs + k0, mask=k_mask[None, :] | EVEN_K, other=0.0)
            acc = tl.dot(wt, tl.trans(xt), acc, input_precision=DOT_PRECISION)  # [BN, BM]
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
        xt = tl.load(x_ptrs + k_start, mask=k_mask | EVEN_K, other=0.0)
        acc3 = xt.to(tl.float32) * wt.to(tl.float32)
        for k0 in range(k_start + BLOCK_K, k_stop, BLOCK_K):
            k_mask = (k0 + offs_k)[None, None, :] < K
            wt = tl.load(w_ptrs + k0, mask=k_mask | EVEN_K, other=0.0)
            xt = tl.load(x_ptrs + k0, mask=k_mask | EVEN_K, other=0.0)
            acc3 += xt.to(tl.float32) * wt.to(tl.float32)
        acc = tl.sum(acc3, axis=2)  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT:
        # this split's partial sums, then (serial) the last program of the row block sums all splits
        tl.store(partials + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)
        if SERIAL_REDUCE:
            tl.debug_barrier()  # every thread's partial stores precede the release below
            arrived = tl.atomic_add(counters + pid_n, 1, sem="acq_rel")
            if arrived == num_splits - 1:
                tl.debug_barrier()
                _sum_splits(partials, bias, y, offs_m, offs_n, M, N, num_splits, stride_ym,
                            BLOCK_M, BLOCK_N, HAS_BIAS)
                tl.atomic_xchg(counters + pid_n, 0)  # ready for the next call
    else:
        if HAS_BIAS:
            acc += tl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_splits_kernel(partials, bias, y, M, N, num_splits, stride_ym,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    _sum_splits(partials, bias, y, tl.arange(0, BLOCK_M), offs_n, M, N, num_splits, stride_ym,
                BLOCK_M, BLOCK_N, HAS_BIAS)


def skinny_linear_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when skinny_linear takes (x, weight) and is expected to beat a GEMM: 1 <= M <= 16 rows
    (leading dims of x flattened), fp16/bf16/fp32 with matching dtypes and devices, a contiguous
    [N, K] weight, and K a multiple of 16 (aligned 16-byte loads; other K work but run slower)."""
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        return False
    m = x.numel() // max(1, x.shape[-1])
    return (1 <= m <= MAX_M and x.dtype == weight.dtype and x.dtype in _DTYPES and x.device == weight.device
            and weight.is_contiguous() and weight.shape[1] % 16 == 0 and x.stride(-1) == 1)


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check(weight.dim() == 2, f"weight must be [N, K], got {tuple(weight.shape)}")
    check(weight.shape[1] >= 1, "weight must have K >= 1 columns")
    check(x.dim() >= 1 and x.shape[-1] == weight.shape[1],
          f"x {tuple(x.shape)} must be [..., K] with K = weight.shape[1] = {weight.shape[1]}")
    check(x.dtype in _DTYPES and x.dtype == weight.dtype, f"x {x.dtype} and weight {weight.dtype} must be one of "
          "float16/bfloat16/float32 and equal")
    check(x.device == weight.device, "x and weight are on different devices")
    check(weight.stride(1) == 1 and weight.stride(0) >= weight.shape[1], "weight rows must be contiguous")
    check(x.stride(-1) == 1, "x must have a contiguous last dim")
    if bias is not None:
        check(bias.shape == (weight.shape[0],), f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
        check(bias.dtype == x.dtype and bias.device == x.device and bias.stride(0) == 1,
              "bias must be contiguous with x's dtype and device")


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: SkinnyConfig | None = None,
                  workspace: SkinnyWorkspace | None = None) -> torch.Tensor:
    """y = x @ weight^T (+ bias), F.linear for decode-sized batches, fp32 accumulation.

    x        : [..., K] with M = prod(leading dims) in 1..16, fp16/bf16/fp32, last dim contiguous
    weight   : [N, K] (nn.Linear layout), same dtype, rows contiguous
    bias     : optional [N], same dtype
    out      : optional [..., N] contiguous, x's dtype (written in place and returned)
    config   : launch parameters; default default_config(M, N, K, number of SMs)
    workspace: split-K scratch (SkinnyWorkspace); when None and the config splits K, one is allocated
               for this call (its counters need a memset). Pass one to reuse it across calls/graphs.
    Returns y [..., N] in x's dtype. Raises ValueError on bad shapes, dtypes, devices or strides,
    M > 16, or a workspace that is too small.
    """
    _check_args(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    check(m <= MAX_M, f"skinny_linear takes at most {MAX_M} rows, got {m} (use F.linear)")
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
    _launch(x2, weight, bias, y2, config, workspace)
    return out


def _launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y2: torch.Tensor,
            cfg: SkinnyConfig, workspace: SkinnyWorkspace | None) -> None:
    (m, k), n = x2.shape, weight.shape[0]
    # split ranges are whole chunks; drop the splits that rounding leaves empty
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    num_splits = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, cfg.block_n)
    block_m = 16 if cfg.use_dot else next_pow2(m)
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
    _skinny_kernel[(tiles, num_splits)](
        x2, weight, bias_arg, y2, partials, counters,
        m, n, k, k_per_split, num_splits,
        x2.stride(0), weight.stride(0), y2.stride(0),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
        USE_DOT=cfg.use_dot, SPLIT=split, SERIAL_REDUCE=cfg.serial_reduce, HAS_BIAS=bias is not None,
        DOT_PRECISION=dot_precision(x2.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split and not cfg.serial_reduce:
        _reduce_splits_kernel[(triton.cdiv(n, 256),)](
            partials, bias_arg, y2, m, n, num_splits, y2.stride(0),
            BLOCK_M=next_pow2(m), BLOCK_N=256, HAS_BIAS=bias is not None, num_warps=4,
        )
