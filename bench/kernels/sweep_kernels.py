"""Blind config sweep of the paged attention kernels against torch SDPA (cuDNN, flash) in one run.

    python3 bench/kernels/sweep_kernels.py [--budget-s 225] [--out sweep.json] [--best-out best.json]

Qwen2.5-7B heads (28 query, 4 KV, head dim 128), page 16, bf16, on the shapes of issue 19:
  decode  batch 64 x 4,096 and 128 x 2,048 (paged, random page order): kernel configs (BLOCK_N,
          warps, stages) x split-count policies (attention_configs "decode_splits");
  extend  8,192 new tokens causal, and 4,096 cached + 4,096 new: tiles x stages x USE_TMA;
  cascade 128 requests sharing 2,048 tokens + 64-192 own each (fused form): stage-A tiles.
Every variant is checked against the fp32 reference (torch SDPA, math backend, on the same K/V laid
out contiguously; the torch reference of kernels/reference.py for cascade) before it is timed; a
variant that fails to compile or to match (rel err > 1e-2) is dropped. The peers are torch SDPA's
cuDNN / flash / memory-efficient backends on contiguous K/V (sdpa_peers.py); the ceilings the best
of several methods (ceilings.py). Timing: CUDA-graph replay, median of do_bench (L2 flushed).

Per kind the winner is the variant with the lowest mean over the kind's shapes of time / best time
of that shape; it is written to "best" (the attention_configs override format) only when that mean
is at least 2% below the current default's, so a noisy tie keeps the default. Apply the winners in
a later run with RADIXRT_ATTN_CONFIG=best.json (or bench_kernels.py --use-best best.json), then
commit them to kernels/attention_configs.py. When the time budget runs out the remaining variants
are skipped (listed in "skipped") and the JSON is written with what was measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_kernels as bk  # noqa: E402
from ceilings import measure_best_ceilings  # noqa: E402
from sdpa_peers import best_peer, device_ms, peer_rows, reference  # noqa: E402

from bench.common import rel_err, run_header, write_json  # noqa: E402

K, REF = bk.K, bk.REF
AC = sys.modules["radixrt.kernels.attention_configs"]
HQ, HKV, D, PAGE, DEV, BF16 = bk.HQ, bk.HKV, bk.D, bk.PAGE, bk.DEV, bk.BF16
B = "d128"
DECODE_SHAPES = [(64, 4096), (128, 2048)]
EXTEND_SHAPES = [(0, 8192), (4096, 4096)]  # (cached prefix, new tokens)
CASCADE_SHAPE = (128, 2048)  # (requests, shared prefix tokens)
DECODE_CONFIGS = [(128, 4, 2), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 4, 4), (128, 8, 2),
                  (128, 8, 3), (128, 8, 4), (256, 4, 2), (256, 8, 2)]
SPLIT_POLICIES = [{"policy": "per_sm", "programs_per_sm": n} for n in (4, 1, 2, 8)]
SPLIT_POLICIES += [{"policy": "waves", "occupancy": n, "merge_tokens": 256} for n in (1, 2, 3, 4)]
EXTEND_CONFIGS = [(128, 64, 8, 3, False), (128, 64, 8, 3, True), (128, 64, 8, 4, True), (128, 64, 8, 2, True),
                  (128, 128, 8, 3, True), (128, 128, 8, 2, True), (128, 64, 8, 4, False),
                  (128, 128, 8, 3, False), (128, 64, 4, 3, True), (64, 64, 4, 3, True), (64, 64, 4, 2, False)]
CASCADE_TILES = [(128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 128, 8, 2)]
EXTEND_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA")
TOL = 1e-2


class Budget:
    """Wall-clock budget of the sweep; `left()` > 0 while variants may still start."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allow(self, what: str) -> bool:
        if self.left() > 0:
            return True
        self.skipped.append(what)
        return False


def timed_variant(run, ref: torch.Tensor, out: torch.Tensor) -> dict:
    """Check run() (which writes `out`) against ref, then time it; {"us", "rel_err"} or {"error"}."""
    try:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        if not err <= TOL:  # NaN too
            return {"error": f"rel err {err:.2e} > {TOL}", "rel_err": err}
        ms, _ = device_ms(run)
        return {"us": ms * 1e3, "rel_err": err}
    except Exception as e:  # noqa: BLE001 - out of resources, compile errors: the variant is dropped
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}


