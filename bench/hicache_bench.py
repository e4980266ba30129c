"""Does the host KV tier bring evicted conversations back cheaply? Tier off vs on, same run.

A multi-turn chat workload whose working set is several times the device KV pool: `--convs`
conversations, each a `--history`-token first prompt, then `--turns - 1` more turns of `--user`
new tokens each, `--out` output tokens per turn (greedy, ignore_eos). `--concurrency` turns are
in flight at once (closed loop): a conversation whose turn ends goes to the back of a round-robin
queue and the one at its front submits its next turn, so between two turns of a conversation all
the others have one (its KV has long left the device: the working set, convs x history, is ~4x
the device pool that `--max-total-tokens` sets), while the server is not queue-saturated (the
concurrency stays under --max-running-requests), so TTFT measures prefill or load-back, not
queueing. `--concurrency 0`: every conversation at once (a saturated queue). One Engine (dummy
Qwen2.5-7B weights on the GPU) runs both: the tier-off pass uses a scheduler without a host tier
over the same worker.

Reports per mode: output tok/s, cache hit rate (cached / prompt tokens), TTFT p50 / p99 of the
short turns (all but the first), and for the tier: load-back bandwidth (bytes / seconds the copy
stream was busy with loads, CUDA events around each group of loads) against the pinned host-to-
device bandwidth of one large transfer measured in the same run; loaded and stored pages.

    python bench/hicache_bench.py --out $OUT/hicache.json          # H200, ~3-4 min
    python bench/hicache_bench.py --quick --out /tmp/hicache.json   # CPU smoke test (default model)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import run_header, write_json  # noqa: E402
from radixrt.engine import Engine  # noqa: E402
from radixrt.protocol import GenerateReq  # noqa: E402
from radixrt.scheduler.factory import build_scheduler  # noqa: E402

PINNED_GIB = 1.0


def pinned_h2d_gib_per_s(device: str, gib: float = PINNED_GIB) -> float | None:
    """Pinned host -> device copy bandwidth (GiB/s), median of 5; None off CUDA."""
    if device != "cuda":
        return None
    import torch

    src = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    times = []
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return gib / sorted(times[1:])[2]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def run_workload(engine: Engine, ns: argparse.Namespace, label: str) -> dict[str, Any]:
    """Drive the multi-turn workload through engine's pass pipeline; return its figures."""
    sched, rng = engine.scheduler, random.Random(ns.seed)
    vocab = int(engine.info["vocab_size"])
    hist = {c: [rng.randrange(100, vocab - 1) for _ in range(ns.history)] for c in range(ns.convs)}
    turn = dict.fromkeys(range(ns.convs), 0)
    sent: dict[str, tuple[int, float, list[int]]] = {}  # rid -> (conv, submit time, prompt)
    ready = collections.deque(range(ns.convs))  # conversations with a turn to submit, round robin
    first: dict[str, float] = {}
    outs: dict[str, list[int]] = {}
    ttft_short: list[float] = []
    prompt_tokens = cached_tokens = out_tokens = 0
    sp = {"temperature": 0.0, "max_new_tokens": ns.out_len, "ignore_eos": True}

    def submit(c: int) -> None:
        user = [] if turn[c] == 0 else [rng.randrange(100, vocab - 1) for _ in range(ns.user)]
        prompt = hist[c] + user
        rid = f"{label}-c{c}-t{turn[c]}"
        sent[rid], outs[rid] = (c, time.perf_counter(), prompt), []
        sched.add_request(GenerateReq(rid=rid, input_ids=np.array(prompt, np.int32), sampling=sp))

    t0 = time.perf_counter()
    for _ in range(ns.concurrency or ns.convs):
        submit(ready.popleft())
    while sent:
        engine.step()
        out, _ = sched.take_outputs()
        if out is None:
            continue
        now, ids, offsets = time.perf_counter(), out.output_ids.tolist(), out.offsets.tolist()
        for i, rid in enumerate(out.rids):
            c, t_sub, prompt = sent[rid]
            new = ids[offsets[i]:offsets[i + 1]]
            if new and rid not in first:
                first[rid] = now
                if turn[c] > 0:
                    ttft_short.append(now - t_sub)
            outs[rid] += new
            if out.finish_reasons[i] is None:
                continue
            prompt_tokens += out.prompt_tokens[i]
            cached_tokens += out.cached_tokens[i]
            out_tokens += len(outs[rid])
            del sent[rid]
            hist[c] = prompt + outs[rid]
            turn[c] += 1
            if turn[c] < ns.turns:
                ready.append(c)
            if ready:
                submit(ready.popleft())
    while engine.pipeline.in_flight is not None or sched.kv.has_copies:
        engine.step()
    wall = time.perf_counter() - t0
    stats = sched.stats()
    ttft = sorted(ttft_short) or [0.0]
    r = {"mode": label, "wall_s": wall, "output_tok_s": out_tokens / wall,
         "cache_hit_rate": cached_tokens / max(prompt_tokens, 1), "prompt_tokens": prompt_tokens,
         "cached_tokens": cached_tokens, "ttft_short_p50_s": ttft[len(ttft) // 2],
         "ttft_short_p99_s": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
         "retractions": stats["num_retractions"]}
    if "hicache_load_bytes" in stats:
        r.update({k: v for k, v in stats.items() if k.startswith("hicache_")})
        r["load_gib_per_s"] = _gib_per_s(stats["hicache_load_bytes"], stats["hicache_load_s"])
        r["store_gib_per_s"] = _gib_per_s(stats["hicache_store_bytes"], stats["hicache_store_s"])
    return r


def _gib_per_s(nbytes: float, seconds: float) -> float | None:
    return nbytes / (1 << 30) / seconds if seconds > 0 else None


def ratios(off: dict[str, Any], on: dict[str, Any], h2d: float | None) -> dict[str, float | None]:
    """Tier-on / tier-off figures; None (n/a) where the tier-off figure is 0 (a hit rate of 0:
    the absolute rates are in the results) or a figure is missing."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {"output_tok_s": ratio(on["output_tok_s"], off["output_tok_s"]),
            "cache_hit_rate": ratio(on["cache_hit_rate"], off["cache_hit_rate"]),
            "ttft_short_p99": ratio(on["ttft_short_p99_s"], off["ttft_short_p99_s"]),
            "load_bw_vs_pinned_h2d": ratio(on.get("load_gib_per_s"), h2d)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default="bench/configs/qwen2.5-7b-instruct")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--device", default="cuda")
    p.add_argument("--convs", type=int, default=256)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--history", type=int, default=2048)
    p.add_argument("--user", type=int, default=64)
    p.add_argument("--out-len", type=int, default=64, help="output tokens per turn")
    p.add_argument("--max-total-tokens", type=int, default=160_000, help="device KV pool (tokens)")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=48,
                   help="turns in flight at once (0: all conversations at once)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--hicache-size", type=float, default=48.0, help="host tier, GB")
    p.add_argument("--write-policy", default="write_through")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny CPU run on the default model")
    p.add_argument("--out", default="hicache.json", help="JSON report")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.model_path, ns.load_format, ns.device = None, "auto", "cpu"
        ns.convs, ns.turns, ns.history, ns.user, ns.out_len = 3, 2, 64, 8, 2
        ns.max_total_tokens, ns.max_running_requests, ns.hicache_size = 160, 2, 0.05
        ns.concurrency = 0
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    report: dict[str, Any] = {**run_header(ns.device), "args": vars(ns).copy(), "results": []}
    report["pinned_h2d_gib_per_s"] = pinned_h2d_gib_per_s(ns.device)
    engine = Engine(model_path=ns.model_path, load_format=ns.load_format, device=ns.device,
                    page_size=ns.page_size, max_total_tokens=ns.max_total_tokens,
                    max_running_requests=ns.max_running_requests, enable_hierarchical_cache=True,
                    hicache_size=ns.hicache_size, hicache_write_policy=ns.write_policy)
    report["worker_info"] = engine.info
    tier_sched = engine.scheduler
    off_args = dataclasses.replace(engine.args, enable_hierarchical_cache=False)
    engine.scheduler = build_scheduler(off_args, {**engine.info, "num_host_pages": 0})
    report["results"].append(run_workload(engine, ns, "tier-off"))
    write_json(ns.out, report)
    engine.scheduler = tier_sched
    report["results"].append(run_workload(engine, ns, "tier-on"))
    off, on = report["results"]
    h2d = report["pinned_h2d_gib_per_s"]
    report["ratios"] = ratios(off, on, h2d)
    write_json(ns.out, report)
    print("| mode | output tok/s | hit rate | short TTFT p50 s | short TTFT p99 s | load GiB/s "
          "| retractions |")
    print("|---|---|---|---|---|---|---|")
    for r in report["results"]:
        bw = r.get("load_gib_per_s")
        print(f"| {r['mode']} | {r['output_tok_s']:.1f} | {r['cache_hit_rate']:.3f} "
              f"| {r['ttft_short_p50_s']:.3f} "
              f"| {r['ttft_short_p99_s']:.3f} | {'-' if bw is None else f'{bw:.2f}'} | {r['retractions']} |")
    print(f"load-back {_fmt(on.get('load_gib_per_s'))} GiB/s (copy stream busy) vs pinned H2D "
          f"{_fmt(h2d)} GiB/s (one {PINNED_GIB} GiB transfer); "
          f"store {_fmt(on.get('store_gib_per_s'))} GiB/s; "
          f"pages loaded {on.get('hicache_loaded_pages')}, stored {on.get('hicache_stored_pages')}, "
          f"unpinned before admission {on.get('hicache_unpinned_load_pages')}")
    print("on/off ratios: " + ", ".join(f"{k} {_fmt(v)}" for k, v in report["ratios"].items())
          + f" (hit rates {off['cache_hit_rate']:.3f} -> {on['cache_hit_rate']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
