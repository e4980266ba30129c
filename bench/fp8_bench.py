"""FP8 on one GPU: weights (--quantization fp8) and KV cache (--kv-cache-dtype fp8_e4m3) against bf16.

One process, about 6 minutes on an H200 with the Qwen2.5-7B shape and dummy weights:
  1. decode attention, batch 64 x 4,096 tokens (and 128 x 2,048): bf16 pool vs FP8 pool, kernel
     time in a CUDA graph (goal: FP8 <= 0.6x bf16);
  2. the decode linears of one layer at M = 1..64 rows: bf16 (as models/linear.py routes it), FP8
     through fp8_skinny_linear (Fp8Linear's decode path: the int GEMV at M <= 2, the Triton skinny
     GEMM above, both W8A16) and FP8 through per-token quantization + _scaled_mm,
     so RADIXRT_FP8_SKINNY_MAX_ROWS can be set from the crossover;
  3. an Engine in bf16, then one with --quantization fp8 (then, with --kv-fp8-engine, one with both
     FP8 weights and KV): batch-1 decode step (goal: FP8 <= 0.6x bf16) and the `random` workload's
     output tok/s (goal: FP8 >= 1.5x bf16), with bench/gpu_engine.py's workload code.
Prints one table; JSON to --out after each stage.

    python3 bench/fp8_bench.py --model-config qwen2.5-7b --load-format dummy --out $OUT/fp8.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import run_header, write_json  # noqa: E402
from bench.gpu_engine import decode_step_ms, workloads  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402
from bench.offline import run_workload  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"
# one decoder layer of Qwen2.5-7B: qkv, o_proj, gate_up, down ([N, K])
LAYER_SHAPES = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)]


def model_dir(name: str) -> Path:
    """bench/configs/<name>, or the one directory there whose name starts with `name`, or a path."""
    if Path(name).is_dir():
        return Path(name)
    hits = sorted(p for p in CONFIGS.iterdir() if p.name == name or p.name.startswith(name))
    if not hits:
        raise SystemExit(f"no model config {name!r} in {CONFIGS}")
    return hits[0]


def graph_us(fn: Any, rep: int = 200) -> float:
    """Median device time (us) of fn() replayed from a CUDA graph (triton.testing.do_bench_cudagraph)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")) * 1e3


def bench_decode_attention(batch: int, seq_len: int, hq: int = 28, hkv: int = 4, d: int = 128,
                           page_size: int = 16, fp8_splits: int | None = None) -> dict[str, Any]:
    """decode_attention over a random-page bf16 pool and the same pool in FP8 (scales 1.0), each with
    the split count the attention backend gives its pool dtype (choose_num_kv_splits(kv_fp8=)), or
    fp8_splits for the FP8 pool when given (e.g. what a graph sized for a longer context runs), and
    max_seq_len = seq_len, so the launch config is the backend's for a length class of seq_len
    (since 2026-12-03; before, the base config at every program count)."""
    from radixrt.kernels import choose_num_kv_splits, decode_attention

    dev = torch.device("cuda")
    pages_per_req = seq_len // page_size
    num_pages = batch * pages_per_req + 1
    perm = torch.randperm(num_pages - 1, device=dev).int() + 1
    page_table = perm.view(batch, pages_per_req)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=dev)
    k = torch.randn(num_pages * page_size, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = torch.empty_like(q)
    row: dict[str, Any] = {"batch": batch, "seq_len": seq_len}
    for name, kb, vb in (("bf16", k, v), ("fp8", k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn))):
        # (until 2026-12-02 the FP8 pool ran with the bf16 split count here, not the backend's)
        splits = choose_num_kv_splits(batch, hkv, seq_len, num_sms, kv_fp8=name == "fp8")
        if name == "fp8" and fp8_splits is not None:
            splits = fp8_splits
        row[f"{name}_splits"] = splits
        mid_o = torch.empty(batch, hq, splits, d, device=dev)
        mid_lse = torch.empty(batch, hq, splits, device=dev)

        def run(kb=kb, vb=vb, splits=splits, mid_o=mid_o, mid_lse=mid_lse) -> None:
            decode_attention(q, kb, vb, page_table, seq_lens, page_size, None, splits, out=out,
                             mid_o=mid_o, mid_lse=mid_lse, max_seq_len=seq_len)  # as the backend
        run()  # compile outside the graph
        row[f"{name}_us"] = graph_us(run)
        row[f"{name}_kv_bytes"] = 2 * batch * seq_len * hkv * d * kb.element_size()
    row["fp8_over_bf16"] = row["fp8_us"] / row["bf16_us"]
    return row


