"""CudaGraphRunner's static buffers and padding on CPU: the ModelRunner builds its graph runner as on
CUDA, with each "graph" replaying its captured pass eagerly over the static buffers, so a decode
batch served by a padded graph must sample what the eager passes sample."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.worker import cuda_graph, model_runner
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import BASE, write_config
from tests.worker.driver import GreedyDriver


def _eager_capture(self: cuda_graph.CudaGraphRunner, bs: int, cascade: bool = False,
                   fused: bool = False) -> None:
    """Stands in for a CUDA capture: `replay` runs the pass captured for `bs` over the static buffers."""
    meta = self._meta(bs, cascade, fused)

    def replay() -> None:
        self.__dict__.setdefault("replayed", []).append(bs)
        self._run(bs, meta)

    graph = SimpleNamespace(replay=replay)
    if cascade:
        self.cascade_graphs[bs, fused] = graph
    else:
        self.graphs[bs] = graph


@pytest.fixture()
def graph_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> ModelRunner:
    monkeypatch.setattr(model_runner, "use_cuda_graphs", lambda args, device: True)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(cuda_graph.CudaGraphRunner, "_capture", _eager_capture)
    d = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", page_size=4, max_total_tokens=256,
                      max_running_requests=4, cuda_graph_max_bs=4, random_seed=5)
    return ModelRunner(args, d)


def test_graph_runner_is_built_from_the_runner(graph_runner: ModelRunner) -> None:
    g = graph_runner.graphs
    assert g is not None and sorted(g.graphs) == [1, 2, 4] and g.cascade_graphs == {}
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
    assert graphs.replayed == [4, 4, 4]  # 3 decode passes of 3 requests, each on the padded size-4 graph
    assert graph_tokens == eager_tokens
