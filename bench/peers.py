"""HF transformers baselines on the benchmark workloads (the peers of shared/bench/peers.md).

Two baselines, greedy with EOS disabled so every request produces exactly its output length:
- hf_generate: `model.generate` on static batches of `batch_size` prompts (workload order, left padded,
  sdpa attention); a batch runs to its longest output length, only requested tokens are counted.
- hf_continuous_batching: transformers' continuous batching manager (`generate_batch`'s engine, paged
  sdpa, default ContinuousBatchingConfig unless overridden), one request per prompt with its own
  max_new_tokens. Manager start-up (cache allocation, warm-up) is outside the timed region.
Multi-turn workloads run as rounds: turn k of every client at once, the answers feeding turn k + 1.

Weights come from an HF model directory, or are random (a config.json, or the preset `qwen2.5-7b`).
Report: output tok/s and wall time per baseline in one JSON; `compare` and `format_ratios` put
radixrt's bench/serving.py report next to it (and a roofline bound, when given).

Usage:
  python bench/peers.py run --model-config qwen2.5-7b --workload random --output-json peers.json
  python bench/peers.py ratios --peers peers.json --serving serving.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

try:
    from .roofline import H200, Hardware, ModelShape, roofline
    from .workloads import Workload, WorkloadSpec, add_workload_args, next_prompt, spec_from_args
except ImportError:  # run as a script: python bench/peers.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.roofline import H200, Hardware, ModelShape, roofline
    from bench.workloads import Workload, WorkloadSpec, add_workload_args, next_prompt, spec_from_args

SCHEMA_VERSION = 1
BASELINES = ("hf_generate", "hf_continuous_batching")
QWEN25_7B_CONFIG = {  # the shape of peers.md (random weights)
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151643,
}
BASELINE_FIELDS = ("name", "wall_s", "output_tok_s", "output_tokens", "input_tokens", "num_requests",
                   "num_rounds", "exact_output_lens", "settings")

# (model, prompts, output_lens) -> (generated ids per prompt, seconds)
RoundRunner = Callable[[object, list[list[int]], list[int]], tuple[list[list[int]], float]]


@dataclass(slots=True)
class PeerConfig:
    """One baselines run. device: "cuda" or "cpu" (None: cuda if available); dtype: torch dtype name."""

    model_path: str | None = None  # HF model dir with weights
    model_config: str | None = None  # config.json (file or dir) or "qwen2.5-7b": random weights
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    baselines: tuple[str, ...] = BASELINES
    device: str | None = None
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    batch_size: int = 64
    cb_block_size: int | None = None  # None: ContinuousBatchingConfig defaults
    cb_num_blocks: int | None = None
    cb_max_batch_tokens: int | None = None
    warmup: bool = True  # hf_generate: one untimed batch (the batch_size first prompts, full output lengths)
    repeat: int = 1  # timed runs of each baseline; the report holds the median run (by output tok/s)
    seed: int = 0  # random weights
    output_json: str | None = None

    def __post_init__(self) -> None:
        if (self.model_path is None) == (self.model_config is None):
            raise ValueError("give exactly one of model_path and model_config")
        if self.repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {self.repeat}")
        unknown = set(self.baselines) - set(BASELINES)
        if unknown:
            raise ValueError(f"unknown baselines {sorted(unknown)}; choose from {BASELINES}")


# ----------------------------------------------------------------------------- model


def _device_and_dtype(cfg: PeerConfig) -> tuple[str, object]:
    import torch

    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = cfg.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return device, getattr(torch, name)


def _config_dict(model_config: str) -> dict:
    if model_config.lower() == "qwen2.5-7b":
        return dict(QWEN25_7B_CONFIG)
    path = Path(model_config)
    return json.loads((path / "config.json" if path.is_dir() else path).read_text())


def load_model(cfg: PeerConfig) -> tuple[object, dict]:
    """(model in eval mode with sdpa attention and EOS disabled, its config dict)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device, dtype = _device_and_dtype(cfg)
    if cfg.model_path:
        model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=dtype, attn_implementation="sdpa")
        model = model.to(device)
    else:
        values = _config_dict(cfg.model_config)
        hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
        torch.manual_seed(cfg.seed)
        with torch.device(device):  # random init directly on the device (7B in seconds on a GPU)
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.generation_config.eos_token_id = None  # EOS disabled: every request runs to its length
    return model, model.config.to_dict()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _pad_id(model: object) -> int:
    pad = model.config.pad_token_id  # type: ignore[attr-defined]
    return int(pad) if pad is not None else 0


