"""TritonAttnBackend over several passes (prefill, chunked extend with a prefix ending inside a page,
a shared prefix page, decode, mixed) on two layers, against attention over each request's full K/V
history computed in torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from radixrt.kernels.reference import slots_of

pytest.importorskip("orjson", reason="radixrt.protocol needs orjson")  # absent on bare GPU images
from radixrt.attention.base import CascadeMeta, ForwardMeta  # noqa: E402
from radixrt.protocol import ForwardMode  # noqa: E402
from radixrt.worker.attention_triton import TritonAttnBackend  # noqa: E402

PAGE, HQ, HKV, D, LAYERS, SCALE = 16, 8, 2, 64, 2, 0.125


@dataclass
class Pool:
    page_size: int
    k_buffers: list[torch.Tensor]
    v_buffers: list[torch.Tensor]

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:  # unused here
        raise NotImplementedError


@dataclass
class Req:
    pages: list[int]
    history: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer (k, v)

    def seq_len(self) -> int:
        return self.history[0][0].shape[0] if self.history else 0


def make_meta(mode: ForwardMode, reqs: list[Req], extend_lens: list[int], prefix_lens: list[int],
              device: torch.device) -> ForwardMeta:
    max_pages = max(len(r.pages) for r in reqs)
    table = torch.zeros(len(reqs), max_pages, dtype=torch.int32)
    for i, r in enumerate(reqs):
        table[i, : len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32)
    ext = torch.tensor(extend_lens, dtype=torch.int32)
    pre = torch.tensor(prefix_lens, dtype=torch.int32)
    spans = enumerate(zip(prefix_lens, extend_lens, strict=True))
    loc = torch.cat([slots_of(table[i], PAGE, p, p + e) for i, (p, e) in spans])
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens, strict=True)])
    seq = pre + ext
    return ForwardMeta(mode=mode, page_size=PAGE, page_table=table.to(device), seq_lens=seq.to(device),
                       extend_lens=ext.to(device), prefix_lens=pre.to(device),
                       extend_start_loc=(torch.cumsum(ext, 0, dtype=torch.int32) - ext).to(device),
                       out_cache_loc=loc.to(device), positions=positions.to(device),
                       max_seq_len=int((pre + ext).max()), max_extend_len=int(ext.max()))


def expected(q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """q [E, Hq, D] at positions prefix_len.. over k_all/v_all [prefix_len + E, Hkv, D], causal, fp32."""
    k = k_all.float().repeat_interleave(HQ // HKV, 1)
    v = v_all.float().repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), k) * SCALE
    visible = torch.arange(k.shape[0])[None, :] <= (prefix_len + torch.arange(q.shape[0]))[:, None]
    s = s.masked_fill(~visible.to(q.device)[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", s.softmax(-1), v)


def run_pass(backend, mode, reqs, extend_lens, gen, device, dtype, atol, cascade=None):
    prefix_lens = [r.seq_len() for r in reqs]
    meta = make_meta(mode, reqs, extend_lens, prefix_lens, device)
    meta.cascade = cascade
    backend.prepare(meta)
    num_tokens = sum(extend_lens)
    for layer in range(LAYERS):
        q = torch.randn(num_tokens, HQ, D, generator=gen).to(dtype=dtype, device=device)
        k = torch.randn(num_tokens, HKV, D, generator=gen).to(dtype=dtype, device=device)
        v = torch.randn(num_tokens, HKV, D, generator=gen).to(dtype=dtype, device=device)
        o = backend.forward(q, k, v, layer, SCALE)
        assert o.shape == q.shape and o.dtype == dtype and not torch.isnan(o).any()
        start = 0
        for r, e, p in zip(reqs, extend_lens, prefix_lens, strict=True):
            ks, vs = (r.history[layer] if r.history and len(r.history) > layer
                      else (k[:0], v[:0]))
            k_all, v_all = torch.cat([ks, k[start:start + e]]), torch.cat([vs, v[start:start + e]])
            want = expected(q[start:start + e], k_all, v_all, p)
            torch.testing.assert_close(o[start:start + e].float(), want, atol=atol, rtol=atol)
            if len(r.history) > layer:
                r.history[layer] = (k_all, v_all)
            else:
                r.history.append((k_all, v_all))
            start += e


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float16, 3e-3)])
def test_triton_backend_over_passes(device, dtype, atol):
    gen = torch.Generator().manual_seed(0)
    num_pages = 24
    pool = Pool(PAGE, [torch.randn(num_pages * PAGE, HKV, D, generator=gen).to(dtype=dtype, device=device)
                       for _ in range(LAYERS)],
                [torch.randn(num_pages * PAGE, HKV, D, generator=gen).to(dtype=dtype, device=device)
                 for _ in range(LAYERS)])
    backend = TritonAttnBackend(pool, num_q_heads=HQ, max_batch_size=8)
    a, b = Req(pages=[5, 9, 2]), Req(pages=[7])
    # 1) prefill: A's first chunk ends inside its second page, B is short
    run_pass(backend, ForwardMode.EXTEND, [a, b], [20, 5], gen, device, dtype, atol)
    # 2) chunked extend of A (prefix 20, inside a page) + C reusing A's first page as a cached prefix
    c = Req(pages=[5, 11], history=[(kk[:16], vv[:16]) for kk, vv in a.history])
    run_pass(backend, ForwardMode.EXTEND, [a, c], [13, 4], gen, device, dtype, atol)
    # 3) two decode steps for everyone
    for _ in range(2):
        run_pass(backend, ForwardMode.DECODE, [a, b, c], [1, 1, 1], gen, device, dtype, atol)
    # 4) mixed: B decodes while D prefills
    d = Req(pages=[3, 14])
    run_pass(backend, ForwardMode.MIXED, [b, d], [1, 17], gen, device, dtype, atol)


@pytest.mark.parametrize("fused_max_suffix, splits", [(512, 1), (0, 2)], ids=["fused", "three-launch"])
def test_triton_backend_cascade_decode(device, fused_max_suffix, splits):
    """A cascade decode pass (A and B share their first page; C, in no group, has 200 tokens) picks
    one suffix split when every suffix is under the fused bound, else the usual split count, and
    both give attention over each request's whole history."""
    gen = torch.Generator().manual_seed(3)
    num_pages = 32
    k_bufs = [torch.randn(num_pages * PAGE, HKV, D, generator=gen, device=device) for _ in range(LAYERS)]
    v_bufs = [torch.randn(num_pages * PAGE, HKV, D, generator=gen, device=device) for _ in range(LAYERS)]
    pool = Pool(PAGE, k_bufs, v_bufs)
    backend = TritonAttnBackend(pool, num_q_heads=HQ, max_batch_size=8,
                                cascade_fused_max_suffix=fused_max_suffix)
    a, c = Req(pages=[5, 9]), Req(pages=list(range(10, 23)))
    run_pass(backend, ForwardMode.EXTEND, [a], [20], gen, device, torch.float32, 1e-4)
    # C's 200-token history is written straight into the pool: its prefill through the interpreter
    # took 19 s and is not what this test is about (test_triton_backend_over_passes covers extend)
    c_slots = slots_of(torch.tensor(c.pages, dtype=torch.int32), PAGE, 0, 200).to(device)
    c.history = [(k_bufs[layer][c_slots].clone(), v_bufs[layer][c_slots].clone()) for layer in range(LAYERS)]
    b = Req(pages=[5, 2], history=[(kk[:16], vv[:16]) for kk, vv in a.history])
    run_pass(backend, ForwardMode.EXTEND, [b], [3], gen, device, torch.float32, 1e-4)
    ints = {"dtype": torch.int32, "device": device}
    cascade = CascadeMeta(members=torch.tensor([0, 1], **ints), starts=torch.tensor([0, 2], **ints),
                          prefix_lens=torch.tensor([16], **ints), kv_start=torch.tensor([16, 16, 0], **ints),
                          max_group_size=2, max_prefix_len=16, max_suffix_len=201, num_q_heads=HQ)
    run_pass(backend, ForwardMode.DECODE, [a, b, c], [1, 1, 1], gen, device, torch.float32, 1e-4, cascade)
    assert backend._num_kv_splits == splits


