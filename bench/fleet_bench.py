"""Does routing across replicas keep the radix cache's hits? (`radixrt launch-fleet`)

    python3 bench/fleet_bench.py --out $OUT/fleet.json     # one GPU: Qwen2.5-7B shape, dummy weights
    python3 bench/fleet_bench.py --quick                   # CPU smoke test (default model, tiny sizes)

One run, four set-ups on the same shared-prefix workload (--groups distinct system prompts, each
shared by --per-group questions, in shuffled order, at --concurrency), alternating for --repeat rounds:

  fleet_default two replicas on one GPU (--mem-fraction-static 0.4 each, --max-total-tokens each)
                behind the fleet's own gateway (radixrt/fleet.py: smg with radixrt.gateway's
                DEFAULT_POLICY: cache_aware with smg's defaults)
  prefix_hash_64 the same two replicas behind a second smg with prefix_hash over 64 tokens' worth
                of text (--prefix-token-count 64, which the fleet's gateways always pass)
  round_robin   the same two replicas behind a third smg with round_robin (caches flushed between)
  single        one server with the memory and KV pool of both replicas (0.8, 2x the tokens), direct

The per-replica pool (--max-total-tokens) holds about --prefixes-per-replica system prompts: fewer
than all of them, so round_robin, which sends every prefix to both replicas, evicts, while cache_aware
splits them (--prefixes-per-replica 0: the pool is sized from --mem-fraction-static instead). Also
TTFT at concurrency 1 (--ttft-requests short requests) straight to a replica and through the gateway.
Prompts are text (smg routes on text; the stand-in tokenizer of bench/dummy_tokenizer.py gives one
token per ASCII character, so lengths are exact). Prints one table; --out writes the JSON. Requests
go through bench/serving.py's streaming client (`send_request`, `summarize`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.common import median, out_path, run_header, write_json  # noqa: E402
from bench.server_proc import free_port  # noqa: E402
from bench.serving import BenchConfig, send_request  # noqa: E402
from bench.serving_metrics import RequestOutcome, summarize  # noqa: E402
from radixrt.fleet import Fleet  # noqa: E402
from radixrt.fleet_config import FleetConfig, ModelSpec  # noqa: E402
from radixrt.gateway import Gateway  # noqa: E402

KEY = "fleet-bench"
MODEL = "bench"
GPU = {"groups": 32, "per_group": 16, "prefix_len": 2048, "question_len": 64, "output_len": 32,
       "concurrency": 64, "prefixes_per_replica": 18, "ttft_requests": 16, "repeat": 2}
QUICK = {"groups": 4, "per_group": 3, "prefix_len": 320, "question_len": 16, "output_len": 4,
         "concurrency": 4, "prefixes_per_replica": 3, "ttft_requests": 3, "repeat": 1}


def text_workload(sizes: dict[str, int], seed: int = 0) -> list[str]:
    """groups x per_group prompts `prefix + question`, shuffled; ASCII letters and spaces only."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz    ") for _ in range(n))

    prefixes = [f"[{g:02d}] " + words(sizes["prefix_len"] - 5) for g in range(sizes["groups"])]
    prompts = [p + words(sizes["question_len"]) for p in prefixes for _ in range(sizes["per_group"])]
    rng.shuffle(prompts)
    return prompts


async def run_load(base_url: str, prompts: list[str], output_len: int, concurrency: int) -> dict[str, Any]:
    """Stream every prompt through /v1/completions at `concurrency`; bench/serving_metrics.summarize."""
    cfg = BenchConfig(base_url=base_url, model=MODEL, api_key=KEY, request_token_ids=False)
    sem = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def one(i: int, prompt: str) -> RequestOutcome:
            async with sem:
                out = RequestOutcome(session_id=i, turn=0, prompt_len=len(prompt), output_len=output_len)
                return await send_request(client, cfg, MODEL, out, prompt)  # type: ignore[arg-type]

        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return summarize(list(outcomes), time.perf_counter() - t0)


