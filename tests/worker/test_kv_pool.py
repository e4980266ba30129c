"""PagedKVPool sizing and copy-on-write page copies, alone and through ModelRunner.forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from radixrt.config import ServerArgs
from radixrt.protocol import ForwardBatch, ForwardMode
from radixrt.worker.kv_pool import PagedKVPool
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import BASE, write_config

I32 = np.int32


def test_copy_pages_copies_whole_pages_in_every_layer() -> None:
    pool = PagedKVPool(6, 4, 3, 2, 8, torch.float32, "cpu")
    for buf in (*pool.k_buffers, *pool.v_buffers):
        buf.copy_(torch.randn_like(buf))
    before = [b.clone() for b in (*pool.k_buffers, *pool.v_buffers)]
    pool.copy_pages(torch.tensor([1, 3]), torch.tensor([4, 5]))
    for old, new in zip(before, (*pool.k_buffers, *pool.v_buffers), strict=True):
        assert torch.equal(new[16:20], old[4:8]) and torch.equal(new[20:24], old[12:16])
        assert torch.equal(new[:16], old[:16])  # sources and other pages untouched
    assert pool.kv_bytes_per_token == 2 * 3 * 2 * 8 * 4
    assert pool.usable_tokens == 5 * 4 and pool.num_slots == 24


def _batch(bid: int, mode: ForwardMode, row: int, ids: list[int], start: int, pages: list[int],
           upd: list[tuple[int, int, int]], cow: tuple[list[int], list[int]] = ([], [])) -> ForwardBatch:
    pos = list(range(start, start + len(ids)))
    loc = [pages[p // 4] * 4 + p % 4 for p in pos]
    one = np.ones(1, np.float32)
    return ForwardBatch(
        batch_id=bid, mode=int(mode), req_rows=np.array([row], I32), input_ids=np.array(ids, I32),
        positions=np.array(pos, I32), out_cache_loc=np.array(loc, I32),
        seq_lens=np.array([start + len(ids)], I32), extend_lens=np.array([len(ids)], I32),
        upd_rows=np.array([u[0] for u in upd], I32), upd_cols=np.array([u[1] for u in upd], I32),
        upd_pages=np.array([u[2] for u in upd], I32), cow_src=np.array(cow[0], I32),
        cow_dst=np.array(cow[1], I32), temperature=one * 0, top_p=one, top_k=np.full(1, -1, I32),
        min_p=one * 0, seeds=np.zeros(1, I32), sample_steps=np.zeros(1, I32))


def test_runner_applies_copy_on_write_before_the_pass(tmp_path: Path) -> None:
    d = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", page_size=4, max_total_tokens=64,
                      max_running_requests=2, random_seed=3)
    r = ModelRunner(args, d)
    prompt = list(range(10, 20))  # 10 tokens: pages 1, 2 full, page 3 holds positions 8-9
    r.forward_logits(_batch(1, ForwardMode.EXTEND, 0, prompt, 0, [1, 2, 3],
                            [(0, 0, 1), (0, 1, 2), (0, 2, 3)]))
    # request A continues in its own page 3
    a = r.forward_logits(_batch(2, ForwardMode.DECODE, 0, [42], 10, [1, 2, 3], []))
    # request B shares pages 1, 2 and takes a private copy of page 3 (page 4), then writes there
    b = r.forward_logits(_batch(3, ForwardMode.EXTEND, 1, [42], 10, [1, 2, 4],
                                [(1, 0, 1), (1, 1, 2), (1, 2, 4)], cow=([3], [4])))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # without the copy, page 4 would hold no prefix and the logits would differ
    c = r.forward_logits(_batch(4, ForwardMode.EXTEND, 1, [42], 10, [1, 2, 5],
                                [(1, 2, 5)]))
    assert not torch.allclose(a, c, atol=1e-3)