def test_triton_backend_requires_prepare(device):
    pool = Pool(PAGE, [torch.zeros(PAGE * 2, HKV, D, device=device)],
                [torch.zeros(PAGE * 2, HKV, D, device=device)])
    backend = TritonAttnBackend(pool)
    with pytest.raises(RuntimeError):
        backend.forward(torch.zeros(1, HQ, D, device=device), torch.zeros(1, HKV, D, device=device),
                        torch.zeros(1, HKV, D, device=device), 0, SCALE)


def test_triton_backend_matches_torch_backend(device):
    """Same passes through TritonAttnBackend and the worker's TorchAttnBackend (the CPU oracle)."""
    attention_torch = pytest.importorskip("radixrt.worker.attention_torch")
    gen = torch.Generator().manual_seed(1)
    pools = []
    k0 = torch.randn(20 * PAGE, HKV, D, generator=gen).to(device)
    v0 = torch.randn(20 * PAGE, HKV, D, generator=gen).to(device)
    for _ in range(2):
        pools.append(Pool(PAGE, [k0.clone()], [v0.clone()]))
    triton_backend = TritonAttnBackend(pools[0], num_q_heads=HQ, max_batch_size=4)
    torch_backend = attention_torch.TorchAttnBackend(pools[1])
    a, b = Req(pages=[4, 8, 1]), Req(pages=[6, 2])
    passes = [(ForwardMode.EXTEND, [a, b], [0, 0], [21, 3]),
              (ForwardMode.EXTEND, [a, b], [21, 3], [9, 16]),
              (ForwardMode.DECODE, [a, b], [30, 19], [1, 1]),
              (ForwardMode.MIXED, [a, b], [31, 20], [1, 7])]
    for mode, reqs, prefix_lens, extend_lens in passes:
        meta = make_meta(mode, reqs, extend_lens, prefix_lens, device)
        num_tokens = sum(extend_lens)
        q = torch.randn(num_tokens, HQ, D, generator=gen).to(device)
        k = torch.randn(num_tokens, HKV, D, generator=gen).to(device)
        v = torch.randn(num_tokens, HKV, D, generator=gen).to(device)
        outs = []
        for backend in (triton_backend, torch_backend):
            backend.prepare(meta)
            outs.append(backend.forward(q, k, v, 0, SCALE))
        torch.testing.assert_close(outs[0], outs[1].to(outs[0].dtype), atol=1e-4, rtol=1e-4)
        assert torch.equal(pools[0].k_buffers[0], pools[1].k_buffers[0])


