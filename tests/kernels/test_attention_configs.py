"""The attention config table (kernels/attention_configs.py): every variant the GPU sweep
(bench/kernels/sweep_kernels.py) can pick gives the reference's answer (run here on the interpreter
at small shapes, fp32 / fp16, by swapping the interpreter's entries), the split-count policies, and
override files (what `--use-best` / RADIXRT_ATTN_CONFIG apply)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from radixrt.kernels import attention_configs as ac
from radixrt.kernels import (
    cascade_decode_attention,
    choose_num_kv_splits,
    decode_attention,
    extend_attention,
)
from radixrt.kernels.reference import cascade_decode_attention_ref, decode_attention_ref, extend_attention_ref

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}
GPU = torch.device("cuda")  # only the device type is read
EXT = sys.modules["radixrt.kernels.extend_attention"]


pytestmark = pytest.mark.usefixtures("no_attention_overrides")


@pytest.mark.parametrize("block_m, block_n, use_tma, m_major, dtype", [
    (16, 16, True, False, torch.float32), (32, 16, False, False, torch.float16),
    (32, 16, True, True, torch.float16), (32, 32, True, False, torch.float32),
    (64, 32, False, False, torch.float32), (16, 16, False, True, torch.float32)])
def test_every_extend_variant_matches_reference(paged_batch, close, monkeypatch, block_m, block_n, use_tma,
                                                m_major, dtype):
    """Tiles, the TMA path and the grid order (M_MAJOR): prefixes inside a page, a decoding row (GQA
    packing), requests whose diagonal block runs into the next request's tokens and past the end of
    k_new."""
    monkeypatch.setitem(ac.CPU, "extend", {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4,
                                           "num_stages": 1, "USE_TMA": use_tma, "M_MAJOR": m_major})
    b = paged_batch([5, 0, 19], [37, 1, 23], 16, 8, 2, 64, dtype, seed=block_m + block_n)
    out = torch.full_like(b.q, float("nan"), memory_format=torch.contiguous_format)
    extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                     b.extend_start_loc, 16, None, b.max_extend_len, out=out)
    ref = extend_attention_ref(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                               b.extend_lens, b.extend_start_loc, 16, None)
    close(out, ref, *TOL[dtype])


def test_extend_tma_descriptors_only_for_a_layout_tma_can_read(paged_batch):
    b = paged_batch([0], [8], 16, 4, 2, 64, torch.float32)
    assert EXT._new_kv_descriptors(b.k, b.v, 16, 64) is not None  # views of one QKV row
    wide = torch.zeros(8, 2, 128)[:, :, :64]  # head stride 128 != D
    assert EXT._new_kv_descriptors(wide, wide, 16, 64) is None
    odd = torch.zeros(8, 2, 80)
    assert EXT._new_kv_descriptors(odd, odd, 16, 128) is None  # D not the block width


def test_extend_falls_back_to_pointer_loads_when_tma_cannot_read(paged_batch, close, monkeypatch):
    monkeypatch.setitem(ac.CPU, "extend", {**ac.CPU["extend"], "USE_TMA": True})
    b = paged_batch([3], [20], 16, 4, 2, 64, torch.float32)
    wide_k = torch.zeros(20, 2, 128)
    wide_k[:, :, :64] = b.k
    k = wide_k[:, :, :64]  # same values, head stride 128: no descriptor
    out = extend_attention(b.q, k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                           b.extend_start_loc, 16, None, b.max_extend_len)
    ref = extend_attention_ref(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                               b.extend_lens, b.extend_start_loc, 16, None)
    close(out, ref, *TOL[torch.float32])


@pytest.mark.parametrize("block_n, splits, dtype", [(32, 1, torch.float32), (32, 3, torch.float16),
                                                    (64, 2, torch.float32)])
def test_every_decode_variant_matches_reference(paged_batch, close, monkeypatch, block_n, splits, dtype):
    monkeypatch.setitem(ac.CPU, "decode", {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 1})
    b = paged_batch([90, 7, 130], [1, 1, 1], 16, 8, 2, 64, dtype, seed=block_n)
    q = b.q.contiguous()
    out = torch.full_like(q, float("nan"))
    decode_attention(q, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, 16, None, splits, out=out)
    ref = decode_attention_ref(q, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, 16, None)
    close(out, ref, *TOL[dtype])


@pytest.mark.parametrize("tile, fused_n, splits", [((32, 32, 4, 1), 32, 1), ((64, 16, 4, 1), 16, 2)])
def test_every_cascade_variant_matches_reference(paged_batch, close, monkeypatch, tile, fused_n, splits):
    """Stage-A tiles from the table, and the fused suffix stage's key block."""
    bm, bn, w, s = tile
    monkeypatch.setitem(ac.CPU, "cascade", {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": s})
    monkeypatch.setitem(ac.CPU, "decode_fused", {"BLOCK_N": fused_n, "num_warps": 4, "num_stages": 1})
    prefix, batch = 48, 3
    b = paged_batch([prefix + 5, prefix + 20, 9], [1, 1, 1], 16, 8, 2, 64, torch.float32, seed=bm)
    b.page_table[1, : prefix // 16] = b.page_table[0, : prefix // 16]
    i32 = {"dtype": torch.int32}
    kv_start = torch.tensor([prefix, prefix, 0], **i32)
    groups = (torch.arange(2, **i32), torch.tensor([0, 2], **i32), torch.tensor([prefix], **i32))
    q = b.q.contiguous()
    args = (q, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, kv_start, *groups, 16, None)
    out = cascade_decode_attention(*args, splits, 2, 2)
    close(out, cascade_decode_attention_ref(*args), *TOL[torch.float32])
    assert batch == q.shape[0]


def test_split_policies():
    # the d128 default since 2026-12-03 is "waves" (below); the d64 / d256 default is "per_sm"
    assert ac.attention_config("decode_splits", 128)["policy"] == "waves"
    assert ac.attention_config("decode_splits", 64)["policy"] == "per_sm"
    assert choose_num_kv_splits(64, 4, 4096, 132, head_dim=64) == 3
    # per_sm: 4 programs per SM, >= 128 tokens per split, capped by max_splits
    ac.set_overrides({"decode_splits": {"d128": {"policy": "per_sm"}}})
    assert choose_num_kv_splits(64, 4, 4096, 132) == 3
    assert choose_num_kv_splits(1, 4, 300, 132) == 3
    assert choose_num_kv_splits(1, 4, 1 << 20, 132, max_splits=16) == 16
    ac.set_overrides({"decode_splits": {"d128": {"policy": "per_sm", "programs_per_sm": 1}}})
    assert choose_num_kv_splits(64, 4, 4096, 132) == 1
    # waves: 256 (request, KV head) pairs on 132 SMs x 2 fill one wave with no split
    ac.set_overrides({"decode_splits": {"d128": {"policy": "waves", "occupancy": 2, "merge_tokens": 256}}})
    assert choose_num_kv_splits(64, 4, 4096, 132) == 1
    # batch 1: 4 pairs, the split count grows until the merge outweighs it, within the caps
    s = choose_num_kv_splits(1, 4, 8192, 132)
    assert 16 <= s <= 64 and choose_num_kv_splits(1, 4, 8192, 132, max_splits=8) == 8
    assert choose_num_kv_splits(1, 4, 200, 132) == 1  # halving 200 tokens saves less than a merge costs
    ac.set_overrides({"decode_splits": {"d128": {"policy": "waves", "merge_tokens": 0}}})
    assert choose_num_kv_splits(1, 4, 200, 132) == 2  # free merges: capped at >= 128 tokens per split
    ac.set_overrides({"decode_splits": {"d128": {"policy": "bogus"}}})
    with pytest.raises(ValueError, match="policy"):
        choose_num_kv_splits(1, 4, 200, 132)


def test_overrides_merge_into_gpu_configs_only(tmp_path):
    best = {"extend": {"d128": {"BLOCK_N": 128, "num_stages": 4, "USE_TMA": True}},
            "decode": {"d128": {"num_warps": 8}}, "_source": "sweep"}
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"shapes": [], "best": best}))
    ac.load_overrides(path)
    assert EXT._pick_config(128, GPU, 8192, 8192) == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_D": 128,
                                                       "num_warps": 8, "num_stages": 4, "USE_TMA": True,
                                                       "M_MAJOR": True}
    assert EXT._pick_config(128, GPU, 512, 512)["BLOCK_M"] == 64  # the short form is its own entry
    assert EXT._pick_config(64, GPU)["BLOCK_N"] == 64  # other head-dim buckets keep their defaults
    assert ac.attention_config("decode", 128)["num_warps"] == 8
    assert ac.attention_config("decode", 128, on_gpu=False) == ac.CPU["decode"]
    with ac.overriding({"decode": {"d128": {"BLOCK_N": 64}}}):
        assert ac.attention_config("decode", 128) == {"BLOCK_N": 64, "num_warps": 8, "num_stages": 2,
                                                      "num_warps_many": 4, "many_per_sm": 4,
                                                      "peel_tail": 0, "warp_split": False}
    assert ac.attention_config("decode", 128)["BLOCK_N"] == 128