# ----------------------------------------------------------------------------- the two baselines


def hf_generate_round(model: object, prompts: list[list[int]], out_lens: list[int], batch_size: int,
                      ) -> tuple[list[list[int]], float]:
    """Static batches of `batch_size` in order, left padded; returns (ids per prompt, seconds)."""
    import torch
    from transformers import GenerationConfig

    device, pad = str(model.device), _pad_id(model)  # type: ignore[attr-defined]
    outputs: list[list[int]] = []
    _sync(device)
    t0 = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch, lens = prompts[b:b + batch_size], out_lens[b:b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        gen = GenerationConfig(do_sample=False, max_new_tokens=max(lens), min_new_tokens=max(lens),
                               pad_token_id=pad, eos_token_id=None)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)  # type: ignore[attr-defined]
        outputs += [row[width:width + n].tolist() for row, n in zip(out, lens, strict=True)]
    _sync(device)
    return outputs, time.perf_counter() - t0


def hf_cb_round(model: object, prompts: list[list[int]], out_lens: list[int], cb_kwargs: dict,
                ) -> tuple[list[list[int]], float]:
    """transformers continuous batching, one request per prompt; returns (ids per prompt, seconds).

    Raises RuntimeError if the manager fails or a request reports an error.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    device = str(model.device)  # type: ignore[attr-defined]
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(out_lens), eos_token_id=-1,
                           pad_token_id=_pad_id(model))
    hints = WorkloadHints(max_prompt_length=max(len(p) for p in prompts),
                          max_generated_length=max(out_lens), num_requests=len(prompts))
    results: dict[str, object] = {}
    with model.continuous_batching_context_manager(  # type: ignore[attr-defined]
            generation_config=gen, continuous_batching_config=ContinuousBatchingConfig(**cb_kwargs),
            block=True, timeout=5, workload_hints=hints) as manager:
        _sync(device)
        t0 = time.perf_counter()
        rids = [manager.add_request(p, max_new_tokens=n, eos_token_id=-1)
                for p, n in zip(prompts, out_lens, strict=True)]
        while len(results) < len(rids):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                results[res.request_id] = res
            elif res is None and not manager.is_running():
                raise RuntimeError("transformers continuous batching stopped before finishing")
        _sync(device)
        wall_s = time.perf_counter() - t0
    failed = [r.error for r in results.values() if r.error is not None]  # type: ignore[attr-defined]
    if failed:
        raise RuntimeError(f"{len(failed)} continuous-batching requests failed: {failed[0]}")
    return [list(results[rid].generated_tokens) for rid in rids], wall_s  # type: ignore[attr-defined]


def run_rounds(model: object, workload: Workload, runner: RoundRunner) -> dict:
    """Run every session's turns as rounds through `runner`; wall time is the sum over rounds (s)."""
    sessions = workload.sessions
    prompts: dict[int, list[int]] = {}
    answers: dict[int, list[int]] = {}
    wall_s, in_tokens, out_tokens, exact, rounds = 0.0, 0, 0, True, 0
    for k in range(max(len(s.turns) for s in sessions)):
        active = [s for s in sessions if k < len(s.turns)]
        for s in active:
            prompts[s.session_id] = next_prompt(prompts.get(s.session_id), answers.get(s.session_id),
                                                s.turns[k])
        batch = [prompts[s.session_id] for s in active]
        lens = [s.turns[k].output_len for s in active]
        outs, secs = runner(model, batch, lens)
        wall_s, rounds = wall_s + secs, rounds + 1
        in_tokens += sum(len(p) for p in batch)
        for s, out, n in zip(active, outs, lens, strict=True):
            answers[s.session_id] = out[:n]
            out_tokens += min(len(out), n)
            exact &= len(out) >= n
    return {"wall_s": wall_s, "output_tok_s": out_tokens / wall_s if wall_s > 0 else None,
            "output_tokens": out_tokens, "input_tokens": in_tokens, "num_requests": workload.num_requests,
            "num_rounds": rounds, "exact_output_lens": exact}


