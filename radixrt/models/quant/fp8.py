"""FP8 (e4m3) weights for the decoder's linear layers: the quantizers and `Fp8Linear`.

`--quantization fp8` stores every decoder linear (qkv, o, gate_up, down; the LM head too unless
--lm-head-quantization says otherwise: `quantize_lm_head`; never the embedding) as a float8_e4m3fn
weight [N, K] with one float32
scale per output channel, weight ~= weight_fp8 * weight_scale[:, None] (per-channel scales as in
SGLang's / vLLM's dynamic FP8). Checkpoints in bf16 are quantized at load, row by row, so a fused
parameter (q|k|v, gate|up) gets the scales its source tensors would have had alone; FP8 checkpoints
are copied as they are (quant/checkpoint.py). A linear call routes by its row count M:

  M <= Fp8Linear.skinny_max_rows on CUDA -> `radixrt.kernels.fp8_skinny_linear` with the FP8 weight
      (W8A16: x stays in bf16, the weight is widened in registers; decode is a weight read, and the
      activation quantization would be one more launch per linear): at M <= 2 the int GEMV
      (kernels/gemv_fp8_int.py: e4m3 bytes to fp32 bits by integer ops, no conversion
      instructions), at M of 3..16 `skinny_linear(..., weight_scale=)`
  otherwise -> dynamic per-token FP8 activations (`per_token_quant_fp8`, scale = amax(row) / 448),
      then on CUDA where `radixrt.kernels.gemm_fp8.gemm_routed(M, N, K)` (the shape and row bucket
      are in its H200-tuned table, i.e. measured faster there) the Triton FP8 GEMM `fp8_gemm` (e4m3
      operands on the tensor cores, the scales and bias in its epilogue), else `torch._scaled_mm`
      with row-wise scales ([M, 1] and [1, N] float32), which runs on CPU too (torch >= 2.6), so
      the tests run this same call. Both W8A8 with the same quantized operands.

On the W8A8 routes the quantization can move into the kernel that makes x (`takes_fp8_input`): the
decoder layer's RMSNorms hand qkv and gate_up an `Fp8Act` from `ops.rms_norm_fp8`, and the MLP hands
down one from `ops.silu_and_mul_fp8` (on CUDA one kernel each instead of two; the bf16 activation
is then never written; the FP8 values and scales are those of quantizing the bf16 output, up to the
norm kernel's fp32 summation order), as SGLang and vLLM fuse their norm / activation with the FP8
quantization. o's input comes from attention, whose programs each see one head of a row, so o
quantizes its own input.

At 1-2 rows on CUDA (the int GEMV in one pass for all four decoder linears) the RMSNorms between o
and gate_up and between down and the next layer's qkv move into the GEMVs around them
(`Fp8Linear.forward_then_norm` -> `NormedAct` -> `forward` or `silu_and_mul` of the next linear;
kernels/gemv_fp8_int.py NORM_OUT / NORM_IN; RADIXRT_FP8_FUSED_NORM=0 turns it off): the norm scales
a whole row by one number, so that number can be applied after the next linear's sums.

`skinny_max_rows` comes from RADIXRT_FP8_SKINNY_MAX_ROWS (default 16; 0 sends every call to the
W8A8 path), RADIXRT_FP8_TRITON_GEMM=0 keeps every W8A8 call on _scaled_mm, and
RADIXRT_FP8_FAST_ACCUM=0 makes _scaled_mm promote its partial sums to fp32 (fast accumulation is the
default on CUDA), RADIXRT_FP8_FUSED_QUANT=0 keeps the quantization in the linear; all read once in
radixrt.config.Env.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixrt.models.linear import Linear

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value (torch.finfo(torch.float8_e4m3fn).max)


def _fp8_skinny_rows() -> int:
    from radixrt.config import Env

    return Env.read().fp8_skinny_max_rows


def _fp8_triton_gemm() -> bool:
    from radixrt.config import Env

    return Env.read().fp8_triton_gemm


def _fp8_fast_accum() -> bool:
    from radixrt.config import Env

    return Env.read().fp8_fast_accum


def _fp8_fused_quant() -> bool:
    from radixrt.config import Env

    return Env.read().fp8_fused_quant


@dataclass(frozen=True, slots=True)
class Fp8Act:
    """Activations quantized per token, as `quantize_per_token` makes them: q [M, K] float8_e4m3fn,
    scale [M, 1] float32 (q * scale ~= the activations), dtype the activations' model dtype (also the
    dtype of the linear's output). What a producer kernel hands an Fp8Linear whose
    `takes_fp8_input` says yes (module docstring)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device


