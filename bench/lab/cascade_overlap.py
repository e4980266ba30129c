"""Cascade decode attention with its prefix stage on a side stream beside the suffix stage, against
the default order (prefix, then the suffix program that merges the prefix partials itself), issue 19
part 4 (`shared-prefix` at ~0.76 of the read-once bound).

    python3 bench/lab/cascade_overlap.py [--out F]      # H200, ~30 s
    python3 bench/lab/cascade_overlap.py --walk [--out F]   # a graph's padded groups, stage A's grid order

In the `shared-prefix` decode pass cascade attention takes ~48 us per layer at batch 128: stage A
(kernels/cascade_attention.py, 112 programs at one per SM) ~27 us, then the suffix (B, 512 short
programs bound by latency, merging A's partials) ~21 us, one after the other. B reads only
[kv_start, seq_len) of each request, never A's partials, so it could run beside A, with a merge
launch (C) after both. The lab composes the stages itself (`run_prefix_stage` on a side stream,
decode_attention's `run_split_stage` on the current one, a join, `run_merge_stage`), also in order
on one stream. Shapes as bench/lab/sweep_attention.py's cascade part (one group sharing 2,048
tokens, 128-192 own tokens per request, Qwen2.5-7B heads, page 16); us of CUDA-graph replay with the
L2 flushed before each call (its own time subtracted); every variant checked against the fp32
reference first.

--ws: stage A in the warp-specialized Gluon kernel (kernels/cascade_prefix_ws.py) against the Triton
kernel, whole calls and stage A alone, at several prefix split counts.

--walk: a decode graph pads the groups to 8 (7 empty), and stage A's grid bound then has 8 spare
row blocks (programs that find no group and exit): the whole call for one group and for the graph's
8, with the grid's row-block axis first (the default) or last (config "cascade" blocks_last, so the
spare programs start after every real one).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "lab"))
sys.path.insert(0, str(ROOT))

import sweep_attention as SA  # noqa: E402

from bench.common import out_path, run_header, write_json  # noqa: E402

K, bk = SA.K, SA.bk
CA = sys.modules["radixrt.kernels.cascade_attention"]
DA = sys.modules["radixrt.kernels.decode_attention"]


def staged(a: dict, o: torch.Tensor, kv_splits: int, ps: int, side: torch.cuda.Stream | None):
    """A (on `side` when given) and B, then C: cascade_decode_attention's result in three launches."""
    mid_o = torch.empty(*o.shape[:2], kv_splits + ps, o.shape[2], device=o.device, dtype=torch.float32)
    mid_lse = torch.empty(*o.shape[:2], kv_splits + ps, device=o.device, dtype=torch.float32)
    qk_scale = 1.0 / math.sqrt(o.shape[2]) * DA.LOG2E
    tile = CA.default_tile(o.shape[2], o.device)
    stage_a = (a["q"], a["k_buffer"], a["v_buffer"], a["page_table"], a["group_members"], a["group_starts"],
               a["group_prefix_lens"], a["page_size"], qk_scale, 1.0, kv_splits, ps, mid_o, mid_lse, tile)
    stage_b = (a["q"], a["k_buffer"], a["v_buffer"], a["page_table"], a["seq_lens"], a["kv_start"],
               a["page_size"], qk_scale, kv_splits, mid_o, mid_lse)

    def run() -> None:
        if side is None:
            CA.run_prefix_stage(*stage_a)
            DA.run_split_stage(*stage_b)
        else:
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                CA.run_prefix_stage(*stage_a)
            DA.run_split_stage(*stage_b)
            main.wait_stream(side)
        DA.run_merge_stage(mid_o, mid_lse, o, kv_splits, a["kv_start"], ps)

    return run


def padded(a: dict, groups: int) -> dict:
    """The same batch as one real group followed by groups - 1 empty ones (a decode graph's padding)."""
    batch = a["q"].shape[0]
    ints = {"dtype": a["group_starts"].dtype, "device": a["group_starts"].device}
    return {**a, "group_starts": torch.tensor([0] + [batch] * groups, **ints),
            "group_prefix_lens": torch.cat([a["group_prefix_lens"],
                                            torch.zeros(groups - 1, **ints)])}


def walk_part(batches: list[int]) -> list[dict]:
    AC = sys.modules["radixrt.kernels.attention_configs"]
    rows = []
    for batch in batches:
        a, ref = SA.cascade_batch(batch, SA.PREFIX_LEN, 128, 192)
        ps = CA.choose_num_prefix_splits(1, batch, SA.HQ, SA.HKV, SA.PREFIX_LEN)
        o = torch.empty_like(a["q"])
        for groups in (1, 8):
            args = a if groups == 1 else padded(a, groups)
            for last in (False, True):
                def run(args=args, ps=ps, batch=batch, o=o):
                    K.cascade_decode_attention(**args, num_kv_splits=1, num_prefix_splits=ps,
                                               max_group_size=batch, out=o)
                with AC.overriding({"cascade": {"d128": {"blocks_last": last}}}):
                    o.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    err = bk.rel_err(o, ref)
                    us = SA.graph_us(run) if err < 1e-2 else float("nan")
                rows.append({"batch": batch, "groups": groups, "blocks_last": last, "us": us, "rel_err": err})
                print(f"B={batch:3d} groups {groups} blocks_last {last!s:5s}: {us:6.1f} us  err {err:.1e}",
                      flush=True)
    return rows


