"""Constrained vs unconstrained decoding, same run: output tok/s, their ratio, and device idle.

The question (issue 15): do 100% `json_schema` requests keep at least 0.9x the output tok/s of
unconstrained requests of the same prompt / output lengths, with no added device idle under
overlap scheduling (deferred grammar masks, docs/structured-outputs.md)? Two paths:

- engine: the offline Engine in this process; device busy / idle are the pass pipeline's totals
  (PassPipeline.gpu_busy_ms_total / gpu_gap_ms_total, the figures bench/gpu_engine.py traces).
- http: a real server (bench/server_proc.py), requests sent at once to /generate with
  `sampling_params.json_schema`; busy / idle from /get_server_info.
Plus grammar compile time cold and cached (bench/grammar_compile.py's `run`, with this schema added).

Fair lengths with dummy weights: outputs are random, so both kinds run with `ignore_eos` and
`max_new_tokens = --output-len`, and the schema (an object holding a string array with
`minItems` > output_len: an item and its comma take at least one token in practice) cannot be complete
before max_new_tokens, so a constrained request cannot end early either (checked: the report
gives both kinds' mean output length). Phases alternate (plain, json, plain, json, ...) with a
flushed radix cache and fresh random prompts each, after a warm-up of each kind.

    python bench/grammar_bench.py --model-config qwen2.5-7b --device cuda --out grammar.json
    python bench/grammar_bench.py --quick          # CPU: a tiny config, a few requests (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import out_path, run_header, write_json  # noqa: E402
from bench.dummy_tokenizer import make_dummy_model_dir  # noqa: E402
from radixrt.constrained import GrammarKind, GrammarSpec  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=64,
            intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=True)
KINDS = ("plain", "json")


def bench_schema(output_len: int) -> dict[str, Any]:
    """An object with a string array that cannot be complete within output_len tokens (an item and
    its comma take at least one token of their own, in practice). No maxLength: xgrammar's mask fill
    for a bounded string costs ~1.5 ms per request per step on the Qwen vocabulary (H200 host,
    2026-12-01) against ~8 us for the unbounded one, which would make the host's mask fill, not the
    grammar path, the subject of the benchmark."""
    return {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}, "minItems": output_len + 1}},
        "required": ["tags"], "additionalProperties": False}


def model_dir_for(ns: argparse.Namespace, tmp: Path) -> Path:
    """A dummy-weights model directory with a stand-in tokenizer (grammar support needs one)."""
    if ns.quick:
        cfg = tmp / "tiny-config"
        cfg.mkdir()
        (cfg / "config.json").write_text(json.dumps(TINY))
        return make_dummy_model_dir(cfg, tmp / "model")
    name = ns.model_config
    config_dir = Path(name) if Path(name).is_dir() else CONFIGS / (name if name.endswith("-instruct")
                                                                  else f"{name}-instruct")
    return make_dummy_model_dir(config_dir, tmp / "model")


def sampling(kind: str, output_len: int, schema: str) -> dict[str, Any]:
    sp: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    if kind == "json":
        sp["json_schema"] = schema
    return sp


def prompts(rng: np.random.Generator, n: int, prompt_len: int, vocab: int) -> list[list[int]]:
    """Random token ids above the byte / special ids (no prefix shared across requests or phases)."""
    return rng.integers(300, vocab - 8, size=(n, prompt_len)).tolist()


def summarize(kind: str, outs: list[dict[str, Any]], wall_s: float, busy_ms: float, gap_ms: float,
              num_prompts: int) -> dict[str, Any]:
    lens = [o["completion_tokens"] for o in outs]
    reasons: dict[str, int] = {}
    for o in outs:
        reasons[o["finish_reason"]] = reasons.get(o["finish_reason"], 0) + 1
    total = sum(lens)
    return {"kind": kind, "num_requests": num_prompts, "output_tokens": total, "wall_s": wall_s,
            "output_tok_s": total / wall_s if wall_s > 0 else 0.0,
            "mean_output_len": total / max(len(lens), 1),
            "finish_reasons": reasons, "busy_ms": busy_ms, "gap_ms": gap_ms,
            "idle_fraction": gap_ms / (busy_ms + gap_ms) if busy_ms + gap_ms > 0 else None}


def run_engine(ns: argparse.Namespace, model_dir: Path, schema: str) -> list[dict[str, Any]]:
    """Alternating plain / json phases through the offline Engine; one summary per phase."""
    from radixrt.engine import Engine

    eng = Engine(model_path=str(model_dir), load_format="dummy", device=ns.device,
                 max_running_requests=max(ns.num_requests, 8), **engine_memory(ns))
    vocab = eng.info["vocab_size"]
    rng = np.random.default_rng(0)
    pl = eng.pipeline
    rows = []
    for rep in range(-1, ns.repeat):  # rep -1: warm-up (CUDA graphs, the compile cache), not reported
        for kind in KINDS:
            eng.scheduler.flush_cache()
            ps = prompts(rng, ns.num_requests if rep >= 0 else 2, ns.prompt_len, vocab)
            busy0, gap0 = pl.gpu_busy_ms_total, pl.gpu_gap_ms_total
            t0 = time.perf_counter()
            outs = eng.generate(ps, sampling(kind, ns.output_len, schema))
            wall = time.perf_counter() - t0
            if rep < 0:
                continue
            metas = [o["meta_info"] for o in outs]
            rows.append(summarize(kind, metas, wall, pl.gpu_busy_ms_total - busy0,
                                  pl.gpu_gap_ms_total - gap0, len(ps)) | {"path": "engine", "repeat": rep})
    del eng, pl
    _release_device_memory(ns.device)
    return rows


def _release_device_memory(device: str) -> None:
    """Free the in-process Engine's weights and KV pool so the HTTP part's server can size its own."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def engine_memory(ns: argparse.Namespace) -> dict[str, Any]:
    need = ns.num_requests * (ns.prompt_len + ns.output_len + 64) + 4096
    return {"max_total_tokens": need} if ns.device == "cpu" else {}