def _runner(cfg: PeerConfig, name: str) -> tuple[RoundRunner, dict]:
    if name == "hf_generate":
        return (lambda m, p, n: hf_generate_round(m, p, n, cfg.batch_size),
                {"batch_size": cfg.batch_size, "attn_implementation": "sdpa"})
    cb_kwargs = {k: v for k, v in (("block_size", cfg.cb_block_size), ("num_blocks", cfg.cb_num_blocks),
                                   ("max_batch_tokens", cfg.cb_max_batch_tokens)) if v is not None}
    return lambda m, p, n: hf_cb_round(m, p, n, cb_kwargs), {"continuous_batching_config": cb_kwargs}


def run_peers(cfg: PeerConfig) -> dict:
    """Load the model, run each baseline on the workload, write --output-json; returns the report."""
    import torch
    import transformers

    model, config = load_model(cfg)
    workload = cfg.workload.build()
    device, dtype = _device_and_dtype(cfg)
    report = {
        "schema_version": SCHEMA_VERSION, "tool": "radixrt bench-peers",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "model": {"path": cfg.model_path or cfg.model_config, "random_weights": cfg.model_path is None,
                  "dtype": str(dtype).removeprefix("torch."), "shape": _shape_dict(config)},
        "workload": workload.describe(), "baselines": {},
    }
    for name in cfg.baselines:
        runner, settings = _runner(cfg, name)
        # hf_generate: one untimed full-size batch warms the allocator and kernels. The continuous
        # batching manager warms itself up before the timed region (an extra manager run before it
        # made cuDNN attention fail on an H200).
        if cfg.warmup and name == "hf_generate":
            # the first batch at its full output lengths: a 2-token warm-up left the first timed run
            # ~25% slower than the next ones (H200: 602 against 790 and 775 tok/s on shared-prefix)
            firsts = workload.sessions[:cfg.batch_size]
            runner(model, [s.turns[0].user_ids for s in firsts], [s.turns[0].output_len for s in firsts])
        runs = [run_rounds(model, workload, runner) for _ in range(cfg.repeat)]
        # the median run (by throughput; the lower middle one for an even count), with every run's
        # throughput: host speed moves these baselines between machines and calls
        result = sorted(runs, key=lambda r: r["output_tok_s"] or 0.0)[(len(runs) - 1) // 2]
        report["baselines"][name] = {"name": name, **result,
                                     "runs_output_tok_s": [r["output_tok_s"] for r in runs],
                                     "settings": settings}
    if cfg.output_json:
        Path(cfg.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output_json).write_text(json.dumps(report, indent=2))
    return report


def _shape_dict(config: dict) -> dict:
    try:
        shape = ModelShape.from_config(config)
    except KeyError:
        return {}
    return {"hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
            "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
            "tie_word_embeddings": shape.tie_word_embeddings}


# ----------------------------------------------------------------------------- ratios


def compare(serving: dict, peers: dict, bound: dict | None = None) -> dict:
    """radixrt's best run (highest output tok/s) against each baseline and, if given, a roofline bound.

    Ratios are radixrt tok/s / baseline tok/s (> 1: radixrt is faster) and radixrt tok/s / bound tok/s
    (the fraction of the ceiling reached). `workload_match` is False when the two reports ran different
    workload specs (name, sizes or seed), where the ratios mean little.
    """
    best = max(serving["runs"], key=lambda r: r["output_throughput"])
    ours = best["output_throughput"]
    keys = ("name", "seed", "num_requests", "total_output_len", "total_new_input_len")
    match = all(serving["workload"].get(k) == peers["workload"].get(k) for k in keys)
    out = {"workload": serving["workload"]["name"], "workload_match": match,
           "radixrt_output_tok_s": ours, "radixrt_max_concurrency": best["max_concurrency"], "vs": {}}
    for name, b in peers["baselines"].items():
        out["vs"][name] = {"output_tok_s": b["output_tok_s"], "wall_s": b["wall_s"],
                           "ratio": ours / b["output_tok_s"] if b["output_tok_s"] else None}
    if bound is not None:
        out["roofline"] = {"output_tok_s": bound["output_tok_s"], "total_s": bound["total_s"],
                           "prefix_reuse": bound["prefix_reuse"],
                           "fraction_of_bound": (ours / bound["output_tok_s"] if bound["output_tok_s"]
                                                 else None)}
    return out


def format_ratios(cmp: dict) -> str:
    """The comparison as a few human-readable lines (tok/s)."""
    lines = [f"workload {cmp['workload']}: radixrt {cmp['radixrt_output_tok_s']:,.0f} output tok/s "
             f"(max concurrency {cmp['radixrt_max_concurrency'] or 'inf'})"]
    if not cmp["workload_match"]:
        lines.append("  WARNING: the serving and peer reports ran different workloads")
    for name, v in cmp["vs"].items():
        ratio = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        lines.append(f"  vs {name}: {v['output_tok_s']:,.0f} tok/s ({v['wall_s']:.1f} s) -> {ratio}")
    if "roofline" in cmp:
        r = cmp["roofline"]
        lines.append(f"  roofline ({r['prefix_reuse']}): {r['output_tok_s']:,.0f} tok/s -> radixrt reaches "
                     f"{r['fraction_of_bound']:.1%} of it")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/peers.py", description="HF transformers baselines.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the HF baselines on a workload")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-path", help="HF model directory with weights")
    src.add_argument("--model-config", help='config.json (random weights) or "qwen2.5-7b"')
    run.add_argument("--baselines", default=",".join(BASELINES))
    run.add_argument("--device", default=None)
    run.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32")
    run.add_argument("--batch-size", type=int, default=64, help="static batch size of hf_generate")
    run.add_argument("--cb-block-size", type=int, default=None)
    run.add_argument("--cb-num-blocks", type=int, default=None)
    run.add_argument("--cb-max-batch-tokens", type=int, default=None)
    run.add_argument("--no-warmup", action="store_true")
    run.add_argument("--repeat", type=int, default=1,
                     help="timed runs of each baseline; reports the median run")
    run.add_argument("--output-json", default=None)
    add_workload_args(run)
    ratios = sub.add_parser("ratios", help="radixrt's serving report vs a peers report")
    ratios.add_argument("--peers", required=True)
    ratios.add_argument("--serving", required=True)
    ratios.add_argument("--model-config", default=None, help="add the roofline for this shape")
    ratios.add_argument("--copy-bandwidth", type=float, default=H200.copy_bytes_per_s, help="bytes/s")
    ratios.add_argument("--matmul-flops", type=float, default=H200.matmul_flops_per_s, help="FLOP/s")
    ratios.add_argument("--prefix-reuse", default="compute")
    return p


