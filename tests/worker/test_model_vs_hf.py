"""Our model + paged KV + torch attention + sampler vs Hugging Face `generate`, token for token.

Both run greedy in float32 from the same safetensors directory (the embedded SmolLM2-135M). Ours
runs all prompts batched together through ModelRunner.forward with chunked prefill (EXTEND,
MIXED and DECODE passes, prefixes ending inside pages).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.worker.model_runner import ModelRunner
from tests.worker.driver import GreedyDriver

MAX_NEW = 24
TEXTS = [
    "Hi",
    "The capital of France is",
    "Write a short poem about the sea and the sky, please. " * 3,
    "Explain how a transformer language model works, step by step. " * 11,
    "Once upon a time, in a land far away, there lived a " * 24,
]


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = [tok(t)["input_ids"] for t in TEXTS]
    out[0] = out[0] + tok("!!")["input_ids"]  # 3 tokens
    return out


@pytest.fixture(scope="module")
def hf_tokens(model_dir: Path, prompts: list[list[int]], one_thread: None) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out


@pytest.mark.parametrize("page_size,chunk", [(16, 128), (1, 4096)])
def test_greedy_matches_hf_generate(model_dir: Path, prompts: list[list[int]],
                                    hf_tokens: list[list[int]], one_thread: None,
                                    page_size: int, chunk: int) -> None:
    lens = [len(p) for p in prompts]
    assert min(lens) <= 3 and max(lens) >= 250, lens
    args = ServerArgs(device="cpu", dtype="float32", page_size=page_size, max_total_tokens=2048,
                      context_length=1024, max_running_requests=8)
    runner = ModelRunner(args, model_dir)
    ours = GreedyDriver(runner, chunk=chunk).generate(prompts, MAX_NEW)
    for i, (a, b) in enumerate(zip(ours, hf_tokens, strict=True)):
        assert len(b) == MAX_NEW
        assert a == b, f"prompt {i} ({lens[i]} tokens): ours {a} != hf {b}"