async def _http_phase(base: str, ps: list[list[int]], sp: dict[str, Any]
                      ) -> tuple[list[dict[str, Any]], float]:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=3600) as client:
        async def one(ids: list[int]) -> dict[str, Any]:
            r = await client.post("/generate", json={"input_ids": ids, "sampling_params": sp})
            r.raise_for_status()
            return r.json()["meta_info"]
        t0 = time.perf_counter()
        metas = await asyncio.gather(*(one(ids) for ids in ps))
        return list(metas), time.perf_counter() - t0


def run_http(ns: argparse.Namespace, model_dir: Path, schema: str, tmp: Path) -> list[dict[str, Any]]:
    """The same phases through a real server (/generate, all requests at once)."""
    import httpx

    from bench.server_proc import start_server

    extra = ["--load-format", "dummy", "--max-running-requests", str(max(ns.num_requests, 8))]
    if ns.device == "cpu":
        extra += ["--max-total-tokens", str(engine_memory(ns)["max_total_tokens"])]
    server = start_server(model_dir, tmp, *extra, device=ns.device, timeout_s=900)
    rng = np.random.default_rng(1)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]

    def totals() -> tuple[float, float]:
        s = httpx.get(f"{server.base_url}/get_server_info", timeout=60).json()["scheduler"]
        return s["gpu_busy_ms_total"], s["gpu_gap_ms_total"]

    rows = []
    try:
        for rep in range(-1, ns.repeat):
            for kind in KINDS:
                httpx.post(f"{server.base_url}/flush_cache", timeout=60)
                ps = prompts(rng, ns.num_requests if rep >= 0 else 2, ns.prompt_len, vocab)
                busy0, gap0 = totals()
                sp = sampling(kind, ns.output_len, schema)
                metas, wall = asyncio.run(_http_phase(server.base_url, ps, sp))
                busy1, gap1 = totals()
                if rep >= 0:
                    rows.append(summarize(kind, metas, wall, busy1 - busy0, gap1 - gap0, len(ps))
                                | {"path": "http", "repeat": rep})
    finally:
        server.stop()
    return rows


