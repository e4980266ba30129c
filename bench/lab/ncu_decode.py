"""One decode-attention shape launched a few times eagerly, for Nsight Compute (issue 19).

    ncu --clock-control none --set full -k regex:_decode_split --launch-skip 2 --launch-count 1 \
        python3 bench/lab/ncu_decode.py --pool fp8 --batch 256 --ctx 512

Qwen2.5-7B heads (28 / 4, D 128), page 16, random page order (kv_layout._paged), the default
launch config and split count of the attention backend for the pool (max_seq_len passed, as the
backend does). Prints the launch's config and the time of one eager call; the counters are ncu's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_layout as kl  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pool", choices=["bf16", "fp8"], default="fp8")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--cudnn", action="store_true",
                   help="then cuDNN SDPA (contiguous K/V, bf16 pool only) as many times: the same-run peer")
    p.add_argument("--lab", default=None,
                   help="then bench/lab/decode_vt.py forms, e.g. v_bf16:128x8w2s,eng_bf16:128x8w2s (not the "
                        "integer-widening ws_f16i* forms, whose scales this launch does not carry)")
    ns = p.parse_args(argv)
    torch.manual_seed(0)
    fp8 = ns.pool == "fp8"
    q = torch.randn(ns.batch, kl.HQ, kl.D, device=kl.DEV, dtype=kl.BF16)
    kc = torch.randn(ns.batch, kl.HKV, ns.ctx, kl.D, device=kl.DEV, dtype=kl.BF16)
    vc = torch.randn_like(kc)
    scales = {}
    if fp8:
        kc, vc = (kc / kl.K_SCALE).to(kl.FP8), (vc / kl.V_SCALE).to(kl.FP8)
        scales = {"k_scale": kl.K_SCALE, "v_scale": kl.V_SCALE}
    kb, vb, table = kl._paged(kc, vc, ns.ctx)
    seq_lens = torch.full((ns.batch,), ns.ctx, dtype=torch.int32, device=kl.DEV)
    num_sms = torch.cuda.get_device_properties(kl.DEV).multi_processor_count
    splits = kl.K.choose_num_kv_splits(ns.batch, kl.HKV, ns.ctx, num_sms, kv_fp8=fp8)
    out = torch.empty_like(q)
    mid_o = torch.empty(ns.batch, kl.HQ, splits, kl.D, device=kl.DEV)
    mid_lse = torch.empty(ns.batch, kl.HQ, splits, device=kl.DEV)
    for _ in range(ns.calls):
        kl.K.decode_attention(q, kb, vb, table, seq_lens, kl.PAGE, None, splits, out=out, mid_o=mid_o,
                              mid_lse=mid_lse, max_seq_len=ns.ctx, **scales)
    torch.cuda.synchronize()
    print(f"{ns.pool} {ns.batch} x {ns.ctx}: {splits} split(s)")
    if ns.lab:
        import decode_vt as vt

        qk = kl.D ** -0.5 * 1.4426950408889634 * (kl.K_SCALE if fp8 else 1.0)
        for item in ns.lab.split(","):
            form, cfg = item.split(":")
            bn, warps, stages = (int(x) for x in cfg.replace("w", "x").rstrip("s").split("x"))
            v_any = vb if form in vt.V_POOL_FORMS else vt.to_vt_pages(vb, kl.PAGE)  # V^T pages (vt_*, ws_vt)
            for _ in range(ns.calls):
                vt.decode_vt(q, kb, v_any, table, seq_lens, out, qk, kl.V_SCALE if fp8 else 1.0, form, bn,
                             warps, stages)
            torch.cuda.synchronize()
            print(f"lab {form} {cfg} launched {ns.calls} times")
    if ns.cudnn and not fp8:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(ns.calls):
                sdpa(q[:, :, None], kc, vc, enable_gqa=True)
        torch.cuda.synchronize()
        print(f"cuDNN SDPA launched {ns.calls} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
