"""Same-run peers: torch SDPA's cuDNN / flash / memory-efficient backends on contiguous K/V.

Contiguous [B, H, L, D] K/V is each backend's best case (no page table). GQA is passed as such
(enable_gqa=True, K/V read once per KV head); a backend that refuses it is retried on K/V expanded to
the query heads, and the row says so ("gqa": "expanded"), since it then reads Hq / Hkv times the
bytes. Every peer's output is checked against the fp32 reference passed in. Timed as CUDA-graph
replays (eager when capture fails: "graph": False), median of triton.testing.do_bench, L2 flushed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from bench.common import cuda_ms, graph_ms, rel_err

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def device_ms(run: Callable[[], object]) -> tuple[float, bool]:
    """(median ms of run() replayed from a CUDA graph, True), or eager (ms, False) when capture fails.
    run() is called once first."""
    run()
    torch.cuda.synchronize()
    try:
        return graph_ms(run), True
    except Exception:  # noqa: BLE001 - a backend that cannot be captured is timed eagerly
        torch.cuda.synchronize()
        return cuda_ms(run), False


def _lower_right(lq: int, lk: int, device: torch.device) -> torch.Tensor:
    """Bool mask [lq, lk]: query i (the (lk - lq + i)-th token) sees keys j <= lk - lq + i."""
    return torch.arange(lk, device=device)[None, :] <= torch.arange(lq, device=device)[:, None] + (lk - lq)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """fp32 SDPA (math backend) of [B, Hq, Lq, D] q over [B, Hkv, Lk, D] k / v (GQA), causal aligned
    bottom-right (the last query is the last key; Lq == Lk is the usual causal), in chunks of query
    heads that share a KV head so the scores stay small; returns fp32 [B, Hq, Lq, D]."""
    group = q.shape[1] // k.shape[1]
    mask = _lower_right(q.shape[2], k.shape[2], q.device) if causal and q.shape[2] > 1 else None
    outs = []
    with sdpa_kernel(SDPBackend.MATH):
        for h in range(k.shape[1]):
            qh = q[:, h * group:(h + 1) * group].float()
            kh = k[:, h:h + 1].float().expand(-1, group, -1, -1)
            vh = v[:, h:h + 1].float().expand(-1, group, -1, -1)
            outs.append(sdpa(qh, kh, vh, attn_mask=mask))
    return torch.cat(outs, 1)


def peer_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              ref: torch.Tensor | None, backends: tuple[str, ...] = tuple(BACKENDS)) -> dict[str, dict]:
    """{backend: {"us", "graph", "gqa", "rel_err"} or {"error"}} for q [B, Hq, Lq, D], k / v
    [B, Hkv, Lk, D] (contiguous; Lq == 1 is decode); causal aligned bottom-right (torch's
    causal_lower_right bias when Lq < Lk, which not every backend takes); `backends`: which of
    BACKENDS to time (default all)."""
    rows: dict[str, dict] = {}
    group = q.shape[1] // k.shape[1]
    mask_kw: dict = {"is_causal": causal}
    if causal and 1 < q.shape[2] < k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right

        mask_kw = {"attn_mask": causal_lower_right(q.shape[2], k.shape[2])}
    for name in backends:
        backend = BACKENDS[name]
        row: dict = {}
        for gqa in ("native", "expanded"):
            if gqa == "native":
                kk, vv, kw = k, v, {"enable_gqa": group > 1}
            else:
                kk = k.repeat_interleave(group, 1)
                vv = v.repeat_interleave(group, 1)
                kw = {}

            def run(kk=kk, vv=vv, kw=kw, backend=backend):
                with sdpa_kernel(backend):
                    return sdpa(q, kk, vv, **mask_kw, **kw)

            try:
                out = run()
                ms, graphed = device_ms(run)
            except Exception as e:  # noqa: BLE001 - backend unavailable for this shape/dtype
                row = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
                continue
            row = {"us": ms * 1e3, "graph": graphed, "gqa": gqa,
                   "rel_err": rel_err(out, ref) if ref is not None else None}
            break
        rows[name] = row
    return rows


def best_peer(rows: dict[str, dict]) -> tuple[str, float] | None:
    """(backend, us) of the fastest peer that ran and was correct (rel err <= 1e-2)."""
    ok = [(n, r["us"]) for n, r in rows.items()
          if "us" in r and (r["rel_err"] is None or r["rel_err"] <= 1e-2)]
    return min(ok, key=lambda x: x[1]) if ok else None
