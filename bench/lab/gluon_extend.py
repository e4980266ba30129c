"""Lab: the warp-specialized Gluon extend kernel (kernels/extend_attention_ws.py) on one GPU.

First run (2026-12-04 18:09 UTC, H200) used this file's own copy of the kernel without the paged
prefix (8,192 causal: 816 us at 128 x 3 stages against cuDNN's 863 and the Triton kernel's 1,015);
the kernel now lives in kernels/ with the prefix read page by page, and this file times it:
each case checked against an fp32 reference first (SDPA per request without a prefix,
kernels.reference with one), then timed as CUDA-graph replay (do_bench median over replays, L2
flushed per replay: the Gluon launch's host work, five TMA descriptors, would otherwise show in
do_bench's eager timing whenever it outlasts the L2 flush), with the host time per eager call
(50 calls back to back, no sync between) beside it, for the Triton
extend kernel (RADIXRT_EXTEND_WS off: min_extend_len not passed) and, without a prefix, cuDNN and
flash SDPA on contiguous K/V (their best case). Cases: "N" (one request, N new tokens),
"P:N" (prefix P read from the pool, N new), joined by "+" for one launch of several requests.

    python3 bench/lab/gluon_extend.py [--shapes 8192,4096:4096,1000:777+0:2048] [--configs 128x3,128x2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


# ---------------------------------------------------------------------------------------------- GPU
def _sdpa_ref(q, k, v, starts, lens, scale):
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
        qq = q[s:s + n].transpose(0, 1).float()
        kk = k[s:s + n].transpose(0, 1).float().repeat_interleave(group, 0)
        vv = v[s:s + n].transpose(0, 1).float().repeat_interleave(group, 0)
        o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale)
        out[s:s + n] = o.transpose(0, 1).to(q.dtype)
    return out


def run_case(case: str, configs: list, dtype: torch.dtype) -> dict:
    """One case: reference, Triton kernel, extend_attention as routed, SDPA peers, each WS config."""
    from bench.common import graph_ms, rel_err
    from bench.kernels_import import import_kernels

    K = import_kernels()
    from radixrt.kernels import extend_attention_ws as WS
    from radixrt.kernels import reference as REF

    dev, page = "cuda", 16
    hq, hkv, d = 28, 4, 128
    scale = 1.0 / math.sqrt(d)
    reqs = [(int(c.split(":")[0]), int(c.split(":")[1])) if ":" in c else (0, int(c))
            for c in case.split("+")]
    prefixes = [p for p, _ in reqs]
    lens = [n for _, n in reqs]
    t = sum(lens)
    q = torch.randn(t, hq, d, device=dev, dtype=dtype)
    k = torch.randn(t, hkv, d, device=dev, dtype=dtype)
    v = torch.randn(t, hkv, d, device=dev, dtype=dtype)
    # pool: pages in random order, page 0 left as a sink
    pages_per = [(p + page - 1) // page for p in prefixes]
    num_pages = sum(pages_per) + 1
    pool_k = torch.randn(num_pages * page, hkv, d, device=dev, dtype=dtype)
    pool_v = torch.randn(num_pages * page, hkv, d, device=dev, dtype=dtype)
    perm = (torch.randperm(num_pages - 1, device=dev) + 1).to(torch.int32)
    table = torch.zeros(len(reqs), max(1, max(pages_per)), dtype=torch.int32, device=dev)
    off = 0
    for i, n in enumerate(pages_per):
        table[i, :n] = perm[off:off + n]
        off += n
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    pre_t = torch.tensor(prefixes, dtype=torch.int32, device=dev)
    starts = torch.zeros_like(lens_t)
    starts[1:] = torch.cumsum(lens_t, 0)[:-1]
    if any(prefixes):
        ref = REF.extend_attention_ref(q, k, v, pool_k, pool_v, table, pre_t, lens_t, starts, page, scale)
    else:
        ref = _sdpa_ref(q, k, v, starts, lens_t, scale)
    pairs = sum(p * n + n * (n + 1) // 2 for p, n in reqs)
    row = {"case": case, "dtype": str(dtype)}
    max_seq = max(p + n for p, n in reqs)
    out = torch.empty_like(q)

    def run_triton():
        K.extend_attention(q, k, v, pool_k, pool_v, table, pre_t, lens_t, starts, page, None, max(lens),
                           out=out, max_seq_len=max_seq)

    def run_routed():
        K.extend_attention(q, k, v, pool_k, pool_v, table, pre_t, lens_t, starts, page, None, max(lens),
                           out=out, max_seq_len=max_seq, min_extend_len=min(lens))

    def host_us(fn, n=50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    for name, fn in (("triton", run_triton), ("routed", run_routed)):
        out.fill_(float("nan"))
        fn()
        row[name + "_err"] = rel_err(out, ref)
        row[name + "_us"] = graph_ms(fn) * 1e3
        row[name + "_host_us"] = host_us(fn)
    if not any(prefixes) and len(lens) == 1:
        qs = q.transpose(0, 1).unsqueeze(0).contiguous()
        ks = k.transpose(0, 1).unsqueeze(0).repeat_interleave(hq // hkv, 1).contiguous()
        vs = v.transpose(0, 1).unsqueeze(0).repeat_interleave(hq // hkv, 1).contiguous()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run_sdpa():
            torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    run_sdpa()
                    row[f"{name}_us"] = graph_ms(run_sdpa) * 1e3
            except Exception as exc:  # a backend that refuses the shape is reported, not fatal
                row[f"{name}_error"] = repr(exc)[:200]
    for (block_n, stages) in configs:
        key = f"ws_{block_n}x{stages}"

        def run_ws(block_n=block_n, stages=stages):
            WS.extend_attention_ws(q, k, v, pool_k, pool_v, table, pre_t, lens_t, starts, page, scale,
                                   max(lens), out, block_n=block_n, stages=stages)
        try:
            out.fill_(float("nan"))
            run_ws()
            torch.cuda.synchronize()
            row[key + "_err"] = rel_err(out, ref)
            if row[key + "_err"] < 1e-2:
                row[key + "_us"] = graph_ms(run_ws) * 1e3
        except Exception as exc:
            row[key + "_error"] = repr(exc)[:300]
    for key in list(row):
        if key.endswith("_us") and row[key]:
            row[key.replace("_us", "_tflops")] = 4 * hq * d * pairs / (row[key] * 1e-6) / 1e12
    return row


def run_gpu(args) -> dict:
    torch.manual_seed(0)
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    dtype = torch.float16 if args.fp16 else torch.bfloat16
    results = {"rows": []}
    for case in args.shapes.split(","):
        row = run_case(case, configs, dtype)
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1024,8192,4096:4096,2048+2048+1000+3000,1000:777+0:2048+3000:1500,"
                                        "16000:512")
    ap.add_argument("--configs", default="128x3,128x2")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = run_gpu(args)
    Path(args.out, "gluon_extend.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