@pytest.mark.parametrize("table, match", [
    ({"decod": {}}, "unknown attention config kind"), ({"decode": {"d96": {}}}, "bucket"),
    ({"decode": {"d128": {"BLOCK_Q": 1}}}, "unknown keys"), ([1], "JSON object")])
def test_bad_overrides_raise(table, match):
    with pytest.raises(ValueError, match=match):
        ac.set_overrides(table)


def test_extend_config_rejects_a_tile_the_loops_cannot_run():
    ac.set_overrides({"extend": {"d128": {"BLOCK_M": 64, "BLOCK_N": 128}}})
    with pytest.raises(ValueError, match="multiple"):
        EXT._pick_config(128, GPU, 8192, 8192)


def test_fp8_split_rule_keeps_large_batches_whole():
    """The FP8 pool's rule (decode_splits_fp8, "waves" for head dim 128) at Qwen2.5-7B's 4 KV heads:
    a batch of 256 (1,024 (request, KV head) pairs, ~3.9 waves of 264 programs) takes one split at
    every length. Without the per-program cost it took 17 splits at 4,096 tokens and 33 at 32,768, the
    length the decode graphs were sized for, which then ran 28 empty programs of 33 over ~640-token
    sequences (H200: batch-256 decode step 17.1 against 8.3 ms with a bf16 pool)."""
    for batch in (128, 192, 256):
        for seq_len in (640, 1024, 4096, 32768):
            assert choose_num_kv_splits(batch, 4, seq_len, 132, kv_fp8=True) == 1, (batch, seq_len)
    # the decode graphs' 1,024-token class (`random`'s 513-768 tokens): one split at every graph size
    # from 128 up (136 = 2.06 waves still splits longer sequences: its third wave is nearly empty)
    assert all(choose_num_kv_splits(b, 4, 1024, 132, kv_fp8=True) == 1 for b in range(128, 257, 8))
    assert choose_num_kv_splits(136, 4, 32768, 132, kv_fp8=True) > 1
    # the shapes the rule was measured at keep their choice (one split)
    assert choose_num_kv_splits(64, 4, 4096, 132, kv_fp8=True) == 1
    assert choose_num_kv_splits(128, 4, 2048, 132, kv_fp8=True) == 1
    # small batches still split long sequences (batch 1: up to the cap of 64)
    assert choose_num_kv_splits(1, 4, 32768, 132, kv_fp8=True) == 64
    assert choose_num_kv_splits(8, 4, 32768, 132, kv_fp8=True) == 8
    assert choose_num_kv_splits(1, 4, 640, 132, kv_fp8=True) == 5
    # the rule as it was (no per-program cost)
    ac.set_overrides({"decode_splits_fp8": {"d128": {"program_tokens": 0}}})
    assert choose_num_kv_splits(256, 4, 32768, 132, kv_fp8=True) == 33
    assert choose_num_kv_splits(256, 4, 4096, 132, kv_fp8=True) == 17
    assert choose_num_kv_splits(256, 4, 640, 132, kv_fp8=True) == 1
    # the bf16 pool's rule (its own program_tokens) is untouched: one split from 132 requests up
    assert all(choose_num_kv_splits(256, 4, n, 132) == 1 for n in (640, 32768))


