"""The warp-specialized Gluon decode kernel over an FP8 pool (kernels/decode_attention_ws.py) on a
Hopper GPU, through decode_attention's routing, against the fp32 reference: sequences ending inside
a page, inside a warp's keys and on a block boundary, an empty sequence (a zero row), GQA groups of
1, 7, 8 and 16 query heads, pages of 8, 16 and 32, bf16 and fp16 queries, q and out as strided views.
A sequence ends in each of the four warps' 32 keys of a 128-key block (5,000, 17 and 4,111: warp 0;
33: warp 1; 4,170: warp 2; 4,200: warp 3) and on a block's end (4,096). The routing rule (an FP8
pool, one split, no kv_start, int32 metadata, max_seq_len >= 4,096, supported shapes,
RADIXRT_DECODE_WS=0) keeps the Triton kernel where it says so, with the same answers; a CUDA graph
replays it with new lengths. Tolerances as tests/kernels/test_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import decode_attention
from radixrt.kernels.reference import decode_attention_ref

from .conftest import check_attention, count_calls, requires_hopper

D = 128
FP8 = torch.float8_e4m3fn

pytestmark = requires_hopper


@pytest.fixture
def ws_calls(monkeypatch):
    """Counts the launches that reached the Gluon kernel (each records its batch size)."""
    from radixrt.kernels import decode_attention_ws as ws

    monkeypatch.delenv("RADIXRT_DECODE_WS", raising=False)
    return count_calls(monkeypatch, ws, "decode_attention_ws")


def make_fp8_decode(seq_lens: list[int], page_size: int, hq: int, hkv: int, dtype: torch.dtype,
                    seed: int = 0) -> dict:
    """An FP8 pool of random values (K and V of unit variance, scales 0.02 / 0.03; every slot holds
    data, so a wrong page gives a wrong answer), each request's pages drawn in shuffled order, page 0
    unused, q [B, Hq, D] of standard deviation 2: scores spread by ~2, so the softmax weights differ
    by orders of magnitude. On the CPU, over 4,096 keys, merging the four warps' states with equal
    weights moves the output by 14% (relative norm), exp for exp2 by 136%, fp16 operands by 0.04%;
    the tolerance is 1%."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // page_size) for n in seq_lens]
    width = max(1, max(widths))
    pages = sum(widths) + 1
    k_scale, v_scale = 0.02, 0.03
    k_buf = (torch.randn(pages * page_size, hkv, D, generator=gen) / k_scale).to(FP8)  # |x| < 448 * 0.02
    v_buf = (torch.randn(pages * page_size, hkv, D, generator=gen) / v_scale).to(FP8)
    order = (torch.randperm(pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, w in enumerate(widths):
        table[b, :w] = torch.tensor(order[:w], dtype=torch.int32)
        order = order[w:]
    dev = torch.device("cuda")
    q = (torch.randn(len(seq_lens), hq, D, generator=gen) * 2).to(dtype)
    return {"q": q.to(dev), "k_buffer": k_buf.to(dev), "v_buffer": v_buf.to(dev), "page_table": table.to(dev),
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=dev), "page_size": page_size,
            "k_scale": k_scale, "v_scale": v_scale}


def _run(b: dict, num_kv_splits: int = 1, max_seq_len: int | None = None, out=None, **kw) -> torch.Tensor:
    max_seq_len = int(b["seq_lens"].max()) if max_seq_len is None else max_seq_len
    return decode_attention(b["q"], b["k_buffer"], b["v_buffer"], b["page_table"], b["seq_lens"],
                            b["page_size"], None, num_kv_splits, out=out, k_scale=b["k_scale"],
                            v_scale=b["v_scale"], max_seq_len=max_seq_len, **kw)


def _ref(b: dict) -> torch.Tensor:
    return decode_attention_ref(b["q"], b["k_buffer"], b["v_buffer"], b["page_table"], b["seq_lens"],
                                b["page_size"], None, k_scale=b["k_scale"], v_scale=b["v_scale"])


@pytest.mark.parametrize("seq_lens, page_size, hq, hkv, dtype", [
    ([4096, 5000, 1, 0, 17, 4111, 4170, 4200], 16, 28, 4, torch.bfloat16),  # block / page / warp ends
    ([4096, 4096, 4096, 33], 32, 32, 4, torch.float16),          # groups of 8, pages of 32
    ([4100, 15, 128], 8, 16, 16, torch.bfloat16),                 # MHA (groups of 1), pages of 8
    ([4096, 2], 16, 64, 4, torch.bfloat16),                       # groups of 16, the most rows
])
def test_ws_decode_matches_reference(ws_calls, seq_lens, page_size, hq, hkv, dtype):
    b = make_fp8_decode(seq_lens, page_size, hq, hkv, dtype)
    o = _run(b)
    assert ws_calls == [len(seq_lens)], "decode_attention did not route to the Gluon kernel"
    check_attention(o, _ref(b))
    for i, n in enumerate(seq_lens):
        if n == 0:
            assert torch.count_nonzero(o[i]) == 0, "an empty sequence must give a zero row"


def test_ws_decode_strided_q_and_out(ws_calls):
    """q and out as views with a row stride past Hq * D (q as the model passes it: a slice of qkv)."""
    b = make_fp8_decode([4096, 4500, 300], 16, 28, 4, torch.bfloat16, seed=1)
    qkv = torch.randn(3, (28 + 8) * D, device="cuda", dtype=torch.bfloat16)
    qkv[:, :28 * D] = b["q"].reshape(3, 28 * D)
    b["q"] = qkv[:, :28 * D].view(3, 28, D)
    out_rows = torch.full((3, 30 * D), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_rows[:, D:29 * D].view(3, 28, D)
    _run(b, out=out)
    assert ws_calls == [3]
    check_attention(out, _ref(b))
    assert torch.isnan(out_rows[:, :D]).all() and torch.isnan(out_rows[:, 29 * D:]).all(), "wrote outside out"


@pytest.mark.parametrize("case", ["bf16 pool", "no length hint", "short length hint", "two splits",
                                  "kv_start", "int64 page table", "switched off", "pages of 64",
                                  "groups of 32"])
def test_ws_routing_keeps_triton_where_the_rule_says(ws_calls, monkeypatch, case):
    hq, page_size = (128 if case == "groups of 32" else 28), (64 if case == "pages of 64" else 16)
    b = make_fp8_decode([4096, 700], page_size, hq, 4, torch.bfloat16, seed=2)
    kw, splits = {}, 1
    if case == "bf16 pool":
        b["k_buffer"] = (b["k_buffer"].float() * b["k_scale"]).to(torch.bfloat16)
        b["v_buffer"] = (b["v_buffer"].float() * b["v_scale"]).to(torch.bfloat16)
        b["k_scale"] = b["v_scale"] = 1.0
    if case == "short length hint":
        b["seq_lens"] = torch.tensor([2048, 700], dtype=torch.int32, device="cuda")
    if case == "two splits":
        splits = 2
    if case == "kv_start":
        kw["kv_start"] = torch.zeros(2, dtype=torch.int32, device="cuda")
    if case == "int64 page table":
        b["page_table"] = b["page_table"].long()
    if case == "switched off":
        monkeypatch.setenv("RADIXRT_DECODE_WS", "0")
    if case == "no length hint":
        o = decode_attention(b["q"], b["k_buffer"], b["v_buffer"], b["page_table"], b["seq_lens"], page_size,
                             None, 1, k_scale=b["k_scale"], v_scale=b["v_scale"])
    else:
        o = _run(b, splits, **kw)
    assert ws_calls == []
    check_attention(o, _ref(b))


def test_ws_decode_in_a_cuda_graph(ws_calls):
    """Captured once with the graph's length class, replayed after the lengths change in place (the
    descriptors are launch parameters, the lengths and pages device data), the eager answers."""
    b = make_fp8_decode([4096, 4096, 4096], 16, 28, 4, torch.bfloat16, seed=3)
    out = torch.empty_like(b["q"])
    _run(b, out=out, max_seq_len=4096)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(b, out=out, max_seq_len=4096)
    assert ws_calls == [3, 3]
    for lens in ([4096, 4000, 1], [17, 0, 4096]):
        b["seq_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_attention(out, _ref(b))


@pytest.mark.parametrize("v_wide, prefetch_ids", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("page_size", [8, 16, 32])
def test_experiment_variants_match_reference(v_wide, prefetch_ids, page_size):
    """The V_WIDE (V read in 16-byte rows, widened before its dot) and PREFETCH_IDS (the next block's
    page ids loaded before the wait for a stage) experiments, not routed: the same answers, called
    directly."""
    from radixrt.kernels import decode_attention_ws as ws

    b = make_fp8_decode([4096, 4170, 33, 0, 4200, 1], page_size, 28, 4, torch.bfloat16, seed=4)
    out = torch.full_like(b["q"], float("nan"))
    qk_scale = 1.4426950408889634 / D ** 0.5 * b["k_scale"]
    ws.decode_attention_ws(b["q"], b["k_buffer"], b["v_buffer"], b["page_table"], b["seq_lens"], page_size,
                           qk_scale, b["v_scale"], out, v_wide=v_wide, prefetch_ids=prefetch_ids)
    check_attention(out, _ref(b))
    assert torch.count_nonzero(out[3]) == 0
