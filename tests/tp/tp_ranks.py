"""What each tensor-parallel rank (or the --tp-size 1 reference) computes in tests/tp: the logits
of a prefill pass and a few greedy tokens of a batched, chunked generation, per model directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from radixrt.config import ServerArgs
from radixrt.worker.model_runner import ModelRunner
from tests.worker.driver import GreedyDriver, single_request_batch

CONFIG_DIR = Path(__file__).resolve().parents[2] / "bench" / "configs" / "tiny-tp"
PROMPT = [5, 77, 300, 12, 999, 4, 1000, 641, 2, 9, 33]
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [27, 18, 28, 18, 28]]
MAX_NEW = 6


def tiny_model_dir(out: Path, num_kv_heads: int, tie: bool) -> Path:
    """bench/configs/tiny-tp (hidden 256, 4 heads, 2 layers, vocab 1001) with `num_kv_heads` KV
    heads and tied or untied embeddings, written to `out` (config.json only)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((CONFIG_DIR / "config.json").read_text())
    cfg.update(num_key_value_heads=num_kv_heads, tie_word_embeddings=tie)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def server_args(load_format: str, tp_size: int) -> ServerArgs:
    return ServerArgs(device="cpu", load_format=load_format, page_size=4, max_total_tokens=512,
                      max_running_requests=4, tp_size=tp_size, cpu_threads=1, random_seed=3)


def compute(model_dir: Path, load_format: str, tp=None) -> dict[str, object]:
    """{"logits": [1, V] float32 of PROMPT's last token, "tokens": greedy tokens of PROMPTS
    (chunks of 4, so EXTEND, MIXED and DECODE passes all run), "num_pages", "kv_heads"}."""
    runner = ModelRunner(server_args(load_format, 1 if tp is None else tp.size), model_dir, tp)
    logits = runner.forward_logits(single_request_batch(PROMPT, page_size=4)).clone()
    runner.req_to_page.zero_()
    tokens = GreedyDriver(runner, chunk=4).generate(PROMPTS, MAX_NEW)
    return {"logits": logits, "tokens": tokens, "num_pages": runner.pool.num_pages,
            "kv_heads": runner.config.num_kv_heads}


def write_safetensors(model_dir: Path) -> None:
    """Save --tp-size 1 dummy weights under their Hugging Face names (q/k/v, gate/up split) with
    random q/k/v biases, as a checkpoint that the sharded loader must slice."""
    from safetensors.torch import save_file

    from radixrt.models.loader import load_model
    from radixrt.parallel.layout import split_fused

    model, cfg = load_model(model_dir, torch.float32, "cpu", "dummy", seed=11)
    gen = torch.Generator().manual_seed(5)
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        for hf, t in split_fused(name, p.detach(), cfg):
            out[hf] = (torch.randn(t.shape, generator=gen) * 0.1 if hf.endswith("bias")
                       else t).contiguous().clone()
    save_file(out, str(model_dir / "model.safetensors"))


def rank_main(rank: int, store: str, cases: list[tuple[str, str]], out_dir: str) -> None:
    """torch.multiprocessing.spawn target: join a 2-rank gloo group, compute every (model dir,
    load format) case, and (rank 0) save the results to out_dir/tp2.pt."""
    import torch.distributed as dist

    from radixrt.parallel.group import destroy_tp_group, init_tp_group

    torch.set_num_threads(1)
    tp = init_tp_group(rank, 2, store, "cpu")
    try:
        results = [compute(Path(d), fmt, tp) for d, fmt in cases]
        torch.save(results, Path(out_dir) / ("tp2.pt" if rank == 0 else "tp2_rank1.pt"))
        dist.barrier()  # neither rank leaves while the other still talks to it
    finally:
        # a gloo group left to the interpreter's exit can abort the process (a joinable thread
        # destroyed: "terminate called without an active exception", seen once in the full suite)
        destroy_tp_group()


def copy_config(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "config.json", dst / "config.json")
    return dst
