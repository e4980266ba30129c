"""CudaGraphRunner's static buffers, padding and length classes on CPU: the ModelRunner builds its
graph runner as on CUDA, with each "graph" replaying its captured pass eagerly over the static
buffers, so a decode batch served by a padded graph must sample what the eager passes sample, and
a batch must replay the graph of its length class."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from radixrt.attention.base import AttentionBackend
from radixrt.config import ServerArgs
from radixrt.worker import cuda_graph, model_runner
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import BASE, write_config
from tests.worker.driver import GreedyDriver


def _eager_capture(self: cuda_graph.CudaGraphRunner, bs: int, max_seq_len: int, cascade: bool = False,
                   fused: bool = False) -> None:
    """Stands in for a CUDA capture: `replay` runs the pass captured for `bs` over the static buffers
    and records (bs, the max_seq_len it was captured with)."""
    meta = self._meta(bs, max_seq_len, cascade, fused)

    def replay() -> None:
        self.__dict__.setdefault("replayed", []).append((bs, max_seq_len))
        self._run(bs, meta)

    graph = SimpleNamespace(replay=replay)
    if cascade:
        self.cascade_graphs[bs, fused] = graph
    else:
        self.graphs[bs, self.backend.decode_graph_key(bs, max_seq_len)] = graph


def _runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **cfg) -> ModelRunner:
    monkeypatch.setattr(model_runner, "use_cuda_graphs", lambda args, device: True)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(cuda_graph.CudaGraphRunner, "_capture", _eager_capture)
    d = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama",
                     **{**BASE, **cfg})
    args = ServerArgs(device="cpu", load_format="dummy", page_size=4, max_total_tokens=256,
                      max_running_requests=4, cuda_graph_max_bs=4, random_seed=5)
    return ModelRunner(args, d)


@pytest.fixture()
def graph_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> ModelRunner:
    return _runner(tmp_path, monkeypatch)


def _splits_like(self: AttentionBackend, batch_size: int, max_seq_len: int) -> int:
    """A length-dependent graph key (a split count): 8 below 1,500 tokens, else 16 (4 at batch 4)."""
    return 4 if batch_size == 4 else 8 if max_seq_len < 1500 else 16


@pytest.fixture()
def classed_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> ModelRunner:
    """Context 4,096 tokens (length classes 1,024 / 2,048 / 4,096) over a backend whose graph key
    depends on the length."""
    monkeypatch.setattr(AttentionBackend, "decode_graph_key", _splits_like)
    return _runner(tmp_path, monkeypatch, max_position_embeddings=4096)


def test_seq_len_classes() -> None:
    assert cuda_graph.seq_len_classes(32768) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert cuda_graph.seq_len_classes(5000) == [1024, 2048, 4096, 5000]
    assert cuda_graph.seq_len_classes(4096) == [1024, 2048, 4096]
    assert cuda_graph.seq_len_classes(512) == [512]
    assert cuda_graph.seq_len_classes(100, shortest=16) == [16, 32, 64, 100]


def test_one_graph_per_key_and_the_class_of_the_batch(classed_runner: ModelRunner) -> None:
    g = classed_runner.graphs
    assert g is not None and g.len_classes == [1024, 2048, 4096]
    # keys 8 / 16 / 16 at batch 1 and 2: two graphs each, captured at the longest class of their key;
    # batch 4's key never changes: one graph
    assert sorted(g.graphs) == [(1, 8), (1, 16), (2, 8), (2, 16), (4, 4)]
    assert [g.graph_key(1, n) for n in (1, 600, 1024, 1025, 2048, 3000, 4096, 9999)] == [8] * 3 + [16] * 5
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    GreedyDriver(classed_runner).generate(prompts, max_new=3)  # 2 decode passes of 2 short requests
    assert g.replayed == [(2, 1024), (2, 1024)]  # the short graph, captured with max_seq_len 1,024


def test_graph_runner_is_built_from_the_runner(graph_runner: ModelRunner) -> None:
    g = graph_runner.graphs
    assert g is not None and sorted(g.graphs) == [(1, 0), (2, 0), (4, 0)] and g.cascade_graphs == {}
    assert g.len_classes == [graph_runner.context_len]
    assert g.backend is graph_runner.backend and g.model is graph_runner.model
    assert g.page_table.shape == (4, graph_runner.max_pages_per_req)
    assert g.logits.shape == (4, graph_runner.config.vocab_size)
    assert g.context_len == graph_runner.context_len and g.page_size == graph_runner.page_size


def test_padded_graph_replay_matches_eager(graph_runner: ModelRunner) -> None:
    runner = graph_runner
    graphs, runner.graphs = runner.graphs, None
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    driver = GreedyDriver(runner)
    eager_tokens = driver.generate(prompts, max_new=4)  # prefill eagerly, then 3 decode passes of 3
    runner.graphs = graphs
    runner.req_to_page.zero_()
    graph_tokens = GreedyDriver(runner).generate(prompts, max_new=4)
    # 3 decode passes of 3 requests, each on the padded size-4 graph (one length class: the context)
    assert graphs.replayed == [(4, 512)] * 3
    assert graph_tokens == eager_tokens


def test_a_bf16_model_keeps_bf16_graph_logits_and_samples_as_eager(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  one_thread: None) -> None:
    """The graphs' static logits buffer is in the model's dtype (no float32 conversion in the graph),
    and greedy decoding through the padded graph picks the eager passes' tokens."""
    monkeypatch.setattr(model_runner, "use_cuda_graphs", lambda args, device: True)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(cuda_graph.CudaGraphRunner, "_capture", _eager_capture)
    d = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    args = ServerArgs(device="cpu", dtype="bfloat16", load_format="dummy", page_size=4, max_total_tokens=256,
                      max_running_requests=4, cuda_graph_max_bs=4, random_seed=5)
    runner = ModelRunner(args, d)
    assert runner.graphs is not None and runner.graphs.logits.dtype == torch.bfloat16
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    graphs, runner.graphs = runner.graphs, None
    eager = GreedyDriver(runner).generate(prompts, max_new=4)
    runner.graphs = graphs
    runner.req_to_page.zero_()
    assert GreedyDriver(runner).generate(prompts, max_new=4) == eager
    assert graphs.replayed and all(bs == 4 for bs, _ in graphs.replayed)  # padded 3 -> 4

