"""Where the time goes in ONE CPU pass that extends 32 new tokens over a cached 1,800-token prefix
(the "cached TTFT" case of issue 20), default model (SmolLM2-135M-Instruct, float32), 2 torch threads.

    .venv/bin/python bench/lab/cpu_extend_profile.py [--prefix 1800] [--extend 32] [--reps 15]

An in-process `radixrt.Engine` (the server's scheduler + ModelRunner) prefills the prefix once (it is
then cached in the radix tree), then runs prefix + `extend` new tokens with max_new_tokens=1; the
ForwardBatch of that pass (prefix_len = 1,800, extend_len = 32) is captured at `runner.launch` and
replayed on the runner directly (idempotent: same slots, same page-table writes, same COW copy).

Prints:
  1. plain timing (perf_counter, no instrumentation): the whole `runner.forward(batch)` and its steps
     (stage, backend.prepare, model forward, LM head, sampling), median of --reps after warm-up, as
     served (the layers as direct native calls where models/native_layers.py takes the pass);
  2. (2 and 3 over the module path: native_layers patched off) groups by lightweight perf_counter
     wrappers (monkeypatched here, nothing in radixrt changed):
     linears by kind, the native attention call, the K/V store, rotary, norms,
     activation, embedding, LM head, sampling, plan, staging, and the rest of the model forward
     ("Python glue": module calls, split/view/reshape, wrapper overhead);
  3. torch.profiler (CPU, record_shapes): per aten op self-CPU per pass, and per group (same labels as
     record_function ranges) inclusive CPU per pass;
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# ----------------------------------------------------------------------------- instrumentation
MODE = "off"  # "off" | "timer" | "prof"
ACC: dict[str, float] = defaultdict(float)  # seconds per label, since the last reset
CNT: dict[str, int] = defaultdict(int)


def reset() -> None:
    ACC.clear()
    CNT.clear()


class _Span:
    __slots__ = ("name", "t0", "rf")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self):
        if MODE == "prof":
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        dt = time.perf_counter() - self.t0
        if MODE == "prof":
            self.rf.__exit__(*exc)
        ACC[self.name] += dt
        CNT[self.name] += 1
        return False


def span(name: str):
    return _Span(name) if MODE != "off" else nullcontext()


def wrap(fn, name):
    def w(*a, **k):
        if MODE == "off":
            return fn(*a, **k)
        with _Span(name):
            return fn(*a, **k)

    w.__wrapped__ = fn
    return w


_PATCHES: list[tuple[object, str, object]] = []


def patch(obj, attr, new) -> None:
    _PATCHES.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, new)


def unpatch() -> None:
    while _PATCHES:
        obj, attr, old = _PATCHES.pop()
        setattr(obj, attr, old)


def install(runner) -> None:
    """Wrap the pass's pieces (module attributes looked up at call time) with timing spans."""
    from radixrt.models import linear as lin_mod
    from radixrt.models import llama, ops
    from radixrt.worker import cpu_native
    from radixrt.worker import model_runner as mr

    model, backend = runner.model, runner.backend
    kind = {}
    for name, m in model.named_modules():
        if isinstance(m, lin_mod.Linear):
            kind[id(m)] = "linear " + name.rpartition(".")[2]
    orig_linear = lin_mod.Linear.forward

    def linear_fwd(self, x):
        if MODE == "off":
            return orig_linear(self, x)
        with _Span(kind.get(id(self), "linear ?")):
            return orig_linear(self, x)

    patch(lin_mod.Linear, "forward", linear_fwd)
    patch(ops, "rms_norm", wrap(ops.rms_norm, "rmsnorm (native)"))
    patch(ops, "apply_rotary", wrap(ops.apply_rotary, "rotary"))
    patch(ops, "silu_and_mul", wrap(ops.silu_and_mul, "silu_and_mul"))
    emb = model.model.embed_tokens
    patch(emb, "forward", wrap(emb.forward, "embedding"))
    patch(llama.Attention, "forward", wrap(llama.Attention.forward, "[Attention.forward]"))
    patch(llama.MLP, "forward", wrap(llama.MLP.forward, "[MLP.forward]"))
    patch(llama.DecoderLayer, "forward", wrap(llama.DecoderLayer.forward, "[DecoderLayer.forward]"))
    patch(model, "forward", wrap(model.forward, "[model forward]"))
    patch(model, "compute_logits", wrap(model.compute_logits, "[compute_logits]"))
    patch(backend, "prepare", wrap(backend.prepare, "attn plan (prepare)"))
    patch(runner, "stage", wrap(runner.stage, "stage (upload, page table, COW)"))
    patch(mr, "sample_outputs", wrap(mr.sample_outputs, "sampling"))

    patch(cpu_native, "decode_attention", wrap(cpu_native.decode_attention, "attn native call"))
    patch(cpu_native, "store_kv", wrap(cpu_native.store_kv, "K/V store (native)"))
    patch(backend, "forward", wrap(backend.forward, "[backend.forward]"))


