"""FP8 on a CUDA device (Hopper for _scaled_mm's row-wise form) at Qwen2.5-7B shapes: the FP8 linear
(the int GEMV at M <= 2, Triton skinny W8A16 above, per-token quantization + torch._scaled_mm) against
the dequantized reference (the int GEMV routed through Fp8Linear, eagerly and in a CUDA graph, and at
the other configs the lab sweeps), the per-token quantization kernel against torch, store_kv's
rounding into an FP8 pool, and decode / extend / cascade attention over an FP8 pool against the
references. Skipped without CUDA.

Tolerances: the FP8 linear's output within 2e-2 relative norm of the dequantized reference (bf16
output, different accumulation order, and for _scaled_mm the same FP8 operands); attention as
test_kernels_gpu.py (2e-2 + 2e-2 |ref| max, 1e-2 relative norm) since both sides read the same FP8
bytes. The FP8-operand decode forms (kernels/paged_loop_fp8.py) also round q and P to e4m3: "fp8x2"
(q and P as two e4m3 terms each, within 2^-7 relative) keeps the 1e-2 bound, the single-term forms
get bounds from their 2^-4 operand rounding (FP8_FORM_TOL, as tests/kernels/test_fp8_variants.py).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from radixrt.kernels import attention_configs as ac
from radixrt.kernels import (
    cascade_decode_attention,
    choose_num_kv_splits,
    decode_attention,
    extend_attention,
    per_token_quant_fp8,
    rms_norm,
    rms_norm_quant_fp8,
    silu_and_mul,
    silu_and_mul_quant_fp8,
    store_kv,
)
from radixrt.kernels import gemv_fp8_int as G8
from radixrt.kernels.paged_loop_fp8 import LO_WEIGHT, split_e4m3
from radixrt.kernels.reference import (
    cascade_decode_attention_ref,
    decode_attention_ref,
    extend_attention_ref,
    quantize_kv_ref,
)
from radixrt.models.linear import Linear
from radixrt.models.quant.fp8 import Fp8Linear, fp8_linear_ref, quantize_per_token

from .conftest import make_paged_batch
from .test_cascade_attention import make_cascade_batch

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
SHAPES = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)]  # qkv, o, gate_up, down


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _layer(n: int, k: int, bias: bool) -> Fp8Linear:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    with torch.device("meta"):
        lin = Linear(k, n, bias=bias, dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(lin).to_empty(device="cuda")
    layer.set_weight(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    if bias:
        layer.bias.data.normal_(0.0, 0.1, generator=gen)
    return layer


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17, 200])
def test_fp8_linear_matches_dequantized_reference(n: int, k: int, m: int) -> None:
    layer = _layer(n, k, bias=(n == 4608))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    skinny = m <= Fp8Linear.skinny_max_rows
    ref = fp8_linear_ref(x, layer.weight, layer.weight_scale, layer.bias, quantize_input=not skinny)
    assert _rel(out, ref) < 2e-2
    scaled = layer._scaled_mm(*quantize_per_token(x), x.dtype)  # the other path, whatever the routing
    assert _rel(scaled, fp8_linear_ref(x, layer.weight, layer.weight_scale, layer.bias)) < 2e-2


@pytest.mark.parametrize("fast", [True, False], ids=["fast-accum", "promoted"])
def test_fp8_scaled_mm_accumulation_modes(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """_scaled_mm with fast accumulation (the CUDA default) and promoted partial sums: both within
    the FP8 bound of the dequantized reference at the longest K (down_proj, 18,944) and M = 256."""
    layer = _layer(3584, 18944, bias=False)
    monkeypatch.setattr(layer, "fast_accum", fast)
    x = torch.randn(256, 18944, device="cuda", dtype=torch.bfloat16)
    ref = fp8_linear_ref(x, layer.weight, layer.weight_scale, None)
    calls = []
    real = torch._scaled_mm

    def spy(*args, **kwargs):
        calls.append(kwargs.get("use_fast_accum"))
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "_scaled_mm", spy)
    assert _rel(layer._scaled_mm(*quantize_per_token(x), x.dtype), ref) < 1e-2
    assert calls == [fast]  # the flag reaches the GEMM


def _replay_matches_eager(layer: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x) captured in a CUDA graph after a warm-up call (compiles, allocates the workspace), x
    refilled, the graph replayed: its output must equal the eager call's bit for bit. Returns it."""
    layer(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.randn_like(x))
    want = layer(x)
    graph.replay()
    torch.testing.assert_close(y, want, atol=0, rtol=0)
    return y