def bench_linears(rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[dict[str, Any]]:
    """One layer's four linears (Qwen2.5-7B) at M rows: bf16 Linear, FP8 fp8_skinny_linear (W8A16; the
    int GEMV at M <= 2), FP8 _scaled_mm."""
    from radixrt.kernels import fp8_skinny_linear
    from radixrt.models.linear import Linear
    from radixrt.models.quant.fp8 import Fp8Linear, quantize_per_token

    dev = torch.device("cuda")
    layers = []
    for n, k in LAYER_SHAPES:
        lin = Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16).requires_grad_(False)
        lin.weight.normal_(0.0, 0.02)
        with torch.device("meta"):
            meta = Linear(k, n, bias=False, dtype=torch.bfloat16)
        f8 = Fp8Linear.from_linear(meta).to_empty(device=dev)
        f8.set_weight(lin.weight)
        layers.append((lin, f8))

    def bf16(x: list[torch.Tensor]) -> None:
        for (lin, _), xi in zip(layers, x, strict=True):
            lin(xi)

    def fp8_skinny(x: list[torch.Tensor]) -> None:
        for (_, f8), xi in zip(layers, x, strict=True):
            fp8_skinny_linear(xi, f8.weight, f8.weight_scale, None, workspace=f8._scratch(dev))

    def fp8_scaled_mm(x: list[torch.Tensor]) -> None:
        for (_, f8), xi in zip(layers, x, strict=True):
            f8._scaled_mm(*quantize_per_token(xi), xi.dtype)  # the quantization included, as before

    out = []
    for m in rows:
        x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _, k in LAYER_SHAPES]
        res: dict[str, Any] = {"m": m}
        for fn in (bf16, fp8_skinny, fp8_scaled_mm):
            if fn is fp8_skinny and m > 16:
                continue  # the reduce / dot paths are tuned for <= 16 rows (gemv.default_config)
            fn(x)  # compiles, and allocates the split-K workspaces outside the graph
            res[f"{fn.__name__}_us"] = graph_us(lambda fn=fn, x=x: fn(x))
        out.append(res)
    return out


def bench_engine(path: Path, load_format: str, small: bool, **kw: Any) -> dict[str, Any]:
    """Batch-1 decode step and `random` output tok/s (best of 2) of an Engine with ServerArgs `kw`."""
    from radixrt.engine import Engine

    t = time.perf_counter()
    engine = Engine(model_path=str(path), load_format=load_format, device="cuda", max_running_requests=256,
                    chunked_prefill_size=8192, cuda_graph_max_bs=256, mem_fraction_static=0.45, **kw)
    res: dict[str, Any] = {"flags": kw, "start_s": time.perf_counter() - t,
                           "kv_cache_dtype": engine.info.get("kv_cache_dtype"),
                           "weight_bytes": sum(p.numel() * p.element_size()
                                               for n, p in engine.runner.model.named_parameters()
                                               if "embed_tokens" not in n)}
    res["decode_b1_ms"] = decode_step_ms(engine, 128, 32 if small else 128)
    spec = workloads(small, int(engine.info["vocab_size"]))[0]  # random
    runs = [run_workload(engine, spec.build()) for _ in range(2)]
    best = max(runs, key=lambda r: r["output_throughput"])
    res["random_output_tok_per_s"] = best["output_throughput"]
    res["random_wall_s"] = best["wall_s"]
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return res