def test_warmup_extend_covers_both_extend_configs(device, monkeypatch):
    """warmup_extend runs extend attention once per config that _pick_config can give on a GPU (64-row
    blocks for short prompts, 128-row otherwise), so no prefill compiles one mid-serving; it writes
    nothing to the pool."""
    import sys

    ext_mod = sys.modules["radixrt.kernels.extend_attention"]
    pick, seen = ext_mod._pick_config, []

    def spy(head_dim, dev, max_extend_len=1 << 30, max_seq_len=None):
        seen.append((head_dim, max_extend_len, max_seq_len))
        return pick(head_dim, dev, max_extend_len, max_seq_len)

    monkeypatch.setattr(ext_mod, "_pick_config", spy)
    gen = torch.Generator().manual_seed(3)
    pool = Pool(PAGE, [torch.randn(PAGE * 2, HKV, D, generator=gen).to(device)],
                [torch.randn(PAGE * 2, HKV, D, generator=gen).to(device)])
    before = [b.clone() for b in pool.k_buffers + pool.v_buffers]
    TritonAttnBackend(pool).warmup_extend(HQ)
    # the configs the warm-up's (max_extend_len, max_seq_len) hints select on a GPU, at this test's
    # head dim and at Qwen2.5-7B's 128 (two configs there), against every config reachable
    gpu = torch.device("cuda")  # only the device type is read
    assert seen and all(hd == D for hd, _, _ in seen)
    for head_dim in (D, 128):
        configs = {tuple(sorted(pick(head_dim, gpu, e, s).items())) for _, e, s in seen}
        every = {tuple(sorted(pick(head_dim, gpu, e, s).items())) for e in (1, 512, 4096)
                 for s in (16, 1024, 2176, None)}
        assert configs == every
    assert len(every) == 2
    assert all(torch.equal(a, b) for a, b in zip(before, pool.k_buffers + pool.v_buffers, strict=True))