def test_fp8_linear_captures_in_a_cuda_graph() -> None:
    layer = _layer(3584, 3584, bias=False)
    for m in (1, 64):
        _replay_matches_eager(layer, torch.randn(m, 3584, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("n, k", SHAPES + [(152064, 3584)])
@pytest.mark.parametrize("m", [17, 32, 64, 100, 256, 512, 3000])
def test_fp8_gemm_rule_matches_scaled_mm(n: int, k: int, m: int) -> None:
    """kernels/gemm_fp8.py at fp8_gemm_config's rule (and the tuned entry where listed) against
    _scaled_mm on the same e4m3 operands: the same sums in another order, one bf16 rounding each."""
    from radixrt.kernels.gemm_fp8 import fp8_gemm

    layer = _layer(n, k, bias=False)
    xq, xs = per_token_quant_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    ref = torch._scaled_mm(xq, layer.weight.t(), scale_a=xs, scale_b=layer.weight_scale.view(1, n),
                           out_dtype=torch.float32)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8_gemm(xq, xs, layer.weight, layer.weight_scale, out=y)
    assert _rel(y, ref) < 4e-3


def test_fp8_linear_triton_gemm_routed_and_in_a_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tuned entry for the bucket, Fp8Linear takes fp8_gemm (bias in its epilogue, split-K
    workspace sized at the first call) and replays it from a CUDA graph bit for bit."""
    from radixrt.kernels import gemm_fp8 as GF

    n, k = 4608, 3584
    monkeypatch.setattr(GF, "FP8_GEMM_TUNED", {(64, n, k): GF.Fp8GemmConfig(64, 64, 128, swap_ab=True,
                                                                             split_k=2)})
    monkeypatch.setattr(Fp8Linear, "triton_gemm", True)
    layer = _layer(n, k, bias=True)
    x = torch.randn(48, k, device="cuda", dtype=torch.bfloat16)
    assert layer._gemm_routed(48) and not layer._gemm_routed(65)
    y = _replay_matches_eager(layer, x)
    assert _rel(y, fp8_linear_ref(x, layer.weight, layer.weight_scale, layer.bias)) < 2e-2
    assert int(layer._gemm_workspace.counters.abs().sum()) == 0


def _int_ref(x: torch.Tensor, layer: Fp8Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 reference, sum |x| |w|) of the FP8 linear on the same bf16 x and FP8 bytes."""
    wf = layer.weight.double() * layer.weight_scale.double()[:, None]
    ref = x.double() @ wf.t() + (layer.bias.double() if layer.bias is not None else 0.0)
    return ref, x.double().abs() @ wf.abs().t()


def _assert_int_close(out: torch.Tensor, x: torch.Tensor, layer: Fp8Linear) -> None:
    """bf16 output: one bf16 ulp (2^-7 relative; round-to-nearest needs half, a truncating conversion
    such as the CPU interpreter's a whole one) plus 2e-6 of sum |x||w| for the fp32 sums."""
    ref, bound = _int_ref(x, layer)
    assert not torch.isnan(out).any()
    assert ((out.double() - ref).abs() <= 2.0**-7 * ref.abs() + 2e-6 * bound + 1e-30).all()


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 2])
def test_fp8_linear_routes_decode_rows_to_the_int_gemv(n: int, k: int, m: int) -> None:
    """Fp8Linear at M = 1, 2 runs the int kernel with FP8_INT_TUNED's config (bit-equal to launching it
    directly) and matches the float64 reference on the same bytes."""
    layer = _layer(n, k, bias=(n == 4608))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cfg = G8.int_routed(m, n, k, "cuda")
    assert cfg == G8.FP8_INT_TUNED[(m, n, k)] and G8.int_supported(x, layer.weight)
    out = layer(x)
    direct = torch.empty_like(out)
    G8.fp8_int_gemv(x, layer.weight, layer.weight_scale, layer.bias, direct, cfg.block_n, cfg.block_k4,
                    cfg.split_k, cfg.num_warps, prefetch=cfg.prefetch)
    assert torch.equal(out, direct)
    _assert_int_close(out, x, layer)


