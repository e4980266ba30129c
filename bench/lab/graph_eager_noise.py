"""How far a bf16 decode step's logits move between paths, measured against a float32 reference.

The GPU tests of the Gluon routes (tests/worker/test_gpu_model.py: the decode-batch GEMM, the FP8-KV
decode kernel) compare a graph replay through the Gluon kernel with an eager pass through the
Triton / cuBLAS kernels. This lab shows whether their gap is the bf16 noise every path has: for
each case it builds the test's tiny model, runs one 64-request decode step (fixed token ids) through

  - a bf16 runner with the route on (graph replay, and eager),
  - a bf16 runner with the route off (graph replay, and eager),
  - a float32 runner (eager; KV in float32), the reference,

and prints each path's max / mean absolute error against the reference, the argmax agreement and
the logits' scale, and the test's own comparison (route-on graph against route-off eager).

Usage (a CUDA Hopper machine): python3 bench/lab/graph_eager_noise.py [--cases gemm,fp8kv] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from radixrt.config import ServerArgs  # noqa: E402
from radixrt.worker.model_runner import ModelRunner  # noqa: E402
from tests.models.tiny import save_tiny_model  # noqa: E402
from tests.worker.driver import GreedyDriver  # noqa: E402

_MODEL = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4)
CASES = {
    # env switch, value for "on", value for "off", model overrides, prompt length, runner overrides
    "gemm": ("RADIXRT_GEMM_WS", "all", "0", dict(_MODEL, intermediate_size=512), 100, {}),
    "fp8kv": ("RADIXRT_DECODE_WS", None, "0",
              dict(_MODEL, intermediate_size=256, max_position_embeddings=8192),
              4100, dict(kv_cache_dtype="fp8_e4m3")),
}
BS = int(os.environ.get("NOISE_BS", "64"))
DEVICE = "cuda"


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _step_logits(model_dir: Path, dtype: str, prompt_len: int, runner_kw: dict, env: str, on: str | None,
                 off: str) -> dict[str, torch.Tensor]:
    """Logits [BS, V] float32 of one decode step: {"graph": ..., "eager": ...} (graph only for bf16)."""
    _set(env, on)
    kw = dict(device=DEVICE, dtype=dtype, page_size=16, max_total_tokens=BS * (prompt_len + 60) + 1024,
              max_running_requests=BS, cuda_graph_max_bs=BS, disable_cascade_attention=True)
    if dtype == "float32" or DEVICE == "cpu":
        kw["disable_cuda_graph"] = True
        runner_kw = {k: v for k, v in runner_kw.items() if k != "kv_cache_dtype"}
    runner = ModelRunner(ServerArgs(**{**kw, **runner_kw}), model_dir)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (prompt_len,), generator=gen).tolist() for _ in range(BS)]
    driver = GreedyDriver(runner, chunk=2048)
    driver.generate(prompts, 1)
    ids = [[(r * 7) % 300] for r in range(BS)]
    step = driver._batch(list(range(BS)), ids, [prompt_len] * BS, [], 16, 0.0, None, [1] * BS)
    out = {}
    if runner.graphs is not None or DEVICE == "cpu":
        out["graph"] = runner.forward_logits(step).clone()
        assert runner.last_path == ("graph" if DEVICE == "cuda" else "eager"), runner.last_path
    graphs, runner.graphs = runner.graphs, None
    _set(env, off)
    out["eager"] = runner.forward_logits(step).clone()
    runner.graphs = graphs
    del runner
    torch.cuda.empty_cache()
    return out


def _stats(x: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (x - ref).abs()
    return {"max_abs": round(d.max().item(), 4), "mean_abs": round(d.mean().item(), 5),
            "argmax_agree": round((x.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4)}


def run_case(name: str) -> dict:
    env, on, off, model_kw, prompt_len, runner_kw = CASES[name]
    with tempfile.TemporaryDirectory() as d:
        save_tiny_model("llama", Path(d), **model_kw)
        ref = _step_logits(Path(d), "float32", prompt_len, runner_kw, env, off, off)["eager"]
        on_paths = _step_logits(Path(d), "bfloat16", prompt_len, runner_kw, env, on, off)
        off_paths = _step_logits(Path(d), "bfloat16", prompt_len, runner_kw, env, off, off)
    rows = {"route on, graph": on_paths["graph"], "route on runner, eager (route off)": on_paths["eager"],
            "route off, graph": off_paths["graph"], "route off, eager": off_paths["eager"]}
    res = {"case": name, "logits_abs_max": round(ref.abs().max().item(), 3),
           "logits_abs_mean": round(ref.abs().mean().item(), 4),
           "vs_fp32": {k: _stats(v, ref) for k, v in rows.items()},
           "test_pair (on graph vs off eager)": _stats(on_paths["graph"], on_paths["eager"]),
           "baseline_pair (off graph vs off eager)": _stats(off_paths["graph"], off_paths["eager"])}
    print(f"--- {name}: reference |logits| max {res['logits_abs_max']}, mean {res['logits_abs_mean']}")
    for k, v in res["vs_fp32"].items():
        print(f"  {k:38s} vs fp32: {v}")
    print(f"  test pair (on graph vs off eager):       {res['test_pair (on graph vs off eager)']}")
    print(f"  baseline pair (off graph vs off eager):  {res['baseline_pair (off graph vs off eager)']}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="gemm,fp8kv")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the harness (no graphs)")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    results = [run_case(c) for c in a.cases.split(",")]
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