def test_decode_warps_follow_the_program_count():
    """d128 decode: 8 warps per program up to 4 programs per SM, 4 above (launch_warps)."""
    from radixrt.kernels.decode_attention import launch_warps

    cfg = ac.attention_config("decode", 128)
    assert launch_warps(cfg, 64 * 4, 132) == 8  # 64 x 4,096 in one split: 256 programs
    assert launch_warps(cfg, 4 * 132, 132) == 8 and launch_warps(cfg, 4 * 132 + 1, 132) == 4
    assert launch_warps(cfg, 256 * 4, 132) == 4  # 256 x 768: 1,024 programs
    assert launch_warps(ac.attention_config("decode", 64), 10_000, 132) == 4  # d64: never switches
    assert launch_warps(ac.attention_config("decode_fp8", 128), 10_000, 132) == 4  # FP8 pools: no key
    assert launch_warps(ac.CPU["decode"], 10_000, 132) == ac.CPU["decode"]["num_warps"]


def test_fp8_decode_config_switches_above_many_programs():
    """d128 over an FP8 pool: the "long" entries (64-key blocks split across 2 warps) for splits of
    >= 512 keys; else the "many" entries (64-key blocks, kv_dot "f16v") above 4 programs per SM with
    <= 1,024 keys per split, the 128-key "f16" config otherwise; overrides of many_per_sm 0 and
    long_min_tokens 0 pin the config."""
    from radixrt.kernels.decode_attention import _pick_config, launch_config, launch_variant

    cfg = _pick_config(128, 7, torch.device("cuda"), kv_fp8=True)
    assert (cfg["BLOCK_N"], cfg["KV_DOT"], cfg["num_stages"]) == (128, "f16", 3)
    assert launch_config(cfg, 64 * 4, 132, 256) is cfg  # 64 x 256: 256 short programs
    assert launch_config(cfg, 1 * 4 * 64, 132, 128) is cfg  # 1 x 8,192 in 64 splits of 128 keys
    assert launch_config(cfg, 256 * 4, 132) is cfg  # split length unknown
    many = launch_config(cfg, 256 * 4, 132, 500)  # 1,024 programs of < 512 keys
    assert (many["BLOCK_N"], many["KV_DOT"], many["num_stages"], many["num_warps"]) == (64, "f16v", 3, 4)
    assert not many.get("warp_split")
    # splits of >= 512 keys, at any program count: the warp-split "long" config
    for programs, tokens in ((64 * 4, 4096), (256 * 4, 2048), (256 * 4, 768), (16 * 4 * 4, 512)):
        long = launch_config(cfg, programs, 132, tokens)
        got = tuple(long[k] for k in ("BLOCK_N", "num_warps", "num_stages", "KV_DOT", "warp_split"))
        assert got == (64, 2, 3, "f16", True), (programs, tokens)
    assert cfg["BLOCK_N"] == 128 and not cfg["warp_split"]  # the table's dict is not changed
    with ac.overriding({"decode_fp8": {"d128": {"many_per_sm": 0, "long_min_tokens": 0}}}):
        pinned = _pick_config(128, 7, torch.device("cuda"), kv_fp8=True)
        assert launch_config(pinned, 10_000, 132, 512) is pinned
        assert launch_config(pinned, 10_000, 132, 4096) is pinned
    # a variant without entries is no variant (no extra CUDA-graph key for the same launch)
    assert launch_variant({**cfg, "long": {}}, 64 * 4, 132, 4096) == ""
    assert launch_variant({**cfg, "long": {}, "many": {}}, 256 * 4, 132, 500) == ""
    with pytest.raises(ValueError, match="kv_dot"):
        ac.set_overrides({"decode_fp8": {"d128": {"many": {"kv_dot": "bf16"}}}})


