"""Llama-family decoder (Llama 2/3, SmolLM2, Qwen2/2.5, Qwen3) over a flat token layout.

A batch is one flat sequence of T new tokens from B requests (no padding); attention across
requests is kept apart by the attention backend, which reads each request's cached K/V from the
paged pool (the contract: radixrt/attention/base.py). Architecture differences are config flags
(`ModelConfig.qkv_bias`, `qk_norm`, `tie_word_embeddings`, `rope_scaling`).

Weights are stored fused (q|k|v and gate|up) for two large matmuls instead of five;
`load_weights` maps Hugging Face tensor names onto them. With FP8 linears (`--quantization fp8`) the
RMSNorms before qkv and gate_up and the SiLU-and-mul before down quantize their output per token in
their own kernel where the linear takes that (`Linear.takes_fp8_input`; models/quant/fp8.py), and at
1-2 rows on CUDA the norms between the int GEMVs run inside them (`LlamaForCausalLM.fused_norms`).

Built with a `TPGroup` (--tp-size N > 1), the model is one rank's slice: `config` is the rank's
(heads, KV heads, intermediate size per rank: parallel/layout.py), o_proj and down_proj are
row-parallel and the embedding and LM head vocab-parallel (parallel/layers.py). Without one
(--tp-size 1) the layers are the plain ones and no collective runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixrt.attention.base import AttentionBackend, ForwardMeta
from radixrt.models import native_layers, ops
from radixrt.models.linear import Linear
from radixrt.models.model_config import ModelConfig
from radixrt.models.quant.fp8 import NormedAct
from radixrt.models.rope import build_cos_sin_cache

if TYPE_CHECKING:
    from radixrt.models.quant.fp8 import Fp8Act
    from radixrt.parallel.group import TPGroup


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor | NormedAct, residual: torch.Tensor | None = None,
                consumer: Linear | None = None) -> tuple[torch.Tensor | Fp8Act | NormedAct, torch.Tensor]:
        """(out, new_residual) as `ops.rms_norm`; out is an Fp8Act (`ops.rms_norm_fp8`) when x is
        [T, H] and `consumer`, the linear that reads out, takes its input quantized. A NormedAct x is
        this norm already applied by the linear before (Fp8Linear.forward_then_norm; `residual` is
        then its new residual): returned as it is."""
        if isinstance(x, NormedAct):
            return x, residual
        if consumer is not None and x.dim() == 2 and consumer.takes_fp8_input(x.shape[0], x.device):
            return ops.rms_norm_fp8(x, self.weight, self.eps, residual)
        return ops.rms_norm(x, self.weight, self.eps, residual)


def _row_linear(in_features: int, out_features: int, bias: bool, tp: TPGroup | None) -> Linear:
    """A plain Linear (tp None), else a row-parallel one that all-reduces its partial sums."""
    if tp is None:
        return Linear(in_features, out_features, bias=bias)
    from radixrt.parallel.layers import RowParallelLinear

    return RowParallelLinear(in_features, out_features, bias, tp)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = _row_linear(self.q_size, cfg.hidden_size, cfg.o_bias, tp)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor | Fp8Act | NormedAct, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, backend: AttentionBackend,
                after_qkv: Callable[[], None] | None = None) -> torch.Tensor:
        """x [T, H] (or its FP8 / NormedAct form) -> o_proj's output [T, H]; positions [T] int64;
        after_qkv, when given, is called right after the qkv GEMV is queued (L2Prefetch.fork)."""
        return self.o_proj(self.attend(x, positions, cos_sin_cache, backend, after_qkv))

    def attend(self, x: torch.Tensor | Fp8Act | NormedAct, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor, backend: AttentionBackend,
               after_qkv: Callable[[], None] | None = None) -> torch.Tensor:
        """`forward` up to o_proj: the attention output [T, Hq * D], o_proj's input."""
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        if after_qkv is not None:  # L2Prefetch.fork: runs beside rotary, the K/V store and attention
            after_qkv()
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q = self.q_norm(q)[0]
            k = self.k_norm(k)[0]
        # rotary, the K/V store and attention ([T, Hq, D]; v is a strided view)
        o = backend.forward_rope(q, k, v, positions, cos_sin_cache, self.layer_id, self.scale)
        return o.reshape(t, self.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.gate_up_proj.gated = True
        self.down_proj = _row_linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, tp)

    def forward(self, x: torch.Tensor | Fp8Act | NormedAct) -> torch.Tensor:
        if not isinstance(x, NormedAct) and self.down_proj.takes_fp8_input(x.shape[0], x.device):
            # SiLU, product and quantization fused
            return self.down_proj(ops.silu_and_mul_fp8(self.gate_up_proj(x)))
        return self.down_proj(self.activate(x))

    def activate(self, x: torch.Tensor | Fp8Act | NormedAct) -> torch.Tensor:
        """down_proj's input in the model dtype: ops.silu_and_mul(gate_up_proj(x))."""
        return self.gate_up_proj.silu_and_mul(x)


