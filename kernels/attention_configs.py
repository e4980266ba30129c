"""Launch configs of the paged attention kernels: one small table, by kind and head-dim bucket.

Kinds (the launcher that reads each):
  decode        split stage of decode_attention (BLOCK_N keys per step, num_warps, num_stages;
                num_warps_many replaces num_warps when the launch has more than many_per_sm
                programs per SM, 0 = never; warp_split: each block's keys split across the warps,
                paged_loop.py paged_attn_loop_ws, BLOCK_N = num_warps x a power of two >= 16)
  decode_fused  the same stage in the fused cascade form (it also merges the prefix partials)
  decode_fp8    the split stage over an FP8 (e4m3) pool: blocks as "decode", plus kv_dot, the operands
                of its two dots: "f16" (q, K, V and P in fp16: K/V widened by one packed
                cvt.rn.f16x2.e4m3x2 per two values), "f16v" (as "f16", with V widened before the
                P V dot so that Triton does not read it from shared memory a byte at a time:
                paged_loop.py V_WIDEN), "f16v8" (as "f16v", V loaded in 8-byte pieces so that its
                fp16 stores avoid 2-way bank conflicts; slower than "f16v" on an H200, 2026-12-03),
                "q" (K/V widened to q's
                dtype, the form before 2026-12-02: e4m3 -> bf16 takes that cvt plus one
                cvt.bf16.f16 per value), or the
                e4m3 tensor-core forms of paged_loop_fp8.py: "fp8" (q and P as e4m3,
                FlashAttention-3's FP8 operands), "fp8x2" (q and P as two e4m3 terms each), "qk8"
                (q as two e4m3 terms against K, P V in fp16); kv_dot also applies to the fused form
                over an FP8 pool. Above many_per_sm programs per SM (0: never), each over at most
                many_max_tokens keys (0: any), the entries of "many" replace the config's (BLOCK_N,
                num_warps, num_stages, kv_dot, warp_split; decode_attention.launch_config; only d128
                sets them); with splits of at least long_min_tokens keys (0: never; known only
                when the caller passes max_seq_len) the entries of "long" do, before "many"
  decode_splits the split-count rule of choose_num_kv_splits (see there): policy "per_sm"
                (programs_per_sm, min_split_tokens) or "waves" (occupancy, merge_tokens,
                program_tokens)
  decode_splits_fp8 the same rule for FP8 pools (choose_num_kv_splits(kv_fp8=True))
  extend        extend_attention with a cached prefix or a long extend (BLOCK_M, BLOCK_N, num_warps,
                num_stages, USE_TMA: the new tokens' K/V read through TMA tensor descriptors, M_MAJOR:
                the grid launches the longest query blocks of every head first, not head by head)
  extend_short  extend_attention when every prompt and prefix is short (short_max tokens or fewer)
  cascade       stage A of cascade_decode_attention (block_m, block_n, num_warps, num_stages)
Head-dim buckets: "d64" (next_pow2(D) <= 64), "d128" (<= 128), "d256" (larger). The GPU values were
measured on an H200 (sm_90): the comments at the old constants live on at each entry below, and
bench/kernels/sweep_kernels.py re-measures them. On the CPU (Triton interpreter) every kind takes small
blocks (`CPU`) so that the tests exercise every loop.

Overrides: a JSON file of the same shape ({kind: {bucket: {key: value}}}, partial entries allowed,
e.g. the "best" object that sweep_kernels.py writes) named by the environment variable
RADIXRT_ATTN_CONFIG is applied at import; set_overrides / overriding apply one in-process (the sweep).
Overrides apply to GPU lookups only. A malformed file raises ValueError at import (a typo must not
silently fall back to the defaults).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path

from . import switches
from ._checks import check, next_pow2

ENV_VAR = "RADIXRT_ATTN_CONFIG"
KINDS = ("decode", "decode_fused", "decode_fp8", "decode_splits", "decode_splits_fp8", "extend",
         "extend_short", "cascade")
BUCKETS = ("d64", "d128", "d256")
KV_DOTS = ("f16", "f16v", "f16v8", "q", "fp8", "fp8x2", "qk8")  # decode_fp8 kv_dot values
F16_KV_DOTS = ("f16", "f16v", "f16v8")  # the forms whose two dots run in fp16 (q clamped to its range)

# program_tokens ("waves" only): the fixed cost of one split program in key tokens, about one 128-key
# block (loading q and the first page ids, writing a partial; an empty split still pays it). Without
# it (0, until 2026-12-02) the model saw a 3% gain in 128 waves of 33 splits over 4 waves of one at
# batch 256 x 32K tokens (Qwen2.5-7B: 1,024 (request, KV head) pairs), and the decode graphs, sized
# at the context length, then ran 33 splits over ~640-token sequences: 28 of 33 programs empty and
# the batch-256 decode step at 17.1 against 8.3 ms (H200, bench/lab/fp8_random_profile.py)
_SPLITS = {"policy": "per_sm", "programs_per_sm": 4, "min_split_tokens": 128, "occupancy": 2,
           "merge_tokens": 256, "program_tokens": 128}
# an FP8 pool's splits of >= long_min_tokens keys (decode_fp8 "long"): the keys of each 64-key block
# split across 2 warps, 32 each (kernels/paged_loop.py paged_attn_loop_ws, cuDNN's warp tiling).
# H200, 2026-12-04 03:27 (bench/lab/decode_rules.py, same run, against the config before, "no long"):
# 64 x 4,096 91.0 against 101.6 us (bf16 pool 139.4: 0.653x), 128 x 2,048 85.9 / 103.9, 128 x 2,208
# 91.7 / 115.1, 256 x 768 78.1 / 84.7, 32 x 4,096 58.0 / 62.0, 16 x 2,048 (4 splits of 512) 25.0 / 26.2,
# 256 x 512 61.5 / 61.6; with splits of 128 keys it lost (03:09 run: 1 x 512 13.0 against 10.4 us,
# 1 x 2,048 14.6 / 11.7, 1 x 8,192 18.2 / 15.8: two 64-key steps in series per program where the
# default takes one), hence the bound. Other warp-split tiles at 64 x 4,096 against this one's 92.1 us
# in the 03:09 run: 64 x 2 warps x 4 stages 91.6 (but 128 x 2,048 95.5 against 86.6), 128 x 4 x 3
# 96.4, 128 x 2 x 3 103.1, 32 x 2 x 3 122.4. Over the bf16 pool no warp-split tile beat the
# default at the shapes that matter (64 x 4,096 138.9-158.7 against 139.3 us, 256 x 768 118.2-181.1
# against 111.2), so "decode" keeps warp_split off
_FP8_WARP_SPLIT = {"BLOCK_N": 64, "num_warps": 2, "num_stages": 3, "kv_dot": "f16", "warp_split": True}
DEFAULTS: dict[str, dict[str, dict]] = {
    # H200, 2026-11-30 (bench/lab/sweep_attention.py, decode part, graph replay): over 7 batch x
    # context shapes x 8 configs of 2-6 stages, 128-key blocks with 2 stages were the best or within
    # 3%; 64 x 4,096 ran in 145.4 us, 87% of the copy ceiling
    # d128 since 2026-12-03 (H200, bench/lab/decode_rules.py, same run, against the old 4 warps and
    # per-SM splits): 8 warps and the "waves" split rule below ran 64 x 4,096 in 138.8 against 142.2
    # us (1 against 3 splits), 128 x 2,048 140.4 / 147.3, 128 x 2,208 153.8 / 158.9, 16 x 2,048
    # 31.7 / 33.2, batch 1 at 512-8,192 tokens equal, but 256 x 768 (1,024 programs) 113.8 against
    # 110.8: above many_per_sm programs per SM a launch takes num_warps_many (4) warps instead
    "decode": {"d64": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "num_warps_many": 4,
                       "many_per_sm": 0, "peel_tail": 0, "warp_split": False},
               "d128": {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "num_warps_many": 4,
                        "many_per_sm": 4, "peel_tail": 0, "warp_split": False},
               "d256": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "num_warps_many": 4,
                        "many_per_sm": 0, "peel_tail": 0, "warp_split": False}},
    # the prefix merge adds live registers: 64-key blocks ran the fused form of 128 requests (2,048
    # shared + 128-192 own tokens) in 19 us against 26 us with 128-key blocks (H200, 2026-11-30)
    "decode_fused": {"d64": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                     "d128": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                     "d256": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2}},
    # FP8 pool (2026-12-02, reasoned, bench/kernels/sweep_fp8.py measures it): the "q" form of
    # 2026-12-01 ran 64 x 4,096 in 129.8 us against bf16's 134.3 (H200), i.e. 2.1 TB/s, which is
    # what 1.5 conversions per K/V value at 16 per clock per SM allow (132 SMs, ~1.9 GHz: ~100 us
    # for 268 M values), not the bandwidth (~67 us). fp16 dots need 0.5 conversions per value.
    # measured (H200, 2026-12-01, bench/kernels/sweep_fp8.py, 11 blocks x 6 split rules): d128 with
    # 3 stages and the "waves" split rule ran 64 x 4,096 in 101.9 us (bf16 pool 144.5, the old "q"
    # form 136.1, f16 with 2 stages and the per-SM rule 131.5) and 128 x 2,048 in 104.3 us (149.6).
    # The e4m3 tensor-core forms lost to it (H200, 2026-12-02, same sweep, bf16 144.6 / f16 101.3 us
    # at 64 x 4,096): "qk8" 109.4 (best of 8 blocks x 4 split counts), "fp8" 210-300, "fp8x2"
    # 227-350 (the V transpose; paged_loop_fp8.py)
    # kv_dot "f16v" (V widened before its dot, no byte loads from shared memory) measured slower
    # (H200, 2026-12-03, bench/lab/decode_rules.py: 64 x 4,096 114.1 against 101.4 us, 128 x 2,048
    # 115.8 against 103.6; its fp16 copy of V takes 106 against 74 KB of shared memory)
    # Above 4 programs per SM with at most 1,024 keys per split (`random`'s 256 requests x 4 KV heads
    # at 512-768 tokens) the "many" config: 64-key blocks, kv_dot "f16v", 3 stages ran 256 x 512 /
    # 640 / 768 in 61.3 / 72.9 / 84.5 against 69.2 / 80.2 / 90.8 us, but 64 x 4,096 (256 programs)
    # in 126.8 against 101.4, and in a second run 256 x 2,048 / 4,096 in 202.6 / 390.9 against
    # 198.0 / 373.4, 160 x 2,048 (2 splits) 142.7 / 147.7, 192 x 1,024 87.2 / 86.6 (H200, 2026-12-03,
    # bench/lab/decode_rules.py --pools fp8; launch_config)
    "decode_fp8": {"d64": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "kv_dot": "f16", "many_per_sm": 0,
                           "many_max_tokens": 0, "many": {}, "peel_tail": 0,
                           "warp_split": False, "long_min_tokens": 0, "long": {}},
                   "d128": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "kv_dot": "f16",
                            "many_per_sm": 4, "many_max_tokens": 1024,
                            "many": {"BLOCK_N": 64, "num_stages": 3, "kv_dot": "f16v"}, "peel_tail": 0,
                            "warp_split": False, "long_min_tokens": 512, "long": dict(_FP8_WARP_SPLIT)},
                   "d256": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "kv_dot": "f16", "many_per_sm": 0,
                            "many_max_tokens": 0, "many": {}, "peel_tail": 0,
                            "warp_split": False, "long_min_tokens": 0, "long": {}}},
    # 4 programs per SM and >= 128 tokens per split: the best of 2-16 per SM on an H200, 2026-11-29
    "decode_splits": {"d64": dict(_SPLITS), "d256": dict(_SPLITS),
                      "d128": {**_SPLITS, "policy": "waves"}},  # 2026-12-03, with the 8-warp config
    "decode_splits_fp8": {"d64": dict(_SPLITS), "d256": dict(_SPLITS),  # d64 / d256: not measured
                          "d128": {**_SPLITS, "policy": "waves"}},  # occupancy 2, merge_tokens 256
    # head dim 128 (H200, 2026-11-30, 10 configs x 6 prefill shapes): 128 x 64 / 8 warps / 3 stages
    # won every shape with a cached prefix or a long extend (8,192 new: 1,085 against 1,201 us).
    # M_MAJOR (H200, 2026-12-03, bench/lab/kv_layout.py): 8,192 new causal 1,036 against 1,075 us,
    # 4,096 new over 4,096 cached 895 against 950 us; d64 / d256 follow (reasoned: the same tail)
    "extend": {"d64": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "USE_TMA": False,
                       "M_MAJOR": True},
               "d128": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": False,
                        "M_MAJOR": True},
               "d256": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2, "USE_TMA": False,
                        "M_MAJOR": True}},
    # short prompts over short or no prefixes (16 x 512 new tokens: 154 against 176 us); only d128
    # has a short form (short_max 0 disables it)
    "extend_short": {"d64": {"short_max": 0}, "d256": {"short_max": 0},
                     "d128": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "USE_TMA": False,
                              "M_MAJOR": False, "short_max": 1024}},  # M_MAJOR: not measured here
    # 128 rows x 64 tokens, 8 warps, 3 stages: the best of 9 tiles x 4 split counts (H200,
    # 2026-11-30, 128 requests sharing 2,048 tokens: 17.7 against 20.3 us); larger heads halve it
    # remat_rows: the prefix kernel recomputes its rows' requests / heads after the loop instead of
    # holding them through it (no register spills at these tiles on sm_90); off: H200 2026-12-03, 4-8%
    # slower at the 128-row tile (batch 128: 43.9 against 40.7 us), the engine's decode pass unchanged
    # blocks_last: the grid's row-block axis slowest (KV head, split, row block), so the programs of the
    # bound's spare blocks (a decode graph pads to 8 groups, 7 empty: 8 spare blocks) start after
    # every real one instead of among them. On: H200 2026-12-04 (bench/lab/cascade_overlap.py --walk),
    # the whole call at the graph's 8 groups 45.0 against 48.2 us at batch 128, 28.2 / 32.6 at 32,
    # 37.1 / 42.9 at 64, 67.1 / 69.4 at 256 (one group: within 1-2 us either way); measured for d128
    "cascade": {"d64": {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "remat_rows": False,
                        "blocks_last": True},
                "d128": {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "remat_rows": False,
                         "blocks_last": True},
                "d256": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2, "remat_rows": False,
                         "blocks_last": True}},
}
# Triton interpreter (CPU tests): small blocks exercise every loop; splits follow the GPU rule
CPU: dict[str, dict] = {
    "decode": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "decode_fused": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    # "q" keeps the fp32 tests' K/V exact; the tests swap in "f16" (tests/kernels/test_fp8_variants.py)
    "decode_fp8": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "kv_dot": "q"},
    "decode_splits": dict(_SPLITS),
    "decode_splits_fp8": dict(_SPLITS),
    "extend": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "USE_TMA": False},
    "extend_short": {"short_max": 0},
    "cascade": {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1},
}

_overrides: dict[str, dict[str, dict]] = {}


def bucket(head_dim: int) -> str:
    """The head-dim bucket of the table: "d64", "d128" or "d256" (any larger power of two)."""
    block_d = next_pow2(head_dim)
    return "d64" if block_d <= 64 else "d128" if block_d <= 128 else "d256"


def attention_config(kind: str, head_dim: int, on_gpu: bool = True) -> dict:
    """A copy of the config of `kind` for `head_dim`: the default entry with any override merged in
    (GPU; "many" and "long" merged key by key), or the interpreter's small blocks (on_gpu False).
    Raises ValueError for an unknown kind."""
    check(kind in KINDS, f"unknown attention config kind {kind!r} (one of {KINDS})")
    if not on_gpu:
        return dict(CPU[kind])
    b = bucket(head_dim)
    default, over = DEFAULTS[kind][b], _overrides.get(kind, {}).get(b, {})
    cfg = {**default, **over}
    for variant in ("many", "long"):  # an override's entries of a variant replace the default's one by one
        if variant in cfg:
            cfg[variant] = {**default.get(variant, {}), **over.get(variant, {})}
    return cfg


def _validate(table: object) -> dict[str, dict[str, dict]]:
    check(isinstance(table, dict), "attention config overrides must be a JSON object")
    out: dict[str, dict[str, dict]] = {}
    for kind, by_bucket in table.items():  # type: ignore[union-attr]
        if kind.startswith("_"):  # comments / provenance ("_source": ...)
            continue
        check(kind in KINDS, f"unknown attention config kind {kind!r} (one of {KINDS})")
        check(isinstance(by_bucket, dict), f"overrides[{kind!r}] must map head-dim buckets to configs")
        for b, cfg in by_bucket.items():
            check(b in BUCKETS, f"unknown head-dim bucket {b!r} (one of {BUCKETS})")
            check(isinstance(cfg, dict), f"overrides[{kind!r}][{b!r}] must be an object")
            unknown = set(cfg) - set(DEFAULTS[kind][b]) - set(_SPLITS)
            check(not unknown, f"unknown keys {sorted(unknown)} in overrides[{kind!r}][{b!r}]")
            check(cfg.get("kv_dot", "f16") in KV_DOTS,
                  f"overrides[{kind!r}][{b!r}]['kv_dot'] must be one of {KV_DOTS}")
            check(cfg.get("peel_tail", 0) in (0, 1, 2),
                  f"overrides[{kind!r}][{b!r}]['peel_tail'] must be 0 / false, 1 / true or 2")
            check(isinstance(cfg.get("warp_split", False), bool),
                  f"overrides[{kind!r}][{b!r}]['warp_split'] must be true or false")
            check(isinstance(cfg.get("blocks_last", False), bool),
                  f"overrides[{kind!r}][{b!r}]['blocks_last'] must be true or false")
            _validate_many(cfg, f"overrides[{kind!r}][{b!r}]")
            _validate_warp_split(kind, b, cfg)
        out[kind] = copy.deepcopy(by_bucket)
    return out


def warp_split_error(block_n: int, num_warps: int, kv_dot: str) -> str | None:
    """Why a launch of BLOCK_N keys per block on num_warps warps with this kv_dot ("q" for a pool in
    q's dtype) cannot split its keys across the warps (paged_loop.py paged_attn_loop_ws: kv_dot "q"
    or "f16", BLOCK_N = num_warps sub-blocks of a power of two >= 16 positions), or None."""
    if kv_dot not in ("q", "f16"):
        return f"warp_split needs kv_dot 'q' or 'f16', not {kv_dot!r}"
    sub = block_n // max(1, num_warps)
    if block_n % max(1, num_warps) or sub < 16 or next_pow2(sub) != sub:
        return f"warp_split needs BLOCK_N {block_n} = num_warps {num_warps} x a power of two >= 16 positions"
    return None


def _validate_warp_split(kind: str, b: str, over: dict) -> None:
    """Every config a decode launch can take under this override (the entry itself, and with its
    "many" or "long" entries where many_per_sm / long_min_tokens switch them on, as
    decode_attention.launch_config applies them) that sets warp_split
    must be able to run it (warp_split_error), so a bad file fails at load, not mid-serving."""
    if kind not in ("decode", "decode_fp8"):
        return
    default = DEFAULTS[kind][b]
    base = {**default, **over}
    variants = [base]
    for name, switch in (("many", "many_per_sm"), ("long", "long_min_tokens")):
        if not base.get(switch, 0):  # a variant that is never taken
            continue
        entries = {**default.get(name, {}), **over.get(name, {})}
        if name == "many" and "num_warps_many" in base:
            entries = {"num_warps": base["num_warps_many"], **entries}
        variants.append({**base, **entries})
    for cfg in variants:
        if cfg.get("warp_split"):
            err = warp_split_error(int(cfg["BLOCK_N"]), int(cfg["num_warps"]), cfg.get("kv_dot", "q"))
            check(err is None, f"overrides[{kind!r}][{b!r}]: {err}")


# what a "many" or "long" entry may replace
MANY_KEYS = ("BLOCK_N", "num_warps", "num_stages", "kv_dot", "warp_split")


def _validate_many(cfg: dict, where: str) -> None:
    """many_per_sm / many_max_tokens / long_min_tokens: ints >= 0; many / long: objects of MANY_KEYS
    (positive ints, kv_dot one of KV_DOTS, warp_split a bool)."""
    for key in ("many_per_sm", "many_max_tokens", "long_min_tokens"):
        if key in cfg:
            v = cfg[key]
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                  f"{where}[{key!r}] must be an int >= 0")
    for variant in ("many", "long"):
        if variant not in cfg:
            continue
        entries = cfg[variant]
        check(isinstance(entries, dict), f"{where}[{variant!r}] must be an object")
        unknown = set(entries) - set(MANY_KEYS)
        check(not unknown, f"unknown keys {sorted(unknown)} in {where}[{variant!r}] (allowed: {MANY_KEYS})")
        check(entries.get("kv_dot", "f16") in KV_DOTS,
              f"{where}[{variant!r}]['kv_dot'] must be one of {KV_DOTS}")
        check(isinstance(entries.get("warp_split", False), bool),
              f"{where}[{variant!r}]['warp_split'] must be true or false")
        for key in ("BLOCK_N", "num_warps", "num_stages"):
            if key in entries:
                v = entries[key]
                check(isinstance(v, int) and not isinstance(v, bool) and v > 0,
                      f"{where}[{variant!r}][{key!r}] must be an int > 0")


def set_overrides(table: dict | None) -> None:
    """Replace the overrides ({kind: {bucket: partial config}}; None or {} clears them)."""
    global _overrides
    _overrides = _validate(table or {})


def get_overrides() -> dict[str, dict[str, dict]]:
    """A copy of the overrides in force."""
    return copy.deepcopy(_overrides)


def load_overrides(path: str | Path) -> dict:
    """Read an overrides file (a sweep's JSON output: its "best" object if it has one) and apply it.
    Returns the applied table."""
    data = json.loads(Path(path).read_text())
    table = data.get("best", data) if isinstance(data, dict) else data
    set_overrides(table)
    return get_overrides()


@contextlib.contextmanager
def overriding(table: dict) -> Iterator[None]:
    """Apply `table` on top of the overrides in force for the duration of the block (the sweep)."""
    saved = get_overrides()
    merged = get_overrides()
    for kind, by_bucket in _validate(table).items():
        for b, cfg in by_bucket.items():
            merged.setdefault(kind, {}).setdefault(b, {}).update(cfg)
    set_overrides(merged)
    try:
        yield
    finally:
        set_overrides(saved)


if switches.attn_config_file():
    load_overrides(switches.attn_config_file())
