"""FP8 (e4m3) weight GEMV for M = 1..4 rows without conversion instructions; the default FP8 decode
linear at M <= FP8_INT_MAX_ROWS (2) on CUDA (`fp8_skinny_linear`, which Fp8Linear calls).

Each int32 word of the weight holds 4 e4m3 bytes b0..b3 (b_i at bits 8i..8i+7). An e4m3 byte
`s eeee mmm` becomes the float32 bits `s 000 0eeee mmm 0...0` (sign at bit 31, eeee at 26..23, mmm
at 22..20): exponent field 0000eeee, i.e. the value x 2^-120, exactly, for normals and subnormals
(e4m3 eeee = 0 gives an fp32 subnormal 0.mmm x 2^-126 = 0.mmm x 2^-6 x 2^-120). Per byte:
    f_i = ((w << (24 - 8 i)) >>s 4) & 0x87F00000
(arithmetic shift: the sign lands at 31..27, the mask keeps 31 and clears 30..27; for i = 3 no left
shift). Three integer ops per value (two for b3), no cvt. x (bf16) is loaded as int64 words of 4
values, x_i = the 16 bits moved to the top of an fp32 (bf16 -> fp32 is a shift), times 2^48 so that
the products x' w' = x w 2^-72 stay far from fp32 subnormals. The per-channel scale is multiplied by
2^72 in the epilogue, once per output channel and program (a constant, exact in fp32: a power of
two), so the caller passes the model's own weight_scale: no second scale tensor to keep in step with
it, nothing computed per call on the host. Products and sums in fp32 (FFMA), one reduction per
program after the loop; split-K through gemv's serial fix-up (`_sum_splits`).

Routing (`int_routed`): an FP8 call of M rows on CUDA with 1 <= M <= FP8_INT_MAX_ROWS takes this
kernel with `fp8_int_config(M, N, K)` (FP8_INT_TUNED, else the rule there) when `int_supported`
accepts the operands (bf16 x, K % 4 == 0, 8-byte aligned x rows); every other FP8 call goes to
gemv.skinny_linear(weight_scale=) as before. Measured on an H200 (2026-12-02, bench/lab/
fp8_gemv_lab.py, docs/benchmarks.md): one Qwen2.5-7B layer's four linears at M = 1 in 79.6 us
against 86.4 for the skinny path (bf16 129.8), at M = 2 96.6 against 113.0; at M = 4 it lost (137.6
against 110.7), so M >= 3 stays on the skinny path. Launch parameters depend only on shapes: CUDA-
graph safe (the only allocations are the output, and a shape-sized workspace for a split-K config
when none is passed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, check, next_pow2
from .gemv import SkinnyConfig, SkinnyWorkspace, _check_args, _sum_splits, skinny_linear
from .pdl import gdc_enter, launch_options, use_pdl

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
def _norm_operands(residual, sq, stride_r, offs_n, N, P, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                   NORM_OUT: tl.constexpr, NORM_IN: tl.constexpr, BLOCK_P: tl.constexpr):
    """What the fused-norm epilogues read that the kernel before writes, loaded right after the wait
    so that their latency passes during the K loop: the residual rows at this program's output
    channels (NORM_OUT, float32 [BLOCK_N] per row) or the rows' partial sums of squares (NORM_IN,
    [BLOCK_P] per row); zeros where unused."""
    res0 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    res1 = res0
    sq0 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    sq1 = sq0
    nmask = offs_n < N
    offs_p = tl.arange(0, BLOCK_P)
    if NORM_OUT:
        res0 = tl.load(residual + offs_n, mask=nmask, other=0.0).to(tl.float32)
        if ROWS > 1:
            res1 = tl.load(residual + stride_r + offs_n, mask=nmask, other=0.0).to(tl.float32)
    if NORM_IN:
        sq0 = tl.load(sq + offs_p, mask=offs_p < P, other=0.0)
        if ROWS > 1:
            sq1 = tl.load(sq + P + offs_p, mask=offs_p < P, other=0.0)
    return res0, res1, sq0, sq1


@triton.jit
def _rstd(sq_row, K4, eps):
    """1 / sqrt(mean of squares + eps) of a row from its partial sums of squares (NORM_IN): the
    RMSNorm statistic of the row whose K = 4 K4 values the producer wrote."""
    return 1.0 / tl.sqrt(tl.sum(sq_row, 0) / (K4 * 4) + eps)


@triton.jit
def _in_scale(scale, sq_row, K4, eps, NORM_IN: tl.constexpr):
    """The output channels' scale, times the row's rstd under NORM_IN."""
    s = scale
    if NORM_IN:
        s = scale * _rstd(sq_row, K4, eps)
    return s


@triton.jit
def _store_row_norm_out(acc, r, scale, y, bias, res, gam, new_residual, sq, offs_n, N,
                        stride_ym, stride_nr, HAS_BIAS: tl.constexpr):
    """NORM_OUT epilogue of row r: the linear's output v (rounded to y's dtype, as an unfused
    linear returns it), h = v + res (rounded: the residual stream, to new_residual),
    y = h * gam (rounded) and this program's sum of h^2 into sq[r, pid]. res, gam: float32
    [BLOCK_N] (the residual row and the norm's weight at this program's channels)."""
    v = tl.sum(acc, axis=1) * scale
    nmask = offs_n < N
    if HAS_BIAS:
        v += tl.load(bias + offs_n, mask=nmask, other=0.0).to(tl.float32)
    h = (v.to(y.dtype.element_ty).to(tl.float32) + res).to(y.dtype.element_ty)
    tl.store(new_residual + r * stride_nr + offs_n, h, mask=nmask)
    hf = tl.where(nmask, h.to(tl.float32), 0.0)
    tl.store(y + r * stride_ym + offs_n, (hf * gam).to(y.dtype.element_ty), mask=nmask)
    tl.store(sq + r * tl.num_programs(0) + tl.program_id(0), tl.sum(hf * hf, 0))


@triton.jit
def _chunk(acc0, acc1, acc2, acc3, wv, x, stride_x4, k0, xk, K4,
           ROWS: tl.constexpr, EVEN_K: tl.constexpr, X_SCALE: tl.constexpr):
    """One chunk: the weight words wv [BN, BK4] at word offset k0 into the rows' accumulators."""
    kmask = ((k0 + xk) < K4) | EVEN_K
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
    return acc0, acc1, acc2, acc3


