"""The decoder layers of a float32 CPU pass as direct calls into the native library (one layer = nine C
calls, no torch op and no module call between them).

Where a pass qualifies (`layer_calls`), `LlamaForCausalLM.forward` runs its layers through `run`
instead of the module path; both make the same C calls with the same arguments in the same order
(`radixrt.worker.cpu_native`: RMSNorm with its residual add, the packed linear, the rotary embedding in
place, the K/V store, the attention kernel reading q in place, SwiGLU in the gate_up GEMM's epilogue),
so the hidden states are bit for bit the module path's. What goes is the Python between the calls:
module dispatch, the per-op checks of `ops` / `Linear` / the attention backend, views, and one
allocation per op (the buffers are made once per pass). On the 2-vCPU Xeon VM that Python was ~150 us
per layer of the 32-token cached-TTFT pass (bench/lab/cpu_extend_profile.py: "Python glue" 4.5 ms
of a 67 ms pass, 2026-12-03), and the wrappers' own checks ~2 ms more.

A pass qualifies when: the model is a plain (no tensor parallelism, no FP8, no q/k norm) float32
Llama-family model on the CPU whose linears are exactly `Linear` and whose gate_up has no bias; the
native library is loaded and the native linear is on (`linear.native_linear_enabled`); the pass has
1-128 rows (`NATIVE_LINEAR_ROWS`); the attention backend's native plan covers every row in order
(`DecodePlan.all_rows`: decode passes and passes of short extends, attention_sdpa.NATIVE_EXTEND_MAX);
the pool is float32. Every other pass takes the module path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixrt.attention.base import AttentionBackend
    from radixrt.models.llama import LlamaForCausalLM


def _model_ok(model: LlamaForCausalLM) -> bool:
    """The static half of the test (module docstring): the model's structure and dtypes."""
    from radixrt.models.linear import Linear

    if model.tp is not None or not len(model.model.layers):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        lins = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if (attn.q_norm is not None or any(type(m) is not Linear for m in lins)
                or mlp.gate_up_proj.bias is not None
                or any(m.weight.dtype != torch.float32 or m.weight.device.type != "cpu" for m in lins)
                or layer.input_layernorm.weight.dtype != torch.float32
                or layer.post_attention_layernorm.weight.dtype != torch.float32):
            return False
    return True


def layer_calls(model: LlamaForCausalLM, h: torch.Tensor, positions: torch.Tensor,
                backend: AttentionBackend) -> bool:
    """Whether this pass's layers may run through `run` (module docstring). h: [T, H] embeddings."""
    from radixrt.models.linear import NATIVE_LINEAR_ROWS, native_linear_enabled
    from radixrt.worker import cpu_native

    if (h.device.type != "cpu" or h.dtype != torch.float32 or h.dim() != 2 or not h.is_contiguous()
            or h.shape[0] not in NATIVE_LINEAR_ROWS or cpu_native._lib is None
            or not native_linear_enabled()):
        return False
    plan = getattr(backend, "native_plan", None)
    pool = getattr(backend, "pool", None)
    meta = getattr(backend, "meta", None)
    if (plan is None or not plan.all_rows or plan.q_rows.numel() != h.shape[0] or pool is None or meta is None
            or any(b.dtype != torch.float32 or not b.is_contiguous()
                   for b in (pool.k_buffers[0], pool.v_buffers[0]))
            or meta.out_cache_loc.dtype != torch.int64 or not meta.out_cache_loc.is_contiguous()
            or meta.out_cache_loc.numel() != h.shape[0]
            or positions.dtype != torch.int64 or not positions.is_contiguous()):
        return False
    cs = model.cos_sin_cache
    if cs is None or cs.dtype != torch.float32 or not cs.is_contiguous() or model.config.head_dim % 2:
        return False
    ok = getattr(model, "_native_layers_ok", None)
    if ok is None:
        ok = model._native_layers_ok = _model_ok(model)
    return ok