@pytest.mark.parametrize("max_suffix_len,fused", [(128, True), (4096, False)])
def test_prepare_caps_prefix_splits_of_the_fused_form(device, max_suffix_len, fused):
    """A long shared prefix with short suffixes runs the fused form (one suffix split), its prefix
    splits capped at CASCADE_FUSED_MAX_PREFIX_SPLITS; long suffixes run the three-launch form, whose
    prefix splits are not capped there (host-side choice only: nothing is launched)."""
    from radixrt.worker.attention_triton import CASCADE_FUSED_MAX_PREFIX_SPLITS

    pool = Pool(PAGE, [torch.zeros(PAGE * 2, HKV, D, device=device)],
                [torch.zeros(PAGE * 2, HKV, D, device=device)])
    backend = TritonAttnBackend(pool)
    ints = {"dtype": torch.int32, "device": device}
    cascade = CascadeMeta(members=torch.arange(2, **ints), starts=torch.tensor([0, 2], **ints),
                          prefix_lens=torch.tensor([32768], **ints), kv_start=torch.full((2,), 32768, **ints),
                          max_group_size=2, max_prefix_len=32768, max_suffix_len=max_suffix_len,
                          num_q_heads=HQ)
    meta = ForwardMeta(mode=ForwardMode.DECODE, page_size=PAGE, page_table=torch.zeros(2, 1, **ints),
                       seq_lens=torch.full((2,), 32768 + max_suffix_len, **ints),
                       extend_lens=torch.ones(2, **ints),
                       prefix_lens=torch.full((2,), 32767 + max_suffix_len, **ints),
                       extend_start_loc=torch.arange(2, **ints), out_cache_loc=torch.zeros(2, **ints),
                       positions=torch.zeros(2, **ints), max_seq_len=32768 + max_suffix_len, max_extend_len=1,
                       cascade=cascade)
    backend.prepare(meta)
    if fused:
        assert backend._num_kv_splits == 1 and backend._num_prefix_splits == CASCADE_FUSED_MAX_PREFIX_SPLITS
    else:
        assert backend._num_kv_splits >= 2 and backend._num_prefix_splits > CASCADE_FUSED_MAX_PREFIX_SPLITS


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_decode_graph_key_is_the_split_count_prepare_bakes_in(device, kv_dtype):
    """CUDA graphs are keyed by decode_graph_key (worker/cuda_graph.py's length classes): it must be
    the split count that `prepare` picks for a plain DECODE pass of that shape, FP8 pools included
    (host-side choice only: nothing is launched)."""
    pool = Pool(PAGE, [torch.zeros(PAGE * 2, HKV, D, device=device, dtype=kv_dtype)],
                [torch.zeros(PAGE * 2, HKV, D, device=device, dtype=kv_dtype)])
    backend = TritonAttnBackend(pool, q_dtype=torch.float32)
    ints = {"dtype": torch.int32, "device": device}
    keys = set()
    for bs in (1, 8, 64, 256):
        for max_seq_len in (100, 640, 1024, 8192, 32768):
            meta = ForwardMeta(mode=ForwardMode.DECODE, page_size=PAGE, page_table=torch.zeros(bs, 1, **ints),
                               seq_lens=torch.ones(bs, **ints), extend_lens=torch.ones(bs, **ints),
                               prefix_lens=torch.zeros(bs, **ints), extend_start_loc=torch.arange(bs, **ints),
                               out_cache_loc=torch.zeros(bs, **ints), positions=torch.zeros(bs, **ints),
                               max_seq_len=max_seq_len, max_extend_len=1)
            backend.prepare(meta)
            splits, variant = backend.decode_graph_key(bs, max_seq_len)
            assert splits == backend._num_kv_splits
            assert variant == ""  # the interpreter's configs (CPU table) switch nothing
            keys.add(backend._num_kv_splits)
    assert len(keys) > 2  # the key does follow the length and the batch


