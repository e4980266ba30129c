"""Where FP8 weights spend `random`'s time, and the Triton FP8 GEMM's configs (issue 19, H200).

One process (~7 minutes on an H200, Qwen2.5-7B shape, dummy weights):
  1. linears: one layer's four linears (qkv, o, gate_up, down) and the LM head at the decode rows
     of `random` (M = 32..256) and prefill rows (512..8192): bf16 (models/linear.py's routing),
     FP8 through per-token quantization + torch._scaled_mm (Fp8Linear's path until now), the
     quantization alone, _scaled_mm alone, and kernels/gemm_fp8.py's Triton FP8 GEMM over a config
     grid (each config checked against _scaled_mm's output first, then timed; best per shape and M,
     with and without the quantization). CUDA-graph replay over rotating weight copies (>= 256 MB
     per timed graph, several times the 50 MB L2), median;
  2. the LM head at M = 1 (batch-1 decode): bf16 against the FP8 int GEMV's configs;
  3. Engines (--engines, names from ENGINES; by default bf16, --quantization fp8, FP8 +
     --kv-cache-dtype fp8_e4m3, then both FP8 ones again with the grid's winners installed in
     gemm_fp8.FP8_GEMM_TUNED where they beat _scaled_mm): batch-1 decode step, then `random` (256 x
     512 in / 256 out) twice, cold (fresh radix tree) and warm (the same prompts again:
     bench/fp8_bench.py's best-of-2 takes this one), each traced pass by pass: device busy time in
     prefill/extend passes vs decode passes, passes, decode batch sizes;
  4. (--only attention) FP8-pool decode attention at 256 x 640 with the rule's split count and with
     the 33 splits a graph sized for 32K tokens ran before 2026-12-02, beside the bf16 pool.
Prints the tables (ratios to the bf16 engine of the same run); JSON to --out after each stage; the
winners as a Python table (--tuned-out).

    python3 bench/lab/fp8_random_profile.py --out $OUT/fp8-random-profile.json --budget-s 420
    # the FP8-KV decode check: stage fp8kv-check of bench/h200_run.sh (--only attention,engines
    # --engines bf16,fp8,fp8_kv8,kv8,fp8_head_bf16,fp8_kv8_before)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
LM_HEAD = (152064, 3584)
DECODE_M = (32, 64, 128, 256)
PREFILL_M = (512, 8192)
ROTATE_BYTES = 256 << 20
T0 = time.perf_counter()
KV8 = {"kv_cache_dtype": "fp8_e4m3"}
# name -> Engine flags, whether the grid's Triton FP8 GEMM winners are routed, whether `random` runs
# (else the batch-1 step only), whether the decode graphs and split rule are as before 2026-12-02
ENGINES: dict[str, dict[str, Any]] = {
    "bf16": {"flags": {}},
    "fp8": {"flags": {"quantization": "fp8"}},
    "fp8_triton": {"flags": {"quantization": "fp8"}, "triton": True},
    "fp8_kv8": {"flags": {"quantization": "fp8", **KV8}},
    "fp8_triton_kv8": {"flags": {"quantization": "fp8", **KV8}, "triton": True},
    "kv8": {"flags": KV8},  # bf16 weights, FP8 KV pool
    "fp8_head_bf16": {"flags": {"quantization": "fp8", "lm_head_quantization": "none"}, "random": False},
    "fp8_kv8_before": {"flags": {"quantization": "fp8", **KV8}, "before": True},
    # Fp8Linear class attributes set for the engine's life: the linears quantizing their own input
    # (as before 2026-12-03's fused RMSNorm / SiLU quantization), _scaled_mm without fast accumulation
    "fp8_kv8_unfused": {"flags": {"quantization": "fp8", **KV8}, "fp8_attrs": {"fused_quant": False}},
    "fp8_kv8_promoted": {"flags": {"quantization": "fp8", **KV8}, "fp8_attrs": {"fast_accum": False}},
    # the fused SiLU-and-mul + FP8 quantization at every row count (activation.QUANT_FUSED_MIN_ROWS = 1;
    # its one-pass form since 2026-12-03 evening)
    "fp8_kv8_silu_all": {"flags": {"quantization": "fp8", **KV8}, "silu_min_rows": 1},
    # the FP8 pool's decode config at every program count (no "many" switch: launch_config; splits of
    # >= 512 keys still take the "long" config)
    "fp8_kv8_nomany": {"flags": {"quantization": "fp8", **KV8},
                       "attn": {"decode_fp8": {"d128": {"many_per_sm": 0}}}},
}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def graph_us(fn: Any, calls: int, rep: int = 20) -> float:
    """Median device time (us) of one of `calls` calls that fn() makes, from a CUDA graph (do_bench's
    rep: ms of replays)."""
    import triton.testing

    fn()
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")) * 1e3 / calls


def grid(m: int) -> list[Any]:
    """The Triton FP8 GEMM configs tried at M rows."""
    from radixrt.kernels.gemm_fp8 import Fp8GemmConfig as C

    if m <= 64:
        return [C(m, 64, 128, 4, 4, swap_ab=True, split_k=s) for s in (1, 2, 4)] + [
            C(m, 128, 128, 4, 4, swap_ab=True, split_k=s) for s in (1, 2)
        ]
    if m <= 256:
        return [
            C(64, 64, 128, 4, 4),
            C(64, 128, 128, 4, 4),
            C(128, 128, 128, 4, 4),
            C(128, 128, 128, 8, 3),
            C(64, 64, 128, 4, 4, split_k=2),
            C(m, 64, 128, 4, 3, swap_ab=True),
        ]
    return [C(128, 128, 128, 4, 4), C(128, 128, 128, 8, 4), C(128, 256, 128, 8, 3), C(128, 256, 64, 8, 4)]


class Shape:
    """Weight copies of one [N, K] linear in bf16 and FP8 (enough to rotate past L2)."""

    def __init__(self, n: int, k: int) -> None:
        from radixrt.models.quant.fp8 import quantize_per_channel

        dev = torch.device("cuda")
        self.n, self.k = n, k
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        c16 = max(1, -(-ROTATE_BYTES // (2 * n * k)))
        c8 = max(1, -(-ROTATE_BYTES // (n * k)))
        self.w16 = [w.clone() for _ in range(c16)]
        q, s = quantize_per_channel(w)
        self.w8 = [(q.clone(), s.clone()) for _ in range(c8)]


def bench_shape(name: str, sh: Shape, m: int, row: dict[str, Any], deadline: float) -> None:
    """Fill row with this shape's times at M rows (us per call) and the grid's best."""
    from radixrt.kernels import fp8_gemm, per_token_quant_fp8
    from radixrt.kernels.gemv import SkinnyWorkspace
    from radixrt.models.linear import Linear

    dev = torch.device("cuda")
    x = torch.randn(m, sh.k, device=dev, dtype=torch.bfloat16)
    xq, xs = per_token_quant_fp8(x)
    lins = []
    for w in sh.w16:
        lin = Linear(sh.k, sh.n, bias=False, device="meta", dtype=torch.bfloat16)
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        lins.append(lin)

    def scaled_mm(q: torch.Tensor, s: torch.Tensor, w: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(q, w.t(), scale_a=s, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16)

    r: dict[str, Any] = {}
    r["bf16_us"] = graph_us(lambda: [lin(x) for lin in lins], len(lins))
    c8 = len(sh.w8)
    r["quant_us"] = graph_us(lambda: [per_token_quant_fp8(x) for _ in range(8)], 8)
    r["scaled_mm_only_us"] = graph_us(lambda: [scaled_mm(xq, xs, w, s) for w, s in sh.w8], c8)
    r["scaled_mm_us"] = graph_us(lambda: [scaled_mm(*per_token_quant_fp8(x), w, s) for w, s in sh.w8], c8)
    ref = scaled_mm(xq, xs, *sh.w8[0]).float()
    best = None
    r["grid"] = []
    for cfg in grid(m):
        if time.perf_counter() > deadline:
            r["grid_cut"] = True
            break
        p, c = cfg.workspace_need(m, sh.n, sh.k)
        ws = SkinnyWorkspace.allocate(max(p, 1), max(c, 1), dev)
        try:
            y = fp8_gemm(xq, xs, *sh.w8[0], config=cfg, workspace=ws).float()
            err = float((y - ref).norm() / ref.norm())
            if not err < 1e-2 or not torch.isfinite(y).all():
                r["grid"].append({"cfg": repr(cfg), "error": f"rel err {err:.3g}"})
                continue
            us = graph_us(
                lambda cfg=cfg, ws=ws: [fp8_gemm(xq, xs, w, s, config=cfg, workspace=ws) for w, s in sh.w8],
                c8,
            )
        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped and reported
            r["grid"].append({"cfg": repr(cfg), "error": repr(e)[:200]})
            continue
        r["grid"].append({"cfg": repr(cfg), "us": us, "rel_err": err})
        if best is None or us < best[1]:
            best = (cfg, us, ws)
    if best is not None:
        cfg, us, ws = best
        r["triton_only_us"], r["triton_cfg"] = us, cfg
        r["triton_us"] = graph_us(
            lambda: [fp8_gemm(*per_token_quant_fp8(x), w, s, config=cfg, workspace=ws) for w, s in sh.w8], c8
        )
    row[name] = r


def bench_linears(deadline: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shapes = {name: Shape(*nk) for name, nk in SHAPES.items()}
    shapes["lm_head"] = Shape(*LM_HEAD)
    for m in DECODE_M + PREFILL_M:
        row: dict[str, Any] = {}
        for name, sh in shapes.items():
            if name == "lm_head" and m > 256:
                continue  # logits are computed for the last token of each request only
            bench_shape(name, sh, m, row, deadline)
        out[m] = row
        log(
            f"linears M={m}: "
            + ", ".join(
                f"{n} bf16 {r['bf16_us']:.1f} smm {r['scaled_mm_us']:.1f} "
                f"tri {r.get('triton_us', float('nan')):.1f}"
                for n, r in row.items()
            )
        )
    del shapes
    torch.cuda.empty_cache()
    return out


def bench_lm_head_b1() -> dict[str, Any]:
    """The LM head at M = 1: bf16 (skinny / cuBLAS as routed) and the FP8 int GEMV's configs."""
    from radixrt.kernels.gemv_fp8_int import Fp8IntConfig, fp8_int_config, fp8_skinny_linear
    from radixrt.models.linear import Linear

    dev = torch.device("cuda")
    sh = Shape(*LM_HEAD)
    x = torch.randn(1, sh.k, device=dev, dtype=torch.bfloat16)
    lins = []
    for w in sh.w16:
        lin = Linear(sh.k, sh.n, bias=False, device="meta", dtype=torch.bfloat16)
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        lins.append(lin)
    res: dict[str, Any] = {"bf16_us": graph_us(lambda: [lin(x) for lin in lins], len(lins)), "fp8": {}}
    rule = fp8_int_config(1, *LM_HEAD)
    for cfg in {
        rule,
        Fp8IntConfig(4, 256),
        Fp8IntConfig(8, 128),
        Fp8IntConfig(16, 128),
        Fp8IntConfig(4, 512),
        Fp8IntConfig(8, 256),
        Fp8IntConfig(16, 256),
    }:
        us = graph_us(lambda cfg=cfg: [fp8_skinny_linear(x, w, s, config=cfg) for w, s in sh.w8], len(sh.w8))
        res["fp8"][repr(cfg)] = us
    res["rule"] = repr(rule)
    log(
        f"LM head M=1: bf16 {res['bf16_us']:.1f} us, fp8 int "
        + ", ".join(f"{k} {v:.1f}" for k, v in res["fp8"].items())
    )
    return res


