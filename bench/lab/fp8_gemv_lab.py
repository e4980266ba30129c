"""FP8 GEMV lab (issue 19): a config grid of the cvt-free e4m3 kernel (kernels/gemv_fp8_int.py, the FP8
default at M <= 2 since 2026-12-02) against the skinny FP8 path (the default before; M >= 3 still) and
bf16, M = 1, 2, 4, the four Qwen2.5-7B linears, then the batch-1 decode step of three Engines (bf16,
FP8 on the skinny path alone, FP8 as routed with this run's best int configs in FP8_INT_TUNED).
One table at the end, then FP8_INT_TUNED lines to paste; JSON to $OUT/fp8_lab.json.

    python3 bench/lab/fp8_gemv_lab.py [--budget-s 540] [--no-engines] [--rows 1,2,4]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import cuda_ms, graph_ms, rel_err, run_header  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import gemv as G  # noqa: E402
from radixrt.kernels import gemv_fp8_int as G8  # noqa: E402
from radixrt.kernels.gemv_fp8_int import fp8_int_gemv  # noqa: E402
from radixrt.models.quant.fp8 import quantize_per_channel  # noqa: E402

T0 = time.time()
DEV, BF16 = torch.device("cuda"), torch.bfloat16
LINEARS = {"gate_up": (37888, 3584), "down": (3584, 18944), "qkv": (4608, 3584), "o": (3584, 3584)}
ROTATE = 256 << 20
OUT = Path(os.environ.get("OUT", "."))
REPORT: dict = {}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "fp8_lab.json").write_text(json.dumps(REPORT, indent=1, default=str))


def grid(m: int) -> list[tuple[int, int, int, int]]:
    """(block_n, block_k4, warps, split) of the int kernel."""
    if m == 1:
        base = [(4, 256, 4), (4, 512, 4), (8, 256, 4), (8, 128, 4), (16, 128, 4), (8, 512, 4),
                (8, 256, 8), (16, 256, 8), (2, 512, 2), (4, 256, 2), (4, 128, 4), (16, 64, 4)]
        return ([(bn, bk, w, 1, False) for bn, bk, w in base] + [(8, 256, 4, 2, False), (8, 128, 4, 2, False)]
                + [(bn, bk, w, 1, True) for bn, bk, w in ((4, 256, 4), (8, 128, 4), (16, 128, 4), (4, 128, 4),
                                                        (8, 256, 4), (2, 512, 2))] + [(8, 128, 4, 2, True)])
    base = [(4, 128, 4), (4, 256, 4), (8, 128, 4), (8, 256, 4), (4, 512, 4), (16, 128, 4), (8, 64, 4),
            (4, 64, 4)]
    return ([(bn, bk, w, 1, False) for bn, bk, w in base] + [(8, 128, 4, 2, False)]
            + [(bn, bk, w, 1, True) for bn, bk, w in ((4, 128, 4), (8, 128, 4), (4, 64, 4), (8, 64, 4))])


class Shape:
    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        copies = max(1, math.ceil(ROTATE / (n * k)))
        self.w16 = [torch.randn(n, k, device=DEV, dtype=BF16) * 0.02 for _ in range(min(copies, 4))]
        self.w8 = [quantize_per_channel(self.w16[i % len(self.w16)]) for i in range(copies)]
        self.ws = G.SkinnyWorkspace.allocate(16 * 16 * n, n, DEV)


def timed(run, check, y) -> dict:
    try:
        y.fill_(float("nan"))
        run()
        if DEV.type == "cuda":
            torch.cuda.synchronize()
        err = check()
        if not err <= 1e-2:
            return {"error": f"rel err {err}"}
        return {"us": graph_ms(run, timer=lambda f: cuda_ms(f, warmup=10, rep=60)) * 1e3, "rel_err": err}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def _variant(row: dict, label: str, calls: list, y: torch.Tensor, ref: torch.Tensor, cfg=None) -> None:
    """row[label] = timed(one graph of `calls`) with the time per call."""
    def run() -> None:
        for c in calls:
            c()
    r = timed(run, lambda: rel_err(y, ref), y)
    if "us" in r:
        r["us"] /= len(calls)
    if cfg is not None:
        r["cfg"] = cfg
    row[label] = r


def bench_shapes(rows: tuple[int, ...], deadline: float) -> dict:
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count if DEV.type == "cuda" else 132
    res: dict = {}
    for name, (n, k) in LINEARS.items():
        sh = Shape(n, k)
        for m in rows:
            x = torch.randn(m, k, device=DEV, dtype=BF16)
            y = torch.empty(m, n, device=DEV, dtype=BF16)
            w8, s8 = sh.w8[-1]  # y holds the last call's result: that of the last weight copy
            ref8 = x.float() @ (w8.float() * s8[:, None]).t()
            ref16 = x.float() @ sh.w16[-1].float().t()
            c16 = G.default_config(m, n, k, num_sms)
            c8 = G.fp8_config(c16, m, n, k)
            row: dict = {}
            _variant(row, "bf16", [partial(G.skinny_linear, x, w, out=y, config=c16, workspace=sh.ws)
                                   for w in sh.w16], y, ref16)
            _variant(row, "fp8_skinny", [partial(G.skinny_linear, x, w, out=y, config=c8, workspace=sh.ws,
                                                  weight_scale=s) for w, s in sh.w8], y, ref8)
            for bn, bk4, warps, split, pf in grid(m):
                if time.time() > deadline:
                    break
                if bk4 * 4 * split > k * 2 and split > 1:
                    continue
                _variant(row, f"int {bn}x{bk4} w{warps} s{split}{' pf' if pf else ''}",
                         [partial(fp8_int_gemv, x, w, s, None, y, bn, bk4, split, warps, sh.ws.partials,
                                  sh.ws.counters, pf) for w, s in sh.w8],
                         y, ref8, (bn, bk4, warps, split, pf))
            ints = {kk: v for kk, v in row.items() if kk.startswith("int") and "us" in v}
            best = min(ints, key=lambda kk: ints[kk]["us"]) if ints else None
            row["best_int"] = best
            res[f"{name} m{m}"] = row
            errs = [v.get("error") for kk, v in row.items() if isinstance(v, dict) and "error" in v]
            log(f"{name} M={m}: bf16 {row['bf16'].get('us', math.nan):.2f} us, fp8 default "
                f"{row['fp8_skinny'].get('us', math.nan):.2f}, int best "
                f"{ints[best]['us'] if best else math.nan:.2f} ({best}); errors {errs[:2]}")
            REPORT["shapes"] = res
            save()
        sh = None
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    return res


def exact_all_bytes(n: int = 512, k: int = 4096) -> dict:
    """Every non-NaN e4m3 byte in one weight (incl. subnormals, +-0, +-448): the int kernel against the
    fp32 reference, error relative to sum |x| |w| per output (fp32 rounding: ~1e-7)."""
    allb = torch.arange(256, dtype=torch.int32)
    allb = allb[(allb & 0x7F) != 0x7F].to(torch.uint8)
    out = {}
    for m in (1, 2, 4):
        w8 = allb[torch.randint(0, len(allb), (n, k))].view(torch.float8_e4m3fn).to(DEV)
        ws = (torch.rand(n) + 0.5).to(DEV)
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        y = torch.full((m, n), float("nan"), device=DEV)  # fp32 output: the sums before rounding
        fp8_int_gemv(x, w8, ws, None, y, block_n=8, block_k4=256, split_k=1, num_warps=4)
        wf = w8.float() * ws[:, None]
        ref = x.float().double() @ wf.double().t()
        bound = x.float().abs().double() @ wf.abs().double().t()
        out[m] = float(((y.double() - ref).abs() / bound).max())
    return out


def lm_head_us(n: int = 152064, k: int = 3584) -> float:
    ws = [torch.randn(n, k, device=DEV, dtype=BF16) * 0.02 for _ in range(2)]
    x = torch.randn(1, k, device=DEV, dtype=BF16)
    y = torch.empty(1, n, device=DEV, dtype=BF16)
    calls = [partial(G.skinny_linear, x, w, out=y) for w in ws]
    us = graph_ms(lambda: [c() for c in calls], timer=lambda f: cuda_ms(f, 10, 60)) * 1e3 / 2
    ws = calls = None
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return us


def int_table(best: dict[tuple[int, int, int], tuple[int, int, int, int, bool]]) -> None:
    """FP8_INT_TUNED takes this run's best int config of each (M, N, K) with M <= FP8_INT_MAX_ROWS."""
    for (m, n, k), (bn, bk4, warps, split, pf) in best.items():
        if m <= G8.FP8_INT_MAX_ROWS:
            G8.FP8_INT_TUNED[(m, n, k)] = G8.Fp8IntConfig(bn, bk4, warps, split, pf)