def _ratios_main(ns: argparse.Namespace) -> int:
    serving = json.loads(Path(ns.serving).read_text())
    peers = json.loads(Path(ns.peers).read_text())
    bound = None
    if ns.model_config:
        values = _config_dict(ns.model_config)
        spec_keys = set(WorkloadSpec.__dataclass_fields__) - {"extra"}
        spec = WorkloadSpec(**{k: v for k, v in serving["workload"].items() if k in spec_keys})
        bound = roofline(ModelShape.from_config(values), Hardware(ns.copy_bandwidth, ns.matmul_flops),
                         spec.build(), ns.prefix_reuse)
    print(format_ratios(compare(serving, peers, bound)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: `run` the baselines, or print `ratios` of a serving report against a peers report."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "ratios":
        return _ratios_main(ns)
    try:
        cfg = PeerConfig(model_path=ns.model_path, model_config=ns.model_config, workload=spec_from_args(ns),
                         baselines=tuple(b for b in ns.baselines.split(",") if b), device=ns.device,
                         dtype=ns.dtype, batch_size=ns.batch_size, cb_block_size=ns.cb_block_size,
                         cb_num_blocks=ns.cb_num_blocks, cb_max_batch_tokens=ns.cb_max_batch_tokens,
                         warmup=not ns.no_warmup, repeat=ns.repeat, output_json=ns.output_json)
    except ValueError as e:
        parser.error(str(e))
    report = run_peers(cfg)
    for b in report["baselines"].values():
        runs = ", ".join(f"{t:,.1f}" for t in b["runs_output_tok_s"])
        print(f"{b['name']}: {b['output_tok_s']:,.1f} output tok/s, {b['wall_s']:.2f} s "
              f"({b['num_requests']} requests, {b['output_tokens']} output tokens; median of runs {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