def split_trace(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Busy time (ms) and passes of the prefill/extend passes (EXTEND, MIXED) and the DECODE passes."""
    out: dict[str, Any] = {}
    for label, modes in (("extend", (1, 3)), ("decode", (2,))):
        rs = [r for r in rows if r["mode"] in modes]
        out[f"{label}_passes"] = len(rs)
        out[f"{label}_busy_ms"] = sum(r["busy_ms"] for r in rs)
        out[f"{label}_tokens"] = sum(r["num_tokens"] for r in rs)
    dec = sorted(r["busy_ms"] for r in rows if r["mode"] == 2 and r["batch_size"] >= 240)
    out["decode_bs240plus_median_ms"] = dec[len(dec) // 2] if dec else None
    out["gap_ms"] = sum(r["gap_ms"] for r in rows if r["gap_ms"] > 0)
    sizes = [r["batch_size"] for r in rows if r["mode"] == 2]
    out["decode_batch_mean"] = sum(sizes) / len(sizes) if sizes else None
    return out


@contextlib.contextmanager
def as_before_fix() -> Iterator[None]:
    """Decode graphs and the FP8 split rule as before 2026-12-02: one graph per batch size, sized for
    the context length (a single length class), and decode_splits_fp8 without its per-program cost."""
    from radixrt.kernels import attention_configs
    from radixrt.worker import cuda_graph

    saved = cuda_graph.SHORTEST_LEN_CLASS
    cuda_graph.SHORTEST_LEN_CLASS = 1 << 40
    try:
        with attention_configs.overriding({"decode_splits_fp8": {"d128": {"program_tokens": 0}}}):
            yield
    finally:
        cuda_graph.SHORTEST_LEN_CLASS = saved


@contextlib.contextmanager
def fp8_linear_attrs(attrs: dict[str, Any]) -> Iterator[None]:
    """Fp8Linear's class attributes (fused_quant, fast_accum, ...) set to `attrs` inside the block."""
    from radixrt.models.quant.fp8 import Fp8Linear

    saved = {k: getattr(Fp8Linear, k) for k in attrs}
    for k, v in attrs.items():
        setattr(Fp8Linear, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(Fp8Linear, k, v)


@contextlib.contextmanager
def silu_min_rows(rows: int | None) -> Iterator[None]:
    """kernels.activation.QUANT_FUSED_MIN_ROWS set to `rows` inside the block (None: unchanged)."""
    from radixrt.kernels import activation

    saved = activation.QUANT_FUSED_MIN_ROWS
    if rows is not None:
        activation.QUANT_FUSED_MIN_ROWS = rows
    try:
        yield
    finally:
        activation.QUANT_FUSED_MIN_ROWS = saved


def bench_attention() -> list[dict[str, Any]]:
    """Decode attention (fp8_bench's harness): 256 x 640 at the rule's split counts and with 33 FP8
    splits, and 64 x 4,096."""
    from bench.fp8_bench import bench_decode_attention

    rows = [bench_decode_attention(256, 640), bench_decode_attention(256, 640, fp8_splits=33),
            bench_decode_attention(64, 4096)]
    for r in rows:
        log(f"decode attention {r['batch']} x {r['seq_len']}: bf16 {r['bf16_us']:.1f} us ({r['bf16_splits']} "
            f"splits), fp8 {r['fp8_us']:.1f} us ({r['fp8_splits']} splits), "
            f"fp8 / bf16 {r['fp8_over_bf16']:.3f}")
    return rows


def bench_engine(name: str, path: Path, random: bool = True, **kw: Any) -> dict[str, Any]:
    from bench.gpu_engine import decode_step_ms, traced, workloads
    from bench.offline import run_workload
    from radixrt.engine import Engine
    from radixrt.scheduler.factory import build_scheduler

    t = time.perf_counter()
    engine = Engine(
        model_path=str(path),
        load_format="dummy",
        device="cuda",
        max_running_requests=256,
        chunked_prefill_size=8192,
        cuda_graph_max_bs=256,
        mem_fraction_static=0.45,
        **kw,
    )
    res: dict[str, Any] = {"flags": kw, "start_s": time.perf_counter() - t}
    graphs = engine.runner.graphs
    res["decode_graphs"] = len(graphs.graphs) if graphs is not None else 0
    res["decode_b1_ms"] = decode_step_ms(engine, 128, 128)
    log(f"{name}: start {res['start_s']:.0f} s ({res['decode_graphs']} decode graphs), "
        f"batch-1 {res['decode_b1_ms']:.3f} ms")
    if not random:
        return res
    spec = workloads(False, int(engine.info["vocab_size"]))[0]
    engine.scheduler = build_scheduler(engine.args, engine.info)  # fresh tree: a cold run
    for run in ("cold", "warm"):
        r, rows = traced(engine, lambda: run_workload(engine, spec.build()))
        res[run] = {
            "output_tok_per_s": r["output_throughput"],
            "wall_s": r["wall_s"],
            "cache_hit_rate": r["cache_hit_rate"],
            **split_trace(rows),
        }
        c = res[run]
        log(
            f"{name} {run}: {c['output_tok_per_s']:.0f} tok/s, wall {c['wall_s']:.3f} s, "
            f"hit {c['cache_hit_rate']:.2f}, "
            f"extend {c['extend_passes']} passes {c['extend_busy_ms']:.0f} ms, decode {c['decode_passes']} "
            f"passes {c['decode_busy_ms']:.0f} ms (bs>=240 median {c['decode_bs240plus_median_ms']}), "
            f"gaps {c['gap_ms']:.0f} ms"
        )
    return res


def winners(lin: dict[Any, Any]) -> dict[tuple[int, int, int], Any]:
    """(M, N, K) -> best Triton config where it beat _scaled_mm with the quantization counted in both."""
    out = {}
    for m, row in lin.items():
        for name, r in row.items():
            nk = LM_HEAD if name == "lm_head" else SHAPES[name]
            if "triton_us" in r and r["triton_us"] < r["scaled_mm_us"]:
                out[(int(m), *nk)] = r["triton_cfg"]
    return out


def print_tables(rep: dict[str, Any]) -> None:
    lin = rep.get("linears", {})
    if lin:
        print(
            "\n| M | linear | bf16 us | quant us | _scaled_mm only | _scaled_mm + quant | triton only | "
            "triton + quant | best triton config | fp8 best / bf16 |\n"
            "|---|---|---|---|---|---|---|---|---|---|"
        )
        for m, row in lin.items():
            layer = {"bf16": 0.0, "smm": 0.0, "best": 0.0}
            for name, r in row.items():
                t = r.get("triton_us", float("inf"))
                best = min(t, r["scaled_mm_us"])
                if name != "lm_head":
                    layer["bf16"] += r["bf16_us"]
                    layer["smm"] += r["scaled_mm_us"]
                    layer["best"] += best
                print(
                    f"| {m} | {name} | {r['bf16_us']:.1f} | {r['quant_us']:.1f} | "
                    f"{r['scaled_mm_only_us']:.1f} | "
                    f"{r['scaled_mm_us']:.1f} | {r.get('triton_only_us', float('nan')):.1f} | "
                    f"{t:.1f} | "
                    f"{r.get('triton_cfg', '')} | {best / r['bf16_us']:.3f} |"
                )
            print(
                f"| {m} | **layer** | {layer['bf16']:.1f} | | | "
                f"{layer['smm']:.1f} ({layer['smm'] / layer['bf16']:.3f}) "
                f"| | {layer['best']:.1f} | | "
                f"{layer['best'] / layer['bf16']:.3f} |"
            )
    att = rep.get("attention", [])
    if att:
        print("\n| decode attention | bf16 us (splits) | fp8 us (splits) | fp8 / bf16 |\n|---|---|---|---|")
        for r in att:
            print(f"| {r['batch']} x {r['seq_len']} | {r['bf16_us']:.1f} ({r['bf16_splits']}) | "
                  f"{r['fp8_us']:.1f} ({r['fp8_splits']}) | {r['fp8_over_bf16']:.3f} |")
    print_engines(rep.get("engines", {}))


def print_engines(eng: dict[str, Any]) -> None:
    """One row per engine and run; every ratio is to the bf16 engine of the same run."""
    if not eng:
        return

    def base_of(name: str) -> dict | None:  # the bf16 engine of the same round
        return eng.get("bf16" + (name[name.index("#"):] if "#" in name else ""))

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.3f}" if x and y else ""

    print(
        "\n| engine | start s (graphs) | batch-1 ms | / bf16 | run | out tok/s | / bf16 | wall s | "
        "extend passes / busy ms | decode passes / busy ms | decode bs>=240 median ms | / bf16 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for name, e in eng.items():
        base = base_of(name)
        head = (f"| {name} | {e['start_s']:.0f} ({e['decode_graphs']}) | {e['decode_b1_ms']:.3f} | "
                f"{ratio(e['decode_b1_ms'], base and base['decode_b1_ms'])} |")
        if "cold" not in e:
            print(head + " | | | | | | | |")
        for run in ("cold", "warm") if "cold" in e else ():
            c, b = e[run], base and base.get(run)
            print(
                f"{head} {run} | {c['output_tok_per_s']:.0f} | "
                f"{ratio(c['output_tok_per_s'], b and b['output_tok_per_s'])} | {c['wall_s']:.3f} | "
                f"{c['extend_passes']} / {c['extend_busy_ms']:.0f} | "
                f"{c['decode_passes']} / {c['decode_busy_ms']:.0f} | {c['decode_bs240plus_median_ms']} | "
                f"{ratio(c['decode_bs240plus_median_ms'], b and b['decode_bs240plus_median_ms'])} |"
            )
    rounds: dict[str, list[tuple[float, float, float]]] = {}  # engine -> (cold / bf16, warm / bf16, b1)
    for name, e in eng.items():
        base = base_of(name)
        if "cold" in e and base and "cold" in base:
            rounds.setdefault(name.split("#")[0], []).append(
                (e["cold"]["output_tok_per_s"] / base["cold"]["output_tok_per_s"],
                 e["warm"]["output_tok_per_s"] / base["warm"]["output_tok_per_s"],
                 e["decode_b1_ms"] / base["decode_b1_ms"]))
    if any(len(v) > 1 for v in rounds.values()):
        print("\n| engine | rounds | cold / bf16 each round | median | warm / bf16 median | "
              "batch-1 / bf16 median |\n|---|---|---|---|---|---|")
        for name, v in rounds.items():
            each = ", ".join(f"{x[0]:.3f}" for x in v)
            print(f"| {name} | {len(v)} | {each} | {statistics.median(x[0] for x in v):.3f} | "
                  f"{statistics.median(x[1] for x in v):.3f} | {statistics.median(x[2] for x in v):.3f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new stages after this")
    p.add_argument("--only", default="linears,lm_head,engines",
                   help="stages: linears, lm_head, engines, attention")
    p.add_argument("--engines", default="bf16,fp8,fp8_triton,fp8_kv8,fp8_triton_kv8",
                   help=f"engines to run, in order, from: {', '.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the engine list this many times in turn (round r >= 2 names its engines "
                        "'name#r'; every ratio is to the bf16 engine of the same round; medians printed)")
    p.add_argument("--out", default="fp8-random-profile.json")
    p.add_argument("--tuned-out", default=None, help="write the grid's winners as FP8_GEMM_TUNED lines")
    ns = p.parse_args(argv)
    unknown = set(ns.engines.split(",")) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}")
    import_kernels()
    from bench.fp8_bench import model_dir
    from radixrt.kernels import attention_configs, gemm_fp8

    stages = ns.only.split(",")
    end = T0 + ns.budget_s
    rep: dict[str, Any] = {**run_header("cuda"), "command": " ".join(sys.argv)}
    if "attention" in stages:
        rep["attention"] = bench_attention()
        write_json(ns.out, rep)
    if "linears" in stages:
        rep["linears"] = bench_linears(deadline=T0 + 0.45 * ns.budget_s)
    lin_json = {
        m: {n: {**r, "triton_cfg": repr(r.get("triton_cfg"))} for n, r in row.items()}
        for m, row in rep.get("linears", {}).items()
    }
    write_json(ns.out, {**rep, "linears": lin_json})
    if "lm_head" in stages:
        rep["lm_head_b1"] = bench_lm_head_b1()
        write_json(ns.out, {**rep, "linears": lin_json})
    best = winners(rep.get("linears", {}))
    tuned_lines = [f"    ({m}, {n}, {k}): {cfg!r}," for (m, n, k), cfg in sorted(best.items())]
    print(
        "\nFP8_GEMM_TUNED winners (beat _scaled_mm, quantization counted):\n" + "\n".join(tuned_lines),
        flush=True,
    )
    if ns.tuned_out:
        Path(ns.tuned_out).write_text("\n".join(tuned_lines) + "\n")
    if "engines" in stages:
        path = model_dir(ns.model_config)
        rep["engines"] = {}
        routed = dict(gemm_fp8.FP8_GEMM_TUNED)  # the committed routing: every engine starts from it
        names = [n if r == 1 else f"{n}#{r}" for r in range(1, ns.rounds + 1) for n in ns.engines.split(",")]
        for name in names:
            if time.perf_counter() > end:
                log(f"budget spent: {name} not run")
                break
            spec = ENGINES[name.split("#")[0]]
            gemm_fp8.FP8_GEMM_TUNED.clear()
            gemm_fp8.FP8_GEMM_TUNED.update(routed)
            if spec.get("triton"):
                gemm_fp8.FP8_GEMM_TUNED.update(best)
            with (as_before_fix() if spec.get("before") else contextlib.nullcontext(),
                  fp8_linear_attrs(spec.get("fp8_attrs", {})), silu_min_rows(spec.get("silu_min_rows")),
                  attention_configs.overriding(spec.get("attn", {}))):
                rep["engines"][name] = bench_engine(name.split("#")[0], path, spec.get("random", True),
                                                    **spec["flags"])
            gc.collect()
            torch.cuda.empty_cache()
            write_json(ns.out, {**rep, "linears": lin_json})
    print_tables(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