def flush(urls: list[str], tries: int = 50) -> None:
    """Empty each server's radix cache. A server refuses (400) while a request runs, the gateway's
    health probes included (a one-token generation), so retry for a few seconds."""
    for u in urls:
        for _ in range(tries):
            r = httpx.post(f"{u}/flush_cache", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
            if r.status_code != 400:
                break
            time.sleep(0.2)
        r.raise_for_status()


METRICS = ("radixrt_requests_total", "radixrt_prompt_tokens_total", "radixrt_cached_tokens_total")


def replica_counters(urls: list[str]) -> list[dict[str, float]]:
    """Per server: finished requests, prompt tokens and cached prompt tokens so far (its /metrics,
    summed over labels), to see where the gateway sent the load and what each replica hit."""
    out = []
    for u in urls:
        text = httpx.get(f"{u}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
        c = dict.fromkeys(METRICS, 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in c:
                c[name] += float(line.rsplit(" ", 1)[1])
        out.append(c)
    return out


def per_replica(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, float]]:
    """What each replica served between two `replica_counters` readings: requests and hit rate."""
    rows = []
    for b, a in zip(before, after, strict=True):
        req, prompt, cached = (a[m] - b[m] for m in METRICS)
        rows.append({"requests": req, "prompt_tokens": prompt,
                     "hit_rate": round(cached / prompt, 3) if prompt else None})
    return rows


def ttft_pair_ms(direct_url: str, gateway_url: str, n: int) -> tuple[float | None, float | None]:
    """Median TTFT in ms of n short requests straight to a replica and n through the gateway,
    alternating one of each (distinct prompts, so no cache hit), so that drift hits both alike."""
    direct, gateway = [], []
    for i in range(n):
        for base, acc in ((direct_url, direct), (gateway_url, gateway)):
            prompt = f"ttft probe {i} {len(acc)} {base[-5:]} " + "x" * 24
            acc.append(asyncio.run(run_load(base, [prompt], 2, 1))["ttft_ms"]["median"])
    return (median([t for t in direct if t is not None]), median([t for t in gateway if t is not None]))


def fleet_config(ns: argparse.Namespace, sizes: dict[str, int], model_path: str | None, log_dir: Path,
                 replicas: int, mem: float) -> FleetConfig:
    """The fleet of one model with `replicas` replicas on GPU 0 (or the CPU)."""
    pool = sizes["prefixes_per_replica"] * sizes["prefix_len"] * (2 if replicas == 1 else 1)
    args = ["--max-running-requests", str(sizes["concurrency"])]
    if pool:  # else the pool is what --mem-fraction-static leaves (on an H200: all 32 prefixes fit)
        args += ["--max-total-tokens", str(pool)]
    if ns.quick:
        args += ["--device", "cpu"]
    else:
        # the pool less one page is the most context a --max-total-tokens pool holds (ServerArgs)
        context = 8192 if not pool else min(8192, pool - 16)
        args += ["--load-format", "dummy", "--mem-fraction-static", str(mem),
                 "--context-length", str(context)]
    gpus = [] if ns.quick else ["0"] * replicas
    return FleetConfig(models=[ModelSpec(MODEL, model_path, replicas=replicas, args=args, gpus=gpus)],
                       port=free_port(), api_key=KEY, log_dir=log_dir)  # the fleet's default policy


def bench_replicas(ns: argparse.Namespace, sizes: dict[str, int], model_path: str | None,
                   prompts: list[str], tmp: Path) -> dict[str, Any]:
    """The fleet's default gateway, prefix_hash over 64 tokens and round_robin over the same two
    replicas, and TTFT with and without the gateway."""
    fleet = Fleet(fleet_config(ns, sizes, model_path, tmp / "fleet", 2, 0.4))
    # beside the fleet's own gateway, smg's prefix_hash over 64 tokens and round_robin: three
    # gateways over the same two replicas
    others = {"prefix_hash_64": Gateway("127.0.0.1", free_port(), KEY, "prefix_hash", tmp / "ph-gateway.log"),
              "round_robin": Gateway("127.0.0.1", free_port(), KEY, "round_robin", tmp / "rr-gateway.log")}
    cmd = fleet.gateway.command()[3:]  # what the fleet runs (`smg launch ...`), the key left out
    out: dict[str, Any] = {"fleet_gateway_command": [("***" if a == KEY else a) for a in cmd]}
    try:
        fleet.start()
        urls = [w.url for w in fleet.workers]
        for gw in others.values():
            gw.start()
            for u in urls:
                gw.register(u)
            gw.wait_healthy(set(urls), 120)
        bases = {"fleet_default": fleet.gateway.base_url, **{k: g.base_url for k, g in others.items()}}
        warm = prompts[: sizes["concurrency"]]
        for base in bases.values():  # warm-up (CUDA graphs, allocator), not timed
            asyncio.run(run_load(base, [w[::-1] for w in warm], sizes["output_len"], sizes["concurrency"]))
        # the set-ups alternate (--repeat rounds); the table reports the last round, the JSON all
        for rep in range(max(1, sizes["repeat"])):
            for name, base in bases.items():
                flush(urls)
                before = replica_counters(urls)
                r = asyncio.run(run_load(base, prompts, sizes["output_len"], sizes["concurrency"]))
                r["per_replica"] = per_replica(before, replica_counters(urls))
                out[name] = r
                out.setdefault(name + "_repeats", []).append(r)
                print(f"{name} (repeat {rep}): done in {r['duration_s']:.1f} s, hit {r['cache_hit_rate']}, "
                      f"per replica {r['per_replica']}", flush=True)
        flush(urls)
        out["ttft_direct_ms"], out["ttft_gateway_ms"] = ttft_pair_ms(urls[0], fleet.gateway.base_url,
                                                                     sizes["ttft_requests"])
    finally:
        for gw in others.values():
            gw.stop()
        fleet.stop()
    return out


def bench_single(ns: argparse.Namespace, sizes: dict[str, int], model_path: str | None,
                 prompts: list[str], tmp: Path) -> dict[str, Any]:
    """One server with both replicas' memory and pool, straight (no gateway)."""
    fleet = Fleet(fleet_config(ns, sizes, model_path, tmp / "single", 1, 0.8))
    try:
        fleet.start()
        url = fleet.workers[0].url
        warm = prompts[: sizes["concurrency"]]
        asyncio.run(run_load(url, [w[::-1] for w in warm], sizes["output_len"], sizes["concurrency"]))
        flush([url])
        return asyncio.run(run_load(url, prompts, sizes["output_len"], sizes["concurrency"]))
    finally:
        fleet.stop()


def table(res: dict[str, Any]) -> str:
    """The results as a markdown table, and the ratios the issue asks for (the fleet's default and
    prefix_hash_64 against round_robin and the single server)."""
    rows = ["| set-up | hit rate | output tok/s | TTFT p50 ms | TTFT p99 ms | failed | per replica |",
            "|---|---|---|---|---|---|---|"]
    for name in ("fleet_default", "prefix_hash_64", "round_robin", "single"):
        r = res[name]
        hit = "-" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.3f}"
        split = " / ".join(f"{p['requests']:.0f}" for p in r.get("per_replica", [])) or "-"
        rows.append(f"| {name} | {hit} | {r['output_throughput']:.0f} | {r['ttft_ms']['median'] or 0:.1f} | "
                    f"{r['ttft_ms']['p99'] or 0:.1f} | {r['failed']} | {split} |")
    rr, one = res["round_robin"], res["single"]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    rows.append("")
    for name in ("fleet_default", "prefix_hash_64"):
        r = res[name]
        rows.append(f"{name} / round_robin: hit rate "
                    f"{ratio(r['cache_hit_rate'], rr['cache_hit_rate'])} (goal >= 2x), output tok/s "
                    f"{ratio(r['output_throughput'], rr['output_throughput'])} (goal >= 1.5x); / single "
                    f"hit rate {ratio(r['cache_hit_rate'], one['cache_hit_rate'])} (goal >= 0.9x)")
    d, g = res["ttft_direct_ms"], res["ttft_gateway_ms"]
    if d is not None and g is not None:
        rows.append(f"TTFT at concurrency 1: direct {d:.1f} ms, through the gateway {g:.1f} ms "
                    f"({g - d:+.1f} ms)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke test: default model, tiny sizes")
    p.add_argument("--config-dir", default=str(ROOT / "bench" / "configs" / "qwen2.5-7b-instruct"),
                   help="dir with config.json for the dummy-weight model (GPU mode)")
    p.add_argument("--out", help="JSON output (default: $OUT/fleet.json on a device call)")
    for k, v in GPU.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, help=f"(default {v}; --quick {QUICK[k]})")
    ns = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="[%(asctime)s fleet] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    sizes = {k: (QUICK if ns.quick else GPU)[k] if getattr(ns, k) is None else getattr(ns, k) for k in GPU}
    prompts = text_workload(sizes)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as td:
        tmp = Path(td)
        model_path = None
        if not ns.quick:
            from bench.dummy_tokenizer import make_dummy_model_dir

            model_path = str(make_dummy_model_dir(ns.config_dir, tmp / "model"))
        res: dict[str, Any] = {"header": run_header("cpu" if ns.quick else "cuda"), "sizes": sizes}
        res.update(bench_replicas(ns, sizes, model_path, prompts, tmp))
        res["single"] = bench_single(ns, sizes, model_path, prompts, tmp)
    write_json(out_path(ns.out, "fleet.json"), res)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
