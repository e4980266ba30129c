"""SiLU-and-multiply, the gate of a SwiGLU MLP (Shazeer 2020): out = silu(x[:, :I]) * x[:, I:].

`silu_and_mul_quant_fp8` fuses the dynamic per-token FP8 quantization of the output (the input of
an FP8 down projection, models/quant/fp8.py): one program per row computes the row in column blocks
for its amax, then scales and rounds it, so the [T, I] output is written once in FP8 instead of
written in the activation dtype and read back by `per_token_quant_fp8`. The two-pass form computes
the blocks twice (the second pass reads the row's gate and up again, mostly from L2). Values are
rounded to the activation dtype before the amax, so q and scale are those of
`per_token_quant_fp8(silu_and_mul(x))` (the same fp32 arithmetic per value). Rows of at most
ONE_PASS_MAX_CHUNKS column blocks take the one-pass form instead: the program loads all of the
row's blocks at once, keeps the values in registers for the amax and stores them scaled, so the
row's gate and up are read once and no load waits for the one before it (same values and scales).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, FP8_MAX, check
from .pdl import gdc_enter, launch_options, use_pdl


@triton.jit
def _silu_and_mul_kernel(x, out, inter, stride_x, stride_o, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr = False, sq=None, P=0, hidden=1, eps=0.0,
                         RSTD: tl.constexpr = False, BLOCK_P: tl.constexpr = 1):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gdc_enter(USE_PDL)  # kernels/pdl.py
    # gate and up halves of this row, in fp32
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    if RSTD:  # x is the linear of an RMSNorm's unnormalized rows: scale both halves by its rstd
        offs_p = tl.arange(0, BLOCK_P)
        s = tl.sum(tl.load(sq + row * P + offs_p, mask=offs_p < P, other=0.0), 0)
        rstd = 1.0 / tl.sqrt(s / hidden + eps)
        gate = gate * rstd
        up = up * rstd
    # silu(g) = g * sigmoid(g)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out + row * stride_o + offs, y.to(out.dtype.element_ty), mask=mask)


def _pick_config(inter: int) -> dict:
    """1024-wide column blocks (fewer for small rows), 4 warps."""
    return {"BLOCK": min(1024, triton.next_power_of_2(inter)), "num_warps": 4}


def silu_and_mul(x: torch.Tensor, rms: tuple[torch.Tensor, float, int] | None = None) -> torch.Tensor:
    """x: [T, 2I] (gate then up, last dim contiguous) -> [T, I] in x's dtype, computed in fp32.

    rms (sq [T, P] float32 contiguous, eps, hidden): x is a linear (without bias) of RMSNorm rows
    left unnormalized (kernels/gemv_fp8_int.py fp8_int_gemv_norm_out: sq their partial sums of
    squares, hidden their width), so each row's gate and up are first multiplied by its
    rstd = 1 / sqrt(sum(sq[t]) / hidden + eps): the SwiGLU of the normalized rows' linear.

    Raises ValueError if x is not 2-D with an even, contiguous last dim, or sq is not [T, P].
    """
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check(x.stride(1) == 1, "x must have a contiguous last dim")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    sq, eps, hidden = rms if rms is not None else (x, 0.0, 1)
    if rms is not None:
        check(sq.dim() == 2 and sq.shape[0] == num_tokens and sq.dtype == torch.float32 and sq.is_contiguous()
              and hidden > 0, f"sq must be a contiguous [{num_tokens}, P] float32 tensor, hidden > 0")
    num_p = sq.shape[1] if rms is not None else 0
    cfg = _pick_config(inter)
    grid = (num_tokens, triton.cdiv(inter, cfg["BLOCK"]))
    pdl = use_pdl(x)
    _silu_and_mul_kernel[grid](x, out, inter, x.stride(0), out.stride(0),
                               BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"], USE_PDL=pdl,
                               sq=sq, P=num_p, hidden=int(hidden), eps=float(eps), RSTD=rms is not None,
                               BLOCK_P=triton.next_power_of_2(max(num_p, 1)), **launch_options(pdl))
    return out


_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _silu_mul_block(x, row, stride_x, offs, INTER: tl.constexpr):
    """silu(gate) * up of one row's columns offs, rounded to x's dtype, as fp32."""
    mask = offs < INTER
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    return (gate / (1.0 + tl.exp(-gate)) * up).to(x.dtype.element_ty).to(tl.float32)


@triton.jit
def _silu_and_mul_quant_kernel(x, q, scale, stride_x, stride_q, INTER: tl.constexpr, BLOCK: tl.constexpr,
                               USE_PDL: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    # pass 1: the row's largest magnitude
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, INTER, BLOCK):
        amax = tl.maximum(amax, tl.abs(_silu_mul_block(x, row, stride_x, c0 + offs, INTER)))
    a = tl.max(amax, 0)
    s = tl.where(a > 0.0, a / _FP8_MAX, 1.0)
    inv = 1.0 / s
    # pass 2: the same values again, scaled, saturated and rounded to nearest even
    for c0 in range(0, INTER, BLOCK):
        y = tl.clamp(_silu_mul_block(x, row, stride_x, c0 + offs, INTER) * inv, -_FP8_MAX, _FP8_MAX)
        tl.store(q + row * stride_q + c0 + offs, y.to(q.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=(c0 + offs) < INTER)
    tl.store(scale + row, s)


@triton.jit
def _quant_store_block(q, row, stride_q, offs, h, inv, INTER: tl.constexpr):
    """Store h * inv (saturated to +-448, rounded to nearest even) at columns offs of q's row."""
    y = tl.clamp(h * inv, -_FP8_MAX, _FP8_MAX)
    tl.store(q + row * stride_q + offs, y.to(q.dtype.element_ty, fp_downcast_rounding="rtne"),
             mask=offs < INTER)