def print_table(report: dict[str, Any]) -> None:
    rows = []
    for a in report.get("attention", []):
        rows.append((f"decode attention {a['batch']} x {a['seq_len']} (us)", a["bf16_us"], a["fp8_us"], 0.6))
    for lr in report.get("linears", []):
        best = min(lr.get("fp8_skinny_us", float("inf")), lr["fp8_scaled_mm_us"])
        int_gemv = " (int GEMV)" if lr["m"] <= 2 else ""
        rows.append((f"layer linears M={lr['m']} (us; fp8 = best of skinny{int_gemv} "
                     f"{lr.get('fp8_skinny_us', float('nan')):.1f} / scaled_mm {lr['fp8_scaled_mm_us']:.1f})",
                     lr["bf16_us"], best, None))
    eng = report.get("engines", {})
    if "bf16" in eng and "fp8" in eng:
        b, f = eng["bf16"], eng["fp8"]
        rows.append(("batch-1 decode step (ms)", b["decode_b1_ms"], f["decode_b1_ms"], 0.6))
        rows.append(("random output tok/s", b["random_output_tok_per_s"], f["random_output_tok_per_s"], 1.5))
        if "fp8_head_bf16" in eng:
            h = eng["fp8_head_bf16"]
            rows.append(("batch-1 decode step (ms), FP8 weights, bf16 LM head", b["decode_b1_ms"],
                         h["decode_b1_ms"], 0.6))
            rows.append(("random output tok/s, FP8 weights, bf16 LM head", b["random_output_tok_per_s"],
                         h["random_output_tok_per_s"], 1.5))
        if "fp8_kv8" in eng:
            rows.append(("random output tok/s, FP8 weights + FP8 KV", b["random_output_tok_per_s"],
                         eng["fp8_kv8"]["random_output_tok_per_s"], 1.5))
    print("\n| figure | bf16 | fp8 | fp8 / bf16 | goal |\n|---|---|---|---|---|")
    for name, b, f, goal in rows:
        goal_s = "" if goal is None else (f"<= {goal}" if goal < 1 else f">= {goal}")
        print(f"| {name} | {b:.2f} | {f:.2f} | {f / b:.3f} | {goal_s} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b", help="bench/configs/<name> (prefix) or a dir")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--only", default="attention,linears,engines", help="comma-separated stages")
    p.add_argument("--kv-fp8-engine", action="store_true", help="also an Engine with FP8 weights and KV")
    p.add_argument("--head-bf16-engine", action="store_true",
                   help="also an Engine with FP8 weights and a bf16 LM head (--lm-head-quantization none)")
    p.add_argument("--small", action="store_true", help="short workloads (a quick check)")
    p.add_argument("--out", default="fp8.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    import_kernels()
    stages = ns.only.split(",")
    path = model_dir(ns.model_config)
    report: dict[str, Any] = {**run_header("cuda"), "model_path": str(path), "command": " ".join(sys.argv)}
    if "attention" in stages:
        report["attention"] = [bench_decode_attention(64, 4096), bench_decode_attention(128, 2048)]
        write_json(ns.out, report)
    if "linears" in stages:
        report["linears"] = bench_linears()
        write_json(ns.out, report)
    if "engines" in stages:
        flags = {"bf16": {}, "fp8": {"quantization": "fp8"}}
        if ns.head_bf16_engine:
            flags["fp8_head_bf16"] = {"quantization": "fp8", "lm_head_quantization": "none"}
        if ns.kv_fp8_engine:
            flags["fp8_kv8"] = {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}
        report["engines"] = {}
        for name, kw in flags.items():
            report["engines"][name] = r = bench_engine(path, ns.load_format, ns.small, **kw)
            print(f"{name}: batch-1 {r['decode_b1_ms']:.2f} ms/token, random "
                  f"{r['random_output_tok_per_s']:.0f} tok/s, weights {r['weight_bytes'] / 2**30:.2f} GiB",
                  flush=True)
            write_json(ns.out, report)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
