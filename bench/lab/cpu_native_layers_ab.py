"""A/B in one process: the float32 CPU layer loop as direct native calls (radixrt/models/native_layers.py,
2026-12-03) against the module path, on the pass of bench/lab/cpu_extend_profile.py (`--extend` new
tokens over a cached `--prefix`-token prefix, default model, float32).

    .venv/bin/python bench/lab/cpu_native_layers_ab.py [--prefix 1800] [--extend 32] [--rounds 6] [--reps 9]

B patches `native_layers.layer_calls` to answer False (every layer through its modules). Alternates A
and B `--rounds` times (order flipped every round), each the median of `--reps` passes; prints the
medians per round and over the rounds, and whether A's and B's sampled tokens agree.
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
    from radixrt.models import native_layers

    eng, runner, batch = build(args.prefix, args.extend, args.threads)
    native = native_layers.layer_calls

    def use(side: str) -> None:
        native_layers.layer_calls = native if side == "A" else (lambda *a: False)

    a, b = alternate_ab(runner, batch, use, args.rounds, args.reps, ("native calls", "modules"))
    print(f"{args.extend}-token extend over {args.prefix} cached, median of rounds: A {a:.2f} ms, "
          f"B {b:.2f} ms, A/B {a / b:.3f}")


if __name__ == "__main__":
    main()
