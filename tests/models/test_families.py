"""Each supported family (Llama, Llama-3 rope scaling, Qwen2 qkv bias, Qwen3 q/k norm) against
Hugging Face transformers on a tiny random checkpoint: logits and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import save_tiny_model
from tests.worker.driver import GreedyDriver, single_request_batch

FAMILIES = ["llama", "llama3", "qwen2", "qwen3"]
pytestmark = pytest.mark.usefixtures("one_thread")


def _runner(model_dir: Path, page_size: int = 4, dtype: str = "float32") -> ModelRunner:
    args = ServerArgs(device="cpu", dtype=dtype, page_size=page_size, max_total_tokens=1024,
                      max_running_requests=4)
    return ModelRunner(args, model_dir)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_hf(family: str, tmp_path: Path) -> None:
    hf = save_tiny_model(family, tmp_path)
    runner = _runner(tmp_path)
    ids = torch.randint(0, 300, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = runner.forward_logits(single_request_batch(ids))[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1].float()
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)

    prompts = [ids[:5], ids[:40], ids[:97]]
    got = GreedyDriver(_runner(tmp_path), chunk=16).generate(prompts, 12)
    for p, g in zip(prompts, got, strict=True):
        t = torch.tensor([p])
        want = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert g == want


BF16_ATOL = 0.1  # bf16 weights/activations vs the fp32 reference; logits here span about [-2.5, 2.5]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_logits_close_to_fp32_reference(family: str, tmp_path: Path) -> None:
    hf = save_tiny_model(family, tmp_path)
    ids = torch.randint(0, 300, (120,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = _runner(tmp_path, dtype="bfloat16")
    ours = runner.forward_logits(single_request_batch(ids[:-1]))[0]
    step = runner.forward_logits(single_request_batch(ids[-1:], start=len(ids) - 1))[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -2:].float()
    torch.testing.assert_close(ours, ref[0], atol=BF16_ATOL, rtol=0)
    torch.testing.assert_close(step, ref[1], atol=BF16_ATOL, rtol=0)


def test_compute_logits_into_a_buffer(tmp_path: Path) -> None:
    """compute_logits(out=buf) (what CUDA graphs use) fills buf with the same float32 logits."""
    save_tiny_model("llama", tmp_path)
    model = _runner(tmp_path, dtype="bfloat16").model
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(4)).bfloat16()
    buf = torch.full((3, model.config.vocab_size), float("nan"))
    with torch.no_grad():
        got = model.compute_logits(hidden, out=buf)
        want = model.compute_logits(hidden)
    assert got is buf and want.dtype == torch.float32
    torch.testing.assert_close(buf, want, atol=0, rtol=0)
