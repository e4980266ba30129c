"""Cascade decode attention with its prefix stage (stage A) in the warp-specialized Gluon kernel
(kernels/cascade_prefix_ws.py), on a Hopper GPU, against the fp32 reference: a group larger than
one 128-row block, groups whose prefixes end inside a page, more prefix splits than the prefix has
128-token blocks (splits with no keys: zero partials at lse -inf), empty padding groups, requests in
no group, one and several suffix splits, pages of 16 and 64, bf16 and fp16. The kernel is opt-in
(RADIXRT_CASCADE_WS=1): without the setting, and over an FP8 pool, the Triton kernel runs.
Tolerances as tests/kernels/test_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import cascade_decode_attention
from radixrt.kernels.reference import cascade_decode_attention_ref

from .conftest import check_attention, count_calls, requires_hopper
from .test_cascade_attention import make_cascade_batch

HQ, HKV, D = 28, 4, 128

pytestmark = requires_hopper


@pytest.fixture
def ws_calls(monkeypatch):
    """Counts the stage-A launches that reached the Gluon kernel."""
    from radixrt.kernels import cascade_prefix_ws as ws

    monkeypatch.setenv("RADIXRT_CASCADE_WS", "1")  # opt-in
    return count_calls(monkeypatch, ws, "run_prefix_stage_ws")


def _pad_groups(c, extra: int):
    """The group metadata with `extra` empty groups appended (as a CUDA graph pads them)."""
    starts = torch.cat([c.group_starts, c.group_starts[-1:].repeat(extra)])
    lens = torch.cat([c.group_prefix_lens, torch.zeros(extra, dtype=torch.int32, device="cuda")])
    return starts, lens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("groups, loners, page, splits, prefix_splits, pad", [
    ([(2048, [1 + (7 * i) % 200 for i in range(128)])], [], 16, 1, 4, 0),   # one group of 128: 7 row blocks
    ([(2048, [50] * 40), (1000, [3] * 9)], [700, 5], 16, 2, 4, 7),         # prefix ending in a page, padding
    ([(300, [20] * 10)], [100], 16, 1, 8, 0),                               # 8 splits of a 300-token prefix
    ([(129, [1] * 3), (64, [9] * 20)], [3000], 64, 3, 2, 1),                # pages of 64, short prefixes
])
def test_cascade_ws_matches_reference(ws_calls, groups, loners, page, splits, prefix_splits, pad, dtype):
    c = make_cascade_batch(groups, loners, page, HQ, HKV, D, dtype, seed=5)
    args = list(c.args(page))
    if pad:
        args[7], args[8] = _pad_groups(c, pad)  # group_starts, group_prefix_lens
    out = torch.full_like(c.q, float("nan"), memory_format=torch.contiguous_format)
    o = cascade_decode_attention(*args, splits, prefix_splits, c.max_group_size, out=out)
    assert len(ws_calls) == 1, "stage A did not take the Gluon kernel"
    check_attention(o, cascade_decode_attention_ref(*c.args(page)))


@pytest.mark.parametrize("case", ["not opted in", "fp8 pool", "int64 members"])
def test_cascade_ws_routing_keeps_triton(ws_calls, monkeypatch, case):
    c = make_cascade_batch([(1000, [30] * 12)], [200], 16, HQ, HKV, D, torch.bfloat16, seed=6)
    args, kw = list(c.args(16)), {}
    if case == "not opted in":
        monkeypatch.delenv("RADIXRT_CASCADE_WS")
    elif case == "int64 members":  # eager passes upload them as int64; the kernel takes int32
        args[6] = c.group_members.long()
    else:
        args[1] = (c.k_buffer / 0.05).to(torch.float8_e4m3fn)
        args[2] = (c.v_buffer / 0.05).to(torch.float8_e4m3fn)
        kw = {"k_scale": 0.05, "v_scale": 0.05}
    o = cascade_decode_attention(*args, 2, 2, c.max_group_size, **kw)
    assert ws_calls == []
    check_attention(o, cascade_decode_attention_ref(*args, **kw))


def test_cascade_ws_in_a_cuda_graph(ws_calls):
    """Captured once with 8 groups (6 empty), replayed after the prefix lengths and suffixes change
    in place: equal to a fresh eager call."""
    c = make_cascade_batch([(2048, [100] * 48), (1024, [60] * 16)], [900] * 4, 16, HQ, HKV, D, torch.bfloat16,
                           seed=8)
    args = list(c.args(16))
    args[7], args[8] = _pad_groups(c, 6)
    out = torch.empty_like(c.q, memory_format=torch.contiguous_format)
    cascade_decode_attention(*args, 2, 4, c.max_group_size, out=out)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cascade_decode_attention(*args, 2, 4, c.max_group_size, out=out)
    args[8][:2] = torch.tensor([1500, 700], dtype=torch.int32, device="cuda")  # shorter shared prefixes
    kv_start = args[5]
    members = c.group_members.tolist()
    starts = c.group_starts.tolist()
    for g, plen in enumerate((1500, 700)):
        for m in members[starts[g]:starts[g + 1]]:
            kv_start[m] = plen
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = cascade_decode_attention(*args, 2, 4, c.max_group_size)
    assert torch.equal(out, eager)
    ref = cascade_decode_attention_ref(*c.args(16)[:5], kv_start, c.group_members, c.group_starts,
                                       args[8][:2], 16, None)
    check_attention(out, ref)