@triton.jit
def _fp8_int_gemv_kernel(
    x, w, w_scale, bias, y, partials, counters,
    M, N, K4, k4_per_split, num_splits,
    stride_x4, stride_w4, stride_ym,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K4: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, PREFETCH: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
    residual=None, gamma=None, new_residual=None, sq=None, stride_r=0, stride_nr=0, P=0, eps=0.0,
    NORM_OUT: tl.constexpr = False, NORM_IN: tl.constexpr = False, BLOCK_P: tl.constexpr = 1,
    sq_total=None, SQ_LAST: tl.constexpr = False,
):
    """x: int64 words of 4 bf16 [M, K4]; w: int32 words of 4 e4m3 [N, K4]. ROWS = M (1..4).
    USE_PDL (kernels/pdl.py): the first chunk's weight words are loaded before the wait.
    NORM_OUT (no SPLIT): the epilogue of a linear followed by an RMSNorm (`_store_row_norm_out`);
    NORM_IN (no SPLIT): x is such a producer's y, and each output row is scaled by its rstd
    (`_rstd` over sq [M, P]); the two together make the RMSNorm between two linears disappear
    (fp8_int_gemv_norm_out / fp8_int_gemv_norm_in). SQ_LAST (with NORM_OUT): the last program to
    finish (counters[0], left zero) sums the rows' partial sums into sq_total [M] in program order,
    so that the next linear reads one value per row (P = 1) instead of every program's."""
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
    loop_start = k_start
    gam = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if NORM_OUT:  # a parameter: before the wait
        gam = tl.load(gamma + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    if PREFETCH:  # the next chunk's words are loaded before this chunk is computed
        wn = tl.load(w_ptrs + k_start, mask=((k_start + xk) < k_stop) | EVEN_K, other=0)
        gdc_enter(USE_PDL)  # kernels/pdl.py
        res0, res1, sq0, sq1 = _norm_operands(residual, sq, stride_r, offs_n, N, P, ROWS, BLOCK_N,
                                              NORM_OUT, NORM_IN, BLOCK_P)
    elif USE_PDL:  # the first chunk, peeled: its words are in flight during the wait
        w0 = tl.load(w_ptrs + k_start, mask=((k_start + xk) < K4) | EVEN_K, other=0)
        gdc_enter(USE_PDL)
        res0, res1, sq0, sq1 = _norm_operands(residual, sq, stride_r, offs_n, N, P, ROWS, BLOCK_N,
                                              NORM_OUT, NORM_IN, BLOCK_P)
        acc0, acc1, acc2, acc3 = _chunk(acc0, acc1, acc2, acc3, w0, x, stride_x4, k_start, xk, K4,
                                        ROWS, EVEN_K, X_SCALE)
        loop_start = k_start + BLOCK_K4
    else:
        res0, res1, sq0, sq1 = _norm_operands(residual, sq, stride_r, offs_n, N, P, ROWS, BLOCK_N,
                                              NORM_OUT, NORM_IN, BLOCK_P)
    for k0 in range(loop_start, k_stop, BLOCK_K4):
        if PREFETCH:
            wv = wn
            wn = tl.load(w_ptrs + k0 + BLOCK_K4, mask=(k0 + BLOCK_K4 + xk) < k_stop, other=0)
        else:
            wv = tl.load(w_ptrs + k0, mask=((k0 + xk) < K4) | EVEN_K, other=0)
        acc0, acc1, acc2, acc3 = _chunk(acc0, acc1, acc2, acc3, wv, x, stride_x4, k0, xk, K4,
                                        ROWS, EVEN_K, X_SCALE)
    # 2^(120 - 48) = 2^72 undoes the two exponent offsets
    scale = tl.load(w_scale + w_rows) * 4722366482869645213696.0
    if NORM_OUT:
        _store_row_norm_out(acc0, 0, scale, y, bias, res0, gam, new_residual, sq, offs_n, N,
                            stride_ym, stride_nr, HAS_BIAS)
        if ROWS > 1:
            _store_row_norm_out(acc1, 1, scale, y, bias, res1, gam, new_residual, sq, offs_n, N,
                                stride_ym, stride_nr, HAS_BIAS)
        if SQ_LAST:
            tl.debug_barrier()  # every thread's partial-sum store precedes the release below
            arrived = tl.atomic_add(counters, 1, sem="acq_rel")
            if arrived == tl.num_programs(0) - 1:
                tl.debug_barrier()
                num_p = tl.num_programs(0)
                offs_p = tl.arange(0, BLOCK_P)
                # .cg: from L2, never a stale L1 line (other programs wrote these)
                t0 = tl.load(sq + offs_p, mask=offs_p < num_p, other=0.0, cache_modifier=".cg")
                tl.store(sq_total, tl.sum(t0, 0))
                if ROWS > 1:
                    t1 = tl.load(sq + num_p + offs_p, mask=offs_p < num_p, other=0.0, cache_modifier=".cg")
                    tl.store(sq_total + 1, tl.sum(t1, 0))
                tl.atomic_xchg(counters, 0)
    else:
        _store_row(acc0, 0, _in_scale(scale, sq0, K4, eps, NORM_IN), y, partials, bias, offs_n, N, M,
                   stride_ym, pid_k, SPLIT, HAS_BIAS)
        if ROWS > 1:
            _store_row(acc1, 1, _in_scale(scale, sq1, K4, eps, NORM_IN), y, partials, bias, offs_n, N, M,
                       stride_ym, pid_k, SPLIT, HAS_BIAS)
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



FP8_INT_MAX_ROWS = 2  # FP8 calls of at most this many rows route here (M = 4 lost on the H200; M = 3 untried)


@dataclass(frozen=True)
class Fp8IntConfig:
    """Launch parameters of the int GEMV. Raises ValueError when a size is < 1 or block_n / block_k4
    is not a power of two. Registers: the fp32 partial sums are M * block_n * block_k4 / (32 *
    num_warps) per thread (32 at most among the measured winners)."""

    block_n: int  # weight rows (output channels) per program, power of two
    block_k4: int  # int32 words (4 weights each) per row and loop step, power of two
    num_warps: int = 4
    split_k: int = 1  # requested K splits (empty ones dropped); > 1 needs a workspace (serial fix-up)
    prefetch: bool = False  # load the next chunk's words before computing this one

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k4", "num_warps", "split_k"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        check(next_pow2(self.block_n) == self.block_n and next_pow2(self.block_k4) == self.block_k4,
              f"block_n {self.block_n} and block_k4 {self.block_k4} must be powers of two")


