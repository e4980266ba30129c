"""Warp-specialised extend attention for new tokens only (no cached prefix) against the default
extend kernel and cuDNN SDPA, in one GPU run (issue 19: extend 8K causal at or under cuDNN).

    python3 bench/lab/extend_ws.py [--out extend-ws.json]              # variants without WS
    timeout 40 python3 bench/lab/extend_ws.py --shapes 1 --no-default --variants 1   # one WS variant

Triton 3.6 runs its Hopper warp-specialisation pass (`NVGPUWarpSpecialization`) on a loop marked
`tl.range(..., warp_specialize=True)` in a 4-warp kernel: it splits the 128 query rows over two
4-warp consumer groups (64 rows each, one wgmma side) and adds a producer group that issues the TMA
copies of K and V (12 warps, `setmaxnreg` per group), the structure of FlashAttention-3 (Shah et al.
2024) without its explicit ping-pong. Checked on the CPU by compiling for sm_90 (2026-12-03): the
pass accepts one loop per kernel over descriptor loads; a second loop after it (the default kernel's
separate diagonal loop) or the paged prefix loop makes it fail, so this kernel runs ONE loop over
[0, min((mb + 1) * BLOCK_M, ext_len)) with the causal mask applied in every block.

Variants: WS on / off, V rows past the request masked (MASK_V: the rows of the next request in the
packed batch are otherwise multiplied by p = 0, which is exact for finite values), tiles. Every
variant is checked against the fp32 SDPA reference (single 8K request and a packed batch of three
requests) before it is timed. Timing: CUDA-graph replay, median (sdpa_peers.device_ms).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sdpa_peers import device_ms, peer_rows, reference  # noqa: E402

from bench.common import out_path, rel_err, run_header, write_json  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402

HQ, HKV, D = 28, 4, 128
DEV = "cuda"
BF16 = torch.bfloat16
LOG2E = 1.4426950408889634
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


@triton.jit
def _extend_new_ws_kernel(desc_q, desc_k, desc_v, o, qk_scale, stride_o_t, stride_o_h,
                          extend_lens, extend_start_loc, num_m_blocks,
                          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, WS: tl.constexpr, MASK_V: tl.constexpr):
    mb = num_m_blocks - 1 - tl.program_id(1)  # longest query blocks first
    h = tl.program_id(0)
    b = tl.program_id(2)
    kvh = h // GROUP
    ext_len = tl.load(extend_lens + b)
    tok0 = tl.load(extend_start_loc + b)
    if mb * BLOCK_M < ext_len:
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        q = desc_q.load([tok0 + mb * BLOCK_M, h * HEAD_DIM])
        for n0 in tl.range(0, tl.minimum((mb + 1) * BLOCK_M, ext_len), BLOCK_N, warp_specialize=WS):
            k = desc_k.load([tok0 + n0, kvh * HEAD_DIM])
            s = tl.dot(q, k.T)
            idx = n0 + offs_n
            s = tl.where((idx[None, :] <= offs_m[:, None]) & (idx[None, :] < ext_len), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = desc_v.load([tok0 + n0, kvh * HEAD_DIM])
            if MASK_V:
                v = tl.where((idx < ext_len)[:, None], v, 0.0)
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        # l_i started at 1 (the FA tutorial's form) and every row sees key 0 in the first block, whose
        # alpha = exp2(-inf) = 0 removes that 1
        acc = acc / l_i[:, None]
        tl.store(o + (tok0 + offs_m)[:, None].to(tl.int64) * stride_o_t + h * stride_o_h + offs_d[None, :],
                 acc.to(o.dtype.element_ty), mask=(offs_m < ext_len)[:, None])


def extend_new_ws(q, k, v, ext_lens, starts, max_len, out, block_m, block_n, warps, stages, ws, mask_v):
    """q [T, Hq, D], k / v [T, Hkv, D] bf16 (contiguous), ext_lens / starts [B] int32."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = q.shape[0]
    dq = TensorDescriptor(q.view(t, -1), shape=[t, HQ * D], strides=[HQ * D, 1], block_shape=[block_m, D])
    dk = TensorDescriptor(k.view(t, -1), shape=[t, HKV * D], strides=[HKV * D, 1], block_shape=[block_n, D])
    dv = TensorDescriptor(v.view(t, -1), shape=[t, HKV * D], strides=[HKV * D, 1], block_shape=[block_n, D])
    grid = (HQ, triton.cdiv(max_len, block_m), ext_lens.shape[0])
    _extend_new_ws_kernel[grid](dq, dk, dv, out, (1.0 / D ** 0.5) * LOG2E, out.stride(0), out.stride(1),
                                ext_lens, starts, grid[1], GROUP=HQ // HKV, HEAD_DIM=D, BLOCK_M=block_m,
                                BLOCK_N=block_n, WS=ws, MASK_V=mask_v, num_warps=warps, num_stages=stages)
    return out


