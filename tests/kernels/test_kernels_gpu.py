"""The kernels at Qwen2.5-7B shapes in bf16 on a CUDA device (head_dim 128, 28 query / 4 KV heads,
page 16), against the fp32 torch references. Skipped without CUDA.

Tolerances (bf16 inputs and output, fp32 accumulation): attention max |o - ref| <= 2e-2 + 2e-2 |ref|
and ||o - ref|| / ||ref|| <= 1e-2; rms_norm / rope / silu_and_mul within 2 bf16 ulps
(atol = rtol = 1.6e-2).
"""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import (
    apply_rotary,
    build_rope_cache,
    cascade_decode_attention,
    choose_num_kv_splits,
    choose_num_prefix_splits,
    decode_attention,
    extend_attention,
    rms_norm,
    silu_and_mul,
    store_kv,
)
from radixrt.kernels.reference import (
    apply_rotary_ref,
    cascade_decode_attention_ref,
    decode_attention_ref,
    extend_attention_ref,
    rms_norm_ref,
    silu_and_mul_ref,
    store_kv_ref,
)

from .test_cascade_attention import make_cascade_batch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

HQ, HKV, D, PAGE = 28, 4, 128, 16
BF16 = torch.bfloat16


def check_attention(o: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(o).any()
    rel = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel <= 1e-2, f"relative error {rel:.2e}"
    torch.testing.assert_close(o.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_store_kv_gpu(paged_batch):
    b = paged_batch([100, 0], [3000, 77], PAGE, HQ, HKV, D, BF16)
    k_ref, v_ref = b.k_buffer.clone(), b.v_buffer.clone()
    store_kv(b.k_buffer, b.v_buffer, b.out_cache_loc, b.k, b.v)
    store_kv_ref(k_ref, v_ref, b.out_cache_loc, b.k, b.v)
    assert torch.equal(b.k_buffer, k_ref) and torch.equal(b.v_buffer, v_ref)


@pytest.mark.parametrize("prefix_lens, extend_lens", [
    ([0, 1000, 37, 4096, 5], [2048, 512, 300, 1, 129]),
    ([4096], [4096]),
])
def test_extend_attention_gpu(paged_batch, prefix_lens, extend_lens):
    b = paged_batch(prefix_lens, extend_lens, PAGE, HQ, HKV, D, BF16, seed=11)
    out = torch.full_like(b.q, float("nan"), memory_format=torch.contiguous_format)
    o = extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                         b.extend_start_loc, PAGE, None, b.max_extend_len, out=out)
    ref = extend_attention_ref(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                               b.extend_lens, b.extend_start_loc, PAGE, None)
    check_attention(o, ref)


@pytest.mark.parametrize("batch_size, max_len", [(64, 4096), (3, 20000), (256, 300)])
def test_decode_attention_gpu(paged_batch, batch_size, max_len):
    gen = torch.Generator().manual_seed(batch_size)
    seq_lens = torch.randint(1, max_len + 1, (batch_size,), generator=gen).tolist()
    seq_lens[0] = max_len
    b = paged_batch([s - 1 for s in seq_lens], [1] * batch_size, PAGE, HQ, HKV, D, BF16, seed=12)
    store_kv(b.k_buffer, b.v_buffer, b.out_cache_loc, b.k, b.v)
    splits = choose_num_kv_splits(batch_size, HKV, max_len,
                                  torch.cuda.get_device_properties(0).multi_processor_count)
    out = torch.full_like(b.q, float("nan"), memory_format=torch.contiguous_format)
    o = decode_attention(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, PAGE, None, splits, out=out)
    ref = decode_attention_ref(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, PAGE, None)
    check_attention(o, ref)


def _cascade_splits(c, prefix_len: int) -> tuple[int, int]:
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    longest_own = int((c.seq_lens - c.kv_start).max())
    splits = choose_num_kv_splits(c.q.shape[0], HKV, longest_own, num_sms)
    prefix_splits = choose_num_prefix_splits(c.group_starts.shape[0] - 1, c.max_group_size, HQ, HKV,
                                             prefix_len, num_sms)
    return splits, prefix_splits


@pytest.mark.parametrize("fused", [False, True], ids=["three-launch", "fused"])
@pytest.mark.parametrize("num_groups, group_size, num_loners", [(1, 128, 0), (4, 32, 8)])
def test_cascade_decode_attention_gpu(num_groups, group_size, num_loners, fused):
    """128 requests sharing a 2,048-token prefix (or 4 groups of 32, plus requests in no group),
    each with 1..200 private tokens; with the launcher's split counts, and with one suffix split
    (the fused form, whose suffix program merges the prefix partials)."""
    gen = torch.Generator().manual_seed(num_groups)
    groups = [(2048, torch.randint(1, 201, (group_size,), generator=gen).tolist()) for _ in range(num_groups)]
    loners = torch.randint(1, 3000, (num_loners,), generator=gen).tolist()
    c = make_cascade_batch(groups, loners, PAGE, HQ, HKV, D, BF16, seed=21)
    splits, prefix_splits = _cascade_splits(c, 2048)
    splits = 1 if fused else max(2, splits)
    out = torch.full_like(c.q, float("nan"), memory_format=torch.contiguous_format)
    o = cascade_decode_attention(*c.args(PAGE), splits, prefix_splits, c.max_group_size, out=out)
    check_attention(o, cascade_decode_attention_ref(*c.args(PAGE)))


@pytest.mark.parametrize("fused", [False, True], ids=["three-launch", "fused"])
def test_cascade_decode_attention_cuda_graph(fused):
    """Capture the cascade once, then shrink the shared prefix and change the suffixes, pages and
    queries in place: lengths are read on the device, so the replay is exact."""
    gen = torch.Generator().manual_seed(22)
    c = make_cascade_batch([(2048, [200] * 48), (1024, [200] * 16)], [2000] * 4, PAGE, HQ, HKV, D, BF16,
                           seed=22)
    splits, prefix_splits = _cascade_splits(c, 2048)
    splits = 1 if fused else max(2, splits)
    out = torch.empty_like(c.q, memory_format=torch.contiguous_format)
    rows = splits + prefix_splits
    mid_o = torch.empty(c.q.shape[0], HQ, rows, D, device=c.q.device)
    mid_lse = torch.empty(c.q.shape[0], HQ, rows, device=c.q.device)

    def run():
        cascade_decode_attention(*c.args(PAGE), splits, prefix_splits, c.max_group_size, out=out, mid_o=mid_o,
                                 mid_lse=mid_lse)

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    # shorter prefixes (still page-aligned and shared), new suffix lengths and queries
    c.group_prefix_lens.copy_(torch.tensor([1008, 512], dtype=torch.int32))
    members = c.group_members.long()
    new_start = torch.zeros_like(c.kv_start)
    new_start[members[:48]], new_start[members[48:]] = 1008, 512
    c.kv_start.copy_(new_start)
    c.seq_lens.copy_(torch.minimum(c.seq_lens, torch.randint(1, 2300, c.seq_lens.shape, generator=gen)
                                   .to(c.seq_lens)).clamp_min(new_start + 1))
    c.q.copy_(torch.randn(c.q.shape, generator=gen).to(c.q))
    graph.replay()
    torch.cuda.synchronize()
    check_attention(out, cascade_decode_attention_ref(*c.args(PAGE)))


def test_norm_rope_act_gpu():
    dev = torch.device("cuda")
    x = torch.randn(300, 3584, device=dev, dtype=BF16)
    res = torch.randn_like(x)
    w = torch.randn(3584, device=dev, dtype=BF16)
    out, new_res = rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1.6e-2, rtol=1.6e-2)
    assert torch.equal(new_res, ref_res)

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cache = build_rope_cache(D, 32768, 500000.0, scaling, device=dev)
    qkv = torch.randn(300, (HQ + 2 * HKV) * D, device=dev, dtype=BF16)
    q = qkv[:, : HQ * D].view(300, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(300, HKV, D)
    pos = torch.randint(0, 32768, (300,), device=dev)
    q_ref, k_ref = apply_rotary_ref(q, k, pos, cache)
    apply_rotary(q, k, pos, cache)
    torch.testing.assert_close(q.float(), q_ref.float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(k.float(), k_ref.float(), atol=1.6e-2, rtol=1.6e-2)

    g = torch.randn(300, 2 * 18944, device=dev, dtype=BF16)
    torch.testing.assert_close(silu_and_mul(g).float(), silu_and_mul_ref(g).float(), atol=1.6e-2, rtol=1.6e-2)


def test_triton_backend_decode_cuda_graph(paged_batch):
    """Capture one decode forward in a CUDA graph, change the batch's lengths/pages/inputs in place,
    replay, and compare with the reference: no host syncs, no stale metadata, graph-safe workspace."""
    pytest.importorskip("orjson")  # radixrt.protocol needs it
    from radixrt.attention.base import ForwardMeta
    from radixrt.protocol import ForwardMode
    from radixrt.worker.attention_triton import TritonAttnBackend

    batch_size, max_len = 8, 2048
    b = paged_batch([max_len - 1] * batch_size, [1] * batch_size, PAGE, HQ, HKV, D, BF16, seed=13)

    class Pool:
        page_size = PAGE
        k_buffers = [b.k_buffer]
        v_buffers = [b.v_buffer]

    meta = ForwardMeta(mode=ForwardMode.DECODE, page_size=PAGE, page_table=b.page_table,
                       seq_lens=b.seq_lens, extend_lens=b.extend_lens, prefix_lens=b.prefix_lens,
                       extend_start_loc=b.extend_start_loc, out_cache_loc=b.out_cache_loc,
                       positions=b.seq_lens.long() - 1, max_seq_len=max_len, max_extend_len=1)
    backend = TritonAttnBackend(Pool(), num_q_heads=HQ, max_batch_size=64)
    q, k, v = b.q.clone(), b.k.clone(), b.v.clone()
    backend.prepare(meta)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up (compiles) outside the capture
            backend.forward(q, k, v, 0, D ** -0.5)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = backend.forward(q, k, v, 0, D ** -0.5)

    # a new step: shorter sequences, a different page order, new inputs, all written in place
    gen = torch.Generator().manual_seed(14)
    new_lens = torch.randint(1, max_len + 1, (batch_size,), generator=gen).to(torch.int32)
    meta.seq_lens.copy_(new_lens)
    meta.page_table.copy_(meta.page_table[torch.randperm(batch_size, generator=gen)])
    slots = [int(meta.page_table[i, (n - 1) // PAGE]) * PAGE + (n - 1) % PAGE
             for i, n in enumerate(new_lens.tolist())]
    meta.out_cache_loc.copy_(torch.tensor(slots))
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, generator=gen).to(t))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_ref(q, b.k_buffer, b.v_buffer, meta.page_table, meta.seq_lens, PAGE, D ** -0.5)
    assert torch.equal(b.k_buffer[meta.out_cache_loc], k)  # the graph stored this step's K
    check_attention(o, ref)


def test_backend_start_compiles_every_extend_variant():
    """After TritonAttnBackend's start-up warm-ups, extends of any config and any page-table width
    (short prompts, long prompts, short extends over a prefix; widths 1, 16, 17, 80) compile
    no new extend-attention variant: a compile mid-serving stalls a pass for seconds. q/k/v are
    views of one QKV row, as the model passes them. The long ones pass min_extend_len as the backend
    does, so on Hopper they take the Gluon kernel, also with metadata vectors at 4-byte offsets
    (slices of one upload buffer, as worker/device_batch.py makes them)."""
    pytest.importorskip("orjson")  # radixrt.protocol needs it
    from triton import knobs

    from radixrt.worker.attention_triton import TritonAttnBackend

    dev, pages = torch.device("cuda"), 128

    class Pool:
        page_size = PAGE
        k_buffers = [torch.zeros(pages * PAGE, HKV, D, device=dev, dtype=BF16)]
        v_buffers = [torch.zeros(pages * PAGE, HKV, D, device=dev, dtype=BF16)]

    # earlier tests in this process may have compiled the same variants: start from empty in-memory
    # caches (the hook below fires only on a miss), so what the warm-up compiles is all there is
    import importlib

    ea = importlib.import_module("radixrt.kernels.extend_attention")  # (the package's name is the function)
    kernels = [ea._extend_attn_kernel]
    hopper = torch.cuda.get_device_capability()[0] == 9
    if hopper:
        from radixrt.kernels import extend_attention_ws as ws

        kernels.append(ws._extend_ws_kernel)
    for kernel in kernels:
        kernel.device_caches.clear()
    compiled: list[str] = []

    def hook(*, fn, **_):
        compiled.append(fn.name)  # returning None lets the compile go ahead

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        TritonAttnBackend(Pool(), num_q_heads=HQ, max_batch_size=8)
        assert "_extend_attn_kernel" in compiled, compiled
        assert "_extend_ws_kernel" in compiled or not hopper, compiled  # the warm-up reached it
        compiled.clear()
        i32 = {"dtype": torch.int32, "device": dev}
        for width in (1, 16, 17, 80):  # 80 pages: a 1,264-token prefix, past the short-prompt bound
            cases = ((0, 8, 8), (0, 2000, 2000), (width * PAGE - 16, 16, width * PAGE), (4, 4, None))
            for prefix, new, hint in cases:
                prefix = max(0, min(prefix, width * PAGE - new))
                qkv = torch.randn(new, (HQ + 2 * HKV) * D, device=dev, dtype=BF16)
                q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
                table = torch.arange(width, **i32).remainder(pages).view(1, width)
                meta = torch.tensor([7, prefix, new, 0], **i32)[1:]  # slices at 4-byte offsets
                extend_attention(q.view(new, HQ, D), k.view(new, HKV, D), v.view(new, HKV, D),
                                 Pool.k_buffers[0], Pool.v_buffers[0], table, meta[0:1], meta[1:2], meta[2:3],
                                 PAGE, None, new, max_seq_len=hint, min_extend_len=new)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = previous
    assert "_extend_attn_kernel" not in compiled, compiled
    assert "_extend_ws_kernel" not in compiled, compiled
