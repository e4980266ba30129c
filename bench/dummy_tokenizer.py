"""A model directory for `--load-format dummy` that the server can start on with no network.

`radixrt launch-server --load-format dummy` builds random weights from config.json alone, but the
tokenizer process still loads a tokenizer from the model directory. `make_dummy_model_dir` copies
config.json and writes a stand-in tokenizer (the `tokenizers` library, loaded offline by
`transformers.AutoTokenizer`):

- a byte-level BPE with no merges and exactly `vocab_size` entries: the 256 byte symbols (the
  GPT-2 byte-to-unicode table, on the lowest ids that are not special), BOS "<s>", EOS "</s>"
  (or "</s{k}>" for the k-th of several EOS ids), and every other id i the word "<t{i}>";
- byte-level pre-tokenizer and decoder, so any text encodes (one id per byte) and every id in
  [0, vocab_size) decodes ("<t17><t4>..."), so the detokenizer can stream any output;
- tokenizer_config.json with BOS/EOS (also as pad/unk), model_max_length and a trivial chat
  template ("role: content" lines), so /v1/chat/completions works too.

The byte-level layout matters: transformers 5 rebuilds some model types' tokenizers from the
vocabulary alone (Qwen2 gets its own byte-level BPE whatever tokenizer.json says), and this
vocabulary means the same thing under either loader.

    python bench/dummy_tokenizer.py bench/configs/qwen2.5-7b-instruct /tmp/qwen-dummy
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of bytes used by byte-level BPE (GPT-2's table), in byte order."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def vocab_words(config: dict) -> tuple[list[str], dict[str, str], list[str]]:
    """(token string of each id, special tokens by role: bos/eos, every special token), from a HF
    config dict (all EOS ids are special tokens: skipped when decoding with skip_special_tokens).

    Raises:
        ValueError: vocab_size too small for the byte symbols and special tokens.
    """
    n = int(config["vocab_size"])
    eos_ids = list(dict.fromkeys(i for i in _ids(config.get("eos_token_id")) if 0 <= i < n))
    bos_ids = [i for i in _ids(config.get("bos_token_id")) if 0 <= i < n and i not in eos_ids][:1]
    if n < 256 + len(eos_ids) + len(bos_ids):
        raise ValueError(f"vocab_size {n} is too small for a byte-level dummy tokenizer")
    words: list[str] = [f"<t{i}>" for i in range(n)]
    special: dict[str, str] = {}
    for k, i in enumerate(eos_ids):
        words[i] = "</s>" if k == 0 else f"</s{k}>"
    if eos_ids:
        special["eos"] = words[eos_ids[0]]
    if bos_ids:
        words[bos_ids[0]] = special["bos"] = "<s>"
    taken = set(eos_ids) | set(bos_ids)
    free = (i for i in range(n) if i not in taken)
    for sym in byte_symbols():
        words[next(free)] = sym
    return words, special, [words[i] for i in [*bos_ids, *eos_ids]]


def make_dummy_model_dir(config_dir: str | Path, out_dir: str | Path) -> Path:
    """Copy config_dir/config.json to out_dir and write a tokenizer for it; returns out_dir."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    config_dir, out_dir = Path(config_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((config_dir / "config.json").read_text())
    shutil.copyfile(config_dir / "config.json", out_dir / "config.json")
    words, special, special_words = vocab_words(config)
    tok = Tokenizer(models.BPE(vocab={w: i for i, w in enumerate(words)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_words])
    tok.save(str(out_dir / "tokenizer.json"))
    eos = special.get("eos", words[0])
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(config.get("max_position_embeddings") or 4096),
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "eos_token": eos, "pad_token": eos, "unk_token": eos,
        **({"bos_token": special["bos"]} if "bos" in special else {}),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config_dir", help="directory holding config.json")
    p.add_argument("out_dir")
    ns = p.parse_args(argv)
    print(make_dummy_model_dir(ns.config_dir, ns.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