# Best configs per exact (M, N, K), the Qwen2.5-7B decode linears: bench/lab/fp8_gemv_lab.py on an
# H200, 2026-12-02 (docs/benchmarks.md, "FP8 GEMV without conversion instructions"); us of this
# config / of the skinny path it replaced. All split-K-free (split-K lost at every shape, H200
# 2026-12-03, bench/lab/fp8_m1_lab.py --int-grid); Fp8Linear's scratch would cover a split entry
# (models/linear.py _scratch). qkv and o at M = 1 were retuned
# with PDL on (bench/lab/fp8_int_retune.py, H200 2026-12-03, back-to-back calls in one graph): 8 x 512
# loads 16 KB per program before the wait; us of 8 x 512 / of the 4 x 256 before, same run.
FP8_INT_TUNED: dict[tuple[int, int, int], Fp8IntConfig] = {
    (1, 4608, 3584): Fp8IntConfig(8, 512),  # qkv 7.74 / 8.03
    (1, 3584, 3584): Fp8IntConfig(8, 512),  # o 5.13 / 7.61
    (1, 37888, 3584): Fp8IntConfig(8, 128),  # gate_up 40.75 / 42.90
    (1, 3584, 18944): Fp8IntConfig(4, 512),  # down 23.42 / 25.18
    (2, 4608, 3584): Fp8IntConfig(8, 128),  # 10.03 / 13.46
    (2, 3584, 3584): Fp8IntConfig(8, 128),  # 8.93 / 9.64
    (2, 37888, 3584): Fp8IntConfig(16, 128),  # 47.50 / 56.75
    (2, 3584, 18944): Fp8IntConfig(4, 512),  # 30.14 / 33.15
    # the LM head (--lm-head-quantization), H200 2026-12-02 bench/lab/fp8_random_profile.py: 129.9 us
    # against the rule's 8 x 128 at 135.4 (bf16 head 240.7)
    (1, 152064, 3584): Fp8IntConfig(16, 128),
}