@pytest.mark.parametrize("n, k", SHAPES)
def test_fp8_int_gemv_in_a_cuda_graph(n: int, k: int) -> None:
    """The routed Fp8Linear at M = 1, 2 captured in a CUDA graph: a replay with new x equals the eager
    call and the reference."""
    layer = _layer(n, k, bias=False)
    for m in (1, 2):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        _assert_int_close(_replay_matches_eager(layer, x), x, layer)


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("chain", ["o-gate_up", "down-qkv"])
@pytest.mark.parametrize("sq_last", [False, True], ids=["partials", "last-program-sum"])
def test_fused_norm_chain_at_7b_shapes_eager_and_in_a_graph(m: int, chain: str, sq_last: bool) -> None:
    """linear -> residual add + RMSNorm -> linear at Qwen2.5-7B's shapes with the norm in the int
    GEMVs' epilogues (NORM_OUT / NORM_IN; the tuned configs): the residual stream is bit-equal to the
    unfused chain's (the routed linear, then rms_norm), g is h * gamma rounded, the second linear's
    output is within 2e-2 relative (l2) of the unfused chain's (where rstd multiplies before the
    rounding to bf16) and within bf16 roundings of the float64 linear of rms_norm(h) * gamma; a
    CUDA-graph replay with new inputs equals the eager call. sq_last: the producer's last program
    sums the partial sums (SQ_LAST; its counter is left zero)."""
    (n1, k1), (n2, k2) = {"o-gate_up": ((3584, 3584), (37888, 3584)),
                          "down-qkv": ((3584, 18944), (4608, 3584))}[chain]
    first, second = _layer(n1, k1, bias=False), _layer(n2, k2, bias=(n2 == 4608))
    gamma = (torch.rand(n1, device="cuda") + 0.5).to(torch.bfloat16)
    eps = 1e-6
    x = torch.randn(m, k1, device="cuda", dtype=torch.bfloat16)
    resid = torch.randn(m, n1, device="cuda", dtype=torch.bfloat16) * 4

    counters = torch.zeros(1, dtype=torch.int32, device="cuda") if sq_last else None

    def fused():
        g, h, sq = G8.fp8_int_gemv_norm_out(x, first.weight, first.weight_scale, None, resid, gamma,
                                            counters=counters)
        return g, h, sq, G8.fp8_int_gemv_norm_in(g, sq, eps, second.weight, second.weight_scale, second.bias)

    g, h, sq, y = fused()
    xn, h_ref = rms_norm(first(x), gamma, eps, resid)
    y_ref = second(xn)
    assert torch.equal(h, h_ref)
    assert torch.equal(g, (h.float() * gamma.float()).to(torch.bfloat16))
    torch.testing.assert_close(sq.sum(1), h.float().pow(2).sum(1), rtol=1e-5, atol=0)
    assert ((y.float() - y_ref.float()).norm() / y_ref.float().norm()) < 2e-2
    hd = h.double()
    normed = hd * torch.rsqrt(hd.pow(2).mean(1, keepdim=True) + eps) * gamma.double()
    wd = second.weight.double() * second.weight_scale.double()[:, None]
    ref = normed @ wd.t() + (second.bias.double() if second.bias is not None else 0.0)
    bound = normed.abs() @ wd.abs().t()
    assert ((y.double() - ref).abs() <= 2 ** -7 * bound + 2 ** -8 * ref.abs() + 1e-3).all()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fused()
    x.copy_(torch.randn_like(x))
    resid.copy_(torch.randn_like(resid))
    graph.replay()
    eager = fused()
    for a, b in zip(static, eager, strict=True):
        assert torch.equal(a, b)
    assert sq.shape[1] == 1 if sq_last else sq.shape[1] > 1
    if sq_last:
        assert int(counters[0]) == 0


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_int_gemv_lab_configs(n: int, k: int, m: int) -> None:
    """Configs the lab sweeps (split-K, prefetch, M = 4): within 1e-6 of sum |x||w| (fp32 output),
    deterministic."""
    layer = _layer(n, k, bias=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref, bound = _int_ref(x, layer)
    ws = G8.SkinnyWorkspace.allocate(2 * m * n, n, "cuda")
    for cfg in [(8, 256, 4, 1, False), (16, 128, 4, 1, True), (8, 128, 4, 2, False)]:
        bn, bk4, warps, split, pf = cfg
        ys = [torch.full((m, n), float("nan"), device="cuda") for _ in range(2)]
        for y in ys:
            G8.fp8_int_gemv(x, layer.weight, layer.weight_scale, None, y, bn, bk4, split, warps,
                            ws.partials, ws.counters, pf)
        assert ((ys[0].double() - ref).abs() <= 1e-6 * bound + 1e-30).all(), cfg
        assert torch.equal(ys[0], ys[1]), cfg  # deterministic, split-K included


def test_per_token_quant_kernel_matches_torch() -> None:
    rows = torch.logspace(-3, 2, 37, device="cuda")[:, None]
    x = (torch.randn(37, 18944, device="cuda") * rows).to(torch.bfloat16)
    x[5] = 0
    q, s = per_token_quant_fp8(x)
    amax = x.float().abs().amax(1, keepdim=True)
    s_ref = torch.where(amax > 0, amax / 448.0, torch.ones_like(s))
    torch.testing.assert_close(s, s_ref, atol=0, rtol=1e-6)
    q_ref = (x.float() * (1.0 / s_ref)).clamp(-448, 448).to(FP8)
    assert (q.float() != q_ref.float()).float().mean() < 1e-4  # ties: at most a reciprocal's ulp apart


@pytest.mark.parametrize("rows", [17, 256, 8192])
def test_fused_quant_kernels_at_7b_widths_eager_and_in_a_graph(rows: int) -> None:
    """rms_norm_quant_fp8 (hidden 3,584, with the residual) and silu_and_mul_quant_fp8 (intermediate
    18,944) match the unfused kernel then per_token_quant_fp8 (tests/kernels/test_fused_quant.py's
    bounds: the norm's fp32 summation order may differ), eagerly and replayed; the residual exactly."""
    from .test_fused_quant import assert_quant_matches

    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 3584, device="cuda", generator=gen).to(torch.bfloat16)
    res = torch.randn(rows, 3584, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.rand(3584, device="cuda", generator=gen).to(torch.bfloat16)
    gu = (torch.randn(rows, 2 * 18944, device="cuda", generator=gen) * 3).to(torch.bfloat16)

    def fused():
        return (*rms_norm_quant_fp8(x, w, 1e-6, res), *silu_and_mul_quant_fp8(gu))

    def unfused():
        out, new_res = rms_norm(x, w, 1e-6, res)
        return (*per_token_quant_fp8(out), new_res, *per_token_quant_fp8(silu_and_mul(gu)))

    def same(a, b):
        assert_quant_matches(a[0], a[1], b[0].view(torch.uint8), b[1])
        assert torch.equal(a[2], b[2])
        assert_quant_matches(a[3], a[4], b[3].view(torch.uint8), b[4])
    eager = fused()
    same(eager, unfused())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused()
    for t in (x, res, gu):
        t.copy_(torch.randn_like(t))
    graph.replay()
    same(captured, unfused())


def test_store_kv_rounds_random_values_like_torch() -> None:
    b = make_paged_batch([5, 0], [11, 300], 16, 28, 4, 128, torch.bfloat16, device=torch.device("cuda"))
    kb, vb = b.k_buffer.to(FP8), b.v_buffer.to(FP8)
    k_scale, v_scale = 0.013, 0.021  # values up to ~4 / 0.013 = 300: the whole e4m3 range
    store_kv(kb, vb, b.out_cache_loc, b.k * 2, b.v, k_scale=k_scale, v_scale=v_scale)
    want_k = quantize_kv_ref(b.k * 2, k_scale)
    want_v = quantize_kv_ref(b.v, v_scale)
    assert torch.equal(kb[b.out_cache_loc].view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vb[b.out_cache_loc].view(torch.uint8), want_v.view(torch.uint8))


def _attn_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(out).any()
    assert ((out.float() - ref.float()).abs() <= 2e-2 + 2e-2 * ref.float().abs()).all()
    assert _rel(out, ref) < 1e-2


# launch_config's variants: (256, 400) 1,024 programs of < 512 keys, above 4 per SM: the "many" config;
# (64, 4096) and (256, 600) splits of >= 512 keys: the warp-split "long" config
@pytest.mark.parametrize("batch, seq_len", [(1, 8192), (64, 4096), (7, 333), (256, 600), (256, 400)])
def test_decode_attention_fp8_pool(batch: int, seq_len: int) -> None:
    b = make_paged_batch([seq_len] * batch, [0] * batch, 16, 28, 4, 128, torch.bfloat16,
                         device=torch.device("cuda"))
    kb, vb = quantize_kv_ref(b.k_buffer, 0.02), quantize_kv_ref(b.v_buffer, 0.03)
    q = torch.randn(batch, 28, 128, device="cuda", dtype=torch.bfloat16)
    splits = choose_num_kv_splits(batch, 4, seq_len)
    out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, splits, k_scale=0.02,
                           v_scale=0.03, max_seq_len=seq_len)
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, 16, None, k_scale=0.02, v_scale=0.03)
    _attn_close(out, ref)


