"""What the worker builds from its ServerArgs: model dtype, attention backend, CUDA-graph settings.

Pure decisions and constructors, shared by ModelRunner (the real pool and backend) and the memory
profile (a throwaway pool and backend of the same kind, memory_profile.py).
"""

from __future__ import annotations

import torch

from radixrt.attention.base import AttentionBackend, KVPool
from radixrt.config import ServerArgs

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(args: ServerArgs, device: str) -> torch.dtype:
    """--dtype, with auto = bf16 on cuda and fp32 on cpu."""
    if args.dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[args.dtype]


def resolve_kv_dtype(args: ServerArgs, model_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype: auto = the model dtype; fp8_e4m3 = torch.float8_e4m3fn (triton backend only:
    its kernels apply the per-layer scales; the torch reference backend has no FP8 path).

    Raises:
        ValueError: fp8_e4m3 with the torch attention backend.
    """
    if args.kv_cache_dtype == "auto":
        return model_dtype
    if args.resolved_attention_backend() != "triton":
        raise ValueError("--kv-cache-dtype fp8_e4m3 needs --attention-backend triton")
    return torch.float8_e4m3fn


def make_backend(name: str, pool: KVPool, num_q_heads: int, max_batch_size: int,
                 q_dtype: torch.dtype | None = None) -> AttentionBackend:
    """Attention backend by name over `pool`: "sdpa" (CPU default: torch's fused SDPA kernels),
    "torch" (the plain reference, the tests' oracle) or "triton" (CUDA).

    max_batch_size: largest decode batch the triton backend preallocates workspace for (graph-safe).
    q_dtype: the model dtype of q / k / v (the pool's dtype when None; needed for an FP8 pool).

    Raises:
        RuntimeError: the triton backend module is not available, or an unknown name.
    """
    if name == "sdpa":
        from radixrt.worker.attention_sdpa import SdpaAttnBackend

        return SdpaAttnBackend(pool)
    if name == "torch":
        from radixrt.worker.attention_torch import TorchAttnBackend

        return TorchAttnBackend(pool)
    if name == "triton":
        try:
            from radixrt.worker.attention_triton import TritonAttnBackend
        except ImportError as e:
            raise RuntimeError(f"attention backend 'triton' unavailable ({e}); "
                               "use --attention-backend torch") from None
        return TritonAttnBackend(pool, num_q_heads=num_q_heads, max_batch_size=max_batch_size,
                                 q_dtype=q_dtype)
    raise RuntimeError(f"unknown attention backend {name!r}")


def backend_for(args: ServerArgs, pool: KVPool, num_q_heads: int) -> AttentionBackend:
    """The --attention-backend over `pool`, with workspace for the largest batch the server runs
    (--max-running-requests, or --cuda-graph-max-bs when larger)."""
    return make_backend(args.resolved_attention_backend(), pool, num_q_heads,
                        max(args.max_running_requests, args.cuda_graph_max_bs),
                        q_dtype=resolve_dtype(args, args.resolved_device()))


def graph_max_bs(args: ServerArgs) -> int:
    """Largest decode batch served by a CUDA graph."""
    return min(args.cuda_graph_max_bs, args.max_running_requests)


def use_cuda_graphs(args: ServerArgs, device: torch.device) -> bool:
    """Graphs need CUDA and a backend without host syncs in forward (triton)."""
    return (device.type == "cuda" and not args.disable_cuda_graph
            and args.resolved_attention_backend() == "triton" and graph_max_bs(args) >= 1)
