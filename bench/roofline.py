"""Roofline lower bound on the wall time of a workload, as defined in shared/bench/peers.md.

The whole workload runs as one batch:
- prefill time = matmul FLOPs / matmul rate, where matmul FLOPs = 2 * params_without_embedding *
  prompt tokens computed + attention FLOPs (4 * heads * head_dim * layers per (query, key) pair:
  2 for QK^T, 2 for PV);
- decode: one step per output position; a step costs max(bytes / copy bandwidth, FLOPs / matmul rate)
  with bytes = all weights but the input embedding + the KV of every active sequence, and FLOPs = 2 *
  params_without_embedding per active sequence + attention FLOPs.

Prefix reuse (shared-prefix rows of peers.md): "none" computes and reads every prompt in full;
"compute" computes each group's prefix once but every request still reads it at each decode step;
"compute_and_read" also reads the prefix once per group per step (a prefix-sharing attention kernel).
Multi-turn workloads run as rounds (turn k of every client in one batch) with the history cached.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    from .workloads import Workload, WorkloadSpec, add_workload_args, spec_from_args
except ImportError:  # run as a script: python bench/roofline.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.workloads import Workload, WorkloadSpec, add_workload_args, spec_from_args

PREFIX_REUSE_MODES = ("none", "compute", "compute_and_read")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Dense decoder shape (Llama / Qwen2 family). dtype_bytes: 2 for bf16."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2

    @classmethod
    def from_config(cls, config: dict | str | Path, dtype_bytes: int = 2) -> ModelShape:
        """From an HF config.json (dict or path to the file or to its directory)."""
        if not isinstance(config, dict):
            path = Path(config)
            config = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        heads = config["num_attention_heads"]
        return cls(hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
                   num_heads=heads, num_kv_heads=config.get("num_key_value_heads", heads),
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   intermediate_size=config["intermediate_size"], vocab_size=config["vocab_size"],
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   dtype_bytes=dtype_bytes)

    @property
    def params_without_embedding(self) -> int:
        """Matmul weights: attention + MLP of every layer + the LM head (read even when tied)."""
        q_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (q_o + k_v + mlp) + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every weight but the input embedding."""
        return self.params_without_embedding * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, in bytes."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair over all layers: QK^T and PV, 2 each per MAC."""
        return 4 * self.num_heads * self.head_dim * self.num_layers


QWEN25_7B = ModelShape(hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)


@dataclass(frozen=True, slots=True)
class Hardware:
    """Measured ceilings: copy bandwidth in bytes/s (read + written), dense matmul rate in FLOP/s."""

    copy_bytes_per_s: float
    matmul_flops_per_s: float


H200 = Hardware(copy_bytes_per_s=4.23e12, matmul_flops_per_s=769e12)  # peers.md, 2026-11-29


@dataclass(frozen=True, slots=True)
class SeqSpec:
    """One request of a round: `cached_len` prompt tokens are already in the KV cache (history),
    `shared_len` more are a prefix shared within `group`, then new tokens up to `prompt_len`."""

    prompt_len: int
    output_len: int
    group: int | None = None
    shared_len: int = 0
    cached_len: int = 0


def _causal_pairs(start: int, end: int) -> int:
    """(query, key) pairs when tokens start..end-1 attend causally to every earlier token."""
    return (end * (end + 1) - start * (start + 1)) // 2


def prefill_flops(shape: ModelShape, seqs: list[SeqSpec], reuse: str) -> tuple[float, int]:
    """(FLOPs, prompt tokens computed) for one round's prefill."""
    tokens, pairs = 0, 0
    computed_groups: set[int] = set()
    for s in seqs:
        start = s.cached_len if reuse != "none" else 0
        if reuse != "none" and s.group is not None and s.shared_len:
            if s.group not in computed_groups:
                computed_groups.add(s.group)
                tokens += s.shared_len
                pairs += _causal_pairs(start, start + s.shared_len)
            start += s.shared_len
        tokens += s.prompt_len - start
        pairs += _causal_pairs(start, s.prompt_len)
    return 2.0 * shape.params_without_embedding * tokens + shape.attn_flops_per_pair * pairs, tokens