@pytest.mark.parametrize("pool", ["fp8", "bf16"])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_decode_attention_warp_split_ragged(pool: str, splits: int) -> None:
    """The warp-split loop (an FP8 pool's "long" config, taken here through max_seq_len 8,192: >= 512
    keys per split; a bf16 pool through an override) over ragged lengths: at, one past and one short
    of a 64-key block and a warp's 32 keys, so that some warps see no key in the last block or in a
    whole split."""
    lens = [1, 31, 32, 33, 63, 64, 65, 513, 1000, 2049, 4095]
    b = make_paged_batch(lens, [0] * len(lens), 16, 28, 4, 128, torch.bfloat16, device=torch.device("cuda"))
    scales = {}
    kb, vb = b.k_buffer, b.v_buffer
    if pool == "fp8":
        kb, vb = quantize_kv_ref(kb, 0.02), quantize_kv_ref(vb, 0.03)
        scales = {"k_scale": 0.02, "v_scale": 0.03}
    q = torch.randn(len(lens), 28, 128, device="cuda", dtype=torch.bfloat16)
    over = {} if pool == "fp8" else {"decode": {"d128": {"BLOCK_N": 64, "num_warps": 2, "num_stages": 3,
                                                         "many_per_sm": 0, "warp_split": True}}}
    with ac.overriding(over):
        out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, splits, max_seq_len=8192,
                               **scales)
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, 16, None, **scales)
    _attn_close(out, ref)