@triton.jit
def _silu_mul_amax(x, row, stride_x, offs, INTER: tl.constexpr, amax):
    """(_silu_mul_block of columns offs, max(amax, its largest magnitude))."""
    h = _silu_mul_block(x, row, stride_x, offs, INTER)
    return h, tl.maximum(amax, tl.max(tl.abs(h), 0))


@triton.jit
def _silu_and_mul_quant_onepass_kernel(x, q, scale, stride_x, stride_q, INTER: tl.constexpr,
                                       BLOCK: tl.constexpr, NCHUNK: tl.constexpr,
                                       USE_PDL: tl.constexpr = False):
    # NCHUNK (1..6) = cdiv(INTER, BLOCK) blocks of one row, each held in registers from its load to
    # its store (the blocks are written out one by one: Triton has no register arrays)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    h0 = _silu_mul_block(x, row, stride_x, offs, INTER)
    a = tl.max(tl.abs(h0), 0)
    if NCHUNK > 1:
        h1, a = _silu_mul_amax(x, row, stride_x, BLOCK + offs, INTER, a)
    if NCHUNK > 2:
        h2, a = _silu_mul_amax(x, row, stride_x, 2 * BLOCK + offs, INTER, a)
    if NCHUNK > 3:
        h3, a = _silu_mul_amax(x, row, stride_x, 3 * BLOCK + offs, INTER, a)
    if NCHUNK > 4:
        h4, a = _silu_mul_amax(x, row, stride_x, 4 * BLOCK + offs, INTER, a)
    if NCHUNK > 5:
        h5, a = _silu_mul_amax(x, row, stride_x, 5 * BLOCK + offs, INTER, a)
    s = tl.where(a > 0.0, a / _FP8_MAX, 1.0)
    inv = 1.0 / s
    _quant_store_block(q, row, stride_q, offs, h0, inv, INTER)
    if NCHUNK > 1:
        _quant_store_block(q, row, stride_q, BLOCK + offs, h1, inv, INTER)
    if NCHUNK > 2:
        _quant_store_block(q, row, stride_q, 2 * BLOCK + offs, h2, inv, INTER)
    if NCHUNK > 3:
        _quant_store_block(q, row, stride_q, 3 * BLOCK + offs, h3, inv, INTER)
    if NCHUNK > 4:
        _quant_store_block(q, row, stride_q, 4 * BLOCK + offs, h4, inv, INTER)
    if NCHUNK > 5:
        _quant_store_block(q, row, stride_q, 5 * BLOCK + offs, h5, inv, INTER)
    tl.store(scale + row, s)


ONE_PASS_MAX_CHUNKS = 6

# Row counts from which ops.silu_and_mul_fp8 takes the fused kernel on CUDA. H200, 2026-12-03
# (bench/lab/fp8_fused_quant.py, intermediate 18,944, us per call; silu_and_mul then
# per_token_quant_fp8 / the two-pass form at 8 warps / the one-pass form at 16 warps, the default):
# 17 rows 5.39 / 7.86 / 5.36, 64 rows 7.92 / 9.83 / 7.62, 256 rows 13.52 / 14.16 / 10.69, 512 rows
# 23.50 / 30.90 / 19.72, 2,048 rows 95.66 / 84.98 / 71.18, 8,192 rows 374.72 / 315.73 / 269.48 (the
# one-pass form at 8 / 32 warps: 11.37 / 10.66 us at 256 rows). The two-pass form waited on each
# block's load in turn and lost below 2,048 rows (so the threshold was 1,024 until then); the one-pass
# form ties at 17 rows and wins from 64. Fewer rows were not measured: up to 16 rows (the default
# RADIXRT_FP8_SKINNY_MAX_ROWS) the FP8 linears take bf16 input on CUDA (Fp8Linear.takes_fp8_input).
# Rows too wide for the one-pass form (more than ONE_PASS_MAX_CHUNKS blocks, e.g. the 28,672-wide
# MLPs of 70B models) keep the two-pass form and its threshold (not measured at those widths).
QUANT_FUSED_MIN_ROWS = 17
QUANT_FUSED_MIN_ROWS_TWO_PASS = 1024


