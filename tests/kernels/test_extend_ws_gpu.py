"""The warp-specialized Gluon extend kernel (kernels/extend_attention_ws.py) on a Hopper GPU, through
extend_attention's routing, against the fp32 reference: prefixes ending inside a page, requests
whose last query block is partial (down to a second warpgroup without rows), the new tokens' and
the pool's blocks in one launch, strided q / k / v (views of one fused qkv tensor), bf16 and fp16,
pages of 16 and 64. The routing rule (min_extend_len, the pass's token count, an FP8 pool,
RADIXRT_EXTEND_WS=0) keeps the Triton kernel where it says so, with the same answers. Tolerances
as tests/kernels/test_kernels_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixrt.kernels import extend_attention
from radixrt.kernels.reference import extend_attention_ref

from .conftest import check_attention, count_calls, make_paged_batch, requires_hopper

HQ, HKV, D = 28, 4, 128

pytestmark = requires_hopper


@pytest.fixture
def ws_calls(monkeypatch):
    """Counts the launches that reached the Gluon kernel."""
    from radixrt.kernels import extend_attention_ws as ws

    monkeypatch.delenv("RADIXRT_EXTEND_WS", raising=False)
    return count_calls(monkeypatch, ws, "extend_attention_ws")


def _run(b, dtype, min_extend_len, k_buffer=None, v_buffer=None, **kw):
    out = torch.full_like(b.q, float("nan"))
    k_buffer = b.k_buffer if k_buffer is None else k_buffer
    v_buffer = b.v_buffer if v_buffer is None else v_buffer
    extend_attention(b.q, b.k, b.v, k_buffer, v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                     b.extend_start_loc, b.page_size, None, int(b.extend_lens.max()), out=out,
                     max_seq_len=int(b.seq_lens.max()), min_extend_len=min_extend_len, **kw)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("prefix_lens, extend_lens, page_size", [
    ([0], [1100], 16),                         # a partial last query block, no prefix
    ([7], [1030], 16),                         # the last block's second warpgroup has no rows
    ([0, 0], [1000, 2048], 16),                # two requests, the shorter ends mid-block
    ([1000, 0, 3000], [777, 300, 1500], 16),   # prefixes ending inside a page and inside a key block
    ([64, 129], [512, 640], 64),               # pages of 64
    ([5], [4096], 16),                         # a prefix shorter than a page
])
def test_ws_extend_matches_reference(ws_calls, prefix_lens, extend_lens, page_size, dtype):
    b = make_paged_batch(prefix_lens, extend_lens, page_size, HQ, HKV, D, dtype, device=torch.device("cuda"))
    o = _run(b, dtype, min(extend_lens))
    assert ws_calls == [sum(extend_lens)], "extend_attention did not route to the Gluon kernel"
    ref = extend_attention_ref(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                               b.extend_lens, b.extend_start_loc, page_size, None)
    check_attention(o, ref)


@pytest.mark.parametrize("case", ["unknown min", "short request", "few tokens", "fp8 pool", "switched off",
                                  "int64 metadata", "scaled bf16 pool"])
def test_ws_routing_keeps_triton_where_the_rule_says(ws_calls, monkeypatch, case):
    extend_lens = {"short request": [40, 1100], "few tokens": [300, 600]}.get(case, [300, 800])
    b = make_paged_batch([100] * len(extend_lens), extend_lens, 16, HQ, HKV, D, torch.bfloat16,
                         device=torch.device("cuda"))
    kw, k_buffer, v_buffer = {}, b.k_buffer, b.v_buffer
    if case == "fp8 pool":
        k_buffer = (b.k_buffer / 0.05).to(torch.float8_e4m3fn)
        v_buffer = (b.v_buffer / 0.05).to(torch.float8_e4m3fn)
        kw = {"k_scale": 0.05, "v_scale": 0.05}
    if case == "switched off":
        monkeypatch.setenv("RADIXRT_EXTEND_WS", "0")
    if case == "int64 metadata":  # the kernel takes int32 (its block counters index the ring)
        b = dataclasses.replace(b, prefix_lens=b.prefix_lens.long(), extend_lens=b.extend_lens.long(),
                                extend_start_loc=b.extend_start_loc.long())
    if case == "scaled bf16 pool":  # scales apply to the prefix read from any pool; the kernel has none
        kw = {"k_scale": 0.5, "v_scale": 2.0}
    o = _run(b, torch.bfloat16, None if case == "unknown min" else min(extend_lens), k_buffer, v_buffer, **kw)
    assert ws_calls == []
    if case == "scaled bf16 pool":  # the reference dequantizes only an FP8 pool: give it the scaled values
        k_buffer, v_buffer, kw = k_buffer.float() * 0.5, v_buffer.float() * 2.0, {}
    ref = extend_attention_ref(b.q, b.k, b.v, k_buffer, v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                               b.extend_start_loc, 16, None, **kw)
    check_attention(o, ref)


def test_ws_extend_in_a_cuda_graph(ws_calls):
    """Replayed from a CUDA graph (the descriptors are launch parameters), the same answer."""
    b = make_paged_batch([100, 0], [812, 300], 16, HQ, HKV, D, torch.bfloat16, device=torch.device("cuda"))
    eager = _run(b, torch.bfloat16, 300)
    assert ws_calls == [1112]
    out = torch.empty_like(eager)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                         b.extend_start_loc, 16, None, 812, out=out, max_seq_len=912, min_extend_len=300)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