# kv_dot -> bound on ||out - ref|| / ||ref|| over random data: single e4m3 terms ("fp8") measured
# 1.8-4.1% on the CPU (test_fp8_variants.py) and 3.6% on the H200 at 64 x 4,096 (against the bf16
# kernel, bench/results/fp8.md), the split / fp16-P forms 0.1-0.4% and 0.28-0.31%
FP8_FORM_TOL = {"f16": 1e-2, "fp8x2": 1e-2, "qk8": 1e-2, "fp8": 8e-2}


@pytest.mark.parametrize("kv_dot", sorted(FP8_FORM_TOL))
@pytest.mark.parametrize("batch, seq_len, q_mul", [(64, 4096, 1.0), (7, 333, 4.0), (3, 8192, 2.0)])
def test_decode_attention_fp8_operand_forms(kv_dot: str, batch: int, seq_len: int, q_mul: float) -> None:
    """Each kv_dot form against the fp32 reference on the dequantized pool, at the default blocks and
    splits of head dim 128, and with 64-key blocks and one split (no merge stage)."""
    b = make_paged_batch([seq_len] * batch, [0] * batch, 16, 28, 4, 128, torch.bfloat16,
                         device=torch.device("cuda"))
    kb, vb = quantize_kv_ref(b.k_buffer, 0.02), quantize_kv_ref(b.v_buffer, 0.03)
    q = torch.randn(batch, 28, 128, device="cuda", dtype=torch.bfloat16) * q_mul
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, 16, None, k_scale=0.02, v_scale=0.03)
    for blocks, splits in (({}, choose_num_kv_splits(batch, 4, seq_len, kv_fp8=True)),
                           ({"BLOCK_N": 64, "num_stages": 2}, 1)):
        with ac.overriding({"decode_fp8": {"d128": {"kv_dot": kv_dot, "many_per_sm": 0, **blocks}}}):
            out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, splits, k_scale=0.02,
                                   v_scale=0.03)
        assert not torch.isnan(out).any()
        assert _rel(out, ref) < FP8_FORM_TOL[kv_dot], (blocks, splits, _rel(out, ref))


