"""FP8 against bf16, old against new, in one GPU run: the FP8-KV decode attention variants and the
FP8-weight skinny GEMM variants (issue 19).

    python3 bench/kernels/sweep_fp8.py [--budget-s 200] [--out sweep-fp8.json] [--best-out fp8-best.json]

Qwen2.5-7B shapes (28 query / 4 KV heads, head dim 128, page 16; the decoder linears qkv 4608 x 3584,
o 3584 x 3584, gate_up 37888 x 3584, down 3584 x 18944), bf16 activations:
  attention  decode 64 x 4,096 and 128 x 2,048 over a random-page pool: the bf16 pool at its
             default config, then the same K/V as an FP8 pool (k_scale 0.5, v_scale 0.25) for
             kv_dot "f16" (q, K, V and P in fp16: K/V widened in registers) and the FP8-operand
             forms (kernels/paged_loop_fp8.py) "qk8" (q as two e4m3 terms against K as loaded, P V
             in fp16) x blocks / warps / stages x the split counts of a few "decode_splits_fp8"
             policies, and one block each of "fp8" (q and P as single e4m3 terms:
             FlashAttention-3's FP8 operands) and "fp8x2" (q and P split into two e4m3 terms).
             Each FP8 variant is checked against the bf16 kernel on the dequantized pool before it
             is timed (relative error within TOL_OF[kv_dot], recorded);
  gemv       M = 1 (then 2, 4, 16): per linear the bf16 default (skinny_linear as models/linear.py
             routes it) and torch F.linear, the FP8 weight through fp8_config_legacy (old) and
             fp8_config (new default), and a grid of f16_dot configs at M = 1; the layer's four
             linears summed per variant (the fp8_bench "layer linears" figure) and the best FP8
             config per shape, printed as FP8_TUNED lines where it fits the bf16 workspace.
Timing: CUDA-graph replay (triton.testing.do_bench, median, L2 flushed); the GEMM graphs rotate over
weight copies of >= 256 MB so that no weight is served from L2. Prints tables; JSON to --out after
each part; --best-out gets the attention winners as an attention_configs override file
("decode_fp8", "decode_splits_fp8"; RADIXRT_ATTN_CONFIG=FILE applies it), written only when the
winner is >= 2% faster than the FP8 default on the mean over the two shapes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cuda_ms, graph_ms, rel_err, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

K = import_kernels()
from radixrt.kernels import attention_configs as AC  # noqa: E402
from radixrt.kernels import gemv as G  # noqa: E402
from radixrt.models.quant.fp8 import quantize_per_channel  # noqa: E402

HQ, HKV, D, PAGE, B = 28, 4, 128, 16, "d128"
DEV, BF16, FP8 = torch.device("cuda"), torch.bfloat16, torch.float8_e4m3fn
DECODE_SHAPES = [(64, 4096), (128, 2048)]
K_SCALE, V_SCALE = 0.5, 0.25
OLD_FP8 = {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "kv_dot": "f16"}  # the default until 2026-12-02
# (BLOCK_N, num_warps, num_stages) of the "qk8" grid
FP8_BLOCKS = [(128, 8, 3), (64, 4, 3), (128, 8, 2), (64, 4, 2), (64, 8, 3), (128, 4, 3), (128, 8, 4),
              (64, 4, 4)]
SPLIT_POLICIES = [{"policy": "waves", "occupancy": n, "merge_tokens": 256} for n in (2, 4)]
SPLIT_POLICIES += [{"policy": "per_sm", "programs_per_sm": n} for n in (4, 8)]
# the check's bound on ||fp8 - bf16 kernel|| / ||bf16 kernel|| per form: the fp16 forms and the split
# FP8 operands (<= 2^-7 relative per operand) as the bf16 kernel's own test; single e4m3 terms
# (2^-4 per operand) measured 2-4% on the CPU at 70-300 keys (tests/kernels/test_fp8_variants.py)
TOL_OF = {"f16": 1e-2, "q": 1e-2, "fp8x2": 1e-2, "qk8": 1e-2, "fp8": 8e-2}
ACCURATE = ("f16", "fp8x2", "qk8")  # what attention_best may pick: within the bf16 bound
LINEARS = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
GEMV_ROWS = (1, 2, 4, 16)
ROTATE_BYTES = 256 << 20
TOL = 1e-2
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def timed(run, check=None, poison: torch.Tensor | None = None, tol: float = TOL) -> dict:
    """{"us", "rel_err"} of run() replayed from a CUDA graph, after check() (rel err of the output
    `poison`, filled with NaN before the checked call) passes, or {"error"} (compile failure, out of
    resources, wrong answer)."""
    try:
        if poison is not None:
            poison.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = check() if check is not None else 0.0
        if not err <= tol:
            return {"error": f"rel err {err:.2e} > {tol}", "rel_err": err}
        return {"us": graph_ms(run, timer=lambda f: cuda_ms(f, warmup=10, rep=60)) * 1e3, "rel_err": err}
    except Exception as e:  # noqa: BLE001 - a variant that fails is recorded and skipped
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}


# --------------------------------------------------------------------------- decode attention
def _pool(batch: int, ctx: int):
    per = ctx // PAGE
    table = (torch.randperm(batch * per, device=DEV) + 1).view(batch, per).int()
    kb = torch.randn((batch * per + 1) * PAGE, HKV, D, device=DEV, dtype=BF16)
    vb = torch.randn_like(kb)
    k8, v8 = (kb / K_SCALE).to(FP8), (vb / V_SCALE).to(FP8)
    # the bf16 pool holds exactly the dequantized FP8 values, so both compute the same attention
    kd, vd = (k8.float() * K_SCALE).to(BF16), (v8.float() * V_SCALE).to(BF16)
    return table, kd, vd, k8, v8


def decode_shape(batch: int, ctx: int, deadline: float) -> dict:
    table, kd, vd, k8, v8 = _pool(batch, ctx)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    mid = {}

    def runner(kb, vb, splits, scales):
        if splits not in mid:
            mid[splits] = (torch.empty(batch, HQ, splits, D, device=DEV),
                           torch.empty(batch, HQ, splits, device=DEV))
        mo, ml = mid[splits]
        return lambda: K.decode_attention(q, kb, vb, table, seq_lens, PAGE, None, splits, out=out, mid_o=mo,
                                          mid_lse=ml, **scales)

    bf16_splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms)
    ref_run = runner(kd, vd, bf16_splits, {})
    ref_run()
    ref = out.clone()
    res = {"name": f"decode {batch} x {ctx}", "bf16_splits": bf16_splits,
           "kv_bytes_bf16": 2 * batch * ctx * HKV * D * 2, "bf16": timed(ref_run)}
    splits_of = {}
    for pol in SPLIT_POLICIES:
        with AC.overriding({"decode_splits_fp8": {B: pol}}):
            splits_of[str(pol)] = K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=True)
    res["splits_of_policy"] = splits_of
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    # 2026-12-02 (H200, f16: 101 us at 64 x 4,096): "fp8" / "fp8x2" ran 210-350 us over 9 blocks (the
    # V transpose through registers; bench/results/fp8.md), so one block each remains
    variants = [("f16", (128, 4, 3))] + [("qk8", blk) for blk in FP8_BLOCKS]
    variants += [("fp8x2", (128, 4, 3)), ("fp8", (64, 4, 3))]
    res["fp8"] = []
    for kv_dot, blk in variants:
        cfg = {**dict(zip(("BLOCK_N", "num_warps", "num_stages"), blk, strict=True)), "kv_dot": kv_dot,
               "many_per_sm": 0}  # these blocks at every program count (launch_config)
        for splits in sorted(set(splits_of.values()) | {bf16_splits}):
            if time.monotonic() > deadline:
                res.setdefault("skipped", []).append([cfg, splits])
                continue
            with AC.overriding({"decode_fp8": {B: cfg}}):
                r = timed(runner(k8, v8, splits, scales), lambda: rel_err(out, ref), out, TOL_OF[kv_dot])
            res["fp8"].append({"cfg": cfg, "splits": splits, **r})
            log(f"  {cfg} splits {splits}: {r.get('us', float('nan')):.1f} us, rel err "
                f"{r.get('rel_err', float('nan')):.2e} {r.get('error', '')}")
    res["bf16_again"] = timed(ref_run)  # the spread of one version between two timings
    old_splits = splits_of[str(SPLIT_POLICIES[0])]  # the f16 default ran with the "waves" rule
    old = [v for v in res["fp8"] if v["cfg"] == OLD_FP8 and v["splits"] == old_splits]
    new_cfg = AC.attention_config("decode_fp8", D)
    new_splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=True)
    new = [v for v in res["fp8"] if v["cfg"] == new_cfg and v["splits"] == new_splits]
    res["fp8_old"] = old[0] if old else None
    res["fp8_default"] = new[0] if new else None
    ok = [v for v in res["fp8"] if "us" in v]
    res["fp8_best"] = min(ok, key=lambda v: v["us"]) if ok else None
    for key in ("fp8_default", "fp8_best"):  # timed once more: the spread between two timings
        if res[key]:
            with AC.overriding({"decode_fp8": {B: res[key]["cfg"]}}):
                res[key + "_again"] = timed(runner(k8, v8, res[key]["splits"], scales))
    res["best_of_kv_dot"] = {kd: min((v for v in ok if v["cfg"]["kv_dot"] == kd), key=lambda v: v["us"])
                             for kd in {v["cfg"]["kv_dot"] for v in ok}}
    log(f"{res['name']}: bf16 {res['bf16'].get('us', float('nan')):.1f} us (again "
        f"{res['bf16_again'].get('us', float('nan')):.1f}); fp8 default again "
        f"{res.get('fp8_default_again', {}).get('us', float('nan')):.1f}, best again "
        f"{res.get('fp8_best_again', {}).get('us', float('nan')):.1f}; fp8 old "
        f"{(res['fp8_old'] or {}).get('us', float('nan')):.1f}, default "
        f"{(res['fp8_default'] or {}).get('us', float('nan')):.1f}, best "
        f"{(res['fp8_best'] or {}).get('us', float('nan')):.1f} us")
    return res


def attention_best(shapes: list[dict]) -> dict | None:
    """The (config, policy) with the lowest mean over the shapes of time / best FP8 time there, as an
    override table, when it beats the FP8 default's mean by >= 2%; else None."""
    def us(shape, cfg, splits):
        hits = [v["us"] for v in shape["fp8"] if v["cfg"] == cfg and v["splits"] == splits and "us" in v]
        return hits[0] if hits else math.inf

    best_of = [min((v["us"] for v in s["fp8"] if "us" in v), default=math.inf) for s in shapes]
    scores = {}
    cfgs = {str(v["cfg"]): v["cfg"] for s in shapes for v in s["fp8"] if v["cfg"]["kv_dot"] in ACCURATE}
    for key, cfg in cfgs.items():
        for pol in SPLIT_POLICIES:
            rel = [us(s, cfg, s["splits_of_policy"][str(pol)]) / b
                   for s, b in zip(shapes, best_of, strict=True)]
            scores[key, str(pol)] = (sum(rel) / len(rel), cfg, pol)
    default_key = (str(AC.attention_config("decode_fp8", D)), str(SPLIT_POLICIES[0]))  # the default rule
    base = scores.get(default_key, (math.inf,))[0]
    score, cfg, pol = min(scores.values(), key=lambda t: t[0])
    if not score < base / 1.02:
        return None
    return {"decode_fp8": {B: cfg}, "decode_splits_fp8": {B: pol}, "_score": score, "_default_score": base}