def compile_times(model_dir: Path, spec: GrammarSpec, quick: bool) -> dict[str, Any]:
    """bench/grammar_compile.py's cold / cached compile (and fill) figures, this schema included."""
    from transformers import AutoTokenizer

    from bench.grammar_compile import default_grammars, run

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    grammars = [("bench_schema", spec)] + ([] if quick else default_grammars())
    return run(AutoTokenizer.from_pretrained(str(model_dir)), vocab_size=vocab,
               steps=4 if quick else 32, batch_size=2 if quick else 8, grammars=grammars)


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path: summed tokens / summed wall time of each kind, json / plain, idle fractions."""
    out = {}
    for path in sorted({r["path"] for r in rows}):
        agg = {}
        for kind in KINDS:
            rs = [r for r in rows if r["path"] == path and r["kind"] == kind]
            toks, wall = sum(r["output_tokens"] for r in rs), sum(r["wall_s"] for r in rs)
            busy, gap = sum(r["busy_ms"] for r in rs), sum(r["gap_ms"] for r in rs)
            agg[kind] = {"output_tok_s": toks / wall if wall else 0.0,
                         "mean_output_len": toks / max(sum(r["num_requests"] for r in rs), 1),
                         "idle_fraction": gap / (busy + gap) if busy + gap > 0 else None}
        plain = agg["plain"]["output_tok_s"]
        out[path] = agg | {"ratio": agg["json"]["output_tok_s"] / plain if plain else None}
    return out


def print_table(report: dict[str, Any]) -> None:
    print(f"{'path':6} {'kind':6} {'out tok/s':>10} {'mean len':>9} {'idle %':>7}  ratio json/plain")
    for path, agg in report["summary"].items():
        for kind in KINDS:
            a = agg[kind]
            idle = "-" if a["idle_fraction"] is None else f"{100 * a['idle_fraction']:.2f}"
            ratio = f"{agg['ratio']:.3f}" if kind == "json" and agg["ratio"] is not None else ""
            print(f"{path:6} {kind:6} {a['output_tok_s']:10.1f} {a['mean_output_len']:9.1f} {idle:>7}"
                  f"  {ratio}")
    for g in report.get("compile", {}).get("grammars", []):
        print(f"compile {g['name']:18} cold {g['cold_compile_ms']:8.2f} ms"
              f"  cached {g['cached_compile_ms']:.4f} ms")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b",
                   help="bench/configs name (qwen2.5-7b, llama-3.1-8b) or a directory with config.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", default="compile,engine,http", help="comma list of compile, engine, http")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--repeat", type=int, default=2, help="plain / json phase pairs per path")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny config, 4 short requests")
    p.add_argument("--out", default=None, help="JSON output (default $OUT/grammar_bench.json on a device)")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.device, ns.num_requests, ns.prompt_len, ns.output_len, ns.repeat = "cpu", 4, 16, 12, 1
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    only = set(ns.only.split(","))
    schema = json.dumps(bench_schema(ns.output_len))
    report: dict[str, Any] = {"header": run_header(ns.device), "args": vars(ns), "schema": json.loads(schema),
                              "phases": [], "summary": {}}
    path = out_path(ns.out, "grammar_bench.json")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = model_dir_for(ns, tmp)
        spec = GrammarSpec(GrammarKind.JSON_SCHEMA, schema)
        steps = [("compile", lambda: report.__setitem__("compile", compile_times(model_dir, spec, ns.quick))),
                 # HTTP first: its server is a subprocess, gone before the in-process Engine sizes its pool
                 ("http", lambda: report["phases"].extend(run_http(ns, model_dir, schema, tmp))),
                 ("engine", lambda: report["phases"].extend(run_engine(ns, model_dir, schema)))]
        for name, fn in steps:
            if name not in only:
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep the other parts' figures; the error is reported
                report.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
                print(f"{name} failed: {e}", file=sys.stderr)
            report["summary"] = ratios(report["phases"])
            write_json(path, report)  # after every part: a later failure keeps what was measured
    print_table(report)
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