def _p(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def run(model: LlamaForCausalLM, h: torch.Tensor, positions: torch.Tensor, backend: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layers of a pass that `layer_calls` accepted: h [T, H] float32 embeddings ->
    (hidden [T, H], residual [T, H]) before the final norm, as the module path's layer loop returns
    them (bit for bit). Stores each layer's K/V in the pool as the module path does."""
    from radixrt.worker import cpu_native

    lib = cpu_native._lib
    cfg = model.config
    t, hid = h.shape
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    nqkv, qsz, inter = (hq + 2 * hkv) * d, hq * d, cfg.intermediate_size
    eps = float(model.model.layers[0].input_layernorm.eps)
    f32 = torch.float32
    # per pass: the norms' output, o_proj's, the residual stream, q|k|v, attention's, SwiGLU's, the
    # layer's output (the next layer's input), the linears' repacked-x scratch
    xnorm, o, resid = (torch.empty(t, hid, dtype=f32) for _ in range(3))
    qkv, attn = torch.empty(t, nqkv, dtype=f32), torch.empty(t, qsz, dtype=f32)
    act, mlp = torch.empty(t, inter, dtype=f32), torch.empty(t, hid, dtype=f32)
    xp = torch.empty(t * max(hid, qsz, inter), dtype=f32)
    p_x, p_o, p_res, p_qkv, p_attn = (x.data_ptr() for x in (xnorm, o, resid, qkv, attn))
    p_act, p_mlp, p_xp = act.data_ptr(), mlp.data_ptr(), xp.data_ptr()
    p_k, p_v = p_qkv + qsz * 4, p_qkv + (qsz + hkv * d) * 4  # the k and v columns of each qkv row
    p_pos, p_cs = positions.data_ptr(), model.cos_sin_cache.data_ptr()
    slots = backend.meta.out_cache_loc
    p_slots = slots.data_ptr()
    plan = backend.native_plan
    _, items, rest = cpu_native.plan_args(plan, hq, d)
    rest = (*rest[:-1], p_attn)  # the kernel writes o straight into `attn`
    k_bufs, v_bufs = backend.pool.k_buffers, backend.pool.v_buffers
    p_h = h.data_ptr()
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        # input norm: the first layer's residual is h itself (as ops.rms_norm with residual None)
        lib.radixrt_rms_norm(p_h, None if i == 0 else p_res, layer.input_layernorm.weight.data_ptr(), p_x,
                             None if i == 0 else p_res, t, hid, eps)
        if i == 0:
            p_res0 = p_h  # the residual stream is h until the first post-attention norm writes `resid`
        lib.radixrt_linear_f32(p_x, a.qkv_proj._native_weight().data_ptr(), _p(a.qkv_proj.bias), p_qkv, t,
                               nqkv, hid, p_xp)
        lib.radixrt_rotary_f32(p_qkv, t, nqkv, hq + hkv, d, p_pos, p_cs)
        k_buf, v_buf = k_bufs[a.layer_id], v_bufs[a.layer_id]
        lib.radixrt_store_kv_f32(k_buf.data_ptr(), v_buf.data_ptr(), p_k, p_v, nqkv, p_slots, t, hkv * d)
        rc = lib.radixrt_decode_attention(p_qkv, nqkv, k_buf.data_ptr(), v_buf.data_ptr(), 0, hq, hkv, d,
                                          *items, a.scale, *rest)
        if rc != 0:
            raise RuntimeError(f"native CPU decode attention rejected head_dim {d}")
        lib.radixrt_linear_f32(p_attn, a.o_proj._native_weight().data_ptr(), _p(a.o_proj.bias), p_o, t, hid,
                               qsz, p_xp)
        # post-attention norm: residual += o (in place: the kernel reads a row of it before writing)
        lib.radixrt_rms_norm(p_o, p_res0 if i == 0 else p_res,
                             layer.post_attention_layernorm.weight.data_ptr(), p_x, p_res, t, hid, eps)
        lib.radixrt_linear_silu_f32(p_x, m.gate_up_proj._native_gated_weight().data_ptr(), p_act, t, inter,
                                    hid, p_xp)
        lib.radixrt_linear_f32(p_act, m.down_proj._native_weight().data_ptr(), _p(m.down_proj.bias), p_mlp, t,
                               hid, inter, p_xp)
        p_h = p_mlp
    return mlp, resid
