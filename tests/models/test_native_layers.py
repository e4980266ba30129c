"""The float32 CPU layer loop as direct native calls (radixrt/models/native_layers.py) against the module
path, on the default model: bit-equal hidden states, and the passes it must not take."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.models import native_layers
from radixrt.worker import cpu_native
from radixrt.worker.model_runner import ModelRunner
from tests.worker.driver import GreedyDriver

pytestmark = pytest.mark.skipif(not cpu_native.linear_supported(),
                                reason="the native layer loop needs the native linear (C compiler, AVX-512)")


@pytest.fixture(scope="module")
def runner(model_dir: Path) -> ModelRunner:
    import radixrt.models.linear as linear_mod

    if not linear_mod.native_linear_enabled():
        pytest.skip("the native linear is off on this CPU (RADIXRT_CPU_NATIVE_LINEAR)")
    args = ServerArgs(device="cpu", dtype="float32", page_size=16, max_total_tokens=2048,
                      context_length=1024, max_running_requests=8)
    return ModelRunner(args, model_dir)


def _hidden_per_pass(runner: ModelRunner, prompts: list[list[int]], chunk: int, fast: bool,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], list[list[int]], int]:
    """(the final norm's output of every pass, greedy tokens, passes that took native_layers.run)."""
    hidden: list[torch.Tensor] = []
    runs = [0]
    norm = runner.model.model.norm
    orig_norm, orig_run, orig_calls = norm.forward, native_layers.run, native_layers.layer_calls

    def record(x, residual=None):  # noqa: ANN001, ANN202
        out = orig_norm(x, residual)
        hidden.append(out[0].clone())
        return out

    def counted_run(*a):  # noqa: ANN002, ANN202
        runs[0] += 1
        return orig_run(*a)

    monkeypatch.setattr(norm, "forward", record)
    monkeypatch.setattr(native_layers, "run", counted_run)
    monkeypatch.setattr(native_layers, "layer_calls", orig_calls if fast else lambda *a: False)
    tokens = GreedyDriver(runner, chunk=chunk).generate(prompts, 6)
    monkeypatch.undo()
    return hidden, tokens, runs[0]


@pytest.mark.parametrize("chunk", [48, 512])
def test_native_layer_loop_is_bit_equal_to_the_module_path(runner: ModelRunner, chunk: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts of 3-300 tokens: with chunk 48 every pass qualifies (extends of <= 64 new tokens and
    decodes: all rows through the native attention); with chunk 512 the passes with the long prompts'
    extends take the module path (torch's flash kernel for those rows), the others the native loop."""
    g = torch.Generator().manual_seed(chunk)
    prompts = [torch.randint(1000, 40000, (n,), generator=g).tolist() for n in (3, 17, 60, 300)]
    fast_h, fast_tok, fast_runs = _hidden_per_pass(runner, prompts, chunk, True, monkeypatch)
    slow_h, slow_tok, slow_runs = _hidden_per_pass(runner, prompts, chunk, False, monkeypatch)
    assert slow_runs == 0 and fast_tok == slow_tok
    assert len(fast_h) == len(slow_h)
    for i, (a, b) in enumerate(zip(fast_h, slow_h, strict=True)):
        assert torch.equal(a, b), f"pass {i}: max diff {(a - b).abs().max().item()}"
    if chunk == 48:
        assert fast_runs == len(fast_h)  # every pass
    else:
        assert 0 < fast_runs < len(fast_h)  # the first pass (300-token extend) is not one of them


def _backend(runner: ModelRunner, rows: int, plan: bool = True) -> SimpleNamespace:
    """A stand-in attention backend whose native plan (when `plan`) covers `rows` decode rows in order."""
    p = None
    if plan:
        p = cpu_native.DecodePlan.build(list(range(rows)),
                                        [(np.arange(1, 9, dtype=np.int64), [r]) for r in range(rows)])
    return SimpleNamespace(native_plan=p, pool=runner.pool,
                           meta=SimpleNamespace(out_cache_loc=torch.arange(rows, dtype=torch.int64)))


def test_passes_that_do_not_qualify(runner: ModelRunner) -> None:
    """Each case differs from a qualifying 4-row (or 129-row) pass by the one property it names."""
    model = runner.model
    h = torch.zeros(4, model.config.hidden_size)
    pos = torch.arange(4)
    # no native plan (a long extend): the module path
    assert not native_layers.layer_calls(model, h, pos, _backend(runner, 4, plan=False))
    assert not native_layers.layer_calls(model, h.double(), pos, _backend(runner, 4))
    assert not native_layers.layer_calls(model, torch.zeros(129, model.config.hidden_size), torch.arange(129),
                                         _backend(runner, 129))  # more rows than the native linear takes


@pytest.mark.parametrize("family", ["qwen2", "llama3", "qwen3"])
def test_tiny_families(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2 (q|k|v bias) and Llama-3 (scaled rotary) take the native loop bit-equal to the modules;
    Qwen3 (per-head q/k norm) never takes it."""
    import radixrt.models.linear as linear_mod
    from tests.models.tiny import save_tiny_model

    if not linear_mod.native_linear_enabled():
        pytest.skip("the native linear is off on this CPU (RADIXRT_CPU_NATIVE_LINEAR)")
    save_tiny_model(family, tmp_path)
    args = ServerArgs(device="cpu", dtype="float32", page_size=4, max_total_tokens=1024, context_length=256,
                      max_running_requests=4)
    runner = ModelRunner(args, tmp_path)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 23, 40)]
    fast_h, fast_tok, fast_runs = _hidden_per_pass(runner, prompts, 16, True, monkeypatch)
    slow_h, slow_tok, _ = _hidden_per_pass(runner, prompts, 16, False, monkeypatch)
    assert fast_tok == slow_tok and len(fast_h) == len(slow_h)
    assert all(torch.equal(a, b) for a, b in zip(fast_h, slow_h, strict=True))
    assert fast_runs == (0 if family == "qwen3" else len(fast_h))
