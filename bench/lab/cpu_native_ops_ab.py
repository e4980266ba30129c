"""A/B in one process: the native rotary, SiLU-and-mul, K/V store and in-place attention rows
(kernels/cpu_native_ops.h, 2026-12-03) against the torch ops they replace, on the pass of
bench/lab/cpu_extend_profile.py (`--extend` new tokens over a cached `--prefix`-token prefix,
default 32 over 1,800, default model, float32).

    .venv/bin/python bench/lab/cpu_native_ops_ab.py [--prefix 1800] [--extend 32] [--rounds 6] [--reps 9]

B restores the torch paths by patching: cpu_native.takes_rotary and store_kv answer False,
ops.silu_and_mul is the chunk / silu / mul of before, and DecodePlan.build marks no plan
`all_rows` (so q is gathered and o scattered as before). Alternates A and B `--rounds` times, each
the median of `--reps` passes; prints the medians per round and over the rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "lab"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cpu_extend_profile import ab_args, alternate_ab, build  # noqa: E402


def main() -> None:
    args = ab_args()
    from radixrt.models import ops
    from radixrt.worker import cpu_native

    eng, runner, batch = build(args.prefix, args.extend, args.threads)
    from radixrt.models import native_layers

    # both sides over the module path, where these ops are separate calls (models/native_layers.py,
    # which serves such passes since 2026-12-03, calls the native ops directly)
    native_layers.layer_calls = lambda *a: False
    native = {"takes_rotary": cpu_native.takes_rotary, "store_kv": cpu_native.store_kv,
              "silu_and_mul": ops.silu_and_mul, "build": cpu_native.DecodePlan.build}

    def torch_silu(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def build_no_all_rows(*a, **k):  # noqa: ANN002, ANN003, ANN202
        plan = native["build"](*a, **k)
        plan.all_rows = False
        return plan

    def use(side: str) -> None:
        if side == "A":
            cpu_native.takes_rotary, cpu_native.store_kv = native["takes_rotary"], native["store_kv"]
            ops.silu_and_mul, cpu_native.DecodePlan.build = native["silu_and_mul"], native["build"]
        else:
            cpu_native.takes_rotary = lambda *a: False
            cpu_native.store_kv = lambda *a: False
            ops.silu_and_mul, cpu_native.DecodePlan.build = torch_silu, staticmethod(build_no_all_rows)

    a, b = alternate_ab(runner, batch, use, args.rounds, args.reps, ("native ops", "torch ops"),
                        check_tokens=False)
    print(f"32-token extend over 1,800 cached, median of rounds: A {a:.2f} ms, B {b:.2f} ms, A/B {a / b:.3f}")


if __name__ == "__main__":
    main()
