"""FP8 x FP8 GEMM on the tensor cores: the FP8 linear above the skinny rows (decode batches, prefill).

    y [M, N] = (a [M, K] * a_scale [M, 1]) @ (w [N, K] * w_scale [N])^T (+ bias [N])

with `a` per-token e4m3 (kernels/fp8_quant.py, amax(row) / 448) and `w` per-channel e4m3 (the FP8
weight of Fp8Linear), the W8A8 form of `torch._scaled_mm` with row-wise scales. One program per
BLOCK_M x BLOCK_N tile of y: the K loop feeds e4m3 tiles of a and w to `tl.dot` with an fp32
accumulator (QGMMA on sm_90, which needs both operands K-major: a [M, K] and w [N, K] are stored that
way, so neither is transposed in memory), and the epilogue multiplies the fp32 sums by a_scale[m] x
w_scale[n] once per output, adds the bias and rounds to y's dtype. Programs are numbered in groups of
GROUP_M row blocks, so that programs running together share weight tiles in L2 (the grouped order of
the Triton matmul tutorial).

Why it exists: at the Qwen2.5-7B shapes on an H200, `_scaled_mm` (cuBLAS) ran one layer's four linears
at M = 32-64 in 140-144 us, no faster than bf16 (137-138 us), although the weight it reads is half as
large (docs/benchmarks.md). This kernel took 95 us for that layer at M = 32 (_scaled_mm 145, bf16 136)
and 102 at M = 64 (138, 139), but lost from M = 128 up (FP8_GEMM_TUNED's comment), so it is routed at
17-64 rows only. The configs come from bench/lab/fp8_random_profile.py's grid on the H200
(`FP8_GEMM_TUNED`; `fp8_gemm_config`'s rule for shapes not listed, e.g. direct calls).

Launch parameters depend only on shapes (CUDA-graph safe; the only allocation is y when no `out`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, check, next_pow2
from .gemv import SkinnyWorkspace, _last_split_sums


@dataclass(frozen=True, slots=True)
class Fp8GemmConfig:
    """Tile of one program (rows of y x columns of y x reduction step), warps, software-pipeline
    depth, and row blocks per group of the program order."""

    block_m: int
    block_n: int
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    group_m: int = 8
    swap_ab: bool = False  # y^T = w @ a^T: block_n weight rows on wgmma's M side (>= 64), block_m tokens
    split_k: int = 1  # K splits (programs per tile), summed by the tile's last program (a workspace)

    def splits(self, k: int) -> tuple[int, int]:
        """(K per split, rounded up to block_k; number of splits that are not empty) for a K."""
        per = triton.cdiv(triton.cdiv(k, self.split_k), self.block_k) * self.block_k
        return per, triton.cdiv(k, per)

    def workspace_need(self, m: int, n: int, k: int) -> tuple[int, int]:
        """(fp32 partials, int32 counters) this config needs at M x N x K; (0, 0) without split-K."""
        splits = self.splits(k)[1]
        tiles = triton.cdiv(m, self.block_m) * triton.cdiv(n, self.block_n)
        return (splits * m * n, tiles) if splits > 1 else (0, 0)


# (row bucket, N, K) -> config; row bucket = the smallest of FP8_GEMM_BUCKETS >= M (the largest above
# it). An entry routes Fp8Linear's calls of that bucket and shape here (gemm_routed): only where the
# H200 grid (2026-12-02, bench/lab/fp8_random_profile.py, docs/benchmarks.md "FP8 `random`: where the
# time goes") measured this kernel faster than _scaled_mm, the per-token quantization counted in
# both. It lost at 128 rows and above (at M = 256: one layer 240 us against 159; 8,192: 8.0 ms against
# 3.65), so those buckets stay on _scaled_mm. Times: triton / _scaled_mm us, quantization included.
_SWAP = dict(block_k=128, num_warps=4, num_stages=4, swap_ab=True)
FP8_GEMM_BUCKETS = (32, 64, 128, 256, 512, 8192)
FP8_GEMM_TUNED: dict[tuple[int, int, int], Fp8GemmConfig] = {
    (32, 4608, 3584): Fp8GemmConfig(32, 64, split_k=4, **_SWAP),  # qkv 12.1 / 14.8
    (32, 3584, 3584): Fp8GemmConfig(32, 64, split_k=4, **_SWAP),  # o 10.8 / 14.2
    (32, 37888, 3584): Fp8GemmConfig(32, 64, **_SWAP),  # gate_up 43.5 / 62.3
    (32, 3584, 18944): Fp8GemmConfig(32, 64, split_k=4, **_SWAP),  # down 28.7 / 54.1
    (32, 152064, 3584): Fp8GemmConfig(32, 64, **_SWAP),  # LM head 140.9 / 204.8
    (64, 4608, 3584): Fp8GemmConfig(64, 64, **_SWAP),  # qkv 13.7 / 14.6
    (64, 3584, 3584): Fp8GemmConfig(64, 64, split_k=2, **_SWAP),  # o 12.5 / 14.4
    (64, 37888, 3584): Fp8GemmConfig(64, 64, **_SWAP),  # gate_up 43.9 / 57.5
    (64, 3584, 18944): Fp8GemmConfig(64, 64, split_k=4, **_SWAP),  # down 31.5 / 52.0
    (64, 152064, 3584): Fp8GemmConfig(64, 128, **_SWAP),  # LM head 154.1 / 191.4
}


def row_bucket(m: int) -> int:
    """The smallest FP8_GEMM_BUCKETS entry >= m, or the largest for larger m."""
    for b in FP8_GEMM_BUCKETS:
        if m <= b:
            return b
    return FP8_GEMM_BUCKETS[-1]


def gemm_routed(m: int, n: int, k: int) -> bool:
    """True when an FP8 linear call of M rows (above the skinny rows) of an [N, K] weight should take
    fp8_gemm rather than torch._scaled_mm: FP8_GEMM_TUNED lists (row_bucket(M), N, K), i.e. the grid
    measured this kernel faster than _scaled_mm there (module docstring). Never raises."""
    return m >= 1 and (row_bucket(m), n, k) in FP8_GEMM_TUNED


def gemm_workspace_need(n: int, k: int) -> tuple[int, int]:
    """(fp32 partials, int32 counters) enough for every routed call of an [N, K] weight: the largest
    need of the tuned configs at their bucket's row count (rows in a bucket never exceed it)."""
    need = [cfg.workspace_need(b, n, k) for (b, nn, kk), cfg in FP8_GEMM_TUNED.items() if (nn, kk) == (n, k)]
    return max((p for p, _ in need), default=0), max((c for _, c in need), default=0)


