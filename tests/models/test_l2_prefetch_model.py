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


def test_active_only_when_enabled_on_cuda_for_few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate: enabled (off unless RADIXRT_L2_PREFETCH=1), a CUDA tensor, 1..max_rows tokens."""
    from radixrt.config import Env

    monkeypatch.delenv("RADIXRT_L2_PREFETCH", raising=False)
    assert Env.read().l2_prefetch is False and Env.read().l2_prefetch_mb == 24
    monkeypatch.setenv("RADIXRT_L2_PREFETCH", "1")
    monkeypatch.setenv("RADIXRT_L2_PREFETCH_MB", "12")
    assert Env.read().l2_prefetch is True and Env.read().l2_prefetch_mb == 12

    class H:  # stands for hidden states [T, H]: only .is_cuda and .shape are read
        def __init__(self, rows: int, cuda: bool) -> None:
            self.shape, self.is_cuda = (rows, 64), cuda

    pf = L2Prefetch()
    monkeypatch.setattr(L2Prefetch, "enabled", True)
    assert [pf.active(H(t, True)) for t in (0, 1, 2, 3, 16)] == [False, True, True, False, False]
    assert not pf.active(H(1, False))
    monkeypatch.setattr(L2Prefetch, "enabled", False)
    assert not pf.active(H(1, True))


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
    # the real gate except its CUDA condition; the qkv GEMVs recorded to check the fork comes after
    monkeypatch.setattr(L2Prefetch, "enabled", True)
    monkeypatch.setattr(L2Prefetch, "active",
                        lambda self, h: self.enabled and 0 < h.shape[0] <= self.max_rows)
    monkeypatch.setattr(L2Prefetch, "fork", lambda self, ws: events.append(("fork", ws)))
    monkeypatch.setattr(L2Prefetch, "join", lambda self: events.append(("join", None)))
    layers = runner.model.model.layers
    for i, layer in enumerate(layers):
        qkv = layer.self_attn.qkv_proj
        monkeypatch.setattr(qkv, "forward",
                            lambda x, _f=qkv.forward, _i=i: events.append(("qkv", _i)) or _f(x))
    runner.forward_logits(prefill)  # 8 tokens: no prefetch
    assert [e for e in events if e[0] != "qkv"] == []
    events.clear()
    got = runner.forward_logits(step)
    assert [e[0] for e in events] == ["qkv", "fork"] * len(layers) + ["join"]
    forks = [ws for kind, ws in events if kind == "fork"]
    for ws, layer in zip(forks, layers, strict=True):
        assert ws[0] is layer.self_attn.o_proj.weight and ws[1] is layer.mlp.gate_up_proj.weight
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert isinstance(runner.model.l2_prefetch, llama.L2Prefetch)
