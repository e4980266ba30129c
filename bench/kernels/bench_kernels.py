"""Kernel benchmark for one CUDA GPU (built for the H200): ceilings, decode, extend, correctness.

    python3 bench/kernels/bench_kernels.py [--quick] [--out PATH] [--use-best FILE]

--use-best FILE applies an attention config override file (bench/kernels/sweep_kernels.py writes
one; the same as RADIXRT_ATTN_CONFIG=FILE) before anything runs.

Measured in the same run, so ratios stay meaningful when clocks or cards differ:
  (a) ceilings: device-to-device copy bandwidth (bytes read + written) and dense bf16 matmul
      TFLOP/s (8192^3, random data), each the best of several methods with warm clocks (ceilings.py);
  (b) decode attention at Qwen2.5-7B shapes (28 q / 4 kv heads, head dim 128, page 16, bf16):
      batch 64 x context 4096, reported as bytes/s over the bytes that must move (K and V of every
      token read once per KV head, plus q and o) and as % of the copy bandwidth; then a sweep over
      batch x context (combinations above 40 GB of KV are skipped). Timed as CUDA-graph replays
      (how the server runs decode); the eager time, launch overhead included, is reported beside it;
  (c) extend attention: 8192 new tokens (causal), and 4096 cached + 4096 new; TFLOP/s counting only
      the causal pairs (4 * Hq * D FLOPs per query-key pair) and % of the matmul rate;
  (d) cascade decode attention: batch 128 as 1 group (and as 4 groups of 32) sharing a 2,048-token
      prefix (the same physical pages) + 64..192 private tokens each; cascade_decode_attention for a
      few stage-A tiles and prefix-split counts against plain decode_attention on the same batch
      (shared pages: the prefix may be served from L2) and on unshared pages (every token from HBM);
      eager times (launch overhead included, as asked) and CUDA-graph replay times; bandwidth over
      the unique bytes (each group's prefix K/V once + the private K/V, q, o);
  (f) same-run peers: torch SDPA's cuDNN / flash / memory-efficient backends on contiguous K/V of
      the decode headlines (64 x 4,096, 128 x 2,048) and 8,192 new tokens causal (sdpa_peers.py);
  (e) correctness of each headline shape against the fp32 torch reference on random inputs
      (relative error ||o - ref|| / ||ref||), outputs poisoned with NaN before the checked run.
Timing: triton.testing.do_bench, median (it flushes L2 between runs). Random, never zero, inputs.
Prints a table at the end; writes JSON to $OUT/kernels.json when OUT is set (or to --out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from bench.common import cuda_ms as bench_ms  # noqa: E402
from bench.common import graph_ms, rel_err  # noqa: E402, F401 (also used by bench/lab)


def _import_kernels():
    """radixrt.kernels and its torch references, also without `pip install -e .`."""
    from bench.kernels_import import import_kernels

    kernels = import_kernels()
    from radixrt.kernels import reference

    return kernels, reference


K, REF = _import_kernels()
HQ, HKV, D, PAGE = 28, 4, 128, 16
BF16 = torch.bfloat16
DEV = torch.device("cuda")
GB = 1e9


# --------------------------------------------------------------------------- paged inputs
class Pool:
    """One layer's K/V pool of random bf16 data, big enough for the largest case; pages handed out
    in random order so the page table is not the identity."""

    def __init__(self, num_tokens: int):
        self.num_pages = triton.cdiv(num_tokens, PAGE) + 1  # + sink page 0
        self.k = torch.randn(self.num_pages * PAGE, HKV, D, device=DEV, dtype=BF16)
        self.v = torch.randn(self.num_pages * PAGE, HKV, D, device=DEV, dtype=BF16)

    def page_table(self, seq_lens: list[int]) -> torch.Tensor:
        need = [triton.cdiv(s, PAGE) for s in seq_lens]
        pages = torch.randperm(self.num_pages - 1, device=DEV)[: sum(need)] + 1
        table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32, device=DEV)
        start = 0
        for i, n in enumerate(need):
            table[i, :n] = pages[start:start + n]
            start += n
        return table


def decode_case(pool: Pool, batch: int, ctx: int, check: bool) -> dict:
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    table = pool.page_table([ctx] * batch)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
    splits = K.choose_num_kv_splits(batch, HKV, ctx,
                                    torch.cuda.get_device_properties(0).multi_processor_count)
    out = torch.empty_like(q)
    mid_o = torch.empty(batch, HQ, splits, D, device=DEV, dtype=torch.float32)
    mid_lse = torch.empty(batch, HQ, splits, device=DEV, dtype=torch.float32)

    def run():
        K.decode_attention(q, pool.k, pool.v, table, seq_lens, PAGE, None, splits, out=out, mid_o=mid_o,
                           mid_lse=mid_lse)

    # timed as a CUDA-graph replay, as the server runs decode: Python launch overhead (tens of us for
    # two Triton launches) would otherwise dominate the small shapes
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = bench_ms(graph.replay)  # (the graph is replayed once more below, for the check)
    moved = batch * ctx * HKV * D * 2 * 2 + 2 * batch * HQ * D * 2  # K+V once per KV head, q and o
    res = {"batch": batch, "ctx": ctx, "splits": splits, "ms": ms, "bytes_per_s": moved / (ms * 1e-3),
           "ms_eager": bench_ms(run)}
    if check:
        out.fill_(float("nan"))
        graph.replay()
        res["rel_err"] = rel_err(out,
                                 REF.decode_attention_ref(q, pool.k, pool.v, table, seq_lens, PAGE, None))
    return res


def extend_case(pool: Pool, prefix: int, new: int, check: bool) -> dict:
    table = pool.page_table([prefix + new])
    # the new tokens' K/V are passed directly; the prefix is whatever random data the pool holds
    q = torch.randn(new, HQ, D, device=DEV, dtype=BF16)
    k = torch.randn(new, HKV, D, device=DEV, dtype=BF16)
    v = torch.randn(new, HKV, D, device=DEV, dtype=BF16)
    meta = [torch.tensor([x], dtype=torch.int32, device=DEV) for x in (prefix, new, 0)]
    out = torch.empty_like(q)

    def run():
        # the hints the backend passes: max_seq_len picks the tile, min_extend_len the kernel (the
        # warp-specialized Gluon kernel on sm_90, kernels/extend_attention_ws.py)
        K.extend_attention(q, k, v, pool.k, pool.v, table, *meta, PAGE, None, new, out=out,
                           max_seq_len=prefix + new, min_extend_len=new)

    ms = bench_ms(run)
    pairs = prefix * new + new * (new + 1) // 2
    res = {"prefix": prefix, "new": new, "ms": ms, "flops_per_s": 4 * HQ * D * pairs / (ms * 1e-3)}
    if check:
        out.fill_(float("nan"))
        run()
        ref = REF.extend_attention_ref(q, k, v, pool.k, pool.v, table, *meta, PAGE, None)
        res["rel_err"] = rel_err(out, ref)
        del ref
    return res


def cascade_tiles() -> list[tuple[int, int, int, int]]:
    """The launcher's default stage-A tile first, then two others."""
    t = sys.modules["radixrt.kernels.cascade_attention"].default_tile(D, DEV)
    default = (t.block_m, t.block_n, t.num_warps, t.num_stages)
    return list(dict.fromkeys([default, (64, 64, 4, 2), (128, 128, 8, 2)]))


