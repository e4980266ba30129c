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
):
    """x: int64 words of 4 bf16 [M, K4]; w: int32 words of 4 e4m3 [N, K4]. ROWS = M (1..4).
    USE_PDL (kernels/pdl.py): the first chunk's weight words are loaded before the wait."""
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
    if PREFETCH:  # the next chunk's words are loaded before this chunk is computed
        wn = tl.load(w_ptrs + k_start, mask=((k_start + xk) < k_stop) | EVEN_K, other=0)
        gdc_enter(USE_PDL)  # kernels/pdl.py
    elif USE_PDL:  # the first chunk, peeled: its words are in flight during the wait
        w0 = tl.load(w_ptrs + k_start, mask=((k_start + xk) < K4) | EVEN_K, other=0)
        gdc_enter(USE_PDL)
        acc0, acc1, acc2, acc3 = _chunk(acc0, acc1, acc2, acc3, w0, x, stride_x4, k_start, xk, K4,
                                        ROWS, EVEN_K, X_SCALE)
        loop_start = k_start + BLOCK_K4
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
                 counters: torch.Tensor | None = None, prefetch: bool = False) -> torch.Tensor:
    """The raw launch: y2 [M, N] = x2 [M, K] @ (weight * weight_scale[:, None])^T (+ bias), operands
    as int_supported accepts (not checked here), y2 of any float dtype. With split-K, partials
    (fp32, >= splits * M * N) and counters (int32, >= cdiv(N, block_n), zero; left zero) are required.
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
    else:
        partials = counters = y2
    pdl = use_pdl(x2)
    _fp8_int_gemv_kernel[(tiles, num_splits)](
        x64, w32, weight_scale, bias if bias is not None else y2, y2, partials, counters,
        m, n, k4, k4_per_split, num_splits,
        x2.stride(0) // 4, weight.stride(0) // 4, y2.stride(0),
        ROWS=m, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K4=block_k4,
        EVEN_K=k4 % block_k4 == 0, SPLIT=split, HAS_BIAS=bias is not None,
        PREFETCH=prefetch, num_warps=num_warps, num_stages=1, USE_PDL=pdl, **launch_options(pdl),
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
