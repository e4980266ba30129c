"""Pool sizing and the activation profile on CPU: the worst-case batch is well formed, and the profile
pass runs over a throwaway pool and backend, leaving the runner's own pool, backend and page table
as they were (the CUDA peak measurement itself is stubbed out here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.models.model_config import parse_config
from radixrt.worker import memory_profile
from radixrt.worker.kv_pool import PagedKVPool
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import BASE, write_config


@pytest.mark.parametrize("total, page_size, context_len, max_rows", [(10, 4, 512, 4), (1000, 16, 300, 8),
                                                                      (1000, 1, 300, 2), (37, 4, 9, 16)])
def test_profile_batch_is_a_well_formed_extend(total: int, page_size: int, context_len: int,
                                               max_rows: int) -> None:
    batch, num_pages = memory_profile.profile_batch(total, page_size, context_len, max_rows)
    lens = batch.extend_lens.tolist()
    assert all(1 <= n <= context_len - 1 for n in lens) and len(lens) <= max_rows
    assert sum(lens) == min(total, max_rows * (context_len - 1)) == len(batch.input_ids)
    assert lens == batch.seq_lens.tolist()  # nothing cached: every token is new
    table = np.zeros((len(lens), max(1, -(-max(lens) // page_size))), np.int64)
    table[batch.upd_rows, batch.upd_cols] = batch.upd_pages
    start = 0
    for r, n in enumerate(lens):
        pos = batch.positions[start:start + n]
        assert pos.tolist() == list(range(n))
        want = table[r, pos // page_size] * page_size + pos % page_size
        assert batch.out_cache_loc[start:start + n].tolist() == want.tolist()
        start += n
    pages = batch.upd_pages.tolist()
    assert sorted(pages) == list(range(1, num_pages))  # distinct pages from 1, page 0 untouched
    assert batch.return_logprob and batch.top_logprobs_num > 0


def test_num_pool_pages_without_cuda() -> None:
    def never() -> int:
        raise AssertionError("the activation profile runs only on CUDA without --max-total-tokens")

    cfg = parse_config(BASE | {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, {}, [])
    cpu = torch.device("cpu")
    explicit = ServerArgs(device="cpu", page_size=16, max_total_tokens=100)
    assert memory_profile.num_pool_pages(explicit, cfg, cpu, torch.float32, never) == 7 + 1  # + page 0
    default = ServerArgs(device="cpu", page_size=16)
    assert (memory_profile.num_pool_pages(default, cfg, cpu, torch.float32, never)
            == memory_profile.CPU_DEFAULT_POOL_TOKENS // 16 + 1)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> ModelRunner:
    d = write_config(tmp_path_factory.mktemp("m") / "m", architectures=["LlamaForCausalLM"],
                     model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", page_size=4, max_total_tokens=64,
                      max_running_requests=3, chunked_prefill_size=40, random_seed=3)
    return ModelRunner(args, d)


def _snapshot(r: ModelRunner) -> list[torch.Tensor]:
    return [b.clone() for b in (*r.pool.k_buffers, *r.pool.v_buffers)]


def test_profile_pass_writes_only_its_throwaway_pool(runner: ModelRunner) -> None:
    pool_before, backend_before, kv_before = runner.pool, runner.backend, _snapshot(runner)
    batch, num_pages = memory_profile.profile_batch(50, runner.page_size, runner.context_len,
                                                    runner.max_req_rows)
    c = runner.config
    tmp = PagedKVPool(num_pages, runner.page_size, c.num_layers, c.num_kv_heads, c.head_dim, runner.dtype,
                      "cpu")
    st = memory_profile.top_p_sampling(runner.max_req_rows, runner.device)
    backend = memory_profile.profile_pass(runner.args, batch, st, runner.model, c, tmp, runner.req_to_page,
                                          runner.penalties)
    try:
        assert backend is not runner.backend and backend.pool is tmp
        assert runner.pool is pool_before and runner.backend is backend_before
        for old, new in zip(kv_before, (*runner.pool.k_buffers, *runner.pool.v_buffers), strict=True):
            assert torch.equal(old, new)
        slots = torch.from_numpy(batch.out_cache_loc.astype(np.int64))
        assert all(bool(buf[slots].abs().sum(dim=(1, 2)).gt(0).all()) for buf in tmp.k_buffers)
        assert runner.req_to_page[batch.upd_rows, batch.upd_cols].tolist() == batch.upd_pages.tolist()
    finally:
        runner.req_to_page.zero_()


def test_activation_reserve_zeroes_the_page_table_and_adds_slack(runner: ModelRunner,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []

    def fake_peak(run, device) -> int:  # the CUDA measurement, minus CUDA
        run()
        ran.append(int(runner.req_to_page.count_nonzero()))  # the pass wrote its page-table rows
        return 1000

    monkeypatch.setattr(memory_profile, "measure_peak_bytes", fake_peak)
    kv_before, backend_before = _snapshot(runner), runner.backend
    assert runner._activation_reserve_bytes() == 1000 + memory_profile.MIN_SLACK_BYTES  # no graphs on CPU
    assert ran and ran[0] > 0
    assert int(runner.req_to_page.count_nonzero()) == 0
    assert runner.backend is backend_before and runner.last_next_ids is None
    for old, new in zip(kv_before, (*runner.pool.k_buffers, *runner.pool.v_buffers), strict=True):
        assert torch.equal(old, new)
