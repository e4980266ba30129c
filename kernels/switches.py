"""The kernels package's environment switches, read here and nowhere else in kernels/.

radixrt's own settings are read once per process by radixrt/config.py's `Env`; kernels/ is also
imported without radixrt (bench/kernels_import.py, the device machines), so its switches live in this
module. Each function reads its variable when called: a test or a lab can flip a route within one
process, and a CUDA graph keeps the route its capture took.

Values: "0" / "false" / "off" (any case) switch a flag off, any other non-empty value on, unset or empty
leaves the default.
"""

from __future__ import annotations

import os

_OFF = ("0", "false", "off")


def flag(name: str, default: bool) -> bool:
    """Environment variable `name` as an on / off switch (module docstring), `default` when unset."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in _OFF


def file_path(name: str) -> str | None:
    """Environment variable `name` as a file path, None when unset or empty."""
    return os.environ.get(name) or None


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, Triton's own switch, which
    must be set before the kernels are decorated: the CPU tests' conftest sets it)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pdl_enabled() -> bool:
    """RADIXRT_PDL (default on): programmatic dependent launch on Hopper (kernels/pdl.py)."""
    return flag("RADIXRT_PDL", True)


def extend_ws() -> bool:
    """RADIXRT_EXTEND_WS (default on): long extend passes through the Gluon kernel (extend_attention)."""
    return flag("RADIXRT_EXTEND_WS", True)


def decode_ws() -> bool:
    """RADIXRT_DECODE_WS (default on): long one-split FP8-pool decodes through the Gluon kernel."""
    return flag("RADIXRT_DECODE_WS", True)


def cascade_ws() -> bool:
    """RADIXRT_CASCADE_WS (default off): cascade's prefix stage through the Gluon kernel."""
    return flag("RADIXRT_CASCADE_WS", False)


def attn_config_file() -> str | None:
    """RADIXRT_ATTN_CONFIG: a file of attention launch-config overrides (attention_configs.py)."""
    return file_path("RADIXRT_ATTN_CONFIG")


def gemm_ws_tuned_file() -> str | None:
    """RADIXRT_GEMM_WS_TUNED: a file of decode-batch GEMM configs (gemm_ws.py's TUNED entries)."""
    return file_path("RADIXRT_GEMM_WS_TUNED")