def ws_part(batches: list[int]) -> list[dict]:
    """The whole cascade call (fused form, the graph's 8 groups and one) and stage A alone, with stage A
    in the Gluon kernel (RADIXRT_CASCADE_WS=1, kernels/cascade_prefix_ws.py) and in the Triton kernel
    (=0), at the launcher's prefix split count and others; the setting is read at each launch."""
    import os

    rows = []
    for batch in batches:
        a, ref = SA.cascade_batch(batch, SA.PREFIX_LEN, 128, 192)
        ps0 = CA.choose_num_prefix_splits(1, batch, SA.HQ, SA.HKV, SA.PREFIX_LEN)
        o = torch.empty_like(a["q"])
        for groups in (8, 1):
            args = a if groups == 1 else padded(a, groups)
            for ps in sorted({ps0, 2, 4, 8, 16}):
                for ws in ("1", "0"):
                    os.environ["RADIXRT_CASCADE_WS"] = ws

                    def run(args=args, ps=ps, batch=batch, o=o):
                        K.cascade_decode_attention(**args, num_kv_splits=1, num_prefix_splits=ps,
                                                   max_group_size=batch, out=o)
                    o.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    err = bk.rel_err(o, ref)
                    us = SA.graph_us(run) if err < 1e-2 else float("nan")
                    row = {"batch": batch, "groups": groups, "prefix_splits": ps, "ws": ws == "1",
                           "default_splits": ps == ps0, "us": us, "rel_err": err}
                    if groups == 1:  # stage A alone
                        f32 = {"device": o.device, "dtype": torch.float32}
                        mid = torch.empty(batch, SA.HQ, 1 + ps, o.shape[2], **f32)
                        lse = torch.empty(batch, SA.HQ, 1 + ps, **f32)
                        tile = CA.default_tile(o.shape[2], o.device)
                        qk = 1.0 / math.sqrt(o.shape[2]) * DA.LOG2E

                        def run_a(a=a, ps=ps, mid=mid, lse=lse, tile=tile, qk=qk):
                            CA.run_prefix_stage(a["q"], a["k_buffer"], a["v_buffer"], a["page_table"],
                                                a["group_members"], a["group_starts"], a["group_prefix_lens"],
                                                a["page_size"], qk, 1.0, 1, ps, mid, lse, tile)
                        run_a()
                        row["stage_a_us"] = SA.graph_us(run_a)
                    rows.append(row)
                    print(f"B={batch:3d} groups {groups} splits {ps:2d} ws {ws}: {us:6.1f} us"
                          + (f" (stage A {row['stage_a_us']:6.1f})" if "stage_a_us" in row else "")
                          + f"  err {err:.1e}", flush=True)
    os.environ.pop("RADIXRT_CASCADE_WS", None)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="128,32,64,256")
    ap.add_argument("--walk", action="store_true", help="the padded-groups / grid-order A/B instead")
    ap.add_argument("--ws", action="store_true", help="stage A in the Gluon kernel against Triton's instead")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    SA.L2_FLUSH.append(torch.empty(256 << 20, dtype=torch.uint8, device=SA.DEV))
    if args.ws:
        header = run_header()
        rows = ws_part([int(b) for b in args.batches.split(",")])
        write_json(out_path(args.out, "cascade-ws.json"), {"header": header, "rows": rows})
        return 0
    if args.walk:
        header = run_header()
        rows = walk_part([int(b) for b in args.batches.split(",")])
        write_json(out_path(args.out, "cascade-walk.json"), {"header": header, "rows": rows})
        return 0
    side = torch.cuda.Stream()
    header = run_header()
    print(header, flush=True)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        a, ref = SA.cascade_batch(batch, SA.PREFIX_LEN, 128, 192)
        ps0 = CA.choose_num_prefix_splits(1, batch, SA.HQ, SA.HKV, SA.PREFIX_LEN)
        o = torch.empty_like(a["q"])
        variants = [("default (A; B with the merge)", 1, ps0, None, None)]
        for ps in sorted({ps0, 2, 4, 8}):
            variants.append((f"A || B; C, {ps} prefix splits", 1, ps, side, True))
        variants.append((f"A || B; C, 2 suffix splits, {ps0} prefix splits", 2, ps0, side, True))
        variants.append((f"A; B; C on one stream, 2 suffix splits, {ps0} prefix splits", 2, ps0, None, True))
        for name, kv_splits, ps, stream, three in variants:
            if three:
                run = staged(a, o, kv_splits, ps, stream)
            else:
                def run(a=a, o=o, ps=ps, batch=batch):
                    K.cascade_decode_attention(**a, num_kv_splits=1, num_prefix_splits=ps,
                                               max_group_size=batch, out=o)
            o.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = bk.rel_err(o, ref)
            us = SA.graph_us(run) if err < 1e-2 else float("nan")
            rows.append({"batch": batch, "variant": name, "suffix_splits": kv_splits, "prefix_splits": ps,
                         "side_stream": stream is not None, "us": us, "rel_err": err})
            print(f"B={batch:3d} {name:60s} {us:7.1f} us  err {err:.1e}", flush=True)
    write_json(out_path(args.out, "cascade-overlap.json"), {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
