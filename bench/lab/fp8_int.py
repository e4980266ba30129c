"""FP8 (e4m3) weight GEMV for M = 1..4 rows without conversion instructions (lab version).

Each int32 word of the weight holds 4 e4m3 bytes b0..b3 (b_i at bits 8i..8i+7). An e4m3 byte
`s eeee mmm` becomes the float32 bits `s 000 0eeee mmm 0...0` (sign at bit 31, eeee at 26..23, mmm
at 22..20): exponent field 0000eeee, i.e. the value x 2^-120, exactly, for normals and subnormals
(e4m3 eeee = 0 gives an fp32 subnormal 0.mmm x 2^-126 = 0.mmm x 2^-6 x 2^-120). Per byte:
    f_i = ((w << (24 - 8 i)) >>s 4) & 0x87F00000
(arithmetic shift: the sign lands at 31..27, the mask keeps 31 and clears 30..27; for i = 3 no left
shift). Three integer ops per value (two for b3), no cvt. x (bf16) is loaded as int64 words of 4
values, x_i = the 16 bits moved to the top of an fp32 (bf16 -> fp32 is a shift), times 2^48 so that
the products x' w' = x w 2^-72 stay far from fp32 subnormals; the per-channel scale x 2^72 restores
the value after the sum. Products and sums in fp32 (FFMA), one reduction per program after the loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixrt.kernels.gemv import _sum_splits  # radixrt.kernels mapped first (bench.kernels_import)

X_SHIFT = 48  # x is scaled by 2^48 (exact unless |x| >= 2^80), the sums by 2^(120 - 48) at the end
_MASK = tl.constexpr(-0x78100000)  # 0x87F00000 as a signed int32: sign bit + 7 bits at 26..20


@triton.jit
def _e4m3_word_to_f32(wv, BYTE: tl.constexpr):
    """Byte BYTE (0..3) of the int32 words wv as float32 = e4m3 value x 2^-120."""
    if BYTE == 3:
        t = wv >> 4
    else:
        t = (wv << (24 - 8 * BYTE)) >> 4
    return (t & _MASK).to(tl.float32, bitcast=True)


@triton.jit
def _x_quad(x, row, stride_x4, k4, mask, X_SCALE: tl.constexpr):
    """The 4 bf16 values of x row `row` in int64 words k4, each as float32 x 2^X_SHIFT."""
    xv = tl.load(x + row * stride_x4 + k4, mask=mask, other=0)
    lo = xv.to(tl.int32)  # truncation: values 0, 1
    hi = (xv >> 32).to(tl.int32)
    x0 = (lo << 16).to(tl.float32, bitcast=True) * X_SCALE
    x1 = (lo & -65536).to(tl.float32, bitcast=True) * X_SCALE
    x2 = (hi << 16).to(tl.float32, bitcast=True) * X_SCALE
    x3 = (hi & -65536).to(tl.float32, bitcast=True) * X_SCALE
    return x0, x1, x2, x3


@triton.jit
def _fma_quad(acc, x, row, stride_x4, k4, mask, f0, f1, f2, f3, X_SCALE: tl.constexpr):
    x0, x1, x2, x3 = _x_quad(x, row, stride_x4, k4, mask, X_SCALE)
    return acc + x0 * f0 + x1 * f1 + x2 * f2 + x3 * f3


@triton.jit
def _store_row(acc, r, scale, y, partials, bias, offs_n, N, M, stride_ym, pid_k,
               SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr):
    v = tl.sum(acc, axis=1) * scale
    nmask = offs_n < N
    if SPLIT:
        tl.store(partials + pid_k * M * N + r * N + offs_n, v, mask=nmask)
    else:
        if HAS_BIAS:
            v += tl.load(bias + offs_n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y + r * stride_ym + offs_n, v.to(y.dtype.element_ty), mask=nmask)


@triton.jit
def _fp8_int_gemv_kernel(
    x, w, w_scale, bias, y, partials, counters,
    M, N, K4, k4_per_split, num_splits,
    stride_x4, stride_w4, stride_ym,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K4: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, PREFETCH: tl.constexpr = False,
):
    """x: int64 words of 4 bf16 [M, K4]; w: int32 words of 4 e4m3 [N, K4]. ROWS = M (1..4)."""
    X_SCALE: tl.constexpr = 281474976710656.0  # 2^48
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K4)
    w_rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    w_ptrs = w + w_rows[:, None] * stride_w4 + offs_k[None, :]  # [BN, BK4]
    # x offsets in the weight's shape: one layout for both loads and the products (no shuffles)
    xk = offs_k[None, :] + 0 * offs_n[:, None]  # [BN, BK4]
    k_start = pid_k * k4_per_split
    k_stop = tl.minimum(k_start + k4_per_split, K4)
    acc0 = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.float32)
    if PREFETCH:  # the next chunk's words are loaded before this chunk is computed
        wn = tl.load(w_ptrs + k_start, mask=((k_start + xk) < k_stop) | EVEN_K, other=0)
    for k0 in range(k_start, k_stop, BLOCK_K4):
        kmask = ((k0 + xk) < K4) | EVEN_K
        if PREFETCH:
            wv = wn
            wn = tl.load(w_ptrs + k0 + BLOCK_K4, mask=(k0 + BLOCK_K4 + xk) < k_stop, other=0)
        else:
            wv = tl.load(w_ptrs + k0, mask=kmask, other=0)
        f0 = _e4m3_word_to_f32(wv, 0)
        f1 = _e4m3_word_to_f32(wv, 1)
        f2 = _e4m3_word_to_f32(wv, 2)
        f3 = _e4m3_word_to_f32(wv, 3)
        acc0 = _fma_quad(acc0, x, 0, stride_x4, k0 + xk, kmask, f0, f1, f2, f3, X_SCALE)
        if ROWS > 1:
            acc1 = _fma_quad(acc1, x, 1, stride_x4, k0 + xk, kmask, f0, f1, f2, f3, X_SCALE)
        if ROWS > 2:
            acc2 = _fma_quad(acc2, x, 2, stride_x4, k0 + xk, kmask, f0, f1, f2, f3, X_SCALE)
        if ROWS > 3:
            acc3 = _fma_quad(acc3, x, 3, stride_x4, k0 + xk, kmask, f0, f1, f2, f3, X_SCALE)
    # 2^(120 - 48) = 2^72 undoes the two exponent offsets
    scale = tl.load(w_scale + w_rows) * 4722366482869645213696.0
    _store_row(acc0, 0, scale, y, partials, bias, offs_n, N, M, stride_ym, pid_k, SPLIT, HAS_BIAS)
    if ROWS > 1:
        _store_row(acc1, 1, scale, y, partials, bias, offs_n, N, M, stride_ym, pid_k, SPLIT, HAS_BIAS)
    if ROWS > 2:
        _store_row(acc2, 2, scale, y, partials, bias, offs_n, N, M, stride_ym, pid_k, SPLIT, HAS_BIAS)
    if ROWS > 3:
        _store_row(acc3, 3, scale, y, partials, bias, offs_n, N, M, stride_ym, pid_k, SPLIT, HAS_BIAS)
    if SPLIT:
        tl.debug_barrier()  # every thread's partial stores precede the release below
        arrived = tl.atomic_add(counters + pid_n, 1, sem="acq_rel")
        if arrived == num_splits - 1:
            tl.debug_barrier()
            _sum_splits(partials, bias, y, tl.arange(0, BLOCK_M), offs_n, M, N, num_splits, stride_ym,
                        BLOCK_M, BLOCK_N, HAS_BIAS)
            tl.atomic_xchg(counters + pid_n, 0)


def int_supported(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    m, k = x2.shape
    return (1 <= m <= 4 and k % 4 == 0 and x2.dtype == torch.bfloat16 and x2.stride(1) == 1
            and x2.stride(0) % 4 == 0 and x2.data_ptr() % 8 == 0 and weight.stride(0) % 4 == 0
            and weight.data_ptr() % 4 == 0)


def fp8_int_gemv(x2: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None, y2: torch.Tensor, block_n: int, block_k4: int, split_k: int,
                 num_warps: int, partials: torch.Tensor | None = None,
                 counters: torch.Tensor | None = None, prefetch: bool = False) -> torch.Tensor:
    m, k = x2.shape
    n = weight.shape[0]
    k4 = k // 4
    x64 = x2.view(torch.int64) if x2.stride(0) == k else torch.as_strided(
        x2, (m, k), (x2.stride(0), 1)).view(torch.int64)
    w32 = weight.view(torch.int32)
    k4_per_split = triton.cdiv(triton.cdiv(k4, split_k), block_k4) * block_k4
    num_splits = triton.cdiv(k4, k4_per_split)
    tiles = triton.cdiv(n, block_n)
    split = num_splits > 1
    if split:
        assert partials is not None and partials.numel() >= num_splits * m * n
        assert counters is not None and counters.numel() >= tiles
    else:
        partials = counters = y2
    _fp8_int_gemv_kernel[(tiles, num_splits)](
        x64, w32, weight_scale, bias if bias is not None else y2, y2, partials, counters,
        m, n, k4, k4_per_split, num_splits,
        x2.stride(0) // 4, weight.stride(0) // 4, y2.stride(0),
        ROWS=m, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K4=block_k4,
        EVEN_K=k4 % block_k4 == 0, SPLIT=split, HAS_BIAS=bias is not None,
        PREFETCH=prefetch, num_warps=num_warps, num_stages=1,
    )
    return y2
