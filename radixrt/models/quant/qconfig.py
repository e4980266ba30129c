"""config.json's `quantization_config`, read without torch (the launcher checks it before any child
starts; models/resolve.py): which FP8 format a checkpoint declares and its block size. The formats
are described in checkpoint.py, which re-exports these functions.

Every malformed value (a quantization_config, config_groups, group or weights entry that is not an
object, a num_bits that is not 8, a block size that is not two positive integers, ...) raises
ValueError with a message naming it, never AttributeError / TypeError.
"""

from __future__ import annotations

import json
from typing import Any

_CT_STRATEGIES = ("tensor", "channel", "block")


def _config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    q = cfg.get("quantization_config")
    if q is None or q == {}:
        return None
    if not isinstance(q, dict):
        raise ValueError(f"quantization_config must be an object, got {json.dumps(q)[:80]}")
    return q


def _ct_weights(q: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{group name: its "weights" object} of a compressed-tensors config. Raises ValueError."""
    groups = q.get("config_groups")
    if groups is None:
        return {}
    if not isinstance(groups, dict):
        raise ValueError(f"compressed-tensors config_groups must be an object, got {json.dumps(groups)[:80]}")
    out = {}
    for name, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict):
            raise ValueError(f"compressed-tensors group {name!r} ({json.dumps(group)[:80]}) has no "
                             "\"weights\" object")
        out[name] = w
    return out


def checkpoint_quantization(cfg: dict[str, Any]) -> str | None:
    """"fp8" when config.json's `quantization_config` describes FP8 e4m3 weights with per-tensor,
    per-channel or block-wise scales (formats: checkpoint.py), None when there is no
    quantization_config or it quantizes nothing (compressed-tensors without config_groups).

    Raises:
        ValueError: a quantization_config radixrt cannot serve or a malformed one (message names it).
    """
    q = _config(cfg)
    if q is None:
        return None
    method = q.get("quant_method")
    if method == "fbgemm_fp8":
        return "fp8"
    if method == "fp8":
        if str(q.get("fmt") or "e4m3").lower() != "e4m3":  # absent or null: e4m3
            raise ValueError(f"FP8 format {q['fmt']!r} is not supported; radixrt reads e4m3 weights")
        weight_block(cfg)  # raises on a malformed block size
        return "fp8"
    if method == "modelopt" and str(q.get("quant_algo", "")).upper() == "FP8":
        return "fp8"
    if method == "compressed-tensors":
        groups = _ct_weights(q)
        if not groups:  # no quantization groups (e.g. a sparsity-only config): the weights are dense
            return None
        for name, w in groups.items():
            bits = w.get("num_bits")
            bits_ok = isinstance(bits, int) and not isinstance(bits, bool) and bits == 8
            fp8 = w.get("type") == "float" and bits_ok
            if not fp8 or w.get("strategy") not in _CT_STRATEGIES:
                raise ValueError(f"compressed-tensors group {name!r} ({w}) is not FP8 with per-tensor, "
                                 "per-channel or block weight scales")
        weight_block(cfg)  # raises on block groups of different or malformed block_structure
        return "fp8"
    raise ValueError(f"unsupported quantization_config (quant_method {method!r}); radixrt reads FP8 "
                     "checkpoints (compressed-tensors, fbgemm_fp8, fp8, modelopt)")


def weight_block(cfg: dict[str, Any]) -> tuple[int, int] | None:
    """(bn, bk) of a block-wise FP8 checkpoint, else None: `quantization_config.weight_block_size`
    (quant_method fp8; absent or null: no blocks), or compressed-tensors groups of weights strategy
    "block" and their `block_structure` (their scales are `*.weight_scale` [ceil(N / bn), ceil(K / bk)]).

    Raises:
        ValueError: a malformed quantization_config; a block size that is not two positive integers
            (0 and [] included); compressed-tensors groups that mix block scales with others or with
            another block size."""
    q = _config(cfg) or {}
    if q.get("quant_method") == "compressed-tensors":
        groups = list(_ct_weights(q).values())
        blocks = {json.dumps(w.get("block_structure")) for w in groups if w.get("strategy") == "block"}
        if not blocks:
            return None
        if len(blocks) > 1 or any(w.get("strategy") != "block" for w in groups):
            raise ValueError("compressed-tensors groups mix block scales with other scales or block sizes; "
                             "radixrt reads one block size for every group")
        return _block_size(json.loads(blocks.pop()), "block_structure")
    block = q.get("weight_block_size")
    return None if block is None else _block_size(block, "weight_block_size")


def _block_size(block: Any, what: str) -> tuple[int, int]:
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)):
        raise ValueError(f"{what} {block!r} must be two positive integers [rows, columns]")
    return int(block[0]), int(block[1])
