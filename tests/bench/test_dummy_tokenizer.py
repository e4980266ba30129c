"""bench/dummy_tokenizer.py: the stand-in tokenizer loads offline, covers the vocabulary, and a
dummy-weight server starts on the directory it makes (completions with token ids, and chat)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from bench.dummy_tokenizer import make_dummy_model_dir, vocab_words
from bench.server_proc import start_server

ROOT = Path(__file__).resolve().parents[2]
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 600,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1,
        "eos_token_id": [2, 5], "tie_word_embeddings": True, "torch_dtype": "float32"}


def _tiny_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY))
    return make_dummy_model_dir(src, tmp_path / "model")


def test_vocab_layout_has_every_byte_and_the_special_ids() -> None:
    words, special, all_special = vocab_words({"vocab_size": 300, "bos_token_id": 1, "eos_token_id": [2, 0]})
    assert len(words) == len(set(words)) == 300
    assert words[2] == "</s>" and words[0] == "</s1>" and words[1] == "<s>" and special == {"eos": "</s>",
                                                                                            "bos": "<s>"}
    assert sorted(all_special) == ["</s1>", "</s>", "<s>"] and words[299] == "<t299>"
    with pytest.raises(ValueError):
        vocab_words({"vocab_size": 200})


def test_round_trip_and_every_id_decodes(tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(_tiny_dir(tmp_path)))
    assert len(tok) == 600 and tok.eos_token_id == 2 and tok.bos_token_id == 1
    text = "user: Hi there, héllo ✓\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids and max(ids) < 600 and tok.decode(ids) == text
    assert tok.decode([400, 401]) == "<t400><t401>"
    assert tok.decode([400, 2, 5, 401], skip_special_tokens=True) == "<t400><t401>"
    for i in range(600):
        assert isinstance(tok.decode([i]), str)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "user: Hi\nassistant:"


@pytest.mark.parametrize("name", ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct"])
def test_benchmark_configs_load_with_their_vocab_size(tmp_path: Path, name: str) -> None:
    # transformers rebuilds a qwen2 tokenizer from the vocabulary (Qwen2Tokenizer): same ids either way
    d = make_dummy_model_dir(ROOT / "bench" / "configs" / name, tmp_path / name)
    cfg = json.loads((d / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(d))
    assert len(tok) == cfg["vocab_size"]
    eos = cfg["eos_token_id"]
    assert tok.eos_token_id == (eos[0] if isinstance(eos, list) else eos)
    ids = tok.encode("Hello, world", add_special_tokens=False)
    assert ids and tok.decode(ids) == "Hello, world"
    assert tok.decode([cfg["vocab_size"] - 1]) == f"<t{cfg['vocab_size'] - 1}>"


def test_dummy_server_starts_and_serves(tmp_path: Path) -> None:
    server = start_server(_tiny_dir(tmp_path), tmp_path, "--load-format", "dummy", timeout_s=120)
    try:
        url = server.base_url
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": model, "prompt": list(range(100, 140)), "max_tokens": 6, "ignore_eos": True,
            "return_token_ids": True}).json()
        choice = r["choices"][0]
        assert len(choice["token_ids"]) == 6 and r["usage"]["prompt_tokens"] == 40
        assert choice["text"]  # the detokenizer turned the sampled ids into text
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
