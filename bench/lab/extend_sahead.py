"""Extend attention with each block's scores issued one block ahead (`S_AHEAD`) against the default
loop and cuDNN SDPA, in one GPU run (issue 19: extend 8K causal at or under cuDNN).

    python3 bench/lab/extend_sahead.py [--out extend-sahead.json] [--rounds 2]

`S_AHEAD` (kernels/extend_attention.py `_new_tokens_scores_ahead`) runs the new-token blocks before
the diagonal as: P[j-1] V[j-1] (synchronous: its wait also completes block j's scores), the scores of
block j + 1 issued, block j's softmax while they are in flight. Compiled for sm_90 on the CPU
(2026-12-04, Triton 3.6), the look-ahead dot stays asynchronous (no `warp_group_dot_wait` after it in
the loop: FlashAttention-3's intra-warpgroup overlap of softmax and the next QK^T), and P is carried
to the next step through shared memory. Variants: S_AHEAD off / on, the new K/V through pointer loads
or TMA, tiles. Shapes: 8,192 new tokens causal (the goal's), 4,096 new over 4,096 cached (the paged
prefix loop is the same in both forms), 2 x 4,096 new. Every variant is checked against the fp32
SDPA reference before it is timed (CUDA-graph replay, median; bench/kernels/sdpa_peers.device_ms);
`--rounds` repeats the timing of every variant in alternation.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sdpa_peers import device_ms, peer_rows, reference  # noqa: E402

from bench.common import out_path, rel_err, run_header, write_json  # noqa: E402
from kernels import attention_configs as AC  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402

HQ, HKV, D, PAGE = 28, 4, 128, 16
DEV = "cuda"
BF16 = torch.bfloat16
B = "d128"
TOL = 1e-2
T0 = time.time()
# (name, override of the "extend" d128 entry)
VARIANTS = [
    ("default", {}),
    ("s_ahead", {"S_AHEAD": True}),
    ("tma", {"USE_TMA": True}),
    ("s_ahead tma", {"S_AHEAD": True, "USE_TMA": True}),
    ("s_ahead 2 stages", {"S_AHEAD": True, "num_stages": 2}),
    ("s_ahead tma 2 stages", {"S_AHEAD": True, "USE_TMA": True, "num_stages": 2}),
    ("s_ahead 4 warps 64 rows", {"S_AHEAD": True, "BLOCK_M": 64, "num_warps": 4}),
    ("s_ahead 128x32", {"S_AHEAD": True, "BLOCK_N": 32}),
]


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def _paged(kc: torch.Tensor, vc: torch.Tensor, seq_len: int):
    """Contiguous [1, Hkv, L, D] K/V scattered into a token-major pool of random page order."""
    per = -(-seq_len // PAGE)
    table = (torch.randperm(per, device=DEV) + 1).view(1, per).int()
    slots = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=DEV)).view(-1)[:seq_len]
    kb = torch.zeros((per + 1) * PAGE, HKV, D, device=DEV, dtype=kc.dtype)
    vb = torch.zeros_like(kb)
    kb[slots] = kc[0].transpose(0, 1)
    vb[slots] = vc[0].transpose(0, 1)
    return kb, vb, table


def shape_runs(prefix: int, new: list[int]):
    """(label, flops, cudnn us or None, ref [T, Hq, D] fp32, run(), out) for requests of `new` tokens
    each over `prefix` cached tokens (one request when prefix > 0)."""
    total = sum(new)
    qkv = torch.empty(total, (HQ + 2 * HKV) * D, device=DEV, dtype=BF16)
    q, k, v = (t.view(total, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
    q.normal_()
    k.normal_()
    v.normal_()
    refs, flops, cudnn = [], 0, None
    tables, kbs, vbs = [], [], []
    start = 0
    for n in new:
        sl = slice(start, start + n)
        q4 = q[sl].transpose(0, 1)[None].contiguous()
        kc = torch.randn(1, HKV, prefix + n, D, device=DEV, dtype=BF16)
        vc = torch.randn_like(kc)
        kc[0, :, prefix:] = k[sl].transpose(0, 1)
        vc[0, :, prefix:] = v[sl].transpose(0, 1)
        refs.append(reference(q4, kc, vc, True)[0].transpose(0, 1))
        if len(new) == 1:
            cudnn = peer_rows(q4, kc, vc, True, None, backends=("cudnn",)).get("cudnn", {}).get("us")
        if prefix:
            kb, vb, table = _paged(kc[:, :, :prefix], vc[:, :, :prefix], prefix)
            tables.append(table)
            kbs.append(kb)
            vbs.append(vb)
        flops += 4 * HQ * D * (prefix * n + n * (n + 1) // 2)
        start += n
    ref = torch.cat(refs)
    nb = len(new)
    if prefix:
        kb, vb, table = kbs[0], vbs[0], tables[0]
    else:
        kb = vb = torch.zeros(PAGE, HKV, D, device=DEV, dtype=BF16)
        table = torch.zeros(nb, 1, dtype=torch.int32, device=DEV)
    ext = torch.tensor(new, dtype=torch.int32, device=DEV)
    starts = torch.zeros_like(ext)
    starts[1:] = torch.cumsum(ext, 0)[:-1]
    prefix_lens = torch.full((nb,), prefix, dtype=torch.int32, device=DEV)
    out = torch.empty(total, HQ, D, device=DEV, dtype=BF16)
    run = partial(extend_attention, q, k, v, kb, vb, table, prefix_lens, ext, starts, PAGE, None, max(new),
                  out=out, max_seq_len=prefix + max(new))
    label = (f"{new[0]} new over {prefix} cached" if prefix else
             f"{new[0]} new causal" if nb == 1 else f"{nb} x {new[0]} new causal")
    return label, flops, cudnn, ref, run, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", nargs="*", default=None, help="names of VARIANTS to run (default all)")
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("extend_sahead needs a CUDA device")
    torch.manual_seed(0)
    variants = [v for v in VARIANTS if ns.variants is None or v[0] in ns.variants]
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "extend-sahead.json")
    table: list[tuple[str, str, float, float | None, float | None]] = []
    for prefix, new in [(0, [8192]), (4096, [4096]), (0, [4096, 4096])]:
        label, flops, cudnn, ref, run, out = shape_runs(prefix, new)
        ok = []
        for name, over in variants:
            with AC.overriding({"extend": {B: over}}):
                try:
                    out.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    err = rel_err(out.float(), ref)
                except Exception as e:  # noqa: BLE001 - a variant that fails is recorded
                    err, msg = None, f"{type(e).__name__}: {str(e)[:200]}"
            if err is None or not err <= TOL:
                row = {"shape": label, "variant": name, "error": msg if err is None else f"rel err {err:.2e}"}
                result["rows"].append(row)
                log(f"{label:28} {name:26} {row['error']}")
                continue
            ok.append((name, over, err))
        times: dict[str, list[float]] = {name: [] for name, _, _ in ok}
        for _ in range(ns.rounds):
            for name, over, _ in ok:
                with AC.overriding({"extend": {B: over}}):
                    ms, _graphed = device_ms(run)
                times[name].append(ms * 1e3)
        for name, over, err in ok:
            us = min(times[name])
            row = {"shape": label, "variant": name, "override": over, "us_rounds": times[name], "us": us,
                   "rel_err": err, "tflops": flops / (us * 1e-6) / 1e12, "cudnn_us": cudnn,
                   "vs_cudnn": us / cudnn if cudnn else None}
            result["rows"].append(row)
            table.append((label, name, us, cudnn, row["vs_cudnn"]))
            vs = f" vs cuDNN {row['vs_cudnn']:.3f}" if cudnn else ""
            log(f"{label:28} {name:26} {' / '.join(f'{t:.1f}' for t in times[name])} us "
                f"{row['tflops']:5.0f} TFLOP/s{vs} err {err:.1e}")
        if cudnn:
            log(f"{label:28} cuDNN {cudnn:.1f} us ({flops / (cudnn * 1e-6) / 1e12:.0f} TFLOP/s)")
        write_json(path, result)
        del ref, run, out
        torch.cuda.empty_cache()
    print("\n| shape | variant | us (best of rounds) | cuDNN us | / cuDNN |")
    print("|---|---|---|---|---|")
    for label, name, us, cudnn, vs in table:
        print(f"| {label} | {name} | {us:.1f} | {cudnn or '-'} | {f'{vs:.3f}' if vs else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