def cascade_case(num_groups: int, group_size: int, prefix_len: int, quick: bool) -> dict:
    """Plain vs cascade decode for num_groups groups sharing prefix_len tokens (page-aligned)."""
    batch = num_groups * group_size
    gen = torch.Generator().manual_seed(num_groups)
    suffix = torch.randint(64, 193, (batch,), generator=gen)
    seq = (prefix_len + suffix).tolist()
    pool = Pool(sum(triton.cdiv(s, PAGE) * PAGE for s in seq))
    unshared = pool.page_table(seq)
    table = unshared.clone()
    for g in range(num_groups):  # members share the first member's prefix pages
        rows = slice(g * group_size, (g + 1) * group_size)
        table[rows, : prefix_len // PAGE] = table[g * group_size, : prefix_len // PAGE]
    ints = dict(dtype=torch.int32, device=DEV)
    seq_lens = torch.tensor(seq, **ints)
    kv_start = torch.full((batch,), prefix_len, **ints)
    members = torch.arange(batch, **ints)
    starts = torch.arange(0, batch + 1, group_size, **ints)
    prefix_lens = torch.full((num_groups,), prefix_len, **ints)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    ref = REF.cascade_decode_attention_ref(q, pool.k, pool.v, table, seq_lens, kv_start, members, starts,
                                           prefix_lens, PAGE, None)
    unique = (num_groups * prefix_len + int(suffix.sum())) * HKV * D * 2 * 2 + 2 * batch * HQ * D * 2
    res = {"batch": batch, "num_groups": num_groups, "prefix_len": prefix_len,
           "suffix_len_mean": float(suffix.float().mean()),
           "unique_bytes": unique, "tiles": []}

    splits = K.choose_num_kv_splits(batch, HKV, max(seq), num_sms)
    for name, tab in (("decode", table), ("decode_unshared", unshared)):
        def plain(tab=tab):
            K.decode_attention(q, pool.k, pool.v, tab, seq_lens, PAGE, None, splits, out=out)
        out.fill_(float("nan"))
        plain()
        res[name] = {"splits": splits, "ms_eager": bench_ms(plain), "ms_graph": graph_ms(plain),
                     "rel_err": rel_err(out, ref) if tab is table else None}

    splits = K.choose_num_kv_splits(batch, HKV, int(suffix.max()), num_sms)
    for bm, bn, warps, stages in cascade_tiles()[:1] if quick else cascade_tiles():
        tile = K.CascadeTile(bm, bn, warps, stages)
        auto = K.choose_num_prefix_splits(num_groups, group_size, HQ, HKV, prefix_len, num_sms, block_m=bm)
        for prefix_splits in sorted({auto} if quick else {1, auto, 2 * auto}):
            def cascade(tile=tile, prefix_splits=prefix_splits):
                K.cascade_decode_attention(q, pool.k, pool.v, table, seq_lens, kv_start, members, starts,
                                           prefix_lens, PAGE, None, splits, prefix_splits, group_size,
                                           out=out, tile=tile)
            out.fill_(float("nan"))
            cascade()
            res["tiles"].append({"tile": f"{bm}x{bn} w{warps} s{stages}", "splits": splits,
                                 "prefix_splits": prefix_splits, "auto": prefix_splits == auto,
                                 "ms_eager": bench_ms(cascade), "ms_graph": graph_ms(cascade),
                                 "rel_err": rel_err(out, ref)})
    res["best"] = min(res["tiles"], key=lambda t: t["ms_graph"])
    res["default"] = next(t for t in res["tiles"] if t["auto"])  # first tile = default_tile, auto splits
    return res


def print_cascade(rows: list[dict], bw: float) -> None:
    """Table rows of the cascade section (bw: copy ceiling, bytes/s)."""
    for r in rows:
        shape = (f"B={r['batch']} groups={r['num_groups']} prefix={r['prefix_len']} "
                 f"+~{r['suffix_len_mean']:.0f}")
        for name in ("decode", "decode_unshared"):
            t = r[name]
            err = "" if t["rel_err"] is None else f"{t['rel_err']:.1e}"
            print(f"| {name} (eager; graph {t['ms_graph'] * 1e3:.1f} us) | {shape} splits={t['splits']} | "
                  f"{t['ms_eager'] * 1e3:.1f} us | | | {err} |")
        for t in r["tiles"]:
            bps = r["unique_bytes"] / (t["ms_graph"] * 1e-3)
            mark = " (default)" if t is r["default"] else ""
            print(f"| cascade{mark} (eager; graph {t['ms_graph'] * 1e3:.1f} us) | {shape} tile {t['tile']} "
                  f"splits={t['splits']}+{t['prefix_splits']} | {t['ms_eager'] * 1e3:.1f} us | "
                  f"{bps / 1e12:.2f} TB/s unique (graph) | {100 * bps / bw:.0f} | {t['rel_err']:.1e} |")
        print(f"| cascade speed-up | {shape} | decode / best cascade: eager "
              f"{r['decode']['ms_eager'] / min(t['ms_eager'] for t in r['tiles']):.2f}x, graph "
              f"{r['decode']['ms_graph'] / r['best']['ms_graph']:.2f}x | | | |")


def sdpa_peer_cases() -> list[dict]:
    """torch SDPA backends on contiguous K/V at the headline shapes (decode 64 x 4,096 and
    128 x 2,048; 8,192 new tokens causal), checked against the fp32 math reference."""
    from sdpa_peers import peer_rows, reference

    rows = []
    for name, batch, lq, lk, causal in (("decode", 64, 1, 4096, False), ("decode", 128, 1, 2048, False),
                                        ("extend", 1, 8192, 8192, True)):
        q = torch.randn(batch, HQ, lq, D, device=DEV, dtype=BF16)
        k = torch.randn(batch, HKV, lk, D, device=DEV, dtype=BF16)
        v = torch.randn_like(k)
        rows.append({"kind": name, "batch": batch, "lq": lq, "lk": lk,
                     "backends": peer_rows(q, k, v, causal, reference(q, k, v, causal))})
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def print_peers(result: dict, bw: float, mm: float) -> None:
    """Table rows of the SDPA peers beside radixrt's time on the same shape."""
    ext = [r["ms"] for r in result["extend"] if r["prefix"] == 0 and r["new"] == 8192]
    ours = {("decode", 64, 4096): result["decode"]["ms"],
            ("decode", 128, 2048): result["decode_128x2048"]["ms"],
            ("extend", 1, 8192): ext[0] if ext else None}
    for r in result["sdpa_peers"]:
        mine = ours.get((r["kind"], r["batch"], r["lk"]))
        for backend, p in r["backends"].items():
            shape = f"B={r['batch']} ctx={r['lk']}" if r["kind"] == "decode" else f"{r['lq']} new, causal"
            if "us" not in p:
                print(f"| SDPA {backend} ({r['kind']}) | {shape} | {p['error'][:60]} | | | |")
                continue
            if r["kind"] == "decode":
                rate = (r["batch"] * r["lk"] * HKV * D * 4 + 2 * r["batch"] * HQ * D * 2) / (p["us"] * 1e-6)
                ach, pct = f"{rate / 1e12:.2f} TB/s", 100 * rate / bw
            else:
                rate = 4 * HQ * D * (r["lq"] * (r["lq"] + 1) // 2) / (p["us"] * 1e-6)
                ach, pct = f"{rate / 1e12:.0f} TFLOP/s", 100 * rate / mm
            vs = f"; radixrt / this = {mine * 1e3 / p['us']:.3f}" if mine else ""
            err = f"{p['rel_err']:.1e}" if p.get("rel_err") is not None else ""
            print(f"| SDPA {backend} ({r['kind']}, GQA {p['gqa']}{'' if p['graph'] else ', eager'}{vs}) | "
                  f"{shape} | {p['us']:.1f} us | {ach} | {pct:.0f} | {err} |")


def small_kernels(check: bool) -> list[dict]:
    """Bandwidth of the elementwise kernels at prefill size (8192 tokens)."""
    t, hidden, inter = 8192, 3584, 18944
    rows = []
    x, r = torch.randn(t, hidden, device=DEV, dtype=BF16), torch.randn(t, hidden, device=DEV, dtype=BF16)
    w = torch.randn(hidden, device=DEV, dtype=BF16)
    ms = bench_ms(lambda: K.rms_norm(x, w, 1e-6, r))
    row = {"kernel": "rms_norm+residual", "ms": ms, "bytes_per_s": 4 * t * hidden * 2 / (ms * 1e-3)}
    if check:
        row["rel_err"] = rel_err(K.rms_norm(x, w, 1e-6, r)[0], REF.rms_norm_ref(x, w, 1e-6, r)[0])
    rows.append(row)
    g = torch.randn(t, 2 * inter, device=DEV, dtype=BF16)
    ms = bench_ms(lambda: K.silu_and_mul(g))
    row = {"kernel": "silu_and_mul", "ms": ms, "bytes_per_s": 3 * t * inter * 2 / (ms * 1e-3)}
    if check:
        row["rel_err"] = rel_err(K.silu_and_mul(g), REF.silu_and_mul_ref(g))
    rows.append(row)
    cache = K.build_rope_cache(D, 32768, 1e6, device=DEV)
    q, k = torch.randn(t, HQ, D, device=DEV, dtype=BF16), torch.randn(t, HKV, D, device=DEV, dtype=BF16)
    pos = torch.randint(0, 32768, (t,), device=DEV)
    ms = bench_ms(lambda: K.apply_rotary(q, k, pos, cache))
    rows.append({"kernel": "apply_rotary", "ms": ms, "bytes_per_s": 2 * t * (HQ + HKV) * D * 2 / (ms * 1e-3)})
    pool_k = torch.randn(t + PAGE, HKV, D, device=DEV, dtype=BF16)
    pool_v = torch.randn_like(pool_k)
    loc = torch.randperm(t + PAGE, device=DEV)[:t]
    kn, vn = torch.randn(t, HKV, D, device=DEV, dtype=BF16), torch.randn(t, HKV, D, device=DEV, dtype=BF16)
    ms = bench_ms(lambda: K.store_kv(pool_k, pool_v, loc, kn, vn))
    rows.append({"kernel": "store_kv", "ms": ms, "bytes_per_s": 4 * t * HKV * D * 2 / (ms * 1e-3)})
    return rows


def run_all(quick: bool) -> dict:
    """Every section of the benchmark; the result dict that main prints and writes."""
    torch.manual_seed(0)
    result: dict = {**common.run_header(), "quick": quick,
                    "shape": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D, "page_size": PAGE}}
    print(f"{result['device']}, {result['num_sms']} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}",
          flush=True)
    from ceilings import measure_best_ceilings

    result["ceilings"] = ceil = measure_best_ceilings(copy_gib=1 if quick else 4)
    print(f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
          f"{ceil['matmul_flops_per_s'] / 1e12:.0f} "
          "TFLOP/s", flush=True)
    batches = [1, 64] if quick else [1, 4, 16, 64, 256]
    ctxs = [1024, 4096] if quick else [512, 2048, 8192, 32768]
    combos = [(b, c) for b in batches for c in ctxs if b * c * HKV * D * 2 * 2 <= 40 * GB]
    pool = Pool(max([64 * 4096, 8192] + [b * c for b, c in combos]))
    result["decode"] = headline = decode_case(pool, 64, 4096, check=True)
    print(f"decode 64x4096: {headline['ms'] * 1e3:.1f} us, {headline['bytes_per_s'] / 1e12:.2f} TB/s",
          flush=True)
    result["decode_sweep"] = [decode_case(pool, b, c, check=False) for b, c in combos]
    new = 2048 if quick else 8192
    result["extend"] = [extend_case(pool, 0, new, check=True),
                        extend_case(pool, new // 2, new // 2, check=True)]
    result["decode_128x2048"] = decode_case(pool, 128, 2048, check=True)
    result["sdpa_peers"] = sdpa_peer_cases()
    result["small_kernels"] = small_kernels(check=True)
    result["cascade"] = [cascade_case(1, 128, 2048, quick), cascade_case(4, 32, 2048, quick)]
    errs = [r["rel_err"] for r in [headline, result["decode_128x2048"]] + result["extend"]
            + result["small_kernels"] if "rel_err" in r]
    errs += [t["rel_err"] for r in result["cascade"] for t in r["tiles"] + [r["decode"]]]
    result["max_rel_err"] = max(errs)
    result["correct"] = all(e == e and e <= 1e-2 for e in errs)  # e == e rejects NaN
    return result


def print_table(result: dict) -> None:
    """The markdown table of every measured row (bench/results/kernels.md takes its figures from it)."""
    ceil, quick = result["ceilings"], result["quick"]
    bw, mm = ceil["copy_bytes_per_s"], ceil["matmul_flops_per_s"]
    print("\n| what | shape | time | achieved | % of ceiling | rel err |\n|---|---|---|---|---|---|")
    print(f"| copy (ceiling) | {'1' if quick else '4'} GiB | {ceil['copy_ms']:.3f} ms | {bw / 1e12:.2f} TB/s "
          "| 100 | |")
    print(f"| bf16 matmul (ceiling) | 8192^3 | {ceil['matmul_ms']:.3f} ms | {mm / 1e12:.0f} TFLOP/s "
          "| 100 | |")
    for r in [result["decode"], result["decode_128x2048"]] + result["decode_sweep"]:
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        print(f"| decode (graph; eager {r['ms_eager'] * 1e3:.0f} us) | B={r['batch']} ctx={r['ctx']} "
              f"splits={r['splits']} | {r['ms'] * 1e3:.1f} us | "
              f"{r['bytes_per_s'] / 1e12:.2f} TB/s | {100 * r['bytes_per_s'] / bw:.0f} | {err} |")
    for r in result["extend"]:
        print(f"| extend | prefix={r['prefix']} new={r['new']} | {r['ms']:.3f} ms | "
              f"{r['flops_per_s'] / 1e12:.0f} TFLOP/s | {100 * r['flops_per_s'] / mm:.0f} | "
              f"{r['rel_err']:.1e} |")
    for r in result["small_kernels"]:
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        print(f"| {r['kernel']} | 8192 tokens | {r['ms'] * 1e3:.1f} us | {r['bytes_per_s'] / 1e12:.2f} TB/s "
              f"| {100 * r['bytes_per_s'] / bw:.0f} | {err} |")
    print_peers(result, bw, mm)
    print_cascade(result["cascade"], bw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller ceilings, headline shapes, short sweep")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/kernels.json if OUT is set)")
    parser.add_argument("--use-best", default=None, metavar="FILE",
                        help="attention config overrides (sweep_kernels.py's JSON) to apply first")
    args = parser.parse_args()
    if args.use_best:
        applied = sys.modules["radixrt.kernels.attention_configs"].load_overrides(args.use_best)
        print(f"attention config overrides from {args.use_best}: {applied}", flush=True)
    if not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA device")
    result = run_all(args.quick)
    print_table(result)
    print("\ncorrectness (rel err <= 1e-2 at every headline shape): "
          f"{'PASS' if result['correct'] else 'FAIL'}")
    common.write_json(common.out_path(args.out, "kernels.json"), result)
    if not result["correct"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