def paged_copy(kc: torch.Tensor, vc: torch.Tensor, seq_len: int):
    """Contiguous K/V [Bt, Hkv, L, D] laid out in a pool of pages in random order: (k_buffer,
    v_buffer, page_table [Bt, L / PAGE] int32); page 0 is the sink, never used."""
    batch = kc.shape[0]
    per = seq_len // PAGE
    table = (torch.randperm(batch * per, device=DEV) + 1).view(batch, per).int()
    slots = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=DEV)).view(-1)
    kb = torch.zeros((batch * per + 1) * PAGE, HKV, D, device=DEV, dtype=BF16)
    vb = torch.zeros_like(kb)
    kb[slots] = kc.permute(0, 2, 1, 3).reshape(-1, HKV, D)
    vb[slots] = vc.permute(0, 2, 1, 3).reshape(-1, HKV, D)
    return kb, vb, table


def decode_shape(batch: int, ctx: int, budget: Budget) -> dict:
    """Every decode config x distinct split count of the policies, and the SDPA peers."""
    q4 = torch.randn(batch, HQ, 1, D, device=DEV, dtype=BF16)
    kc = torch.randn(batch, HKV, ctx, D, device=DEV, dtype=BF16)
    vc = torch.randn_like(kc)
    ref = reference(q4, kc, vc, False)
    res = {"kind": "decode", "name": f"decode {batch} x {ctx}", "peers": peer_rows(q4, kc, vc, False, ref)}
    q, ref3 = q4[:, :, 0], ref[:, :, 0]
    kb, vb, table = paged_copy(kc, vc, ctx)
    del kc, vc
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits_of = {}
    for pol in SPLIT_POLICIES:
        with AC.overriding({"decode_splits": {B: pol}}):
            splits_of[_key(pol)] = K.choose_num_kv_splits(batch, HKV, ctx, num_sms)
    res["splits_of_policy"] = {str(k): v for k, v in splits_of.items()}
    times: dict = {}
    for cfg in DECODE_CONFIGS:
        for splits in sorted(set(splits_of.values())):
            if not budget.allow(f"decode {batch}x{ctx} {cfg} splits {splits}"):
                continue
            mid_o = torch.empty(batch, HQ, splits, D, device=DEV, dtype=torch.float32)
            mid_lse = torch.empty(batch, HQ, splits, device=DEV, dtype=torch.float32)

            def run(splits=splits, mid_o=mid_o, mid_lse=mid_lse):
                K.decode_attention(q, kb, vb, table, seq_lens, PAGE, None, splits, out=out, mid_o=mid_o,
                                   mid_lse=mid_lse)
            # many_per_sm 0: the variant's warp count at every program count (launch_warps)
            with AC.overriding({"decode": {B: {**dict(zip(("BLOCK_N", "num_warps", "num_stages"), cfg,
                                                          strict=True)), "many_per_sm": 0}}}):
                times[cfg, splits] = timed_variant(run, ref3, out)
    res["variants"] = [{"cfg": list(c), "splits": s, **r} for (c, s), r in times.items()]
    # a (config, policy) variant's time is that of the split count the policy gives here
    res["by_variant"] = {(c, p): times[c, s]["us"] for (c, s) in times for p, ps in splits_of.items()
                         if ps == s and "us" in times[c, s]}
    return res


def _key(d: dict) -> tuple:
    return tuple(sorted(d.items()))


