"""The GPU launch configs of the attention kernels follow the rules their docstrings state (the
configs were picked on an H200: bench/lab/sweep_attention.py, the comments at the constants). Only the
device type is read, so these run without a GPU."""

from __future__ import annotations

import torch

from radixrt.kernels import cascade_attention
from radixrt.kernels.decode_attention import _pick_config as decode_config
from radixrt.kernels.extend_attention import _pick_config as extend_config

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def _tile(cfg: dict) -> tuple[int, int, int, int]:
    return cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]


def test_extend_config_by_prefix_and_extend_length():
    pick = extend_config
    # short prompts over short or no prefixes: 64-row blocks, 2 stages
    assert _tile(pick(128, CUDA, 512, 512)) == (64, 64, 4, 2)
    assert _tile(pick(128, CUDA, 1024, 1024)) == (64, 64, 4, 2)
    # a cached prefix (shared-prefix: 128 new tokens over 2,048 cached), a long extend, or no hint:
    # 128-row blocks, 8 warps, 3 stages (the paged loop is pipelined)
    assert _tile(pick(128, CUDA, 128, 2176)) == (128, 64, 8, 3)
    assert _tile(pick(128, CUDA, 8192, 8192)) == (128, 64, 8, 3)
    assert _tile(pick(128, CUDA, 128)) == (128, 64, 8, 3)
    assert pick(128, CUDA, 128, 2176)["BLOCK_M"] % pick(128, CUDA, 128, 2176)["BLOCK_N"] == 0
    assert _tile(pick(128, CPU, 128, 2176)) == (16, 16, 4, 1)  # interpreter


def test_cascade_tile_and_split_count_fit_one_program_per_sm():
    tile = cascade_attention.default_tile(128, CUDA)
    assert (tile.block_m, tile.block_n, tile.num_warps, tile.num_stages) == (128, 64, 8, 3)
    # 128 requests x 7 query heads per KV head = 7 row blocks of 128, x 4 KV heads x 4 splits = 112
    splits = cascade_attention.choose_num_prefix_splits(1, 128, 28, 4, 2048, 132, block_m=tile.block_m)
    assert splits == 4 and 7 * 4 * splits <= 132
    assert cascade_attention.default_tile(256, CUDA).block_n == 32  # larger heads: half the key block
    assert cascade_attention.default_tile(128, CPU).num_stages == 1


def test_decode_config_of_the_fused_cascade_form():
    pick = decode_config
    assert pick(128, 7, CUDA)["BLOCK_N"] == 128
    assert pick(128, 7, CUDA, True)["BLOCK_N"] == 64  # merging the prefix partials: 64-key blocks
    assert pick(128, 7, CUDA, True)["BLOCK_H"] == 16  # the GQA group padded to a tl.dot tile
    assert pick(128, 7, CPU, True)["BLOCK_N"] == 16
