"""The model's L2 weight prefetch at batch-1 decode (radixrt/models/llama.py L2Prefetch): after each
layer's qkv GEMV it forks a prefetch of that layer's o and gate_up weights, joins once at the end of
the pass, only for passes of at most `max_rows` tokens, and changes no output. On the CPU the
stream work is recorded instead of run (the kernel itself: tests/kernels/test_l2_prefetch.py; on
CUDA with graphs: tests/worker/test_gpu_model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.models import llama, native_layers
from radixrt.models.llama import L2Prefetch
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import save_tiny_model
from tests.worker.driver import single_request_batch


def test_plan_spends_the_budget_in_weight_order() -> None:
    a, b, c = torch.zeros(10, dtype=torch.float32), torch.zeros(64, dtype=torch.uint8), torch.zeros(8)
    plan = L2Prefetch.plan([a, b, c], 40 + 18)
    assert [(w is x, n) for (w, n), x in zip(plan, [a, b], strict=True)] == [(True, 40), (True, 16)]
    assert [n for _, n in L2Prefetch.plan([a, b, c], 1000)] == [40, 64, 32]
    assert L2Prefetch.plan([a, b], 3) == [] and L2Prefetch.plan([], 100) == []


def test_decode_pass_forks_per_layer_and_joins_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_tiny_model("llama", tmp_path)
    monkeypatch.setattr(native_layers, "layer_calls", lambda *a: False)  # the Python layer loop
    runner = ModelRunner(ServerArgs(device="cpu", page_size=4, max_total_tokens=256, max_running_requests=2,
                                    attention_backend="torch"), tmp_path)
    ids = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    prefill = single_request_batch(ids[:-1])
    step = single_request_batch(ids[-1:], start=len(ids) - 1)
    runner.forward_logits(prefill)
    want = runner.forward_logits(step).clone()

    events: list = []
    monkeypatch.setattr(L2Prefetch, "active", lambda self, h: 0 < h.shape[0] <= self.max_rows)
    monkeypatch.setattr(L2Prefetch, "fork", lambda self, ws: events.append(("fork", ws)))
    monkeypatch.setattr(L2Prefetch, "join", lambda self: events.append(("join", None)))
    runner.forward_logits(prefill)  # 8 tokens: no prefetch
    assert events == []
    got = runner.forward_logits(step)
    layers = runner.model.model.layers
    assert [e[0] for e in events] == ["fork"] * len(layers) + ["join"]
    for (_, ws), layer in zip(events, layers, strict=False):
        assert ws[0] is layer.self_attn.o_proj.weight and ws[1] is layer.mlp.gate_up_proj.weight
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert isinstance(runner.model.l2_prefetch, llama.L2Prefetch)