@pytest.mark.parametrize("bs, seq_len, want", [(6, 40, "many"), (6, 200, ""), (1, 40, "")])
def test_backend_launches_the_variant_its_graph_key_names(monkeypatch, bs, seq_len, want):
    """An FP8 pool with a "many" entry in the interpreter's table (1 program per SM, <= 64 keys per
    split, 4 SMs): the config run_split_stage launches after `prepare` is the one decode_graph_key
    names (a graph captured under the key replays that launch), and the output stays right."""
    import sys

    from radixrt.kernels import attention_configs as ac
    from radixrt.kernels.reference import decode_attention_ref

    from .conftest import make_paged_batch

    dec_mod = sys.modules["radixrt.kernels.decode_attention"]
    monkeypatch.setitem(ac.CPU, "decode_fp8", {
        "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "kv_dot": "f16", "many_per_sm": 1,
        "many_max_tokens": 64, "many": {"BLOCK_N": 32, "num_stages": 1, "kv_dot": "f16v"}})
    monkeypatch.setattr(dec_mod, "_num_sms", lambda device: 4)
    launched = []
    real = dec_mod.launch_config

    def spy(cfg, programs, num_sms, split_tokens=None):
        out = real(cfg, programs, num_sms, split_tokens)
        launched.append((out is not cfg, out["BLOCK_N"], out["KV_DOT"]))
        return out
    monkeypatch.setattr(dec_mod, "launch_config", spy)
    b = make_paged_batch([seq_len] * bs, [0] * bs, PAGE, 4, 2, 64, torch.float32)
    kb, vb = b.k_buffer.to(torch.float8_e4m3fn), b.v_buffer.to(torch.float8_e4m3fn)
    backend = TritonAttnBackend(Pool(PAGE, [kb], [vb]), q_dtype=torch.float32)
    backend.num_sms = 4
    ints = {"dtype": torch.int32}
    meta = ForwardMeta(mode=ForwardMode.DECODE, page_size=PAGE, page_table=b.page_table, seq_lens=b.seq_lens,
                       extend_lens=torch.ones(bs, **ints), prefix_lens=b.seq_lens - 1,
                       extend_start_loc=torch.arange(bs, **ints), out_cache_loc=torch.zeros(bs, **ints),
                       positions=torch.zeros(bs, **ints), max_seq_len=seq_len, max_extend_len=1)
    backend.prepare(meta)
    splits, variant = backend.decode_graph_key(bs, seq_len)
    launched.clear()  # (decode_graph_key asks launch_config too)
    q = torch.randn(bs, 4, 64, generator=torch.Generator().manual_seed(1))
    out = backend._decode(q, kb, vb, meta, SCALE, {"k_scale": 1.0, "v_scale": 1.0})
    assert variant == want and splits == backend._num_kv_splits
    assert launched == [(bool(want), 32 if want else 16, "f16v" if want else "f16")]
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, PAGE, SCALE)
    assert float((out - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.usefixtures("no_attention_overrides")
def test_decode_graph_key_carries_the_launch_variant(monkeypatch):
    """With the GPU's config table, an FP8 pool's decode key names the variant launch_config takes:
    "long" with >= 512 keys per split, else "many" above 4 programs per SM with <= 1,024 keys per
    split (host-side only)."""
    import sys

    from radixrt.kernels.decode_attention import decode_launch_variant

    dec_mod = sys.modules["radixrt.kernels.decode_attention"]
    monkeypatch.setattr(dec_mod, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    assert decode_launch_variant(256, 4, 128, 1, 1024, True, cuda) == "long"  # `random`'s length class
    assert decode_launch_variant(256, 4, 128, 1, 2048, True, cuda) == "long"  # longer splits
    assert decode_launch_variant(64, 4, 128, 1, 4096, True, cuda) == "long"  # 256 programs
    assert decode_launch_variant(256, 4, 128, 1, 256, True, cuda) == "many"  # 1,024 short splits
    assert decode_launch_variant(64, 4, 128, 1, 256, True, cuda) == ""  # 256 short splits
    assert decode_launch_variant(1, 4, 128, 64, 8192, True, cuda) == ""  # 128 keys per split
    assert decode_launch_variant(256, 4, 128, 1, None, True, cuda) == ""  # length unknown
    assert decode_launch_variant(160, 4, 128, 4, 2040, True, cuda) == "many"  # 2,560 programs of 510 keys
    assert decode_launch_variant(160, 4, 128, 4, 2048, True, cuda) == "long"  # ... and of 512
    # a bf16 pool switches only its warps, by program count alone: one key per (batch, splits)
    assert decode_launch_variant(256, 4, 128, 1, 1024, False, cuda) == "many"
    assert decode_launch_variant(256, 4, 128, 1, 32768, False, cuda) == "many"
    assert decode_launch_variant(64, 4, 128, 1, 1024, False, cuda) == ""


def test_decode_graph_key_carries_the_gluon_route(monkeypatch):
    """On a Hopper GPU (stood in for here) one split over an FP8 pool with a length class of >= 4,096
    takes decode_attention_ws's kernel: the key says so ("+ws"), so a graph captured at a long class
    is not replayed for a shorter one, which takes the Triton kernel (host-side only)."""
    import sys

    from radixrt.kernels.decode_attention import DECODE_WS_MIN_SEQ, decode_launch_variant

    dec_mod = sys.modules["radixrt.kernels.decode_attention"]
    monkeypatch.setattr(dec_mod, "_num_sms", lambda device: 132)
    monkeypatch.setattr(dec_mod, "_gluon_decode_device", lambda device: True)
    monkeypatch.delenv("RADIXRT_DECODE_WS", raising=False)
    cuda = torch.device("cuda")
    assert decode_launch_variant(64, 4, 128, 1, DECODE_WS_MIN_SEQ, True, cuda) == "long+ws"
    assert decode_launch_variant(64, 4, 128, 1, 32768, True, cuda) == "long+ws"
    assert decode_launch_variant(64, 4, 128, 1, DECODE_WS_MIN_SEQ - 1, True, cuda) == "long"
    assert decode_launch_variant(128, 4, 128, 1, 2048, True, cuda) == "long"
    assert decode_launch_variant(16, 4, 128, 4, 8192, True, cuda) == "long"  # several splits
    assert decode_launch_variant(64, 4, 128, 1, 4096, False, cuda) == ""  # a bf16 pool
    assert decode_launch_variant(64, 4, 64, 1, 4096, True, cuda) in ("", "many", "long")  # head dim 64
    assert decode_launch_variant(64, 4, 128, 1, None, True, cuda) == ""  # length unknown
    monkeypatch.setenv("RADIXRT_DECODE_WS", "0")
    assert decode_launch_variant(64, 4, 128, 1, 4096, True, cuda) == "long"
    monkeypatch.setattr(dec_mod, "_gluon_decode_device", lambda device: False)  # not Hopper
    monkeypatch.delenv("RADIXRT_DECODE_WS")
    assert decode_launch_variant(64, 4, 128, 1, 4096, True, cuda) == "long"