@pytest.mark.usefixtures("no_attention_overrides")
def test_many_entries_are_validated_and_merged_key_by_key():
    """Overrides of the many-program keys: "many" must be an object of BLOCK_N / num_warps /
    num_stages / kv_dot with positive ints and a known kv_dot, many_per_sm / many_max_tokens ints
    >= 0 (ValueError otherwise); a partial "many" keeps the default's other entries."""
    for bad in ({"many": 64}, {"many": None}, {"many": {"BLOK_N": 32}}, {"many": {"BLOCK_N": 0}},
                {"many": {"num_stages": "3"}}, {"many_max_tokens": "1024"}, {"many_per_sm": -1},
                {"many_per_sm": True}):
        with pytest.raises(ValueError):
            ac.set_overrides({"decode_fp8": {"d128": bad}})
    with ac.overriding({"decode_fp8": {"d128": {"many": {"BLOCK_N": 32}}}}):
        cfg = ac.attention_config("decode_fp8", 128)
        assert cfg["many"] == {"BLOCK_N": 32, "num_stages": 3, "kv_dot": "f16v"}
    assert ac.attention_config("decode_fp8", 128)["many"]["BLOCK_N"] == 64  # the default untouched
    with ac.overriding({"decode_fp8": {"d64": {"many_per_sm": 2, "many": {"BLOCK_N": 32}}}}):
        assert ac.attention_config("decode_fp8", 64)["many"] == {"BLOCK_N": 32}


def test_split_stage_asks_launch_config_with_its_program_count(monkeypatch, paged_batch):
    """run_split_stage passes splits x KV heads x requests to launch_config and launches with its
    answer (the interpreter ignores warps, so the call is what is checked)."""
    dec_mod = sys.modules["radixrt.kernels.decode_attention"]
    seen = []
    real = dec_mod.launch_config

    def spy(cfg, programs, num_sms, split_tokens=None):
        seen.append(programs)
        return real(cfg, programs, num_sms, split_tokens)
    monkeypatch.setattr(dec_mod, "launch_config", spy)
    b = paged_batch([30, 5, 60], [1, 1, 1], 16, 8, 2, 64, torch.float32)
    dec_mod.decode_attention(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, 16, None, 3)
    assert seen == [3 * 2 * 3]

