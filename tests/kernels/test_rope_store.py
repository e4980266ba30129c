"""kernels.rope_store_kv (rotary embedding and the K/V store in one launch) against the two launches
it replaces, apply_rotary then store_kv, on the same inputs: q, k (rotated in place) and the pool
bit-equal, over q / k / v as strided views of one fused QKV output, a partial rotary dimension,
int32 positions, padding tokens sent to the sink slot 0, and pools of fp32, fp16 and FP8 on the CPU
(the two paths share the store's code, so even the interpreter's FP8 rounding agrees), bf16 and
FP8 at Qwen2.5-7B's heads on a GPU. Then the
Triton attention backend's forward_rope (which takes it) against apply_rotary + forward over
extend, decode and mixed passes. Runs on the CPU through the Triton interpreter (conftest)."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import apply_rotary, build_rope_cache, rope_store_kv, store_kv
from radixrt.kernels.reference import slots_of

from .conftest import DEVICE

FP8 = torch.float8_e4m3fn


def _qkv(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, gen: torch.Generator):
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype=dtype, device=DEVICE)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return qkv, q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)


def _compare(t, hq, hkv, d, rotary_dim, dtype, pool_dtype, pos_dtype, device, seed=0):
    """Both paths on the same inputs; asserts q, k, v and the pools bit-equal."""
    gen = torch.Generator().manual_seed(seed)
    slots = 4 * t + 8
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype=dtype, device=device)
    qkv2 = qkv.clone()
    q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    q2, k2, v2 = (x.view(t, -1, d) for x in qkv2.split([hq * d, hkv * d, hkv * d], dim=-1))
    positions = torch.randint(0, 500, (t,), generator=gen).to(dtype=pos_dtype, device=device)
    cache = build_rope_cache(rotary_dim, 512, 10000.0).to(device)
    loc = torch.randperm(slots - 1, generator=gen)[:t] + 1
    loc[3] = loc[7] = 0  # padding tokens share the sink slot
    loc = loc.to(device)
    scales = {"k_scale": 0.5, "v_scale": 0.25} if pool_dtype == FP8 else {}
    pools = [(torch.zeros(slots, hkv, d, dtype=pool_dtype, device=device),
              torch.zeros(slots, hkv, d, dtype=pool_dtype, device=device)) for _ in range(2)]

    apply_rotary(q, k, positions, cache)
    store_kv(*pools[0], loc, k, v, **scales)
    rope_store_kv(q2, k2, v2, positions, cache, *pools[1], loc, **scales)

    assert torch.equal(qkv2, qkv)  # q and k rotated in place alike, v untouched
    real = loc != 0  # the sink slot's row is whichever padding token wrote last
    untouched = torch.ones(slots, dtype=torch.bool, device=device)
    untouched[loc] = False
    for a, b in zip(pools[0], pools[1], strict=True):
        assert torch.equal(a[loc[real]].float(), b[loc[real]].float())
        assert bool(b[loc[real]].float().abs().sum((1, 2)).gt(0).all())  # every real token's row written
        assert not b[untouched].float().any()


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16, FP8])
@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
def test_fused_equals_rotary_then_store(pool_dtype, rotary_dim, pos_dtype):
    dtype = torch.float16 if pool_dtype == torch.float16 else torch.float32
    _compare(9, 8, 2, 64, rotary_dim, dtype, pool_dtype, pos_dtype, DEVICE)


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, FP8])
@pytest.mark.parametrize("t", [1, 128, 1000])
def test_fused_equals_rotary_then_store_on_gpu(pool_dtype, t):
    """Qwen2.5-7B's heads (28 query, 4 KV, D 128) in bf16, a bf16 and an FP8 pool."""
    _compare(max(t, 8), 28, 4, 128, 128, torch.bfloat16, pool_dtype, torch.int64, torch.device("cuda"))


def test_checks_both_sets_of_arguments():
    gen = torch.Generator().manual_seed(1)
    _, q, k, v = _qkv(4, 4, 2, 32, torch.float32, gen)
    cache = build_rope_cache(32, 64, 10000.0).to(DEVICE)
    pos = torch.arange(4, device=DEVICE)
    kb = torch.zeros(16, 2, 32, device=DEVICE)
    with pytest.raises(ValueError):  # positions of the wrong length
        rope_store_kv(q, k, v, pos[:3], cache, kb, kb.clone(), torch.arange(4, device=DEVICE))
    with pytest.raises(ValueError):  # pool rows of another head size
        rope_store_kv(q, k, v, pos, cache, kb[..., :16], kb[..., :16].clone(), torch.arange(4, device=DEVICE))
    with pytest.raises(ValueError):  # out_cache_loc of the wrong length
        rope_store_kv(q, k, v, pos, cache, kb, kb.clone(), torch.arange(3, device=DEVICE))
    rope_store_kv(q[:0], k[:0], v[:0], pos[:0], cache, kb, kb.clone(), pos[:0])  # no tokens: nothing


