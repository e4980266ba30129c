"""upload_batch: every ForwardBatch array lands in its own named DeviceBatch field, with the derived
arrays (prefix lens, token offsets, cascade kv starts, sampled rows) and host facts computed right."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from radixrt.protocol import ForwardBatch, ForwardMode
from radixrt.worker.device_batch import DeviceBatch, cascade_kv_start, upload_batch

I32, F32 = np.int32, np.float32
CPU = torch.device("cpu")


def _cascade_batch() -> ForwardBatch:
    """A DECODE pass of 4 requests: requests 0 and 2 share 8 prefix tokens, 1 and 3 are in no group."""
    return ForwardBatch(
        batch_id=7, mode=int(ForwardMode.DECODE), req_rows=np.array([3, 0, 2, 1], I32),
        input_ids=np.array([11, -1, 13, 14], I32), positions=np.array([9, 4, 12, 5], I32),
        out_cache_loc=np.array([41, 22, 54, 27], I32), seq_lens=np.array([10, 5, 13, 6], I32),
        extend_lens=np.ones(4, I32), upd_rows=np.array([3, 2], I32), upd_cols=np.array([2, 3], I32),
        upd_pages=np.array([10, 13], I32), cow_src=np.array([6], I32), cow_dst=np.array([9], I32),
        temperature=np.array([0.0, 0.7, 1.0, 0.0], F32), top_p=np.array([1.0, 0.9, 1.0, 1.0], F32),
        top_k=np.array([-1, -1, -1, 5], I32), min_p=np.array([0.0, 0.0, 0.1, 0.0], F32),
        seeds=np.array([1, 2, 3, 4], I32), sample_steps=np.array([0, 3, 1, 2], I32),
        cascade_members=np.array([0, 2], I32), cascade_starts=np.array([0, 2], I32),
        cascade_prefix_lens=np.array([8], I32))


def test_every_array_lands_in_its_named_field() -> None:
    b = _cascade_batch()
    db = upload_batch(b, CPU, vocab_size=100)
    for name in ("req_rows", "out_cache_loc", "positions", "input_ids", "top_k", "seeds", "sample_steps",
                 "upd_rows", "upd_cols", "cow_src", "cow_dst", "cascade_members"):
        t = getattr(db, name)
        assert t.dtype == torch.int64 and t.tolist() == getattr(b, name).tolist(), name
    for name in ("seq_lens", "extend_lens", "upd_pages", "cascade_starts", "cascade_prefix_lens"):
        t = getattr(db, name)
        assert t.dtype == torch.int32 and t.tolist() == getattr(b, name).tolist(), name
    for name in ("temperature", "top_p", "min_p"):
        t = getattr(db, name)
        assert t.dtype == torch.float32 and t.tolist() == getattr(b, name).tolist(), name
    assert db.mode == ForwardMode.DECODE


def test_derived_arrays_and_host_facts() -> None:
    b = _cascade_batch()
    db = upload_batch(b, CPU, vocab_size=100)
    assert db.prefix_lens.tolist() == [9, 4, 12, 5]
    assert db.extend_start_loc.tolist() == [0, 1, 2, 3]
    assert db.cascade_kv_start.tolist() == [8, 0, 8, 0] == cascade_kv_start(b).tolist()
    assert db.max_seq_len == 13 and db.max_extend_len == 1
    assert db.cascade is not None
    assert (db.cascade.max_group_size, db.cascade.max_prefix_len, db.cascade.max_suffix_len) == (2, 8, 6)
    # row 0 is greedy (temperature 0), row 3 too (top_k 5 < vocab but temperature 0); rows 1, 2 sample
    assert db.sampled_rows.tolist() == [1, 2]
    assert db.use_min_p and db.need_sort  # row 2 has min_p; row 1 has top_p < 1


def test_extend_offsets_and_no_cascade() -> None:
    b = ForwardBatch(batch_id=1, mode=int(ForwardMode.MIXED), req_rows=np.array([0, 1, 2], I32),
                     input_ids=np.arange(8, dtype=I32), positions=np.arange(8, dtype=I32),
                     out_cache_loc=np.arange(8, dtype=I32), seq_lens=np.array([5, 7, 1], I32),
                     extend_lens=np.array([5, 2, 1], I32), temperature=np.zeros(3, F32),
                     top_p=np.ones(3, F32), top_k=np.full(3, -1, I32), min_p=np.zeros(3, F32),
                     seeds=np.zeros(3, I32), sample_steps=np.zeros(3, I32))
    db = upload_batch(b, CPU, vocab_size=100)
    assert db.extend_start_loc.tolist() == [0, 5, 7] and db.prefix_lens.tolist() == [0, 5, 0]
    assert db.max_seq_len == 7 and db.max_extend_len == 5
    assert db.cascade is None and db.cascade_kv_start.numel() == 0
    meta = db.forward_meta(torch.arange(12, dtype=torch.int32).view(3, 4), page_size=4, num_q_heads=2)
    assert meta.cascade is None and meta.mode == ForwardMode.MIXED
    assert db.sampling_tensors().plan.num_sampled == 0


def test_device_tensors_do_not_alias_the_batch() -> None:
    b = _cascade_batch()
    db = upload_batch(b, CPU, vocab_size=100)
    b.input_ids[:] = 99
    b.seq_lens[:] = 99
    b.temperature[:] = 99.0
    assert db.input_ids.tolist() == [11, -1, 13, 14]
    assert db.seq_lens.tolist() == [10, 5, 13, 6]
    assert db.temperature.tolist()[1] == np.float32(0.7)


def test_forward_meta_reads_the_page_table_rows_of_the_requests() -> None:
    db = upload_batch(_cascade_batch(), CPU, vocab_size=100)
    req_to_page = torch.arange(20, dtype=torch.int32).view(4, 5)
    meta = db.forward_meta(req_to_page, page_size=4, num_q_heads=6)
    assert meta.page_table.tolist() == req_to_page[[3, 0, 2, 1]].tolist()
    assert meta.seq_lens is db.seq_lens and meta.out_cache_loc is db.out_cache_loc
    assert meta.page_size == 4 and meta.max_seq_len == 13
    c = meta.cascade
    assert c is not None and c.num_q_heads == 6 and c.kv_start is db.cascade_kv_start
    assert (c.max_group_size, c.max_prefix_len, c.max_suffix_len) == (2, 8, 6)
    st = db.sampling_tensors()
    assert st.plan.num_sampled == 2 and st.plan.use_min_p and st.plan.need_sort
    assert st.top_k is db.top_k and st.seeds is db.seeds


def test_every_tensor_field_is_filled_by_upload() -> None:
    db = upload_batch(_cascade_batch(), CPU, vocab_size=100)
    tensor_fields = [f.name for f in dataclasses.fields(DeviceBatch) if f.type == "torch.Tensor"]
    assert len(tensor_fields) == 26
    assert all(isinstance(getattr(db, n), torch.Tensor) for n in tensor_fields)