def bench_engines(best: dict, model: str = "qwen2.5-7b", device: str = "cuda", steps_n: int = 128) -> dict:
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine

    path = model_dir(model)
    out = {}
    int_rows = G8.FP8_INT_MAX_ROWS
    int_table(best)
    for name, kw in (("bf16", {}), ("fp8_skinny", {"quantization": "fp8"}), ("fp8", {"quantization": "fp8"})):
        G8.FP8_INT_MAX_ROWS = 0 if name == "fp8_skinny" else int_rows  # read at each call (and capture)
        t = time.perf_counter()
        eng = Engine(model_path=str(path), load_format="dummy", device=device, max_running_requests=8,
                     chunked_prefill_size=8192, cuda_graph_max_bs=8, mem_fraction_static=0.45, **kw)
        start = time.perf_counter() - t
        steps = [decode_step_ms(eng, 128, steps_n) for _ in range(3)]
        out[name] = {"start_s": start, "decode_b1_ms": sorted(steps)[1], "runs": steps}
        log(f"engine {name}: start {start:.0f} s, batch-1 step {steps} ms")
        REPORT["engines"] = out
        save()
        del eng
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    G8.FP8_INT_MAX_ROWS = int_rows
    return out


def print_table(shapes: dict) -> dict:
    """The per-linear table and layer sums; FP8_INT_TUNED lines for M <= FP8_INT_MAX_ROWS (the best int
    config of each shape: the routing takes the int kernel there whether or not it beat the skinny
    path). Returns {(M, N, K): best int config tuple}."""
    best, lines = {}, []
    print("\n| linear, M | bf16 us | fp8 skinny us | fp8 int best us (config) | int / skinny | int / bf16 |")
    print("|---|---|---|---|---|---|")
    tot: dict = {}
    for key, row in shapes.items():
        name, m = key.split(" m")
        b = row.get("best_int")
        bi = row[b]["us"] if b else math.nan
        b16, d8 = row["bf16"].get("us", math.nan), row["fp8_skinny"].get("us", math.nan)
        if b:
            best[(int(m), *LINEARS[name])] = cfg = tuple(row[b]["cfg"])
            if int(m) <= G8.FP8_INT_MAX_ROWS:
                lines.append(f"    ({m}, {LINEARS[name][0]}, {LINEARS[name][1]}): Fp8IntConfig{cfg},"
                             f"  # {name} {bi:.2f} / {d8:.2f}")
        t = tot.setdefault(m, [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate((b16, d8, bi, min(bi, d8))):
            t[i] += v
        print(f"| {key} | {b16:.2f} | {d8:.2f} | {bi:.2f} ({b}) | {bi / d8:.3f} | {bi / b16:.3f} |")
    for m, t in tot.items():
        print(f"| layer (4 linears), M={m} | {t[0]:.1f} | {t[1]:.1f} | {t[2]:.1f} "
              f"(best of both {t[3]:.1f}) | {t[2] / t[1]:.3f} | {t[2] / t[0]:.3f} |")
    print(f"lm_head bf16 M=1: {REPORT['lm_head_bf16_us']:.1f} us")
    REPORT["int_best"] = {str(k): v for k, v in best.items()}
    print("FP8_INT_TUNED (us int / skinny):\n" + "\n".join(lines), flush=True)
    return best


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--budget-s", type=float, default=540)
    p.add_argument("--no-engines", action="store_true")
    p.add_argument("--rows", default="1,2,4")
    ns = p.parse_args()
    REPORT.update(run_header("cuda"))
    REPORT["exact_all_bytes"] = exact_all_bytes()
    log(f"all e4m3 bytes, max |err| / sum|x||w|: {REPORT['exact_all_bytes']}")
    rows = tuple(int(r) for r in ns.rows.split(","))
    engines_s = 0 if ns.no_engines else 190
    shapes = bench_shapes(rows, T0 + ns.budget_s - engines_s - 20)
    REPORT["lm_head_bf16_us"] = lm_head_us()
    log(f"lm_head bf16 M=1: {REPORT['lm_head_bf16_us']:.1f} us")
    save()
    best = print_table(shapes)
    save()
    if not ns.no_engines:
        try:
            bench_engines(best)
        except Exception as e:  # noqa: BLE001
            log(f"engines failed: {type(e).__name__}: {e}")
    eng = REPORT.get("engines", {})
    if "bf16" in eng:
        b = eng["bf16"]["decode_b1_ms"]
        for name, r in eng.items():
            share = REPORT["lm_head_bf16_us"] / 1e3 / r["decode_b1_ms"]
            print(f"batch-1 step {name}: {r['decode_b1_ms']:.3f} ms (runs {[f'{v:.3f}' for v in r['runs']]}) "
                  f"= {r['decode_b1_ms'] / b:.3f} x bf16; lm_head share {share:.3f}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