def fp8_int_config(m: int, n: int, k: int) -> Fp8IntConfig:
    """FP8_INT_TUNED[(M, N, K)] if listed, else a rule read off the same H200 grid (2026-12-02), whose
    winners all had 4 warps, one K split (split 2 was never best; none needs a workspace) and no
    prefetch, with 1,024-2,048 weight words per loop step:
      - long rows (K >= 8,192, i.e. >= 2,048 words: down 3584 x 18944): 4 x 512, at M = 1 and 2;
      - wide weights (N >= 16,384: gate_up 37888 x 3584, thousands of row blocks): 8 M x 128, and
        16 x 128 for a vocabulary-sized N >= 131,072 at M = 1 (the LM head 152064 x 3584, measured
        once: 129.9 us against 135.4 at 8 x 128; M = 2 there is not measured);
      - otherwise (qkv / o, N 3584-4608, K 3584): 8 x 512 at M = 1 (retuned with PDL on, 2026-12-03:
        o 5.1 against 7.6 us at 4 x 256), 8 x 128 at M = 2.
    block_k4 is capped at next_pow2(K / 4). The rule reproduces the table at the shapes it lists; the
    thresholds between the measured shapes (N 4608 vs 37888, K 3584 vs 18944) are not measured."""
    tuned = FP8_INT_TUNED.get((m, n, k))
    if tuned is not None:
        return tuned
    k4 = max(1, k // 4)
    if k4 >= 2048:
        block_n, block_k4 = 4, 512
    elif n >= 16384:
        block_n, block_k4 = (16 if m == 1 and n >= 131072 else 8 * next_pow2(m)), 128
    else:
        block_n, block_k4 = (8, 512) if m == 1 else (8, 128)
    return Fp8IntConfig(block_n, min(block_k4, next_pow2(k4)))


def int_routed(m: int, n: int, k: int, device_type: str) -> Fp8IntConfig | None:
    """The int kernel's config for an FP8 call of M rows of an [N, K] weight on `device_type`
    ("cuda", "cpu", ...), or None when the call stays on skinny_linear: not CUDA, M outside
    1..FP8_INT_MAX_ROWS, or K not a multiple of 4 (the operand checks are int_supported's).
    Depends only on shapes; never raises."""
    if device_type != "cuda" or not 1 <= m <= FP8_INT_MAX_ROWS or k % 4 or n < 1:
        return None
    return fp8_int_config(m, n, k)


def int_supported(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when the int kernel takes x2 [M, K] against an FP8 weight [N, K]: M of 1..4, bf16 x with
    a contiguous last dim and 8-byte aligned rows (read as int64 words), an FP8 weight with contiguous,
    4-byte aligned rows (int32 words), K a multiple of 4. Never raises."""
    if x2.dim() != 2 or weight.dim() != 2 or x2.shape[1] != weight.shape[1]:
        return False
    m, k = x2.shape
    return (1 <= m <= 4 and k % 4 == 0 and x2.dtype == torch.bfloat16 and weight.dtype == FP8_DTYPE
            and x2.stride(1) == 1 and x2.stride(0) % 4 == 0 and x2.data_ptr() % 8 == 0
            and weight.stride(1) == 1 and weight.stride(0) % 4 == 0 and weight.data_ptr() % 4 == 0)


def fp8_int_gemv(x2: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None, y2: torch.Tensor, block_n: int, block_k4: int, split_k: int,
                 num_warps: int, partials: torch.Tensor | None = None,
                 counters: torch.Tensor | None = None, prefetch: bool = False,
                 norm_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 norm_in: tuple[torch.Tensor, float] | None = None,
                 sq_total: torch.Tensor | None = None) -> torch.Tensor:
    """The raw launch: y2 [M, N] = x2 [M, K] @ (weight * weight_scale[:, None])^T (+ bias), operands
    as int_supported accepts (not checked here), y2 of any float dtype. With split-K, partials
    (fp32, >= splits * M * N) and counters (int32, >= cdiv(N, block_n), zero; left zero) are required.
    norm_out (residual, gamma, new_residual, sq) or norm_in (sq, eps): the kernel's NORM_OUT / NORM_IN
    epilogues (fp8_int_gemv_norm_out / _norm_in check them); not with split-K, M <= 2. sq_total
    (fp32 [M], with norm_out and counters: zero int32, left zero): SQ_LAST.
    Returns y2. fp8_skinny_linear is the checked entry point."""
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
        check(partials is not None and partials.numel() >= num_splits * m * n
              and counters is not None and counters.numel() >= tiles,
              f"split-K needs {num_splits * m * n} partials and {tiles} counters")
    elif sq_total is None:
        partials = counters = y2
    else:
        partials = y2
    check(not ((norm_out or norm_in) and (split or m > 2)), "a fused norm takes M <= 2 and no split-K")
    residual = gamma = new_residual = sq = y2
    stride_r = stride_nr = num_p = 0
    eps = 0.0
    if norm_out is not None:
        residual, gamma, new_residual, sq = norm_out
        stride_r, stride_nr = residual.stride(0), new_residual.stride(0)
        if sq_total is not None:
            check(counters is not None and counters.numel() >= 1, "SQ_LAST needs a zero int32 counter")
            num_p = tiles
    elif norm_in is not None:
        sq, eps = norm_in
        num_p = sq.shape[1]
    pdl = use_pdl(x2)
    _fp8_int_gemv_kernel[(tiles, num_splits)](
        x64, w32, weight_scale, bias if bias is not None else y2, y2, partials, counters,
        m, n, k4, k4_per_split, num_splits,
        x2.stride(0) // 4, weight.stride(0) // 4, y2.stride(0),
        ROWS=m, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K4=block_k4,
        EVEN_K=k4 % block_k4 == 0, SPLIT=split, HAS_BIAS=bias is not None,
        PREFETCH=prefetch, num_warps=num_warps, num_stages=1, USE_PDL=pdl,
        residual=residual, gamma=gamma, new_residual=new_residual, sq=sq, stride_r=stride_r,
        stride_nr=stride_nr, P=num_p, eps=float(eps), NORM_OUT=norm_out is not None,
        NORM_IN=norm_in is not None, BLOCK_P=triton.next_power_of_2(max(num_p, 1)),
        sq_total=sq_total if sq_total is not None else y2, SQ_LAST=sq_total is not None,
        **launch_options(pdl),
    )
    return y2


def int_workspace_need(cfg: Fp8IntConfig, m: int, n: int, k: int) -> tuple[int, int]:
    """(fp32 partials, int32 counters) cfg needs at M rows of an [N, K] weight; (0, 0) without split-K."""
    k4 = k // 4
    k4_per_split = triton.cdiv(triton.cdiv(k4, cfg.split_k), cfg.block_k4) * cfg.block_k4
    splits = triton.cdiv(k4, k4_per_split)
    return (splits * m * n, triton.cdiv(n, cfg.block_n)) if splits > 1 else (0, 0)


def fp8_skinny_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
                      workspace: SkinnyWorkspace | None = None,
                      config: Fp8IntConfig | SkinnyConfig | None = None) -> torch.Tensor:
    """y = x @ (weight * weight_scale[:, None])^T (+ bias) for an FP8 (float8_e4m3fn) weight [N, K] at
    decode sizes, the path Fp8Linear takes for M <= its skinny_max_rows on CUDA.

    config None: int_routed(M, N, K, x's device) -> this module's kernel when int_supported accepts
    the operands, else gemv.skinny_linear with its FP8 default (fp8_config). An Fp8IntConfig runs the
    int kernel on any device (the CPU through the Triton interpreter); a SkinnyConfig runs
    skinny_linear. Arguments as skinny_linear's (x [..., K], out [..., N] in x's dtype, workspace for
    split-K; one is allocated for a split-K call without). Raises ValueError as skinny_linear, and
    for an Fp8IntConfig with operands int_supported refuses."""
    routed = False  # int_supported already accepted the operands
    if config is None and weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[1]:
        config = int_routed(x.numel() // max(1, x.shape[-1]), weight.shape[0], weight.shape[1], x.device.type)
        routed = config is not None and int_supported(x.reshape(-1, weight.shape[1]), weight)
        if not routed:
            config = None
    if not isinstance(config, Fp8IntConfig):
        return skinny_linear(x, weight, bias, out=out, config=config, workspace=workspace,
                             weight_scale=weight_scale)
    _check_args(x, weight, bias, weight_scale)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    check(routed or int_supported(x2, weight),
          "the int FP8 GEMV takes 1-4 bf16 rows, K % 4 == 0, aligned rows")
    out_shape = (*x.shape[:-1], n)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    check(tuple(out.shape) == out_shape and out.dtype == x.dtype and out.is_contiguous(),
          f"out must be a contiguous {out_shape} {x.dtype} tensor")
    partials, counters = int_workspace_need(config, x2.shape[0], n, k)
    if partials and workspace is None:
        workspace = SkinnyWorkspace.allocate(partials, counters, x.device)
    ws = (workspace.partials, workspace.counters) if partials else (None, None)
    fp8_int_gemv(x2, weight, weight_scale, bias, out.view(-1, n), config.block_n, config.block_k4,
                 config.split_k, config.num_warps, *ws, config.prefetch)
    return out


def norm_fusable(m: int, n: int, k: int, device_type: str) -> Fp8IntConfig | None:
    """The int GEMV's config when a call of M rows of an [N, K] FP8 weight on `device_type` runs it
    in one pass (no split-K) with M <= 2, so that it can take a NORM_OUT or NORM_IN epilogue
    (fp8_int_gemv_norm_out / _norm_in); else None. Shapes only; never raises."""
    cfg = int_routed(m, n, k, device_type)
    return cfg if cfg is not None and cfg.split_k == 1 and m <= 2 else None


def _fused_config(x2: torch.Tensor, weight: torch.Tensor, config: Fp8IntConfig | None) -> Fp8IntConfig:
    m, k = x2.shape
    cfg = config if config is not None else norm_fusable(m, weight.shape[0], k, x2.device.type)
    check(cfg is not None and cfg.split_k == 1 and 1 <= m <= 2 and int_supported(x2, weight),
          "a fused norm needs the int FP8 GEMV: 1-2 bf16 rows, K % 4 == 0, aligned rows, no split-K")
    return cfg


def fp8_int_gemv_norm_out(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                          bias: torch.Tensor | None, residual: torch.Tensor, gamma: torch.Tensor,
                          config: Fp8IntConfig | None = None, counters: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A linear followed by the residual add and RMSNorm of a pre-norm block, the norm left to the
    next linear (the RMSNorm of Zhang & Sennrich 2019 split across two kernels). With
    v = x @ (weight * weight_scale[:, None])^T (+ bias) rounded to x's dtype:

        h  = v + residual                 (rounded: the new residual stream)
        g  = h * gamma                    (rounded: the next linear's input)
        sq[r, p] = sum of h[r, j]^2 over program p's output channels j (float32)

    so that rms_norm(h) * gamma == g[r] / sqrt(sum(sq[r]) / N + eps) (up to roundings), which
    fp8_int_gemv_norm_in applies after its dot products.

    x [M, K] bf16 (M of 1..2), weight [N, K] float8_e4m3fn, weight_scale [N] float32, bias [N] or
    None, residual [M, N] bf16 (last dim contiguous), gamma [N]. config: the int GEMV's launch
    parameters (default: FP8_INT_TUNED / the rule). Returns (g [M, N], h [M, N], sq [M, P] float32),
    P = cdiv(N, block_n); with `counters` (int32, >= 1 element, zero; left zero) the last program
    sums each row's partial sums (SQ_LAST) and sq is [M, 1]. Allocates its outputs only (CUDA-graph
    safe). Raises ValueError when the call cannot take the int GEMV in one pass (norm_fusable) or a
    shape or dtype does not match."""
    _check_args(x, weight, bias, weight_scale)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    cfg = _fused_config(x2, weight, config)
    m = x2.shape[0]
    check(tuple(residual.shape) == (m, n) and residual.dtype == x.dtype and residual.stride(-1) == 1,
          f"residual must be [{m}, {n}] {x.dtype} with a contiguous last dim")
    check(tuple(gamma.shape) == (n,) and gamma.is_contiguous(), f"gamma must be a contiguous [{n}]")
    g = torch.empty((m, n), dtype=x.dtype, device=x.device)
    h = torch.empty((m, n), dtype=x.dtype, device=x.device)
    sq = torch.empty((m, triton.cdiv(n, cfg.block_n)), dtype=torch.float32, device=x.device)
    total = None if counters is None else torch.empty((m, 1), dtype=torch.float32, device=x.device)
    fp8_int_gemv(x2, weight, weight_scale, bias, g, cfg.block_n, cfg.block_k4, 1, cfg.num_warps,
                 counters=counters, prefetch=cfg.prefetch, norm_out=(residual, gamma, h, sq), sq_total=total)
    return g, h, (sq if total is None else total)


def fp8_int_gemv_norm_in(g: torch.Tensor, sq: torch.Tensor, eps: float, weight: torch.Tensor,
                         weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                         config: Fp8IntConfig | None = None) -> torch.Tensor:
    """The linear after fp8_int_gemv_norm_out: y[r] = (g[r] @ (weight * weight_scale[:, None])^T)
    / sqrt(sum(sq[r]) / K + eps) (+ bias), i.e. the linear of rms_norm(h) * gamma.

    g [M, K] bf16 (M of 1..2), sq [M, P] float32 contiguous, weight [N, K] float8_e4m3fn,
    weight_scale [N], bias [N] or None. Returns y [M, N] in g's dtype (allocated: CUDA-graph safe).
    Raises ValueError as fp8_int_gemv_norm_out."""
    _check_args(g, weight, bias, weight_scale)
    n, k = weight.shape
    g2 = g.reshape(-1, k)
    cfg = _fused_config(g2, weight, config)
    m = g2.shape[0]
    check(sq.dim() == 2 and sq.shape[0] == m and sq.dtype == torch.float32 and sq.is_contiguous(),
          f"sq must be a contiguous [{m}, P] float32 tensor")
    y = torch.empty((m, n), dtype=g.dtype, device=g.device)
    return fp8_int_gemv(g2, weight, weight_scale, bias, y, cfg.block_n, cfg.block_k4, 1, cfg.num_warps,
                        prefetch=cfg.prefetch, norm_in=(sq, eps))