def quant_fused_min_rows(inter: int) -> int:
    """The row count from which ops.silu_and_mul_fp8 takes silu_and_mul_quant_fp8 for an intermediate
    size `inter` on CUDA: QUANT_FUSED_MIN_ROWS where "auto" runs the one-pass form, else
    QUANT_FUSED_MIN_ROWS_TWO_PASS. Never raises."""
    return QUANT_FUSED_MIN_ROWS if _one_pass_fits(inter) else QUANT_FUSED_MIN_ROWS_TWO_PASS


@functools.cache
def _one_pass_fits(inter: int) -> bool:
    """Whether "auto" runs the one-pass form for rows of `inter` columns (cached: asked once per MLP
    call of an eager pass)."""
    return _pick_quant_config(max(inter, 1))["NCHUNK"] > 0


QUANT_FORMS = ("auto", "one_pass", "two_pass")


def _pick_quant_config(inter: int, form: str = "auto", num_warps: int | None = None) -> dict:
    """Column blocks of up to 4,096 (8 warps from 2,048 up; the one-pass form 16 from 8,192 up,
    all of its blocks in flight at once; measured at 18,944 only): the one-pass form where the row is
    at most ONE_PASS_MAX_CHUNKS blocks ("auto"), else the two passes. {"BLOCK", "NCHUNK" (0: two
    passes), "num_warps"}. Raises ValueError for a one-pass row that is too wide or num_warps <= 0."""
    check(num_warps is None or num_warps > 0, f"num_warps must be positive, got {num_warps}")
    block = min(4096, triton.next_power_of_2(inter))
    nchunk = triton.cdiv(inter, block)
    one_pass = form == "one_pass" or form == "auto" and nchunk <= ONE_PASS_MAX_CHUNKS
    check(not one_pass or nchunk <= ONE_PASS_MAX_CHUNKS,
          f"the one-pass form takes at most {ONE_PASS_MAX_CHUNKS} blocks of {block}")
    warps = (16 if inter >= 8192 else 8 if block >= 2048 else 4) if one_pass else 8 if block >= 2048 else 4
    return {"BLOCK": block, "NCHUNK": nchunk if one_pass else 0, "num_warps": num_warps or warps}


def silu_and_mul_quant_fp8(x: torch.Tensor, form: str = "auto",
                           num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, 2I] fp16/bf16/fp32 (gate then up, last dim contiguous) -> (q [T, I] float8_e4m3fn,
    scale [T, 1] float32) with q * scale ~= silu_and_mul(x), as
    `per_token_quant_fp8(silu_and_mul(x))` gives them (module docstring). Allocates its outputs (CUDA-graph
    safe). `form` / `num_warps` (benchmarks, tests): "auto" (the module docstring's rule), "one_pass"
    (at most ONE_PASS_MAX_CHUNKS blocks of 4,096), "two_pass"; warps per program (None: the rule's).
    Raises ValueError if x is not 2-D with an even, contiguous last dim or of another dtype, or for a
    form that cannot take the row."""
    check(form in QUANT_FORMS, f"form must be one of {QUANT_FORMS}, got {form!r}")
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check(x.stride(1) == 1, "x must have a contiguous last dim")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {x.dtype}")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    q = torch.empty((num_tokens, inter), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
    cfg = _pick_quant_config(max(inter, 1), form, num_warps)  # (raises before the empty cases return)
    if num_tokens == 0 or inter == 0:
        return q, scale.fill_(1.0)
    pdl = use_pdl(x)
    if cfg["NCHUNK"]:
        _silu_and_mul_quant_onepass_kernel[(num_tokens,)](
            x, q, scale, x.stride(0), q.stride(0), INTER=inter, BLOCK=cfg["BLOCK"], NCHUNK=cfg["NCHUNK"],
            num_warps=cfg["num_warps"], USE_PDL=pdl, **launch_options(pdl))
        return q, scale
    _silu_and_mul_quant_kernel[(num_tokens,)](x, q, scale, x.stride(0), q.stride(0), INTER=inter,
                                              BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"], USE_PDL=pdl,
                                              **launch_options(pdl))
    return q, scale