VARIANTS = [  # (block_m, block_n, warps, stages, ws, mask_v)
    (128, 128, 4, 2, True, False), (128, 64, 4, 3, True, False), (128, 64, 4, 2, True, False),
    (128, 128, 4, 2, True, True), (128, 64, 4, 3, True, True),
    (128, 64, 8, 3, False, False), (128, 128, 8, 2, False, False),
]


def make_batch(lens: list[int]):
    t = sum(lens)
    q = torch.randn(t, HQ, D, device=DEV, dtype=BF16)
    k = torch.randn(t, HKV, D, device=DEV, dtype=BF16)
    v = torch.randn(t, HKV, D, device=DEV, dtype=BF16)
    ext = torch.tensor(lens, dtype=torch.int32, device=DEV)
    starts = torch.zeros_like(ext)
    starts[1:] = torch.cumsum(ext, 0)[:-1]
    refs = []
    for i, n in enumerate(lens):
        s0 = int(starts[i])
        sl = slice(s0, s0 + n)
        refs.append(reference(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                              v[sl].transpose(0, 1)[None], True)[0].transpose(0, 1))
    return q, k, v, ext, starts, torch.cat(refs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--variants", type=int, nargs="*", default=None,
                   help="indices into VARIANTS (default: those without warp specialisation); run a "
                        "warp-specialised one in its own process under a timeout: its launch hung")
    p.add_argument("--shapes", type=int, default=3, help="how many of the three batches to run")
    p.add_argument("--no-default", action="store_true", help="skip the default extend kernel and peers")
    ns = p.parse_args(argv)
    torch.manual_seed(0)
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "extend-ws.json")
    # by default only the variants without warp specialisation: the warp-specialised launches hung on
    # the H200 (Triton 3.6, 2026-12-03); run one of those by index, in its own process under `timeout`
    if ns.variants is None:
        variants = [v for v in VARIANTS if not v[4]]
    else:
        variants = [VARIANTS[i] for i in ns.variants]
    for lens in ([8192], [1000, 3000, 4192], [512] * 16)[:ns.shapes]:
        q, k, v, ext, starts, ref = make_batch(lens)
        out = torch.empty_like(q)
        max_len = max(lens)
        flops = sum(4 * HQ * D * n * (n + 1) // 2 for n in lens)
        shape = "+".join(map(str, lens)) if len(lens) < 4 else f"{len(lens)} x {lens[0]}"
        cudnn = None
        if len(lens) == 1 and not ns.no_default:
            peers = peer_rows(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], True,
                              None, backends=("cudnn", "flash"))
            cudnn = peers.get("cudnn", {}).get("us")
            result["rows"].append({"shape": shape, "variant": "peers", **{n_: r for n_, r in peers.items()}})
        # the default extend kernel (no prefix: an empty page table)
        table = torch.zeros(len(lens), 1, dtype=torch.int32, device=DEV)
        zeros = torch.zeros(len(lens), dtype=torch.int32, device=DEV)
        kb = torch.zeros(16, HKV, D, device=DEV, dtype=BF16)
        run = partial(extend_attention, q, k, v, kb, kb, table, zeros, ext, starts, 16, None,
                      max_len, out=out, max_seq_len=max_len)
        rows = [] if ns.no_default else [("default extend", run)]
        for var in variants:
            rows.append((str(var), partial(extend_new_ws, q, k, v, ext, starts, max_len, out, *var)))
        for name, fn in rows:
            try:
                out.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = rel_err(out.float(), ref)
                if not err <= 1e-2:
                    row = {"error": f"rel err {err:.2e}"}
                else:
                    ms, _ = device_ms(fn)
                    row = {"us": ms * 1e3, "rel_err": err, "tflops": flops / (ms * 1e-3) / 1e12,
                           "vs_cudnn": ms * 1e3 / cudnn if cudnn else None}
            except Exception as e:  # noqa: BLE001 - a variant that fails is recorded
                row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            result["rows"].append({"shape": shape, "variant": name, **row})
            if "us" in row:
                vs = f" vs cuDNN {row['vs_cudnn']:.3f}" if row["vs_cudnn"] else ""
                log(f"{shape:20} {name:36} {row['us']:8.1f} us {row['tflops']:6.0f} TFLOP/s{vs} "
                    f"err {row['rel_err']:.1e}")
            else:
                log(f"{shape:20} {name:36} {row['error']}")
        if cudnn:
            log(f"{shape:20} cuDNN {cudnn:.1f} us")
        write_json(path, result)
        del q, k, v, ref, out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