def _fp8_fused_norm() -> bool:
    from radixrt.config import Env

    return Env.read().fp8_fused_norm


@dataclass(frozen=True, slots=True)
class NormedAct:
    """An RMSNorm's output not yet normalized (Fp8Linear.forward_then_norm): rms_norm(h) * gamma
    == g / sqrt(sum(sq, 1) / H + eps) row by row, with g [M, H] = h * gamma in the model dtype and
    sq [M, P] float32 partial sums of h's squares. An Fp8Linear applies the division after its dot
    products (kernels/gemv_fp8_int.py NORM_IN); `materialize` computes the normed rows in torch."""

    g: torch.Tensor
    sq: torch.Tensor
    eps: float

    @property
    def shape(self) -> torch.Size:
        return self.g.shape

    @property
    def device(self) -> torch.device:
        return self.g.device

    @property
    def dtype(self) -> torch.dtype:
        return self.g.dtype

    def materialize(self) -> torch.Tensor:
        """The normed rows [M, H] in the model dtype (g * rstd, rstd in float32)."""
        rstd = torch.rsqrt(self.sq.sum(1, keepdim=True) / self.g.shape[1] + self.eps)
        return (self.g.float() * rstd).to(self.g.dtype)


def _scales(amax: torch.Tensor) -> torch.Tensor:
    """amax (float32) -> scale = amax / 448, and 1.0 where amax == 0 (all-zero rows stay zero).
    Divided element by element (a tensor divisor): CUDA turns a division by a Python number into a
    multiplication by its reciprocal, which differs from the CPU's quotient in the last bit, and a
    checkpoint must load to the same scales on either device."""
    return torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (w_fp8 [N, K] float8_e4m3fn, scale [N] float32), w ~= w_fp8 * scale[:, None].

    Each row's largest magnitude maps to 448; values are rounded to nearest even, so an element's
    error is at most half an e4m3 step: |w - w_fp8 * scale| <= max(|w| * 2^-4, scale * 2^-10)
    (3 mantissa bits in the normal range |w| >= scale * 2^-6; steps of 2^-9 * scale below it).
    A zero row gets scale 1.0 and zero weights. Computed in float32 on w's device.

    Raises:
        ValueError: w is not 2-D.
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_per_channel takes a [N, K] weight, got {tuple(w.shape)}")
    wf = w.float()
    scale = _scales(wf.abs().amax(dim=1))
    inv = 1.0 / scale  # torch.reciprocal: a true division on CUDA too
    q = (wf * inv[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_fp8 [M, K] float8_e4m3fn, scale [M, 1] float32): dynamic per-token scales,
    scale = amax(|row|) / 448 (1.0 for a zero row). One Triton launch on CUDA
    (kernels.per_token_quant_fp8), torch elsewhere; both multiply by the fp32 reciprocal."""
    if x.is_cuda:
        from radixrt.kernels import per_token_quant_fp8

        return per_token_quant_fp8(x)
    xf = x.float()
    scale = _scales(xf.abs().amax(dim=1, keepdim=True))
    return (xf * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequantize(w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w_fp8 [N, K] float8_e4m3fn, scale [N] or [N, 1] float32 -> [N, K] float32."""
    return w_fp8.float() * scale.reshape(-1, 1).float()


def fp8_linear_ref(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                   bias: torch.Tensor | None = None, quantize_input: bool = True) -> torch.Tensor:
    """The FP8 linear in float32 from dequantized operands (test reference and fallback): x [M, K]
    (quantized per token first when quantize_input, as the _scaled_mm path does) @ dequantized
    weight^T (+ bias) -> [M, N] in x's dtype."""
    xf = x.float()
    if quantize_input:
        xq, xs = quantize_per_token(x)
        xf = xq.float() * xs
    y = xf @ dequantize(w_fp8, w_scale).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


class Fp8Linear(Linear):
    """A Linear whose weight is float8_e4m3fn [N, K] with weight_scale [N] float32 (both parameters,
    requires_grad False); bias [N] and x / y stay in the model dtype. x [..., K] -> y [..., N].

    Build with `from_linear` (on the meta device, before `to_empty`), then fill with `set_weight`
    (quantizes a float weight) or by copying FP8 rows and scales (checkpoint loading)."""

    skinny_max_rows = _fp8_skinny_rows()  # M up to this: fp8_skinny_linear on CUDA (int GEMV at M <= 2)
    triton_gemm = _fp8_triton_gemm()  # W8A8 calls through kernels.gemm_fp8 where gemm_routed says so
    fast_accum = _fp8_fast_accum()  # _scaled_mm's use_fast_accum on CUDA (RADIXRT_FP8_FAST_ACCUM)
    fused_quant = _fp8_fused_quant()  # takes_fp8_input may say yes (RADIXRT_FP8_FUSED_QUANT)
    fused_norm = _fp8_fused_norm()  # norm_fusable may say yes (RADIXRT_FP8_FUSED_NORM)
    skinny_devices = ("cuda",)  # device types whose decode rows take fp8_skinny_linear (tests add "cpu")
    # forward_then_norm: the producer's last program sums the partial sums of squares (SQ_LAST)
    norm_sq_last = False
    # silu_and_mul of a NormedAct: rstd applied by the SiLU kernel (False: by the GEMV's epilogue)
    norm_in_silu = True
    _gemm_workspace = None  # split-K scratch of the routed fp8_gemm calls (allocated at the first one)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """An Fp8Linear of linear's shape and bias (the bias parameter is shared), on linear's device
        (normally meta); the model dtype is linear's weight dtype."""
        n, k = linear.weight.shape
        dev = linear.weight.device
        mod = cls(k, n, bias=False, device="meta", dtype=linear.weight.dtype)
        mod.weight = nn.Parameter(torch.empty((n, k), dtype=FP8_DTYPE, device=dev), requires_grad=False)
        mod.weight_scale = nn.Parameter(torch.ones(n, dtype=torch.float32, device=dev), requires_grad=False)
        mod.bias = linear.bias
        return mod

    @torch.no_grad()
    def set_weight(self, w: torch.Tensor, rows: tuple[int, int] | None = None) -> None:
        """Quantize float w [n, K] (quantize_per_channel) into rows [rows[0], rows[1]) of the weight
        (all rows when None) and their scales. Raises ValueError on a shape mismatch."""
        lo, hi = rows if rows is not None else (0, self.weight.shape[0])
        if tuple(w.shape) != (hi - lo, self.weight.shape[1]):
            raise ValueError(f"weight rows {tuple(w.shape)} != expected {(hi - lo, self.weight.shape[1])}")
        q, s = quantize_per_channel(w.to(self.weight.device))
        self.weight[lo:hi].copy_(q)
        self.weight_scale[lo:hi].copy_(s)

    def forward(self, x: torch.Tensor | Fp8Act | NormedAct) -> torch.Tensor:
        """x [..., K] in the model dtype, an Fp8Act of [M, K] (`takes_fp8_input`) or a NormedAct of
        [M, K] (`forward_then_norm` of the linear before) -> y [..., N] / [M, N] in the model dtype."""
        n, k = self.weight.shape
        if isinstance(x, Fp8Act):
            return self._w8a8(x.q, x.scale, x.dtype)
        if isinstance(x, NormedAct):
            if self.norm_fusable(x.shape[0], x.device, x.dtype):
                from radixrt.kernels.gemv_fp8_int import fp8_int_gemv_norm_in

                return fp8_int_gemv_norm_in(x.g, x.sq, x.eps, self.weight, self.weight_scale, self.bias)
            x = x.materialize()
        x2 = x.reshape(-1, k)
        m = x2.shape[0]
        if (x.device.type in self.skinny_devices and self._skinny and 0 < m <= self.skinny_max_rows
                and k % 16 == 0):
            from radixrt.kernels import fp8_skinny_linear

            y = fp8_skinny_linear(x2, self.weight, self.weight_scale, self.bias,
                                  workspace=self._scratch(x.device))
        else:
            y = self._w8a8(*quantize_per_token(x2), x2.dtype)
        return y.view(*x.shape[:-1], n)

    def takes_fp8_input(self, rows: int, device: torch.device) -> bool:
        """True where forward would quantize its input per token itself (the W8A8 routes: rows above
        skinny_max_rows on CUDA, any rows elsewhere; K and N multiples of 16 on CUDA), unless
        RADIXRT_FP8_FUSED_QUANT=0. Shapes only, so CUDA-graph safe. Never raises."""
        if not self.fused_quant or rows <= 0:
            return False
        if device.type != "cuda":
            return True
        n, k = self.weight.shape
        return not (k % 16 or n % 16 or (self._skinny and rows <= self.skinny_max_rows))

    def norm_fusable(self, rows: int, device: torch.device, dtype: torch.dtype) -> bool:
        """True where a call of `rows` rows of `dtype` x on `device` runs the int FP8 GEMV in one pass
        (kernels/gemv_fp8_int.py norm_fusable: CUDA, 1-2 rows, no split-K; bf16 x; forward's own
        skinny conditions), so it can produce (`forward_then_norm`) or take (`forward` of a
        NormedAct) an RMSNorm split across its epilogue; False with RADIXRT_FP8_FUSED_NORM=0.
        Shapes only, so CUDA-graph safe. Never raises."""
        n, k = self.weight.shape
        if not (self.fused_norm and self._skinny and dtype == torch.bfloat16
                and 0 < rows <= self.skinny_max_rows and k % 16 == 0):
            return False
        from radixrt.kernels.gemv_fp8_int import norm_fusable

        return norm_fusable(rows, n, k, device.type) is not None

    def forward_then_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
                          ) -> tuple[NormedAct, torch.Tensor]:
        """This linear, the residual add and `norm` (an RMSNorm: `weight` [N], `eps`) in one kernel, the
        normalization left to the next Fp8Linear: (NormedAct of rms_norm(y + residual) * norm.weight,
        the new residual y + residual [M, N]), x [M, K] and residual [M, N] in the model dtype. Where
        the int GEMV cannot take the call in one pass (`norm_fusable`, or operands it refuses:
        unaligned rows, a strided residual) the same NormedAct is computed in torch after the plain
        linear (sq then holds one sum per row), so the caller's next layer sees the same kind of
        value either way. Never raises for a fusable-shaped call."""
        from radixrt.kernels.gemv_fp8_int import fp8_int_gemv_norm_out, int_supported

        x2 = x.reshape(-1, self.weight.shape[1])
        if not (self.norm_fusable(x2.shape[0], x.device, x.dtype) and int_supported(x2, self.weight)
                and residual.shape == (x2.shape[0], self.weight.shape[0]) and residual.stride(-1) == 1):
            y = self(x2)
            h = (y.float() + residual.reshape(y.shape).float()).to(y.dtype)
            g = (h.float() * norm.weight.float()).to(y.dtype)
            return NormedAct(g, h.float().pow(2).sum(1, keepdim=True), norm.eps), h
        counters = self._scratch(x.device).counters if self.norm_sq_last else None
        g, h, sq = fp8_int_gemv_norm_out(x2, self.weight, self.weight_scale, self.bias, residual,
                                         norm.weight.contiguous(), counters=counters)
        return NormedAct(g, sq, norm.eps), h

    def silu_and_mul(self, x: torch.Tensor | Fp8Act | NormedAct) -> torch.Tensor:
        """SwiGLU of this fused [gate; up] FP8 weight: `ops.silu_and_mul(self(x))`. A NormedAct x
        (with no bias, where `norm_fusable`) takes the plain GEMV of its unnormalized rows and leaves
        the division by the RMS to the SiLU kernel (its few programs each sum the partial sums of
        squares once, not each of the GEMV's thousands)."""
        from radixrt.models import ops

        if (isinstance(x, NormedAct) and self.norm_in_silu and self.bias is None
                and self.norm_fusable(x.shape[0], x.device, x.dtype)):
            return ops.silu_and_mul(self(x.g), rms=(x.sq, x.eps, x.g.shape[1]))
        return ops.silu_and_mul(self(x))

    def _w8a8(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """FP8 x [M, K] (per-token scales xs [M, 1]) @ FP8 weight^T -> [M, N] in `dtype`: the Triton
        FP8 GEMM where gemm_routed says so on CUDA, else torch._scaled_mm; shapes outside the
        row-wise _scaled_mm form on CUDA in fp32 from dequantized operands."""
        n, k = self.weight.shape
        m = xq.shape[0]
        if m == 0:
            return torch.empty((0, n), dtype=dtype, device=xq.device)
        if xq.is_cuda and (k % 16 or n % 16):
            y = (xq.float() * xs) @ dequantize(self.weight, self.weight_scale).t()
            return (y if self.bias is None else y + self.bias.float()).to(dtype)
        if xq.is_cuda and self.triton_gemm and self._gemm_routed(m):
            return self._triton_gemm(xq, xs, dtype)
        return self._scaled_mm(xq, xs, dtype)

    def _gemm_routed(self, m: int) -> bool:
        from radixrt.kernels.gemm_fp8 import gemm_routed

        return gemm_routed(m, *self.weight.shape)

    def _triton_gemm(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Per-token FP8 x [M, K] @ FP8 weight^T through kernels.gemm_fp8 (bias in its epilogue), in
        `dtype`. The split-K workspace is sized for every tuned bucket of this shape at the first
        call (a graph warm-up call, outside capture)."""
        from radixrt.kernels.gemm_fp8 import fp8_gemm, gemm_workspace_need
        from radixrt.kernels.gemv import SkinnyWorkspace

        if self._gemm_workspace is None:
            partials, counters = gemm_workspace_need(*self.weight.shape)
            self._gemm_workspace = SkinnyWorkspace.allocate(max(partials, 1), max(counters, 1), xq.device)
        return fp8_gemm(xq, xs, self.weight, self.weight_scale, self.bias, out_dtype=dtype,
                        workspace=self._gemm_workspace)

    def _scaled_mm(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Per-token FP8 x [M, K] @ FP8 weight^T with row-wise scales, in `dtype`. On CUDA the
        row-wise form needs bf16 output and K, N multiples of 16 (`_w8a8` checks); the bias is added
        after (row-wise _scaled_mm takes only a bf16 bias). On CUDA with `fast_accum` the MMAs
        accumulate in the tensor core over the whole K loop (H200, 2026-12-03,
        bench/lab/fp8_fast_accum.py: one layer's four linears at M = 256 in 137.6 against 175.0 us,
        relative error against the fp32 product of the same operands 2.0e-3 / 3.8e-3 (down, K =
        18,944) against 1.7e-3 promoted)."""
        n = self.weight.shape[0]
        out_dtype = torch.bfloat16 if xq.is_cuda else dtype
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=xs, scale_b=self.weight_scale.view(1, n),
                             out_dtype=out_dtype, use_fast_accum=bool(self.fast_accum and xq.is_cuda))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y if y.dtype == dtype else y.to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3 per-channel"


def convert_to_fp8(model: nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> list[str]:
    """Replace every `Linear` of `model` (on the meta device, after `.to(dtype)`) whose name does
    not end with one of `skip` by an Fp8Linear of the same shape; returns the replaced names."""
    names = [name for name, mod in model.named_modules()
             if type(mod) is Linear and not name.endswith(skip)]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, Fp8Linear.from_linear(getattr(parent, attr)))
    return names


@torch.no_grad()
def quantize_lm_head(model: nn.Module) -> Fp8Linear:
    """Replace `model.lm_head` (a loaded `Linear` [V, H]) by an Fp8Linear quantized from its weight
    (per channel: one scale per vocabulary row), on the same device; returns it. A tied head (its
    weight is the embedding's) gets its own FP8 copy and the embedding keeps the model dtype, so the
    model holds V x H more bytes than a tied bf16 head; an untied head's bf16 weight is freed.
    The model's `tie_weights` leaves an Fp8Linear head alone. Logits are computed as before
    (hidden [B, H] in the model dtype -> [B, V]); the head routes by rows like every Fp8Linear.

    Raises:
        TypeError: lm_head is not a plain `Linear` (e.g. a tensor-parallel head)."""
    head = model.lm_head
    if type(head) is not Linear:
        raise TypeError(f"quantize_lm_head takes a Linear head, got {type(head).__name__}")
    with torch.device("meta"):
        shape = Linear(head.in_features, head.out_features, bias=head.bias is not None,
                       dtype=head.weight.dtype)
    fp8 = Fp8Linear.from_linear(shape).to_empty(device=head.weight.device)
    fp8.set_weight(head.weight)
    if head.bias is not None:
        fp8.bias = nn.Parameter(head.bias.detach().clone(), requires_grad=False)
    fp8.requires_grad_(False)
    model.lm_head = fp8
    return fp8
