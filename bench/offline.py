"""Offline throughput of `radixrt.Engine` on the serving benchmark's workloads (no HTTP).

Single-turn workloads submit every request at once; multi-turn workloads run turn k of every
session together, each turn resending the history (prompt + answer of turn k-1 + new tokens).
Greedy, EOS ignored, so every request produces exactly its output length.

Usage:
    python bench/offline.py --workload shared-prefix --model-path bench/configs/qwen2.5-7b \
        --load-format dummy --device cuda --output-json out.json
    # CPU, default model:
    python bench/offline.py --workload random --num-prompts 8 --input-len 64 --output-len 16

Reports (JSON): wall_s, request/input/output throughput (tok/s), cached_tokens and cache_hit_rate
(from each request's meta_info), total_output_tokens (counted from returned ids) and
total_output_tokens_expected (from the workload), and the engine's KV stats.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workloads import Workload, add_workload_args, next_prompt, spec_from_args  # noqa: E402
from radixrt.engine import Engine  # noqa: E402


def _params(output_len: int) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}


def run_workload(engine: Engine, workload: Workload) -> dict[str, Any]:
    """Run every request of `workload` through `engine`; returns the metrics dict (units in keys)."""
    sessions = workload.sessions
    prompts: list[list[int] | None] = [None] * len(sessions)
    answers: list[list[int] | None] = [None] * len(sessions)
    num_turns = max(len(s.turns) for s in sessions)
    n_in = n_out = n_cached = n_expected = n_requests = 0
    t0 = time.perf_counter()
    for k in range(num_turns):
        idx = [i for i, s in enumerate(sessions) if k < len(s.turns)]
        batch = [next_prompt(prompts[i], answers[i], sessions[i].turns[k]) for i in idx]
        outs = engine.generate(batch, [_params(sessions[i].turns[k].output_len) for i in idx])
        for i, p, o in zip(idx, batch, outs, strict=True):
            prompts[i], answers[i] = p, o["output_ids"]
            n_in += len(p)
            n_out += len(o["output_ids"])
            n_cached += o["meta_info"]["cached_tokens"]
            n_expected += sessions[i].turns[k].output_len
            n_requests += 1
    wall = time.perf_counter() - t0
    return {
        "workload": workload.describe(), "num_requests": n_requests, "wall_s": wall,
        "request_throughput": n_requests / wall, "input_throughput": n_in / wall,
        "output_throughput": n_out / wall, "total_input_tokens": n_in, "total_output_tokens": n_out,
        "total_output_tokens_expected": n_expected, "token_counts_consistent": n_out == n_expected,
        "cached_tokens": n_cached, "cache_hit_rate": n_cached / max(n_in, 1), "kv_stats": engine.stats(),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--model-path", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--device", default="auto")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests before timing")
    p.add_argument("--output-json", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    engine = Engine(model_path=ns.model_path, load_format=ns.load_format, device=ns.device,
                    page_size=ns.page_size, max_total_tokens=ns.max_total_tokens,
                    max_running_requests=ns.max_running_requests,
                    chunked_prefill_size=ns.chunked_prefill_size,
                    disable_radix_cache=ns.disable_radix_cache, disable_cuda_graph=ns.disable_cuda_graph)
    spec = spec_from_args(ns)
    spec.vocab_size = min(spec.vocab_size, int(engine.info["vocab_size"]))
    spec.min_token_id = min(spec.min_token_id, spec.vocab_size // 2)
    if ns.warmup:
        engine.generate([[spec.min_token_id + i for i in range(8)]] * ns.warmup, _params(4))
        engine.scheduler.flush_cache()
    report = run_workload(engine, spec.build())
    report["engine"] = {"model_dir": str(engine.model_dir), "device": engine.info.get("device"),
                        "dtype": engine.info.get("dtype"), "page_size": ns.page_size,
                        "disable_radix_cache": ns.disable_radix_cache}
    print(json.dumps({k: v for k, v in report.items() if k != "kv_stats"}, indent=1, default=str))
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
