"""A/B in one process: the MLP's gate_up linear with SiLU-and-mul in the GEMM's epilogue
(`Linear.silu_and_mul` -> `cpu_native.linear_silu`, kernels/cpu_native_gemm.h, 2026-12-03) against the
native linear followed by the native SiLU-and-mul call, on the pass of bench/lab/cpu_extend_profile.py
(`--extend` new tokens over a cached `--prefix`-token prefix, default model, float32).

    .venv/bin/python bench/lab/cpu_fused_silu_ab.py [--prefix 1800] [--extend 32] [--rounds 6] [--reps 9]

B patches `Linear.silu_and_mul` to `ops.silu_and_mul(self(x))` (what MLP.forward computed before).
Alternates A and B `--rounds` times (order flipped every round), each the median of `--reps` passes;
prints the medians per round and over the rounds, and whether A's and B's sampled tokens agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "lab"))

from cpu_extend_profile import ab_args, alternate_ab, build  # noqa: E402


def main() -> None:
    args = ab_args()
    from radixrt.models import ops
    from radixrt.models.linear import Linear

    eng, runner, batch = build(args.prefix, args.extend, args.threads)
    from radixrt.models import native_layers

    # both sides over the module path, where these ops are separate calls (models/native_layers.py,
    # which serves such passes since 2026-12-03, calls the native ops directly)
    native_layers.layer_calls = lambda *a: False
    fused = Linear.silu_and_mul

    def unfused(self, x):  # noqa: ANN001, ANN202
        return ops.silu_and_mul(self(x))

    def use(side: str) -> None:
        Linear.silu_and_mul = fused if side == "A" else unfused

    a, b = alternate_ab(runner, batch, use, args.rounds, args.reps, ("fused", "linear + silu_and_mul"))
    print(f"{args.extend}-token extend over {args.prefix} cached, median of rounds: A {a:.2f} ms, "
          f"B {b:.2f} ms, A/B {a / b:.3f}")


if __name__ == "__main__":
    main()
