"""Which slice of each checkpoint tensor a tensor-parallel rank holds (Megatron-LM's split).

For N ranks and rank r (H query heads, K KV heads, D head dim, I intermediate, V vocab):

    q_proj  rows  [r*H/N*D, (r+1)*H/N*D)         column-parallel (q|k|v fused per rank)
    k/v     rows  of KV head r*K/N .. (K >= N),   or KV head r // (N/K), replicated (K < N)
    gate/up rows  [r*I/N, (r+1)*I/N)              column-parallel (gate|up fused per rank)
    o_proj  cols  = q_proj's rows                 row-parallel: partial sums, one all-reduce
    down    cols  = gate's rows                   row-parallel: partial sums, one all-reduce
    embed / lm_head rows [r*Vp, (r+1)*Vp), Vp = ceil(V/N), zero rows past V (vocab-parallel)
    o / down bias: rank 0 only (zeros elsewhere), so the all-reduce adds it once
    norms (and q_norm / k_norm, shared by the heads): replicated

`take` reads one rank's slice from anything indexable like a tensor: a full tensor (dummy weights,
tests) or a safetensors `get_slice` handle, which reads only those bytes from the file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from radixrt.models.model_config import ModelConfig

_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")
_VOCAB = ("embed_tokens.weight", "lm_head.weight")


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """Raises ValueError unless `size` ranks can split this model (message names --tp-size)."""
    kv = cfg.num_kv_heads
    problems = [
        (cfg.num_heads % size, f"{cfg.num_heads} attention heads"),
        (cfg.intermediate_size % size, f"intermediate size {cfg.intermediate_size}"),
        (kv % size if kv >= size else size % kv, f"{kv} KV heads (or a multiple of them)"),
    ]
    for rest, what in problems:
        if rest:
            raise ValueError(f"--tp-size {size} does not divide the model's {what}")


def local_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config of one rank's slice: heads, KV heads and intermediate size per rank (the vocab
    and everything else stay full: the sampler and the page table see the whole model)."""
    check_divisible(cfg, size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // size,
                               num_kv_heads=max(1, cfg.num_kv_heads // size),
                               intermediate_size=cfg.intermediate_size // size)


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Rank `rank` of `size`: the ranges it holds of a model with config `full` (module docstring)."""

    full: ModelConfig
    rank: int
    size: int

    @property
    def vocab_per_rank(self) -> int:
        return math.ceil(self.full.vocab_size / self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def q_rows(self) -> tuple[int, int]:
        n = self.full.q_size // self.size
        return self.rank * n, (self.rank + 1) * n

    def kv_rows(self) -> tuple[int, int]:
        c, d = self.full, self.full.head_dim
        if c.num_kv_heads >= self.size:
            n = c.kv_size // self.size
            return self.rank * n, (self.rank + 1) * n
        head = self.rank // (self.size // c.num_kv_heads)  # replicated: ranks of one group share it
        return head * d, (head + 1) * d

    def inter_rows(self) -> tuple[int, int]:
        n = self.full.intermediate_size // self.size
        return self.rank * n, (self.rank + 1) * n

    def _rows_of(self, name: str) -> tuple[int, int]:
        if ".q_proj." in name:
            return self.q_rows()
        if ".k_proj." in name or ".v_proj." in name:
            return self.kv_rows()
        return self.inter_rows()

    def take(self, name: str, src: Any, shape: tuple[int, ...],
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """This rank's slice of the HF checkpoint tensor `name` (full shape `shape`) read from `src`
        (a tensor or a safetensors slice handle), as a new tensor."""
        if any(f".{m}." in name for m in _COLUMN):
            a, b = self._rows_of(name)
            return src[a:b]
        if any(f".{m}." in name for m in _ROW):
            a, b = self.q_rows() if ".o_proj." in name else self.inter_rows()
            if name.endswith(".bias"):  # added once, after the all-reduce would sum N copies
                return src[:] if self.rank == 0 else torch.zeros(shape, dtype=dtype)
            return src[:, a:b]
        if name.endswith(_VOCAB):
            a = min(self.vocab_start, shape[0])
            b = min(self.vocab_start + self.vocab_per_rank, shape[0])
            part = src[a:b]
            pad = self.vocab_per_rank - (b - a)
            if pad:
                part = torch.cat([part, part.new_zeros((pad, *shape[1:]))])
            return part
        return src[:]


def split_fused(name: str, full: torch.Tensor, cfg: ModelConfig) -> list[tuple[str, torch.Tensor]]:
    """Our fused parameter (`qkv_proj`, `gate_up_proj`) as its HF tensors; others as they are.
    The inverse of LlamaForCausalLM.map_name, for dummy weights drawn at full size."""
    if ".qkv_proj." in name:
        q, kv = cfg.q_size, cfg.kv_size
        parts = [("q_proj", full[:q]), ("k_proj", full[q:q + kv]), ("v_proj", full[q + kv:])]
        return [(name.replace("qkv_proj", p), t) for p, t in parts]
    if ".gate_up_proj." in name:
        i = cfg.intermediate_size
        return [(name.replace("gate_up_proj", "gate_proj"), full[:i]),
                (name.replace("gate_up_proj", "up_proj"), full[i:])]
    return [(name, full)]
