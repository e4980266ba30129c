"""FP8 int GEMV (kernels/gemv_fp8_int.py) at M = 1, retuned with programmatic dependent launch on, then
the batch-1 decode step with the winners (issue 19).

    python3 bench/lab/fp8_int_retune.py [--budget-s 200]          # H200, ~3 min with the engines
    python3 bench/lab/fp8_int_retune.py --configs "o=8x512,qkv=8x512"   # engines only

FP8_INT_TUNED came from a grid timed before PDL (bench/lab/fp8_gemv_lab.py, 2026-12-02). With PDL
each call loads its first weight chunk before waiting for its predecessor, so a larger first chunk
may hide more of a small GEMV's latency. Part 1: per shape (the four Qwen2.5-7B decode linears and
the LM head), a grid of (block_n, block_k4), each timed as a CUDA graph of back-to-back calls over
rotating weight copies (fp8_gemv_lab.py's harness) and checked against the fp32 reference. Part 2:
three Engines on the dummy Qwen2.5-7B (bf16; FP8 as configured; FP8 with part 1's winners, or
`--configs`), graphs captured with each one's table, the batch-1 decode step in alternated rounds
(median), and the greedy tokens of the two FP8 engines compared.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_gemv_lab as lab  # noqa: E402

G8 = lab.G8
SHAPES = {**lab.LINEARS, "lm_head": (152064, 3584)}
GRID = [(4, 256), (4, 512), (8, 128), (8, 256), (16, 128), (16, 256), (32, 128), (8, 512), (4, 1024),
        (8, 1024), (16, 512)]


def part1(deadline: float) -> dict[str, tuple[int, int]]:
    """The best (block_n, block_k4) per shape name."""
    res: dict = {}
    best_cfg: dict[str, tuple[int, int]] = {}
    for name, (n, k) in SHAPES.items():
        sh = lab.Shape(n, k)
        x = torch.randn(1, k, device=lab.DEV, dtype=lab.BF16)
        y = torch.empty(1, n, device=lab.DEV, dtype=lab.BF16)
        w8, s8 = sh.w8[-1]  # y holds the last call's result: that of the last weight copy
        ref = x.float() @ (w8.float() * s8[:, None]).t()
        tuned = G8.fp8_int_config(1, n, k)
        row: dict = {"tuned": f"{tuned.block_n}x{tuned.block_k4}"}
        for bn, bk4 in [(tuned.block_n, tuned.block_k4)] + [c for c in GRID if c != (tuned.block_n,
                                                                                    tuned.block_k4)]:
            if time.time() > deadline or bk4 > triton.next_power_of_2(k // 4):
                continue
            calls = [partial(G8.fp8_int_gemv, x, w, s, None, y, bn, bk4, 1, 4) for w, s in sh.w8]
            lab._variant(row, f"{bn}x{bk4}", calls, y, ref, (bn, bk4))
        ok = {kk: v for kk, v in row.items() if isinstance(v, dict) and "us" in v}
        best = min(ok, key=lambda kk: ok[kk]["us"]) if ok else None
        row["best"] = best
        if best:
            best_cfg[name] = tuple(ok[best]["cfg"])
        res[name] = row
        lab.log(f"{name}: tuned {row['tuned']} {row.get(row['tuned'], {}).get('us', math.nan):.2f} us, best "
                f"{best} {ok[best]['us'] if best else math.nan:.2f} us = "
                f"{n * k / (ok[best]['us'] * 1e-6) / 1e12 if best else math.nan:.2f} TB/s")
        lab.REPORT["retune_shapes"] = res
        lab.save()
        sh = None
        torch.cuda.empty_cache()
    return best_cfg


def part2(best: dict[str, tuple[int, ...]] | list[dict[str, tuple[int, ...]]], rounds: int) -> dict:
    """Engines bf16, fp8 (FP8_INT_TUNED as it is) and one "fp8 retuned" engine per table in `best`
    (a dict, or a list of dicts for several: "fp8 retuned 1", "fp8 retuned 2", ...), each mapping a
    shape name to (block_n, block_k4[, split_k[, prefetch[, num_warps]]])."""
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine

    path = model_dir("qwen2.5-7b")
    saved = dict(G8.FP8_INT_TUNED)
    tables = best if isinstance(best, list) else [best]

    def config(cfg: tuple[int, ...]) -> G8.Fp8IntConfig:
        return G8.Fp8IntConfig(*cfg[:2], split_k=cfg[2] if len(cfg) > 2 else 1,
                               prefetch=bool(cfg[3]) if len(cfg) > 3 else False,
                               num_warps=cfg[4] if len(cfg) > 4 else 4)

    def label(v: G8.Fp8IntConfig) -> str:
        return f"{v.block_n}x{v.block_k4}k{v.split_k}{'p' if v.prefetch else ''}w{v.num_warps}"

    retuned = [{(1, *SHAPES[name]): config(cfg) for name, cfg in t.items()} for t in tables]
    names = ["fp8 retuned"] if len(retuned) == 1 else [f"fp8 retuned {i + 1}" for i in range(len(retuned))]
    engines = {}
    out: dict = {"retuned": {n: {str(kk): label(v) for kk, v in r.items()} for n, r in zip(names, retuned,
                                                                                             strict=True)}}
    prompt = [[1000 + i for i in range(128)]]
    variants = [("bf16", {}, saved), ("fp8", {"quantization": "fp8"}, saved)]
    variants += [(n, {"quantization": "fp8"}, {**saved, **r}) for n, r in zip(names, retuned, strict=True)]
    for name, kw, table in variants:
        G8.FP8_INT_TUNED.clear()
        G8.FP8_INT_TUNED.update(table)
        t = time.perf_counter()
        engines[name] = Engine(model_path=str(path), load_format="dummy", device="cuda",
                               max_running_requests=16, cuda_graph_max_bs=8, max_total_tokens=8192,
                               chunked_prefill_size=8192, **kw)
        out[name] = {"start_s": time.perf_counter() - t, "steps_ms": [],
                     "tokens": engines[name].generate(prompt, {"temperature": 0.0, "max_new_tokens": 32,
                                                               "ignore_eos": True})[0]["output_ids"]}
        lab.log(f"engine {name} started in {out[name]['start_s']:.0f} s")
    G8.FP8_INT_TUNED.clear()
    G8.FP8_INT_TUNED.update(saved)
    for r in range(rounds):
        for name, eng in engines.items():
            out[name]["steps_ms"].append(decode_step_ms(eng, 128, 128))
        lab.log(f"round {r}: " + ", ".join(f"{nm} {out[nm]['steps_ms'][-1]:.3f}" for nm in engines))
    bf = statistics.median(out["bf16"]["steps_ms"])
    for name in engines:
        out[name]["median_ms"] = statistics.median(out[name]["steps_ms"])
        out[name]["over_bf16"] = out[name]["median_ms"] / bf
    f8 = out["fp8"]
    lab.log(f"batch-1 step: bf16 {bf:.3f} ms, fp8 {f8['median_ms']:.3f} ({f8['over_bf16']:.3f}x)")
    for name in names:
        rt = out[name]
        rt["tokens_equal_fp8"] = rt["tokens"] == f8["tokens"]
        lab.log(f"  {name} {out['retuned'][name]}: {rt['median_ms']:.3f} ({rt['over_bf16']:.3f}x; "
                f"/ fp8 {rt['median_ms'] / f8['median_ms']:.3f}); greedy tokens equal "
                f"{rt['tokens_equal_fp8']}")
    for name in engines:
        out[name].pop("tokens")
    del engines
    gc.collect()
    torch.cuda.empty_cache()
    return out


def parse_config(text: str) -> tuple[int, int, int, int, int]:
    """(block_n, block_k4, split, prefetch, num_warps) of "8x512", "4x512k2", "8x128p", "4x256k2p" or
    any of them with "w8" (8 warps; 4 without) appended."""
    text, _, warps = text.partition("w")
    prefetch = text.endswith("p")
    bn, rest = text.rstrip("p").split("x")
    bk4, _, split = rest.partition("k")
    return int(bn), int(bk4), int(split or 1), int(prefetch), int(warps or 4)


def grid_winners(report: dict) -> dict[str, tuple[int, int, int, int]]:
    """(block_n, block_k4, split, prefetch) per shape of an fp8_m1_lab.py --int-grid report (names
    "4x512k1", "p" appended for prefetch), where the grid's best is >= 2% faster than the tuned
    config (timed in the same grid) or the tuned one is absent."""
    best: dict[str, tuple[int, int, int, int]] = {}
    for name, row in report.get("shapes", {}).items():
        ok = {c: v["us"] for c, v in row.items() if isinstance(v, dict) and "us" in v}
        if not ok or name not in SHAPES:
            continue
        cfg = G8.fp8_int_config(1, *SHAPES[name])
        tuned_us = ok.get(f"{cfg.block_n}x{cfg.block_k4}k{cfg.split_k}" + ("p" if cfg.prefetch else ""))
        win = min(ok, key=ok.get)
        if tuned_us is None or ok[win] < 0.98 * tuned_us:
            bn, rest = win.split("x")
            bk4, split = rest.split("k")
            best[name] = (int(bn), int(bk4), int(split.rstrip("p")), int(split.endswith("p")))
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-engines", action="store_true")
    p.add_argument("--configs", action="append", default=[],
                   help='skip part 1: e.g. "o=8x512,down=4x512k1p" (block_n x block_k4, k: split-K, '
                        'p: prefetch, w: warps); repeat it for one engine per table')
    p.add_argument("--from-grid", default="", help="skip part 1: the winners of bench/lab/fp8_m1_lab.py "
                   "--int-grid's JSON, where one beats the tuned config by >= 2%%")
    ns = p.parse_args()
    if ns.from_grid:
        best = grid_winners(json.loads(Path(ns.from_grid).read_text()))
        lab.log(f"from the grid: {best}")
    elif ns.configs:
        best = [{kv.split("=")[0]: parse_config(kv.split("=")[1]) for kv in c.split(",") if kv.strip()}
                for c in ns.configs]
    else:
        best = part1(time.time() + ns.budget_s)
    if not ns.no_engines:
        lab.REPORT["retune_engines"] = part2(best, ns.rounds)
    (lab.OUT / "fp8_int_retune.json").write_text(json.dumps(lab.REPORT, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