def fp8_gemm_config(m: int, n: int, k: int, num_sms: int = 132) -> Fp8GemmConfig:
    """FP8_GEMM_TUNED[(row_bucket(M), N, K)] if listed, else a rule: above 1,024 rows 128 x 256 tiles
    (8 warps, 3 stages); 65-1,024 rows 64- or 128-row tiles with 128 columns, 64 where the grid would
    not cover the SMs; up to 64 rows the swapped form (weight rows on wgmma's 64-row side, the
    tokens as its narrow side, 16 at least) with K split until the grid covers the SMs."""
    tuned = FP8_GEMM_TUNED.get((row_bucket(m), n, k))
    if tuned is not None:
        return tuned
    block_k = max(16, min(128, next_pow2(k)))
    if m > 1024:
        return Fp8GemmConfig(128, 256, block_k, num_warps=8, num_stages=3)
    if m > 64:
        block_m = 64 if m <= 128 else 128
        block_n = 128 if triton.cdiv(m, block_m) * triton.cdiv(n, 128) >= num_sms else 64
        return Fp8GemmConfig(block_m, block_n, block_k)
    block_m = max(16, next_pow2(m))
    block_n = 128 if triton.cdiv(n, 128) >= num_sms else 64
    tiles = triton.cdiv(n, block_n)
    split = max(1, min(triton.cdiv(num_sms, tiles), k // (4 * block_k)))
    return Fp8GemmConfig(block_m, block_n, block_k, swap_ab=True, split_k=split)


@triton.jit
def _fp8_gemm_kernel(a, a_scale, w, w_scale, bias, y, partials, counters, M, N, K, k_per_split, num_splits,
                     stride_am, stride_wn, stride_ym,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT: tl.constexpr,
                     EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    # program id -> (row block, column block), GROUP_M row blocks at a time; axis 1: the K split
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows / columns past the edge read row M-1 / N-1 again (no load masks); their sums are not stored
    rows_in = tl.minimum(rows, M - 1).to(tl.int64)
    cols_in = tl.minimum(cols, N - 1).to(tl.int64)
    offs_k = pid_k * k_per_split + tl.arange(0, BLOCK_K)
    if SWAP_AB:  # y^T tile = w tile @ a tile^T: the weight rows fill wgmma's 64-row side at small M
        w_ptr = w + cols_in[:, None] * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
        a_ptr = a + rows_in[None, :] * stride_am + offs_k[:, None]  # [BLOCK_K, BLOCK_M], K-major
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        a_ptr = a + rows_in[:, None] * stride_am + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
        w_ptr = w + cols_in[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N], K-major
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # (a split's last steps may pass K: masked; EVEN_K: every split is whole steps inside K)
    for k0 in range(0, k_per_split, BLOCK_K):
        if EVEN_K:
            at = tl.load(a_ptr)
            wt = tl.load(w_ptr)
        elif SWAP_AB:
            at = tl.load(a_ptr, mask=(offs_k + k0)[:, None] < K, other=0.0)
            wt = tl.load(w_ptr, mask=(offs_k + k0)[None, :] < K, other=0.0)
        else:
            at = tl.load(a_ptr, mask=(offs_k + k0)[None, :] < K, other=0.0)
            wt = tl.load(w_ptr, mask=(offs_k + k0)[:, None] < K, other=0.0)
        if SWAP_AB:
            acc = tl.dot(wt, at, acc)
        else:
            acc = tl.dot(at, wt, acc)
        a_ptr += BLOCK_K
        w_ptr += BLOCK_K
    # epilogue: per-token x per-channel scale (before any split-K sum), bias, one rounding
    sa = tl.load(a_scale + rows_in)
    sw = tl.load(w_scale + cols_in)
    if SWAP_AB:
        acc = acc * sw[:, None] * sa[None, :]
        mask = (cols < N)[:, None] & (rows < M)[None, :]
        offs_y = rows_in[None, :] * stride_ym + cols_in[:, None]
        offs_p = rows_in[None, :] * N + cols_in[:, None]
    else:
        acc = acc * sa[:, None] * sw[None, :]
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        offs_y = rows_in[:, None] * stride_ym + cols_in[None, :]
        offs_p = rows_in[:, None] * N + cols_in[None, :]
    if SPLIT:
        # this split's scaled partial sums; the last program of the tile to arrive sums all splits
        tl.store(partials + pid_k * M * N + offs_p, acc, mask=mask)
        _last_split_sums(partials, counters + pid, bias, y, rows, cols, M, N, num_splits, stride_ym,
                         BLOCK_M, BLOCK_N, HAS_BIAS)
    else:
        if HAS_BIAS:
            if SWAP_AB:
                acc += tl.load(bias + cols_in).to(tl.float32)[:, None]
            else:
                acc += tl.load(bias + cols_in).to(tl.float32)[None, :]
        tl.store(y + offs_y, acc.to(y.dtype.element_ty), mask=mask)


def check_fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None) -> None:
    """Raise ValueError unless the operands are as fp8_gemm documents them."""
    check(a.dim() == 2 and weight.dim() == 2 and a.shape[1] == weight.shape[1],
          f"a [M, K] and weight [N, K] expected, got {tuple(a.shape)} and {tuple(weight.shape)}")
    check(a.dtype == FP8_DTYPE and weight.dtype == FP8_DTYPE,
          f"e4m3 operands expected, got {a.dtype}, {weight.dtype}")
    check(a.stride(1) == 1 and weight.stride(1) == 1, "a and weight need a contiguous last dim")
    m, n = a.shape[0], weight.shape[0]
    check(a_scale.dtype == torch.float32 and a_scale.numel() == m and a_scale.is_contiguous(),
          f"a_scale must be {m} contiguous float32 values")
    check(weight_scale.dtype == torch.float32 and weight_scale.numel() == n
          and weight_scale.is_contiguous(), f"weight_scale must be {n} contiguous float32 values")
    check(bias is None or (bias.numel() == n and bias.is_contiguous()), f"bias must be [{n}] contiguous")


def fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
             out: torch.Tensor | None = None, config: Fp8GemmConfig | None = None,
             workspace: SkinnyWorkspace | None = None) -> torch.Tensor:
    """y [M, N] = (a * a_scale) @ (weight * weight_scale[:, None])^T (+ bias), in out_dtype.

    a [M, K] float8_e4m3fn with a_scale [M, 1] (or [M]) float32 (per_token_quant_fp8's outputs);
    weight [N, K] float8_e4m3fn with weight_scale [N] float32; bias [N] any float dtype or None; both
    operands with a contiguous last dim. Products and sums in fp32, one rounding to out_dtype.
    out: a contiguous [M, N] tensor of out_dtype to write (else allocated). config: tile and launch
    parameters (default fp8_gemm_config(M, N, K)). K need not be a multiple of the K step (masked).
    workspace: for a split-K config, fp32 partials and zeroed int32 counters as large as
    `config.workspace_need(M, N, K)` (allocated when None: not inside a CUDA-graph capture).

    Raises:
        ValueError: shapes, dtypes or strides other than the above, or a workspace too small.
    """
    check_fp8_gemm(a, a_scale, weight, weight_scale, bias)
    m, k = a.shape
    n = weight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    check(tuple(out.shape) == (m, n) and out.is_contiguous(), f"out must be a contiguous [{m}, {n}] tensor")
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n)) if bias is not None else out.zero_()
    cfg = config or fp8_gemm_config(m, n, k)
    k_per_split, num_splits = cfg.splits(k)
    need_p, need_c = cfg.workspace_need(m, n, k)
    if need_p:
        if workspace is None:
            workspace = SkinnyWorkspace.allocate(need_p, need_c, a.device)
        check(workspace.partials.numel() >= need_p and workspace.counters.numel() >= need_c,
              f"split-K needs {need_p} partials and {need_c} counters")
        partials, counters = workspace.partials, workspace.counters
    else:
        partials = counters = out
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    _fp8_gemm_kernel[(tiles, num_splits)](
        a, a_scale, weight, weight_scale, bias if bias is not None else weight_scale, out, partials, counters,
        m, n, k, k_per_split, num_splits, a.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SWAP_AB=cfg.swap_ab, SPLIT=num_splits > 1, EVEN_K=k % k_per_split == 0,
        HAS_BIAS=bias is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