@pytest.mark.parametrize("rope_store", ["1", "0"], ids=["fused", "switched-off"])
def test_backend_forward_rope_equals_rotary_then_forward(monkeypatch, rope_store):
    """forward_rope against apply_rotary + forward: the fused kernel bit-equal; a backend built with
    RADIXRT_ROPE_STORE=0 (the unfused way: the models' rotary, then forward) within float32 roundings
    (its rotary may be torch's on the CPU), so a route that skipped the rotation fails here too."""
    pytest.importorskip("orjson", reason="radixrt.protocol needs orjson")
    from radixrt.attention.base import ForwardMeta
    from radixrt.protocol import ForwardMode
    from radixrt.worker.attention_triton import TritonAttnBackend

    from .test_attention_triton import HKV, HQ, PAGE, Pool

    d, layers = 64, 2
    gen = torch.Generator().manual_seed(2)
    cache = build_rope_cache(d, 256, 10000.0).to(DEVICE)

    def pool():
        g = torch.Generator().manual_seed(3)
        return Pool(PAGE, [torch.randn(16 * PAGE, HKV, d, generator=g).to(DEVICE) for _ in range(layers)],
                    [torch.randn(16 * PAGE, HKV, d, generator=g).to(DEVICE) for _ in range(layers)])

    pools = [pool(), pool()]
    backends = [TritonAttnBackend(pools[0], num_q_heads=HQ, max_batch_size=4)]
    monkeypatch.setenv("RADIXRT_ROPE_STORE", rope_store)
    backends.append(TritonAttnBackend(pools[1], num_q_heads=HQ, max_batch_size=4))
    assert backends[1].fuse_rope_store == (rope_store == "1")
    tol = {"atol": 0, "rtol": 0} if rope_store == "1" else {}
    table = torch.tensor([[3, 5, 0], [7, 9, 11]], dtype=torch.int32)
    # (mode, prefix lens, extend lens): a prefill, two decode steps, a mixed pass
    passes = [(ForwardMode.EXTEND, [0, 0], [20, 33]), (ForwardMode.DECODE, [20, 33], [1, 1]),
              (ForwardMode.DECODE, [21, 34], [1, 1]), (ForwardMode.MIXED, [22, 35], [1, 6])]
    for mode, pre, ext in passes:
        spans = list(enumerate(zip(pre, ext, strict=True)))
        loc = torch.cat([slots_of(table[i], PAGE, p, p + e) for i, (p, e) in spans])
        positions = torch.cat([torch.arange(p, p + e) for p, e in zip(pre, ext, strict=True)]).to(DEVICE)
        pre_t, ext_t = torch.tensor(pre, dtype=torch.int32), torch.tensor(ext, dtype=torch.int32)
        meta = ForwardMeta(mode=mode, page_size=PAGE, page_table=table.to(DEVICE),
                           seq_lens=(pre_t + ext_t).to(DEVICE), extend_lens=ext_t.to(DEVICE),
                           prefix_lens=pre_t.to(DEVICE),
                           extend_start_loc=(torch.cumsum(ext_t, 0, dtype=torch.int32) - ext_t).to(DEVICE),
                           out_cache_loc=loc.to(DEVICE), positions=positions,
                           max_seq_len=int((pre_t + ext_t).max()), max_extend_len=int(ext_t.max()))
        for b in backends:
            b.prepare(meta)
        for layer in range(layers):
            t = sum(ext)
            q = torch.randn(t, HQ, d, generator=gen).to(DEVICE)
            k = torch.randn(t, HKV, d, generator=gen).to(DEVICE)
            v = torch.randn(t, HKV, d, generator=gen).to(DEVICE)
            q2, k2 = q.clone(), k.clone()
            apply_rotary(q, k, positions, cache)
            want = backends[0].forward(q, k, v, layer, 0.125)
            got = backends[1].forward_rope(q2, k2, v, positions, cache, layer, 0.125)
            torch.testing.assert_close(got, want, **tol)
    bufs = [p.k_buffers + p.v_buffers for p in pools]
    for a, b in zip(*bufs, strict=True):
        torch.testing.assert_close(b, a, **tol)


def _compiled_form(kernel):
    """The JITFunction that `triton.jit` makes of `kernel` outside the interpreter (the tests run
    under TRITON_INTERPRET=1, where the decorator keeps its arguments in `.kwargs`)."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    return JITFunction(kernel.fn, **{k: v for k, v in kernel.kwargs.items() if v is not None})


@pytest.mark.parametrize("kernel_name", ["rotary._rope_kernel", "rotary._rope_store_kernel",
                                         "store_kv._store_kv_kernel"])
def test_per_token_kernels_compile_one_variant_whatever_the_metadata_alignment(kernel_name):
    """The worker uploads positions and out_cache_loc as slices of one buffer
    (worker/device_batch.py), 16-byte aligned or not by batch size; a kernel that specialised on
    their alignment would compile a second variant at the first prefill of the other kind (a stall
    of that pass). Triton's binder, with an sm_90 target, must give aligned and unaligned slices the
    same specialisation."""
    import importlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    module, name = kernel_name.split(".")
    fn = _compiled_form(getattr(importlib.import_module(f"radixrt.kernels.{module}"), name))
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))
    buf = torch.zeros(64, dtype=torch.int64)
    x = torch.zeros(3, 4, 128, dtype=torch.bfloat16)

    def specialisation(offset: int):
        idx = buf[offset:offset + 3]  # 16-byte aligned for even offsets
        args = {p.name: 1 for p in fn.params if not p.is_constexpr}
        args.update({p.name: x for p in fn.params if p.name in ("q", "k", "v", "k_buf", "v_buf", "k_src",
                                                                 "v_src")})
        args.update({p.name: idx for p in fn.params if p.name in ("positions", "out_cache_loc")})
        if "cos_sin" in args:
            args["cos_sin"] = torch.zeros(8, 128)
        consts = {p.name: (False if p.name in ("QUANT", "USE_PDL") else 64)
                  for p in fn.params if p.is_constexpr}
        return binder(*[args.get(p.name, consts.get(p.name)) for p in fn.params])[1]

    assert specialisation(0) == specialisation(1)
    # the check can fail: an aligned and an unaligned q do specialise differently
    aligned = specialisation(0)
    x = torch.zeros(3 * 4 * 128 + 1, dtype=torch.bfloat16)[1:].view(3, 4, 128)
    assert specialisation(0) != aligned

