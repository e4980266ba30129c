"""The Gluon decode-batch GEMM (kernels/gemm_ws.py) against F.linear (cuBLAS) at Qwen2.5-7B's decode
linears, M = 128 first, then 64 and 100 (as the time budget allows).

    python3 bench/lab/gemm_ws.py [--m 128,64,100] [--budget-s 150] [--out PATH] [--tuned-out PATH]

Each case: F.linear and every config timed as a CUDA graph of CALLS back-to-back calls rotating over
weight copies of >= 400 MB in all (no L2 reuse, as in a decode pass where 14 GB of other weights pass
between two uses of one), median of triton.testing.do_bench over the graph replays; relative error
against the fp32 product. Phase 1: tiles (block_n, block_k, stages) at the default split rule; phase 2:
split counts for the two fastest tiles. Then the eager time of the best config (the host cost a
graph removes), and gate_up with its SiLU-and-mul three ways (run_gated). Prints a table, the TUNED
lines of kernels/gemm_ws.py for cases where the kernel beat F.linear by MIN_SPEEDUP, and writes
JSON."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import gemm_ws as G  # noqa: E402

SHAPES = {"qkv": (4608, 3584, True), "o_proj": (3584, 3584, False), "gate_up": (37888, 3584, False),
          "down": (3584, 18944, False)}
CALLS, ROTATE_BYTES, MIN_SPEEDUP = 20, 400e6, 1.02
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def graph_us(fn) -> float:
    return common.graph_ms(fn, timer=lambda f: common.cuda_ms(f, warmup=5, rep=25)) * 1e3 / CALLS


def tiles(mp: int) -> list[G.GemmWsConfig]:
    out = []
    for bn in (128, 256, 64):
        for bk in (64, 128):
            for st in (3, 4, 6):
                c = G.GemmWsConfig(bn, bk, st, 1)
                if G.fits(c, mp):
                    out.append(c)
    return out


def with_splits(c: G.GemmWsConfig, splits: int) -> G.GemmWsConfig:
    return G.GemmWsConfig(c.block_n, c.block_k, c.stages, splits)


def run_case(name: str, m: int, sms: int, deadline: float) -> dict:
    n, k, has_bias = SHAPES[name]
    mp = G.rows_padded(m)
    copies = max(1, min(CALLS, math.ceil(ROTATE_BYTES / (n * k * 2))))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None
    ref = x.float() @ weights[0].float().t() + (b.float() if b is not None else 0)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    partials = torch.empty(64 << 20, device="cuda")
    counters = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")

    def torch_calls():
        for i in range(CALLS):
            F.linear(x, weights[i % copies], b)

    torch_calls()
    res = {"name": name, "m": m, "mp": mp, "n": n, "k": k, "torch_us": graph_us(torch_calls),
           "torch_eager_us": common.cuda_ms(lambda: F.linear(x, weights[0], b)) * 1e3, "configs": []}

    def time_cfg(cfg: G.GemmWsConfig) -> dict:
        entry = {"config": asdict(cfg), "splits_used": G.split_plan(k, cfg)[2]}
        try:
            y.fill_(float("nan"))
            G.gemm_ws(x, weights[0], b, out=y, config=cfg, partials=partials, counters=counters)
            torch.cuda.synchronize()
            entry["rel_err"] = common.rel_err(y, ref)

            def calls():
                for i in range(CALLS):
                    G.gemm_ws(x, weights[i % copies], b, out=y, config=cfg, partials=partials,
                              counters=counters)

            calls()
            entry["us"] = graph_us(calls)
            entry["counters_zero"] = int(counters.abs().sum()) == 0
        except Exception as e:  # noqa: BLE001 - record and keep sweeping
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            entry["us"] = float("inf")
        res["configs"].append(entry)
        return entry

    for t in tiles(mp):
        if time.time() > deadline:
            break
        n_tiles, steps = math.ceil(n / t.block_n), math.ceil(k / t.block_k)
        time_cfg(with_splits(t, max(1, min(sms // n_tiles, steps // 4)) if n_tiles < sms else 1))
    ok = sorted((c for c in res["configs"] if c.get("rel_err", 1) < 1e-2), key=lambda c: c["us"])
    seen = []
    for c in ok:
        t = G.GemmWsConfig(**{**c["config"], "splits": 1})
        if t not in seen:
            seen.append(t)
    done = {tuple(c["config"].values()) for c in res["configs"]}
    for t in seen[:2]:
        steps = math.ceil(k / t.block_k)
        for s in (1, 2, 3, 4, 6, 8, 12):
            cfg = with_splits(t, s)
            if time.time() > deadline or tuple(asdict(cfg).values()) in done or steps // s < 2:
                continue
            if math.ceil(n / t.block_n) * s > 3 * sms:
                continue
            time_cfg(cfg)
    ok = sorted((c for c in res["configs"] if c.get("rel_err", 1) < 1e-2), key=lambda c: c["us"])
    if ok:
        best = ok[0]
        res["best"] = best
        cfg = G.GemmWsConfig(**best["config"])
        res["best_eager_us"] = common.cuda_ms(lambda: G.gemm_ws(
            x, weights[0], b, out=y, config=cfg, partials=partials, counters=counters)) * 1e3
        log(f"{name} M={m}: F.linear {res['torch_us']:.1f} us, gemm_ws best {best['us']:.1f} us "
            f"({cfg}, rel err {best['rel_err']:.1e}) = {best['us'] / res['torch_us']:.3f}x; "
            f"eager {res['best_eager_us']:.1f} vs {res['torch_eager_us']:.1f} us; "
            f"{len(res['configs'])} configs")
    else:
        errs = [c.get("error") or c.get("rel_err") for c in res["configs"]][:3]
        log(f"{name} M={m}: no valid config ({errs})")
    weights.clear()
    torch.cuda.empty_cache()
    return res


def run_gated(m: int, cfg: G.GemmWsConfig | None) -> dict:
    """gate_up then SiLU-and-mul at M rows, three ways, each a CUDA graph over rotated weight copies:
    F.linear + kernels.silu_and_mul (the engine today), gemm_ws + silu_and_mul, and gemm_silu_ws
    (the product in the GEMM's epilogue); cfg: the gate_up case's best (one split), else the default."""
    from radixrt.kernels import silu_and_mul

    n, k, _ = SHAPES["gate_up"]
    copies = max(1, min(CALLS, math.ceil(ROTATE_BYTES / (n * k * 2))))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n // 2, device="cuda", dtype=torch.bfloat16)
    cfg = G.GemmWsConfig(cfg.block_n, cfg.block_k, cfg.stages, 1) if cfg else G.default_config(m, n, k)
    full = x.float() @ weights[0].float().t()
    ref = F.silu(full[:, : n // 2]) * full[:, n // 2:]
    forms = {"F.linear + silu_and_mul": lambda w: silu_and_mul(F.linear(x, w)),
             "gemm_ws + silu_and_mul": lambda w: silu_and_mul(G.gemm_ws(x, w, config=cfg)),
             "gemm_silu_ws": lambda w: G.gemm_silu_ws(x, w, out=y, config=cfg)}
    res = {"m": m, "mp": G.rows_padded(m), "n": n, "k": k, "config": asdict(cfg), "forms": {}}
    for name, fn in forms.items():
        try:
            err = common.rel_err(fn(weights[0]), ref)

            def calls(fn=fn):
                for i in range(CALLS):
                    fn(weights[i % copies])

            calls()
            res["forms"][name] = {"us": graph_us(calls), "rel_err": err}
        except Exception as e:  # noqa: BLE001
            res["forms"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    log(f"gate_up + SiLU M={m} ({cfg}): " + ", ".join(
        f"{k_}: {v.get('us', float('nan')):.1f} us (err {v.get('rel_err', float('nan')):.1e})"
        for k_, v in res["forms"].items()))
    weights.clear()
    torch.cuda.empty_cache()
    return res


def gated_wins(g: dict) -> bool:
    """Whether run_gated's fused form (gemm_silu_ws) beat both unfused forms by MIN_SPEEDUP, each
    checked against the fp32 reference first (relative error < 1e-2)."""
    def us(name):
        f = g["forms"].get(name, {})
        return f["us"] if f.get("rel_err", 1) < 1e-2 and "us" in f else math.inf

    fused, unfused = us("gemm_silu_ws"), min(us("F.linear + silu_and_mul"), us("gemm_ws + silu_and_mul"))
    return fused < math.inf and unfused / fused >= MIN_SPEEDUP


def report(out: dict) -> dict[str, list[int]]:
    """Print the cases' table and the TUNED / TUNED_GATED lines of the winners (gemm_ws at least
    MIN_SPEEDUP faster than F.linear; gemm_silu_ws per gated_wins), and return them as a TUNED file's
    entries ({"MP,N,K": [block_n, block_k, stages, splits]}, "MP,N,K,silu" for the SwiGLU form)."""
    print("\n| linear | M | F.linear us | gemm_ws us (config) | ratio | TB/s weights, F.linear -> gemm_ws |")
    print("|---|---|---|---|---|---|")
    tuned, entries = [], {}
    for c in out["cases"]:
        if "best" not in c:
            continue
        b = c["best"]
        gb = c["n"] * c["k"] * 2 / 1e3
        cfg = G.GemmWsConfig(**b["config"])
        print(f"| {c['name']} | {c['m']} | {c['torch_us']:.1f} | {b['us']:.1f} ({cfg.block_n}x{cfg.block_k}x"
              f"{cfg.stages}, {b['splits_used']} splits) | {b['us'] / c['torch_us']:.3f} | "
              f"{gb / c['torch_us']:.2f} -> {gb / b['us']:.2f} |")
        if c["torch_us"] / b["us"] >= MIN_SPEEDUP:
            tuned.append(f"    ({c['mp']}, {c['n']}, {c['k']}): GemmWsConfig({cfg.block_n}, {cfg.block_k}, "
                         f"{cfg.stages}, {cfg.splits}),  # {b['us']:.1f} vs F.linear {c['torch_us']:.1f} us")
            # cases of one MP share a key: the first measured (M = MP, the graphs' padded batch) holds it
            entries.setdefault(f"{c['mp']},{c['n']},{c['k']}",
                               [cfg.block_n, cfg.block_k, cfg.stages, cfg.splits])
    print("\nTUNED lines:\n" + "\n".join(tuned))
    for g in out.get("gated", []):
        if not gated_wins(g):
            continue
        cfg = G.GemmWsConfig(**g["config"])
        print(f"TUNED_GATED line: ({g['mp']}, {g['n']}, {g['k']}): GemmWsConfig({cfg.block_n}, "
              f"{cfg.block_k}, {cfg.stages}, 1),  # {g['forms']['gemm_silu_ws']['us']:.1f} us")
        entries.setdefault(f"{g['mp']},{g['n']},{g['k']},silu", [cfg.block_n, cfg.block_k, cfg.stages, 1])
    return entries


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="128,64,100")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tuned-out", default=None, help="write the winners as a RADIXRT_GEMM_WS_TUNED file")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    deadline = T0 + args.budget_s
    out = {**common.run_header(), "cases": []}
    for m in (int(v) for v in args.m.split(",")):
        for name in args.shapes.split(","):
            if time.time() > deadline:
                log(f"budget spent before {name} M={m}")
                continue
            out["cases"].append(run_case(name, m, sms, deadline))
            common.write_json(args.out, out)
    best_gate_up = {c["m"]: G.GemmWsConfig(**c["best"]["config"]) for c in out["cases"]
                    if c["name"] == "gate_up" and "best" in c}
    out["gated"] = [run_gated(m, best_gate_up.get(m)) for m in (int(v) for v in args.m.split(","))
                    if time.time() < deadline + 30]
    common.write_json(args.out, out)
    entries = report(out)
    common.write_json(args.out, out)
    if args.tuned_out:  # the winners as a TUNED file (kernels/gemm_ws.py TUNED_ENV)
        common.write_json(args.tuned_out, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