# --------------------------------------------------------------------------- skinny GEMM
def f16_grid(m: int) -> list[G.SkinnyConfig]:
    """f16_dot configs of the M = 1 grid (M > 1: a few wider tiles)."""
    if m > 1:
        return [G.SkinnyConfig(bn, bk, s, 4, st, use_dot=True, f16_dot=True)
                for bn, bk, st in ((64, 256, 4), (64, 128, 4), (128, 128, 3)) for s in (1, 2)]
    return [G.SkinnyConfig(bn, bk, s, w, st, use_dot=True, f16_dot=True)
            for bn, bk, w in ((16, 512, 4), (32, 512, 4), (64, 256, 4), (16, 512, 2))
            for st in (4, 3) for s in (1, 2, 4)]


def cfg_label(c: G.SkinnyConfig) -> str:
    return f"fp8 {c.block_n}x{c.block_k} split {c.split_k} w{c.num_warps} st{c.num_stages}"


class Linear8:
    """One linear shape: bf16 weight copies and their FP8 (per-channel) copies, rotated through."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        copies = max(1, math.ceil(ROTATE_BYTES / (n * k)))  # >= 256 MB of FP8 weights
        self.w = [torch.randn(n, k, device=DEV, dtype=BF16) * 0.02 for _ in range(min(copies, 4))]
        self.w8 = [quantize_per_channel(self.w[i % len(self.w)]) for i in range(copies)]
        self.ws = G.SkinnyWorkspace.allocate(16 * 16 * n, n, DEV)  # any split <= 16, block_n >= 1

    def calls(self, x: torch.Tensor, y: torch.Tensor, cfg, fp8: bool):
        if fp8:
            ws = [(w, s) for w, s in self.w8]
            return lambda: [G.skinny_linear(x, w, out=y, config=cfg, workspace=self.ws, weight_scale=s)
                            for w, s in ws]
        if cfg == "torch":
            return lambda: [F.linear(x, w) for w in self.w]
        return lambda: [G.skinny_linear(x, w, out=y, config=cfg, workspace=self.ws) for w in self.w]

    def per_call(self, fp8: bool) -> int:
        return len(self.w8) if fp8 else len(self.w)


def gemv_rows(m: int, lin: dict[str, Linear8], deadline: float) -> dict:
    """Every variant of the four linears at M rows; times are per call (us)."""
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    res: dict = {"m": m, "linears": {}}
    for name, L in lin.items():
        x = torch.randn(m, L.k, device=DEV, dtype=BF16)
        y = torch.empty(m, L.n, device=DEV, dtype=BF16)
        # y holds the last call's result: that of the last weight copy
        ref8 = x.float() @ (L.w8[-1][0].float() * L.w8[-1][1][:, None]).t()
        ref16 = x.float() @ L.w[-1].float().t()

        bf16_cfg = G.default_config(m, L.n, L.k, num_sms)
        variants = {"bf16_torch": ("torch", False), "bf16_skinny": (bf16_cfg, False),
                    "fp8_old": (G.fp8_config_legacy(bf16_cfg, m), True),
                    "fp8_default": (G.fp8_config(bf16_cfg, m, L.n, L.k), True)}
        variants |= {cfg_label(c): (c, True) for c in f16_grid(m)}
        row: dict = {}
        for label, (cfg, fp8) in variants.items():
            if time.monotonic() > deadline and label.startswith("fp8 "):
                row.setdefault("skipped", []).append(label)
                continue
            check = None if cfg == "torch" else (lambda y=y, ref=ref8 if fp8 else ref16: rel_err(y, ref))
            r = timed(L.calls(x, y, cfg, fp8), check, y)
            if "us" in r:
                r["us"] /= L.per_call(fp8)
            if cfg != "torch":
                r["config"] = asdict(cfg)
                r["fits_bf16_workspace"] = G.fits_bf16_workspace(cfg, m, L.n, L.k, num_sms)
            row[label] = r
        fp8_ok = {k: v for k, v in row.items() if k.startswith("fp8") and "us" in v}
        best = min(fp8_ok, key=lambda k: fp8_ok[k]["us"]) if fp8_ok else None
        fit = {k: v for k, v in fp8_ok.items() if v["fits_bf16_workspace"]}
        row["best"] = best
        row["best_fitting"] = min(fit, key=lambda k: fit[k]["us"]) if fit else None
        res["linears"][name] = row
        log(f"M={m} {name}: bf16 {_us(row['bf16_skinny']):.1f} us (torch {_us(row['bf16_torch']):.1f}), "
            f"fp8 old {_us(row['fp8_old']):.1f}, default {_us(row['fp8_default']):.1f}, best "
            f"{fp8_ok[best]['us'] if best else math.nan:.1f} ({best})")
    res["layer_us"] = {v: sum(r[v].get("us", math.nan) for r in res["linears"].values())
                       for v in ("bf16_torch", "bf16_skinny", "fp8_old", "fp8_default")}
    res["layer_us"]["fp8_best_fitting"] = sum(
        r[r["best_fitting"]]["us"] if r["best_fitting"] else math.nan for r in res["linears"].values())
    return res


def tuned_lines(gemv: list[dict]) -> list[str]:
    """FP8_TUNED lines for the best fitting config per (M bucket, N, K) that beats fp8_default by >= 2%."""
    lines = []
    for res in gemv:
        for name, r in res["linears"].items():
            best = r.get("best_fitting")
            if not best or best == "fp8_default" or "us" not in r["fp8_default"]:
                continue
            if r[best]["us"] * 1.02 > r["fp8_default"]["us"]:
                continue
            c = G.SkinnyConfig(**r[best]["config"])
            n, k = LINEARS[name]
            lines.append(f"    ({res['m']}, {n}, {k}): SkinnyConfig({c.block_n}, {c.block_k}, {c.split_k}, "
                         f"{c.num_warps}, {c.num_stages}, use_dot={c.use_dot}, "
                         f"serial_reduce={c.serial_reduce}, f16_dot={c.f16_dot}),")
    return lines


# --------------------------------------------------------------------------- report
def _us(r: dict | None) -> float:
    return (r or {}).get("us", math.nan)


def print_tables(report: dict) -> None:
    print("\n| decode attention | bf16 us | fp8 old us | fp8 default us | fp8 best us | old / bf16 | "
          "default / bf16 | best / bf16 | best variant |\n|---|---|---|---|---|---|---|---|---|")
    for s in report.get("attention", []):
        b, o, d, x = _us(s["bf16"]), _us(s["fp8_old"]), _us(s["fp8_default"]), _us(s["fp8_best"])
        best = s["fp8_best"] or {}
        print(f"| {s['name']} | {b:.1f} | {o:.1f} | {d:.1f} | {x:.1f} | {o / b:.3f} | {d / b:.3f} | "
              f"{x / b:.3f} | {best.get('cfg')} splits {best.get('splits')} |")
    print("\n| decode attention | kv_dot | best us | / bf16 | rel err vs bf16 kernel | config | splits |\n"
          "|---|---|---|---|---|---|---|")
    for s in report.get("attention", []):
        for kd, v in sorted(s.get("best_of_kv_dot", {}).items()):
            print(f"| {s['name']} | {kd} | {v['us']:.1f} | {v['us'] / _us(s['bf16']):.3f} | "
                  f"{v['rel_err']:.2e} | {v['cfg']} | {v['splits']} |")
    if not report.get("gemv"):
        return
    print("\n| layer linears (sum of 4, us) | bf16 torch | bf16 skinny | fp8 old | fp8 default | fp8 best* | "
          "old / bf16 | default / bf16 | best / bf16 |\n|---|---|---|---|---|---|---|---|---|")
    for res in report.get("gemv", []):
        u = res["layer_us"]
        bf = min(u["bf16_torch"], u["bf16_skinny"])
        print(f"| M={res['m']} | {u['bf16_torch']:.1f} | {u['bf16_skinny']:.1f} | {u['fp8_old']:.1f} | "
              f"{u['fp8_default']:.1f} | {u['fp8_best_fitting']:.1f} | {u['fp8_old'] / bf:.3f} | "
              f"{u['fp8_default'] / bf:.3f} | {u['fp8_best_fitting'] / bf:.3f} |")
    print("(* best FP8 config per linear among those fitting the bf16 workspace; bf16 = the faster of "
          "torch and skinny)")
    lines = report.get("fp8_tuned_lines", [])
    if lines:
        print("\nFP8_TUNED lines (kernels/gemv.py):\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=200.0, help="wall-clock budget of the grids")
    p.add_argument("--only", default="attention,gemv")
    p.add_argument("--out", default="sweep-fp8.json")
    p.add_argument("--best-out", default=None, help="attention override file of the winners")
    ns = p.parse_args(argv)
    start = time.monotonic()
    report: dict = {**run_header("cuda"), "command": " ".join(sys.argv), "budget_s": ns.budget_s}
    parts = ns.only.split(",")
    if "attention" in parts:  # ~45% of the budget
        report["attention"] = []
        for i, (batch, ctx) in enumerate(DECODE_SHAPES):
            deadline = start + ns.budget_s * 0.45 * (i + 1) / len(DECODE_SHAPES)
            report["attention"].append(decode_shape(batch, ctx, deadline))
            torch.cuda.empty_cache()
            write_json(ns.out, report)
        best = attention_best(report["attention"])
        report["attention_best"] = best
        if ns.best_out and best:
            write_json(ns.best_out, best)
    if "gemv" in parts:
        lin = {name: Linear8(n, k) for name, (n, k) in LINEARS.items()}
        report["gemv"] = []
        for m in GEMV_ROWS:
            left = ns.budget_s - (time.monotonic() - start)
            deadline = time.monotonic() + left * (0.6 if m == 1 else 0.34)
            report["gemv"].append(gemv_rows(m, lin, deadline))
            write_json(ns.out, report)
        report["fp8_tuned_lines"] = tuned_lines(report["gemv"])
        write_json(ns.out, report)
    print_tables(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