def decode_time_s(shape: ModelShape, hw: Hardware, seqs: list[SeqSpec], reuse: str) -> float:
    """Sum over decode steps of max(bytes / bandwidth, FLOPs / rate); step s reads prompt + s tokens."""
    total = 0.0
    for step in range(max((s.output_len for s in seqs), default=0)):
        active = [s for s in seqs if s.output_len > step]
        ctx_flops = sum(s.prompt_len + step for s in active)
        ctx_read = ctx_flops
        if reuse == "compute_and_read":
            shared = {s.group: s.shared_len for s in active if s.group is not None and s.shared_len}
            ctx_read -= sum(s.shared_len for s in active if s.group in shared) - sum(shared.values())
        step_bytes = shape.weight_bytes + ctx_read * shape.kv_bytes_per_token
        flops = 2.0 * shape.params_without_embedding * len(active) + shape.attn_flops_per_pair * ctx_flops
        total += max(step_bytes / hw.copy_bytes_per_s, flops / hw.matmul_flops_per_s)
    return total


def workload_rounds(workload: Workload) -> list[list[SeqSpec]]:
    """Rounds of SeqSpecs: one round for single-turn workloads, one per turn for multi-turn."""
    rounds: list[list[SeqSpec]] = []
    history = {s.session_id: 0 for s in workload.sessions}
    for k in range(max(len(s.turns) for s in workload.sessions)):
        seqs = []
        for s in workload.sessions:
            if k >= len(s.turns):
                continue
            turn, cached = s.turns[k], history[s.session_id]
            seqs.append(SeqSpec(prompt_len=cached + len(turn.user_ids), output_len=turn.output_len,
                                group=s.group if k == 0 else None, shared_len=s.prefix_len if k == 0 else 0,
                                cached_len=cached))
            history[s.session_id] = cached + len(turn.user_ids) + turn.output_len
        rounds.append(seqs)
    return rounds


def roofline(shape: ModelShape, hw: Hardware, workload: Workload, reuse: str = "compute") -> dict:
    """Lower bound on the workload's wall time. Returns seconds and output tok/s at the bound."""
    if reuse not in PREFIX_REUSE_MODES:
        raise ValueError(f"reuse must be one of {PREFIX_REUSE_MODES}, got {reuse!r}")
    prefill_s, decode_s, computed = 0.0, 0.0, 0
    for seqs in workload_rounds(workload):
        flops, tokens = prefill_flops(shape, seqs, reuse)
        prefill_s += flops / hw.matmul_flops_per_s
        computed += tokens
        decode_s += decode_time_s(shape, hw, seqs, reuse)
    total_s = prefill_s + decode_s
    out_tokens = workload.total_output_len()
    return {"prefix_reuse": reuse, "prefill_s": prefill_s, "decode_s": decode_s, "total_s": total_s,
            "output_tokens": out_tokens, "prompt_tokens_computed": computed,
            "output_tok_s": out_tokens / total_s if total_s > 0 else None,
            "hardware": asdict(hw), "shape": asdict(shape),
            "weight_bytes": shape.weight_bytes, "kv_bytes_per_token": shape.kv_bytes_per_token}


def main(argv: list[str] | None = None) -> int:
    """CLI: print the roofline of a workload for a config.json shape (default: Qwen2.5-7B) as JSON."""
    parser = argparse.ArgumentParser(description="Roofline bound of a workload (see peers.md).")
    parser.add_argument("--model-config", help="config.json (or its directory); default Qwen2.5-7B shape")
    parser.add_argument("--copy-bandwidth", type=float, default=H200.copy_bytes_per_s, help="bytes/s")
    parser.add_argument("--matmul-flops", type=float, default=H200.matmul_flops_per_s, help="FLOP/s")
    parser.add_argument("--prefix-reuse", choices=(*PREFIX_REUSE_MODES, "all"), default="all")
    add_workload_args(parser)
    ns = parser.parse_args(argv)
    shape = ModelShape.from_config(ns.model_config) if ns.model_config else QWEN25_7B
    spec: WorkloadSpec = spec_from_args(ns)
    hw = Hardware(ns.copy_bandwidth, ns.matmul_flops)
    modes = PREFIX_REUSE_MODES if ns.prefix_reuse == "all" else (ns.prefix_reuse,)
    workload = spec.build()
    print(json.dumps({"workload": workload.describe(),
                      "bounds": [roofline(shape, hw, workload, m) for m in modes]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