def extend_shape(prefix: int, new: int, budget: Budget) -> dict:
    """Every extend config on one request of `prefix` cached + `new` new tokens, and the peers."""
    total = prefix + new
    q4 = torch.randn(1, HQ, new, D, device=DEV, dtype=BF16)
    kc = torch.randn(1, HKV, total, D, device=DEV, dtype=BF16)
    vc = torch.randn_like(kc)
    ref = reference(q4, kc, vc, True)
    name = f"extend {new} causal" + (f" over {prefix} cached" if prefix else "")
    res = {"kind": "extend", "name": name, "peers": peer_rows(q4, kc, vc, True, ref)}
    # q / k / v of the new tokens as views of one QKV row, as the model passes them
    qkv = torch.empty(new, (HQ + 2 * HKV) * D, device=DEV, dtype=BF16)
    q, k, v = (t.view(new, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
    q.copy_(q4[0].transpose(0, 1))
    k.copy_(kc[0, :, prefix:].transpose(0, 1))
    v.copy_(vc[0, :, prefix:].transpose(0, 1))
    kb, vb, table = paged_copy(kc, vc, total)  # the prefix is read from the pool
    ref3 = ref[0].transpose(0, 1)
    meta = [torch.tensor([x], dtype=torch.int32, device=DEV) for x in (prefix, new, 0)]
    out = torch.empty(new, HQ, D, device=DEV, dtype=BF16)

    def run():
        K.extend_attention(q, k, v, kb, vb, table, *meta, PAGE, None, new, out=out, max_seq_len=total)
    times = {}
    for cfg in EXTEND_CONFIGS:
        if not budget.allow(f"{name} {cfg}"):
            continue
        with AC.overriding({"extend": {B: dict(zip(EXTEND_KEYS, cfg, strict=True))}}):
            times[cfg] = timed_variant(run, ref3, out)
    res["variants"] = [{"cfg": list(c), **r} for c, r in times.items()]
    res["by_variant"] = {c: r["us"] for c, r in times.items() if "us" in r}
    res["flops"] = 4 * HQ * D * (prefix * new + new * (new + 1) // 2)
    return res


def cascade_shape(budget: Budget) -> dict:
    """Fused cascade (one suffix split) for each stage-A tile; peer: SDPA decode of the same batch on
    contiguous K/V of the mean sequence length (it reads the shared prefix once per request)."""
    batch, prefix = CASCADE_SHAPE
    args, ref = _cascade_inputs(batch, prefix)
    q4 = args["q"][:, :, None]
    kc = torch.randn(batch, HKV, prefix + 128, D, device=DEV, dtype=BF16)  # the mean length
    res = {"kind": "cascade", "name": f"cascade {batch} x ({prefix} shared + 64-192)",
           "peers": peer_rows(q4, kc, torch.randn_like(kc), False, None)}
    del kc
    out = torch.empty_like(args["q"])
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    times = {}
    for tile in CASCADE_TILES:
        if not budget.allow(f"cascade {tile}"):
            continue
        ps = K.choose_num_prefix_splits(1, batch, HQ, HKV, prefix, num_sms, max_splits=4, block_m=tile[0])

        def run(tile=tile, ps=ps):
            K.cascade_decode_attention(**args, num_kv_splits=1, num_prefix_splits=ps, max_group_size=batch,
                                       out=out, tile=K.CascadeTile(*tile))
        times[tile] = {**timed_variant(run, ref, out), "prefix_splits": ps}
    res["variants"] = [{"cfg": list(c), **r} for c, r in times.items()]
    res["by_variant"] = {c: r["us"] for c, r in times.items() if "us" in r}
    return res


def _cascade_inputs(batch: int, prefix: int):
    ints = {"dtype": torch.int32, "device": DEV}
    gen = torch.Generator().manual_seed(0)
    seq = (prefix + torch.randint(64, 193, (batch,), generator=gen)).tolist()
    pool = bk.Pool(sum(-(-s // PAGE) * PAGE for s in seq))
    table = pool.page_table(seq)
    table[:, : prefix // PAGE] = table[0, : prefix // PAGE]
    args = dict(q=torch.randn(batch, HQ, D, device=DEV, dtype=BF16), k_buffer=pool.k, v_buffer=pool.v,
                page_table=table, seq_lens=torch.tensor(seq, **ints),
                kv_start=torch.full((batch,), prefix, **ints), group_members=torch.arange(batch, **ints),
                group_starts=torch.tensor([0, batch], **ints),
                group_prefix_lens=torch.tensor([prefix], **ints),
                page_size=PAGE, scale=None)
    return args, REF.cascade_decode_attention_ref(*args.values())


def pick_winner(shapes: list[dict], default) -> tuple[object, dict]:
    """(winning variant, scores): lowest mean over shapes of us / best us of that shape, among the
    variants measured on every shape; the default wins unless beaten by >= 2%."""
    common = set.intersection(*(set(s["by_variant"]) for s in shapes)) if shapes else set()
    scores = {}
    for v in common:
        scores[v] = sum(s["by_variant"][v] / min(s["by_variant"].values()) for s in shapes) / len(shapes)
    if not scores:
        return default, {}
    best = min(scores, key=scores.get)
    if default in scores and scores[best] > 0.98 * scores[default]:
        best = default
    return best, {str(k): v for k, v in scores.items()}


def _defaults() -> dict:
    """The variant keys of the config table in force (defaults + any RADIXRT_ATTN_CONFIG)."""
    dec = AC.attention_config("decode", D)
    ext = AC.attention_config("extend", D)
    cas = AC.attention_config("cascade", D)
    pol = AC.attention_config("decode_splits", D)
    dec_pol = next((p for p in SPLIT_POLICIES if all(pol.get(k) == v for k, v in p.items())),
                   SPLIT_POLICIES[0])
    return {"decode": ((dec["BLOCK_N"], dec["num_warps"], dec["num_stages"]), _key(dec_pol)),
            "extend": tuple(bool(ext[k]) if k == "USE_TMA" else ext[k] for k in EXTEND_KEYS),
            "cascade": (cas["block_m"], cas["block_n"], cas["num_warps"], cas["num_stages"])}


def best_table(winners: dict, defaults: dict) -> dict:
    """The overrides (attention_configs format) of the winners that differ from the defaults."""
    table: dict = {"_source": "bench/kernels/sweep_kernels.py"}
    if winners["decode"] != defaults["decode"]:
        cfg, pol = winners["decode"]
        table["decode"] = {B: {**dict(zip(("BLOCK_N", "num_warps", "num_stages"), cfg, strict=True)),
                               "many_per_sm": 0}}
        table["decode_splits"] = {B: dict(pol)}
    if winners["extend"] != defaults["extend"]:
        table["extend"] = {B: dict(zip(EXTEND_KEYS, winners["extend"], strict=True))}
    if winners["cascade"] != defaults["cascade"]:
        table["cascade"] = {B: dict(zip(("block_m", "block_n", "num_warps", "num_stages"), winners["cascade"],
                                        strict=True))}
    return table


def print_summary(result: dict) -> None:
    """Per shape: the default's and the winner's time beside cuDNN's and flash's, then the winners."""
    ceil = result["ceilings"]
    print(f"\nceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
          f"{ceil['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (best of {ceil['methods']})")
    print("\n| shape | default | best config | best | chosen | cuDNN | flash | efficient "
          "| chosen / best peer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in result["shapes"]:
        bv = s["by_variant"]
        if not bv:
            print(f"| {s['name']} | (no variant ran) |")
            continue
        best = min(bv, key=bv.get)
        d, c = bv.get(s["default_variant"]), bv.get(s["chosen_variant"])
        peers = {n: r.get("us") for n, r in s["peers"].items()}
        bp = best_peer(s["peers"])
        ratio = f"{c / bp[1]:.3f} ({bp[0]})" if c and bp else "-"

        def f(x):
            return f"{x:.1f} us" if x else "-"
        print(f"| {s['name']} | {f(d)} | {best} | {f(bv[best])} | {f(c)} | {f(peers.get('cudnn'))} | "
              f"{f(peers.get('flash'))} | {f(peers.get('efficient'))} | {ratio} |")
    print(f"\nbest (apply with RADIXRT_ATTN_CONFIG=FILE): {result['best']}")
    if result["skipped"]:
        print(f"skipped for the time budget: {len(result['skipped'])} variants, e.g. {result['skipped'][:3]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=225.0, help="wall-clock budget for the variants")
    p.add_argument("--out", default=None, help="JSON of every measurement (default $OUT/kernels-sweep.json)")
    p.add_argument("--best-out", default=None, help="the winners alone, an override file "
                   "(default $OUT/attn-best.json)")
    p.add_argument("--parts", nargs="+", default=["extend", "decode", "cascade"],
                   choices=["extend", "decode", "cascade"])
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("sweep_kernels needs a CUDA device")
    from bench import common

    budget = Budget(ns.budget_s)
    torch.manual_seed(0)
    result: dict = {**run_header(), "ceilings": measure_best_ceilings(), "shapes": [],
                    "skipped": budget.skipped}
    defaults = _defaults()
    winners = dict(defaults)
    result["defaults"] = {k: str(v) for k, v in defaults.items()}
    out_path = common.out_path(ns.out, "kernels-sweep.json")
    best_path = common.out_path(ns.best_out, "attn-best.json")
    try:
        for part in ns.parts:
            print(f"--- {part} ({budget.left():.0f} s left)", flush=True)
            if part == "extend":
                shapes = [extend_shape(p, n, budget) for p, n in EXTEND_SHAPES]
            elif part == "decode":
                shapes = [decode_shape(b, c, budget) for b, c in DECODE_SHAPES]
            else:
                shapes = [cascade_shape(budget)]
            winners[part], scores = pick_winner(shapes, defaults[part])
            for s in shapes:
                s["default_variant"], s["chosen_variant"], s["scores"] = defaults[part], winners[part], scores
            result["shapes"] += shapes
            torch.cuda.empty_cache()
    finally:
        result["best"] = best_table(winners, defaults)
        for s in result["shapes"]:  # tuple keys are not JSON
            s["by_variant"] = {str(k): v for k, v in s["by_variant"].items()}
            for key in ("default_variant", "chosen_variant"):
                s[key] = str(s.get(key))
        write_json(out_path or "kernels-sweep.json", result)
        write_json(best_path or "attn-best.json", result["best"])
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