@triton.jit
def _split_kernel(x_ptr, out_ptr, one_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    hi, lo = split_e4m3(x, True)
    tl.store(out_ptr + offs, hi.to(tl.float32) + lo.to(tl.float32) * LO_WEIGHT)
    one, _ = split_e4m3(x, False)
    tl.store(one_ptr + offs, one.to(tl.float32))


def test_split_e4m3_bounds() -> None:
    """hi + lo / 8 is within 2^-7 |x| of x, plus an absolute 2^-9 below e4m3's normal range (hi and
    lo round there to steps of 2^-9); one term within 2^-4 |x| (plus 2^-10, half of e4m3's smallest
    step). The kernels scale q rows to amax 448 and P to 256, so the absolute terms are < 2^-16
    relative to the largest operand. On the GPU: the interpreter mis-rounds fp32 -> e4m3."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.rand(4096, device="cuda", generator=gen) * 2 - 1
    x = x * torch.logspace(-4, 2.65, 4096, device="cuda")  # |x| up to ~446
    out, one = torch.empty_like(x), torch.empty_like(x)
    _split_kernel[(1,)](x, out, one, N=4096)
    assert ((out - x).abs() <= x.abs() * 2.0**-7 + 2.0**-9).all()
    assert ((one - x).abs() <= x.abs() * 2.0**-4 + 2.0**-10).all()
    assert torch.equal(one, x.to(FP8).float())  # the single term is round-to-nearest e4m3


def test_extend_attention_fp8_prefix() -> None:
    b = make_paged_batch([0, 2048, 513], [1024, 128, 1], 16, 28, 4, 128, torch.bfloat16,
                         device=torch.device("cuda"))
    kb, vb = quantize_kv_ref(b.k_buffer, 0.02), quantize_kv_ref(b.v_buffer, 0.03)
    out = extend_attention(b.q, b.k, b.v, kb, vb, b.page_table, b.prefix_lens, b.extend_lens,
                           b.extend_start_loc, 16, None, b.max_extend_len, k_scale=0.02, v_scale=0.03)
    ref = extend_attention_ref(b.q, b.k, b.v, kb, vb, b.page_table, b.prefix_lens, b.extend_lens,
                               b.extend_start_loc, 16, None, k_scale=0.02, v_scale=0.03)
    _attn_close(out, ref)


@pytest.mark.parametrize("kv_dot", ["f16", "fp8x2", "qk8"])
@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_cascade_attention_fp8_pool(num_kv_splits: int, kv_dot: str) -> None:
    """The suffix pass (the fused form with one split) takes decode_fp8's kv_dot."""
    c = make_cascade_batch([(2048, [1, 130, 64] * 6)], [300, 17], 16, 28, 4, 128, torch.bfloat16, seed=2)
    kb, vb = quantize_kv_ref(c.k_buffer, 0.02), quantize_kv_ref(c.v_buffer, 0.03)
    args = (c.q, kb, vb, c.page_table, c.seq_lens, c.kv_start, c.group_members, c.group_starts,
            c.group_prefix_lens, 16, None)
    with ac.overriding({"decode_fp8": {"d128": {"kv_dot": kv_dot}}}):
        out = cascade_decode_attention(*args, num_kv_splits, 4, c.max_group_size, k_scale=0.02,
                                       v_scale=0.03)
    _attn_close(out, cascade_decode_attention_ref(*args, k_scale=0.02, v_scale=0.03))


@pytest.mark.parametrize("n, k", [(3584, 18944), (4608, 3584), (200, 300)])  # down, qkv, partial blocks
def test_blockwise_requantization_on_the_gpu_equals_the_cpu(n: int, k: int) -> None:
    """A block-wise FP8 checkpoint's weight (128 x 128 blocks, as Qwen3-FP8 ships) requantized per
    channel on the GPU (where the loader does it for an FP8 parameter on CUDA) gives the CPU's codes
    and scales."""
    from radixrt.models.quant.checkpoint import requantize_blockwise

    gen = torch.Generator().manual_seed(n * k)
    codes = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(FP8)
    scale_inv = torch.rand(-(-n // 128), -(-k // 128), generator=gen) * 1e-3 + 1e-5
    q_cpu, s_cpu = requantize_blockwise(codes, scale_inv, (128, 128))
    q_gpu, s_gpu = requantize_blockwise(codes.cuda(), scale_inv, (128, 128))
    assert q_gpu.is_cuda and s_gpu.is_cuda
    assert torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
