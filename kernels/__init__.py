"""Triton kernels of radixrt (installed as `radixrt.kernels`); pure-torch references in `.reference`.

KV layout and the metadata each kernel takes: docs/kernels.md.
"""

from .activation import silu_and_mul, silu_and_mul_quant_fp8
from .cascade_attention import CascadeTile, cascade_decode_attention, choose_num_prefix_splits
from .decode_attention import choose_num_kv_splits, decode_attention
from .extend_attention import extend_attention
from .fp8_quant import per_token_quant_fp8
from .gemm_fp8 import Fp8GemmConfig, fp8_gemm
from .gemv import SkinnyConfig, SkinnyWorkspace, skinny_linear, skinny_linear_supported
from .gemv_fp8_int import Fp8IntConfig, fp8_skinny_linear
from .norm import rms_norm, rms_norm_quant_fp8
from .rotary import apply_rotary, build_rope_cache, rope_store_kv
from .store_kv import store_kv

__all__ = [
    "CascadeTile",
    "Fp8GemmConfig",
    "Fp8IntConfig",
    "SkinnyConfig",
    "SkinnyWorkspace",
    "apply_rotary",
    "build_rope_cache",
    "cascade_decode_attention",
    "choose_num_kv_splits",
    "choose_num_prefix_splits",
    "decode_attention",
    "extend_attention",
    "fp8_gemm",
    "fp8_skinny_linear",
    "per_token_quant_fp8",
    "rms_norm",
    "rms_norm_quant_fp8",
    "rope_store_kv",
    "silu_and_mul",
    "silu_and_mul_quant_fp8",
    "skinny_linear",
    "skinny_linear_supported",
    "store_kv",
]