class L2Prefetch:
    """Batch-1 decode on CUDA: after each layer's qkv GEMV, a side stream streams the layer's o weight
    and then the start of its gate_up weight (`budget_bytes` in all) into L2
    (kernels/l2_prefetch.py) while rotary, the K/V store and attention run on the main stream, so
    the o and gate_up GEMVs read part of their weights from L2. Nothing is written (numerics are
    unchanged); the side stream is joined at the end of the forward pass (also inside a CUDA-graph
    capture: a fork and a join of the captured graph). Off unless RADIXRT_L2_PREFETCH=1 (config.Env):
    on an H200 the GEMVs gained 2.6-4.9 us each after a longer kernel, but the engine's batch-1 step
    was 2.1% slower in bf16 and unchanged in FP8 with it (docs/benchmarks.md, "Weights prefetched
    into L2"). RADIXRT_L2_PREFETCH_MB sets the budget per layer (default 24). `enabled` and
    `budget_bytes` are read from the environment when the model is built (benchmarks set them)."""

    enabled: bool | None = None  # None: Env's RADIXRT_L2_PREFETCH, read at the first construction
    max_rows = 2  # tokens per pass at most (batch-1 decode, and 2)
    budget_bytes: int | None = None  # None: Env's RADIXRT_L2_PREFETCH_MB MiB

    def __init__(self) -> None:
        if type(self).enabled is None or type(self).budget_bytes is None:
            from radixrt.config import Env

            env = Env.read()
            if type(self).enabled is None:
                type(self).enabled = env.l2_prefetch
            if type(self).budget_bytes is None:
                type(self).budget_bytes = env.l2_prefetch_mb << 20
        self.stream: torch.cuda.Stream | None = None
        self.sink: torch.Tensor | None = None
        self.pending = False

    def active(self, h: torch.Tensor) -> bool:
        """Whether a pass over hidden states h [T, H] prefetches: enabled, CUDA, 1 <= T <= max_rows."""
        return self.enabled and h.is_cuda and 0 < h.shape[0] <= self.max_rows

    def fork(self, weights: list[torch.Tensor]) -> None:
        """Prefetch the weights (contiguous CUDA tensors of one device, any dtype) in order, budget_bytes
        in all, on the side stream, after the work queued on the current stream so far. The stream
        and the sink are made at the first call (the warm-up pass before any graph capture).
        Raises ValueError as kernels.l2_prefetch.prefetch_l2 does (a non-contiguous or misaligned
        weight)."""
        from radixrt.kernels.l2_prefetch import prefetch_l2, prefetch_programs

        dev = weights[0].device
        if self.stream is None:
            self.stream = torch.cuda.Stream(dev)
            self.sink = torch.zeros(prefetch_programs(self.budget_bytes) + 1, dtype=torch.int32, device=dev)
        self.stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self.stream):
            for w, nbytes in self.plan(weights, self.budget_bytes):
                prefetch_l2(w, nbytes, self.sink)
        self.pending = True

    @staticmethod
    def plan(weights: list[torch.Tensor], budget_bytes: int) -> list[tuple[torch.Tensor, int]]:
        """(weight, bytes from its start) to prefetch: the weights in order until budget_bytes are
        spent (the last one cut short, whole 4-byte words), none of 0 bytes."""
        out, left = [], budget_bytes
        for w in weights:
            nbytes = min(left, w.numel() * w.element_size()) // 4 * 4
            if nbytes <= 0:
                break
            out.append((w, nbytes))
            left -= nbytes
        return out

    def join(self) -> None:
        """Order the current stream after every prefetch forked so far."""
        if self.pending and self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
            self.pending = False


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id, tp)
        self.mlp = MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor | NormedAct, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, backend: AttentionBackend, prefetch: L2Prefetch | None = None,
                fused_norms: bool = False, next_norm: RMSNorm | None = None
                ) -> tuple[torch.Tensor | NormedAct, torch.Tensor]:
        """h [T, H] and the residual stream (None at the first layer) -> (MLP output [T, H], residual).
        prefetch: an L2Prefetch to fork after this layer's qkv GEMV (this layer's o, then gate_up).
        fused_norms (LlamaForCausalLM.fused_norms said yes for this pass): o_proj applies
        post_attention_layernorm in its epilogue (Fp8Linear.forward_then_norm), and with next_norm
        (the next layer's input_layernorm) down_proj applies that one: the output is then a NormedAct
        and the residual already includes the MLP's output. h may be such a NormedAct."""
        x, residual = self.input_layernorm(h, residual, consumer=self.self_attn.qkv_proj)
        after_qkv = None
        if prefetch is not None:
            weights = [self.self_attn.o_proj.weight, self.mlp.gate_up_proj.weight]
            after_qkv = lambda: prefetch.fork(weights)  # noqa: E731
        if fused_norms:
            o = self.self_attn.attend(x, positions, cos_sin_cache, backend, after_qkv)
            x, residual = self.self_attn.o_proj.forward_then_norm(o, residual, self.post_attention_layernorm)
        else:
            x = self.self_attn(x, positions, cos_sin_cache, backend, after_qkv)
            x, residual = self.post_attention_layernorm(x, residual, consumer=self.mlp.gate_up_proj)
        if fused_norms and next_norm is not None:
            return self.mlp.down_proj.forward_then_norm(self.mlp.activate(x), residual, next_norm)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Module, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder plus LM head.

    Build on any device, then call `init_rope` once the parameters live on their final device
    (the rotary table is not a parameter and is not saved). With `tp`, this rank's slice (module
    docstring); `config` is then the rank's config and `layout` says which slices it holds.

    Raises:
        ValueError: `tp.size` does not divide the heads, KV heads or intermediate size.
    """

    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.tp = tp
        if tp is None:
            self.config = cfg
            # An explicit (uninitialised) weight skips reset_parameters: normal_ on the meta device runs
            # through torch._refs, whose import of torch._dynamo cost 2-4 s of every server start.
            embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                 _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
            self.model = LlamaModel(cfg, embed)
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        else:
            self._build_sharded(cfg, tp)
        self.tie_weights()
        self.cos_sin_cache: torch.Tensor | None = None
        self.l2_prefetch = L2Prefetch()

    def _build_sharded(self, cfg: ModelConfig, tp: TPGroup) -> None:
        from radixrt.parallel.layers import ParallelLMHead, VocabParallelEmbedding
        from radixrt.parallel.layout import ShardLayout, local_config

        self.layout = ShardLayout(cfg, tp.rank, tp.size)
        self.config = local = local_config(cfg, tp.size)
        vp, h = self.layout.vocab_per_rank, cfg.hidden_size
        self.model = LlamaModel(local, VocabParallelEmbedding(vp, h, self.layout.vocab_start, tp), tp)
        self.lm_head = ParallelLMHead(h, vp, cfg.vocab_size, tp)

    def tie_weights(self) -> None:
        """Share lm_head with embed_tokens when the config says so (again after `to_empty`); an FP8
        head (quant/fp8.py quantize_lm_head) keeps its own quantized copy."""
        same_format = self.lm_head.weight.dtype == self.model.embed_tokens.weight.dtype
        if self.config.tie_word_embeddings and same_format:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_rope(self, max_positions: int, device: torch.device | str) -> None:
        """Build the [max_positions, D] float32 rotary table on `device`."""
        c = self.config
        self.cos_sin_cache = build_cos_sin_cache(c.head_dim, max_positions, c.rope_theta, c.rope_scaling,
                                                 device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: ForwardMeta,
                backend: AttentionBackend) -> torch.Tensor:
        """Run the decoder over T new tokens.

        Args:
            input_ids: [T] int64 token ids; positions: [T] int64.
            meta: this pass's metadata (already passed to `backend.prepare`).
            backend: attention backend that stores K/V in the pool and attends.

        Returns:
            hidden [T, H] after the final norm, in the model dtype.
        """
        assert self.cos_sin_cache is not None, "call init_rope() after moving the model to its device"
        h = self.model.embed_tokens(input_ids)  # [T, H]
        residual: torch.Tensor | None = None
        if native_layers.layer_calls(self, h, positions, backend):  # float32 CPU: the same C calls, no glue
            h, residual = native_layers.run(self, h, positions, backend)
        else:
            prefetch = self.l2_prefetch if self.l2_prefetch.active(h) else None
            fused, layers = self.fused_norms(h), self.model.layers
            for i, layer in enumerate(layers):
                next_norm = layers[i + 1].input_layernorm if fused and i + 1 < len(layers) else None
                h, residual = layer(h, residual, positions, self.cos_sin_cache, backend, prefetch, fused,
                                    next_norm)
            if prefetch is not None:
                prefetch.join()
        h, _ = self.model.norm(h, residual)
        return h

    def fused_norms(self, h: torch.Tensor) -> bool:
        """Whether this pass over hidden states h [T, H] splits the decoder layers' RMSNorms across
        the FP8 int GEMVs around them (o -> gate_up, down -> the next layer's qkv; Fp8Linear
        .norm_fusable for all four linears: FP8 weights, CUDA, 1-2 bf16 rows, one pass each, no
        tensor parallelism). The first layer's input norm and the final norm stay kernels. Shapes
        only: the same answer at a CUDA graph's capture and replays."""
        if not self.model.layers or h.dim() != 2:
            return False
        first = self.model.layers[0]
        linears = (first.self_attn.qkv_proj, first.self_attn.o_proj, first.mlp.gate_up_proj,
                   first.mlp.down_proj)
        return all(hasattr(lin, "norm_fusable") and lin.norm_fusable(h.shape[0], h.device, h.dtype)
                   for lin in linears)

    @torch.inference_mode()
    def compute_logits(self, hidden_last: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden_last [B, H] -> logits [B, V] float32; with `out` ([B, V], any float dtype: CUDA
        graphs keep a static buffer in the model's dtype) the LM head's output is copied into it,
        converted to out's dtype, and out is returned."""
        logits = self.lm_head(hidden_last)
        if out is None:
            return logits.float()
        return out.copy_(logits)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into the fused parameters; returns the names of parameters filled.

        Raises:
            KeyError: a tensor name this model does not know.
            ValueError: a shape mismatch, or an integer / bool tensor for a float parameter.
        """
        params = dict(self.named_parameters())
        filled: set[str] = set()
        for name, w in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target, rows = self.map_name(name)
            p = params[target]
            dst = p.data if rows is None else p.data[rows[0]:rows[1]]
            if tuple(dst.shape) != tuple(w.shape):
                raise ValueError(f"{name}: shape {tuple(w.shape)} != expected {tuple(dst.shape)}")
            if p.dtype.is_floating_point and not w.is_floating_point():  # int8 / bool: cast silently before
                raise ValueError(f"{name}: a {w.dtype} tensor for a {p.dtype} parameter")
            dst.copy_(w.to(dtype=p.dtype))
            filled.add(target if rows is None else f"{target}[{rows[0]}:{rows[1]}]")
        return filled

    def map_name(self, name: str) -> tuple[str, tuple[int, int] | None]:
        """HF tensor name -> (our parameter name, row range inside a fused parameter or None)."""
        c = self.config
        q, kv = c.q_size, c.kv_size
        fused = {
            "self_attn.q_proj": ("self_attn.qkv_proj", (0, q)),
            "self_attn.k_proj": ("self_attn.qkv_proj", (q, q + kv)),
            "self_attn.v_proj": ("self_attn.qkv_proj", (q + kv, q + 2 * kv)),
            "mlp.gate_proj": ("mlp.gate_up_proj", (0, c.intermediate_size)),
            "mlp.up_proj": ("mlp.gate_up_proj", (c.intermediate_size, 2 * c.intermediate_size)),
        }
        for src, (dst, rows) in fused.items():
            if f".{src}." in name:
                return name.replace(src, dst), rows
        return name, None

    def expected_fills(self) -> set[str]:
        """Names `load_weights` must fill for a complete checkpoint (used to detect missing tensors)."""
        c = self.config
        out: set[str] = set()
        for name, _ in self.named_parameters():
            if name == "lm_head.weight" and c.tie_word_embeddings:
                continue
            module = name.rpartition(".")[0]  # weight, bias, and an FP8 layer's weight_scale
            if module.endswith("qkv_proj"):
                q, kv = c.q_size, c.kv_size
                out |= {f"{name}[0:{q}]", f"{name}[{q}:{q + kv}]", f"{name}[{q + kv}:{q + 2 * kv}]"}
            elif module.endswith("gate_up_proj"):
                i = c.intermediate_size
                out |= {f"{name}[0:{i}]", f"{name}[{i}:{2 * i}]"}
            else:
                out.add(name)
        return out