# ----------------------------------------------------------------------------- set-up
def ab_args() -> argparse.Namespace:
    """The flags of the same-process A/B scripts: --prefix, --extend (the pass that `build` captures),
    --rounds, --reps (alternate_ab), --threads."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1800)
    ap.add_argument("--extend", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


def alternate_ab(runner, batch, use, rounds: int, reps: int, names: tuple[str, str],
                 check_tokens: bool = True) -> tuple[float, float]:
    """Same-process A/B of `runner.forward(batch)`: `use("A")` / `use("B")` switch the code paths.
    Optionally prints whether the two sides sample the same tokens; then alternates the sides `rounds`
    times (order flipped every round), each 2 warm passes and the median of `reps` timed ones, printing
    each round. Leaves side A in use. Returns the medians over the rounds (ms) of A and B."""
    def timed(n: int) -> float:
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            runner.forward(batch)
            xs.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(xs)

    if check_tokens:
        outs = {}
        for side in ("A", "B"):
            use(side)
            outs[side] = runner.forward(batch).next_token_ids
        same = list(outs["A"]) == list(outs["B"])
        print(f"sampled tokens A {outs['A']} B {outs['B']}: {'same' if same else 'DIFFERENT'}")
    res: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            use(side)
            timed(2)  # warm
            res[side].append(timed(reps))
        print(f"round {r}: A ({names[0]}) {res['A'][-1]:.2f} ms, B ({names[1]}) {res['B'][-1]:.2f} ms",
              flush=True)
    use("A")
    return statistics.median(res["A"]), statistics.median(res["B"])


def build(prefix: int, extend: int, threads: int):
    torch.set_num_threads(threads)
    from radixrt import Engine

    t0 = time.perf_counter()
    eng = Engine(max_total_tokens=16384, device="cpu", dtype="float32", cpu_threads=threads)
    print(
        f"engine up in {time.perf_counter() - t0:.1f} s; backend native={eng.runner.backend.native}, "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    rng = np.random.default_rng(0)
    vocab = eng.info["vocab_size"]
    pre = rng.integers(1000, vocab - 1000, prefix).tolist()
    new = rng.integers(1000, vocab - 1000, extend).tolist()
    t0 = time.perf_counter()
    eng.generate([pre], {"temperature": 0, "max_new_tokens": 1})
    print(f"prefix of {prefix} tokens prefilled in {time.perf_counter() - t0:.1f} s", flush=True)
    runner = eng.runner
    captured = []
    orig = runner.launch

    def launch(batch):
        captured.append(batch)
        return orig(batch)

    runner.launch = launch
    out = eng.generate([pre + new], {"temperature": 0, "max_new_tokens": 1})
    runner.launch = orig
    print(f"cached tokens of the 2nd request: {out[0]['meta_info']['cached_tokens']}")
    batch = next(b for b in captured if len(b.input_ids))
    assert len(batch.prev_token_pos) == 0, "captured pass has in-flight inputs; cannot replay"
    print(
        f"captured pass: extend_lens={batch.extend_lens.tolist()} seq_lens={batch.seq_lens.tolist()} "
        f"cow pages={len(batch.cow_src)} page-table writes={len(batch.upd_rows)}"
    )
    return eng, runner, batch


def steps_once(runner, batch) -> dict[str, float]:
    """One pass, its steps timed with perf_counter (what ModelRunner.launch + finish do on CPU)."""
    from radixrt.worker.forward_pass import sample_outputs

    t = [time.perf_counter()]
    with torch.inference_mode():
        meta, ids, st = runner.stage(batch)
        t.append(time.perf_counter())
        runner.backend.prepare(meta)
        t.append(time.perf_counter())
        hidden = runner.model(ids, meta.positions, meta, runner.backend)
        t.append(time.perf_counter())
        last = (meta.extend_start_loc + meta.extend_lens - 1).long()
        logits = runner.model.compute_logits(hidden[last])
        t.append(time.perf_counter())
        nxt, outs = sample_outputs(batch, logits, st, runner.penalties, None)
        outs.next_token_ids.numpy()
        t.append(time.perf_counter())
    names = ["stage", "prepare (plan)", "model forward", "last rows + LM head", "sampling"]
    d = {n: (t[i + 1] - t[i]) * 1e3 for i, n in enumerate(names)}
    d["sum of steps"] = (t[-1] - t[0]) * 1e3
    return d


def med(xs):
    return statistics.median(xs)


# ----------------------------------------------------------------------------- main
def main() -> None:
    global MODE
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1800)
    ap.add_argument("--extend", type=int, default=32)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prof-passes", type=int, default=5)
    args = ap.parse_args()
    eng, runner, batch = build(args.prefix, args.extend, args.threads)

    # 1. plain timing
    for _ in range(5):
        runner.forward(batch)
    whole = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        runner.forward(batch)
        whole.append((time.perf_counter() - t0) * 1e3)
    steps = [steps_once(runner, batch) for _ in range(args.reps)]
    print(f"\n== 1. plain perf_counter, median of {args.reps} (min-max) ==")
    print(f"runner.forward(batch) (launch+finish)  {med(whole):7.2f} ms  ({min(whole):.2f}-{max(whole):.2f})")
    for k in steps[0]:
        xs = [s[k] for s in steps]
        print(f"  {k:36s} {med(xs):7.2f} ms  ({min(xs):.2f}-{max(xs):.2f})")

    # 2. perf_counter spans, over the module path: a pass that models/native_layers.py takes (section
    # 1's, as served since 2026-12-03) makes its native calls with no module or op wrapper to time
    from radixrt.models import native_layers

    native_layers.layer_calls = lambda *a: False
    print("\n(sections 2 and 3 time the module path: native_layers.layer_calls is patched off)")
    install(runner)
    MODE = "timer"
    for _ in range(3):
        runner.forward(batch)
    per: dict[str, list[float]] = defaultdict(list)
    cnts = {}
    tot = []
    for _ in range(args.reps):
        reset()
        t0 = time.perf_counter()
        runner.forward(batch)
        tot.append((time.perf_counter() - t0) * 1e3)
        for k_, v_ in ACC.items():
            per[k_].append(v_ * 1e3)
        cnts = dict(CNT)
    m = {k_: med(v_) for k_, v_ in per.items()}
    leaf_in_model = [
        k_
        for k_ in m
        if not k_.startswith("[")
        and k_ not in ("linear lm_head", "attn plan (prepare)", "stage (upload, page table, COW)", "sampling")
    ]
    glue = m["[model forward]"] - sum(m[k_] for k_ in leaf_in_model)
    print(
        f"\n== 2. perf_counter spans (instrumented pass {med(tot):.2f} ms vs plain {med(whole):.2f}), "
        f"ms per pass, median of {args.reps} =="
    )
    groups = [
        (
            "linears (30 layers: qkv+o+gate_up+down)",
            ["linear qkv_proj", "linear o_proj", "linear gate_up_proj", "linear down_proj"],
        ),
        ("LM head (1 row) + .float()", ["[compute_logits]"]),
        ("native attention call (q read in place, o written)", ["attn native call"]),
        ("K/V store (one native call per layer)", ["K/V store (native)"]),
        ("rotary", ["rotary"]),
        ("RMSNorm (native, 61 calls)", ["rmsnorm (native)"]),
        ("SiLU*mul", ["silu_and_mul"]),
        ("embedding", ["embedding"]),
        ("attn plan (backend.prepare, once per pass)", ["attn plan (prepare)"]),
        ("stage (upload, page-table, COW)", ["stage (upload, page table, COW)"]),
        ("sampling", ["sampling"]),
    ]
    acc = 0.0
    for label, keys in groups:
        v_ = sum(m.get(k_, 0.0) for k_ in keys)
        acc += v_
        print(f"  {label:46s} {v_:7.2f}")
    print(f"  {'Python glue inside model forward (residual)':46s} {glue:7.2f}")
    other = med(tot) - acc - glue
    print(f"  {'rest of runner.forward (outside these)':46s} {other:7.2f}")
    print(f"  {'TOTAL (instrumented)':46s} {med(tot):7.2f}")
    print("  detail (ms/pass, calls/pass):")
    for k_ in sorted(m, key=lambda z: -m[z]):
        print(
            f"    {k_:46s} {m[k_]:7.3f}  {cnts.get(k_, 0):4d}  "
            f"{1e3 * m[k_] / max(cnts.get(k_, 1), 1):8.1f} us/call"
        )
    att_glue = m["[Attention.forward]"] - sum(
        m[k_] for k_ in ("linear qkv_proj", "linear o_proj", "rotary", "[backend.forward]")
    )
    be_glue = m["[backend.forward]"] - sum(m.get(k_, 0) for k_ in groups[2][1] + groups[3][1])
    mlp_glue = m["[MLP.forward]"] - sum(
        m[k_] for k_ in ("linear gate_up_proj", "linear down_proj", "silu_and_mul")
    )
    layer_glue = (
        m["[DecoderLayer.forward]"]
        - m["[Attention.forward]"]
        - m["[MLP.forward]"]
        - m["rmsnorm (native)"] * 60 / 61
    )
    loop_glue = m["[model forward]"] - m["[DecoderLayer.forward]"] - m["embedding"]
    loop_glue -= m["rmsnorm (native)"] / 61
    print(
        f"  glue split: Attention.forward own {att_glue:.2f}, backend.forward own {be_glue:.2f}, "
        f"MLP.forward own {mlp_glue:.2f}, "
        f"DecoderLayer.forward own (incl. 2 norm module calls) {layer_glue:.2f}, "
        f"LlamaForCausalLM.forward loop + 30 layer __call__ "
        f"{loop_glue:.2f}"
    )

    # 3. torch.profiler
    MODE = "prof"
    from torch.profiler import ProfilerActivity, profile

    n = args.prof_passes
    runner.forward(batch)
    reset()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            runner.forward(batch)
        prof_wall = (time.perf_counter() - t0) * 1e3 / n
    MODE = "off"
    print(f"\n== 3. torch.profiler, {n} passes (profiled pass {prof_wall:.2f} ms wall) ==")
    ka = prof.key_averages()
    user = {e.key: e for e in ka if e.key in ACC}
    ops_ = [e for e in ka if e.key not in ACC and not e.key.startswith("ProfilerStep")]
    ops_.sort(key=lambda e: -e.self_cpu_time_total)
    all_self = sum(e.self_cpu_time_total for e in ops_) / n / 1e3
    print(f"  aten ops: total self CPU {all_self:.2f} ms/pass; top ops (self ms/pass, calls/pass):")
    for e in ops_[:22]:
        print(f"    {e.key:42s} {e.self_cpu_time_total / n / 1e3:7.3f}  {e.count / n:6.0f}")
    print("  groups (record_function; self = not inside an aten op: ctypes calls + Python):")
    for k_ in sorted(user, key=lambda z: -user[z].cpu_time_total):
        e = user[k_]
        print(
            f"    {k_:46s} incl {e.cpu_time_total / n / 1e3:7.3f}  "
            f"self {e.self_cpu_time_total / n / 1e3:7.3f}"
            f"  {e.count / n:5.0f}"
        )
    print("  top (op, input shapes) by self CPU:")
    ks = [e for e in prof.key_averages(group_by_input_shape=True) if e.key not in ACC]
    ks.sort(key=lambda e: -e.self_cpu_time_total)
    for e in ks[:16]:
        print(
            f"    {e.key:28s} {str(e.input_shapes)[:70]:70s} {e.self_cpu_time_total / n / 1e3:7.3f} "
            f"{e.count / n:5.0f}"
        )
    unpatch()



if __name__ == "__main__":
    main()
