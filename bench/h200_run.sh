#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): install the carried wheels, then run the named
# stages, each under its own time limit, writing results under $OUT. Usage from the repo root:
#   COMMIT=$(git rev-parse --short HEAD) bash bench/h200_run.sh verify   # stages: the case list below
# (the device copy of the tree has no .git: COMMIT names the code in the JSON). Wheels come from
# ../shared/tools/device-wheels.sh (.whl/, carried with the call) with these extras, which fastapi,
# openai and radixrt.constrained import: opentelemetry-api httpx2 httpcore2 truststore anyio idna h11
# xgrammar==0.2.8 apache-tvm-ffi jsonschema jsonschema-specifications referencing rpds-py attrs.
# `verify` fits one 10-minute call.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# .whl-extra/ (optional, carried only by the calls that need it): smg, setproctitle, pyyaml, psutil
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  $(ls .whl-extra/*.whl 2>/dev/null) >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -sfn ../kernels radixrt/kernels
ln -sfn ../tokenizer_proc radixrt/tokenizer_proc
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  echo "=== $name rc=$rc in $((SECONDS - t0)) s"
}
PEERS="python3 bench/peers.py run --model-config qwen2.5-7b"
SHARED="--workload shared-prefix --num-groups 1 --prompts-per-group 128 --system-prompt-len 2048 --question-len 128
  --output-len 64"
RANDOM_WL="--workload random --num-prompts 256 --input-len 512 --output-len 256"
for s in "$@"; do
  case $s in
    # the lead's check after a merge: every GPU test, then the engine figures of bench/results/engine.md
    # (batch-1 decode, random, shared-prefix; same arguments as recorded) and one table against them
    # (gpu-tests: 239 s on a warm machine, 2026-12-04; a cold one's Triton compiles ran past 290 s, and
    # on 2026-12-05 past 340 s with 308 of 327 done; engine-verify took 63 s)
    verify) stage gpu-tests 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests
      stage engine-verify 140 python3 bench/gpu_engine.py --only profile,random,shared-prefix \
        --out "$OUT/engine-verify.json"
      python3 bench/compare_results.py "$OUT/engine-verify.json" ;;
    gpu-tests) stage gpu-tests 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests ;;
    # chosen GPU tests: PYTEST_ARGS (paths, -k ...)
    pytest) stage pytest 200 python3 -m pytest -q -m gpu -p no:cacheprovider ${PYTEST_ARGS:-tests/kernels} ;;
    # verify's second half alone: the engine figures and the table against bench/results/engine.md
    engine-verify) stage engine-verify 250 python3 bench/gpu_engine.py --only profile,random,shared-prefix \
        --out "$OUT/engine-verify.json"
      python3 bench/compare_results.py "$OUT/engine-verify.json" ;;
    # issue 15: 100% json_schema against unconstrained, Engine and HTTP (bench/results/grammar_bench.md)
    grammar) stage grammar 280 python3 bench/grammar_bench.py --model-config qwen2.5-7b --device cuda \
        --num-requests 64 --prompt-len 256 --output-len 256 --repeat 2 --out "$OUT/grammar_bench.json" ;;
    # issue 17: host KV tier off vs on, multi-turn working set ~4x the device pool
    hicache) stage hicache 330 python3 bench/hicache_bench.py --out "$OUT/hicache.json" ;;
    # issue 19: FP8 weights (Triton skinny GEMV / _scaled_mm) and FP8 KV against bf16
    fp8) stage fp8 330 python3 bench/fp8_bench.py --model-config qwen2.5-7b --load-format dummy \
        --out "$OUT/fp8.json" ;;
    # issue 19: FP8 KV decode attention (kv_dot q / f16 x blocks x splits) and FP8-weight skinny GEMM
    # (fp8_config_legacy / fp8_config / f16_dot grid) against bf16, old and new side by side (~4 min)
    # (every variant is checked against a reference on the GPU before it is timed)
    fp8-sweep) stage fp8-sweep 235 python3 bench/kernels/sweep_fp8.py --budget-s 165 --out "$OUT/sweep-fp8.json" \
        --best-out "$OUT/fp8-attn-best.json" ;;
    # issue 19: FP8-KV decode attention only: the FP8-operand forms (kernels/paged_loop_fp8.py) against
    # the f16 form and bf16 (sweep_fp8.py attention part, each variant checked first), fp8_bench's
    # attention rows, and the GPU tests of the decode kernels (~6 min)
    fp8-attn) stage fp8-attn-sweep 260 python3 bench/kernels/sweep_fp8.py --only attention --budget-s 480 \
        --out "$OUT/sweep-fp8-attn.json" --best-out "$OUT/fp8-attn-best.json"
      stage fp8-attn-bench 90 python3 bench/fp8_bench.py --only attention --out "$OUT/fp8-attn.json"
      # the sweep's winner (written when >= 2% faster than the FP8 default) in fp8_bench's harness
      [ -f "$OUT/fp8-attn-best.json" ] && RADIXRT_ATTN_CONFIG="$OUT/fp8-attn-best.json" stage fp8-attn-bench-best 90 \
        python3 bench/fp8_bench.py --only attention --out "$OUT/fp8-attn-best-bench.json"
      stage fp8-attn-tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gpu.py \
        tests/kernels/test_kernels_gpu.py tests/worker/test_gpu_model.py ;;
    # issue 19 round 4: where FP8 `random` spends its time (prefill vs decode passes, bf16 / FP8 / FP8 +
    # FP8 KV), the layer linears at decode and prefill rows, the Triton FP8 GEMM grid (then engines with
    # its winners); the FP8 GPU tests first (~8 min)
    fp8-profile) stage fp8-gemm-tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py \
        tests/kernels/test_fp8_gpu.py -k "gemm or linear"
      stage fp8-profile 420 python3 bench/lab/fp8_random_profile.py --budget-s 360 \
        --out "$OUT/fp8-random-profile.json" --tuned-out "$OUT/fp8-gemm-tuned.txt" ;;
    # issue 19 round 4 check: the FP8 GPU tests, then fp8_bench's engines (bf16, FP8 with the FP8 LM head,
    # FP8 with the bf16 head, FP8 weights + KV) with the routed Triton FP8 GEMM (~5 min)
    fp8-check) stage fp8-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gpu.py \
        -k "gemm or linear or int" tests/worker/test_gpu_model.py
      stage fp8-engines 300 python3 bench/fp8_bench.py --only engines --head-bf16-engine --kv-fp8-engine \
        --out "$OUT/fp8-engines.json" ;;
    # issue 19: the FP8-KV decode step at batch 256 (graphs per length class, decode_splits_fp8's
    # per-program cost): the touched GPU tests and the FP8 ones, then decode attention 256 x 640 at 1
    # and 33 FP8 splits, and engines bf16 / FP8 / FP8 + FP8 KV / bf16 + FP8 KV (batch-1 step, `random`
    # cold and warm, decode step at batch >= 240), FP8 with a bf16 LM head (batch-1 only) and FP8 + FP8
    # KV as before the fix; one table of same-run ratios (<= 420 s)
    fp8kv-check) stage fp8kv-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/worker/test_gpu_model.py \
        tests/kernels/test_fp8_gpu.py
      stage fp8kv-engines 265 python3 bench/lab/fp8_random_profile.py --only attention,engines --budget-s 200 \
        --engines bf16,fp8,fp8_kv8,kv8,fp8_head_bf16,fp8_kv8_before --out "$OUT/fp8kv-check.json" ;;
    # issue 19: programmatic dependent launch (kernels/pdl.py): the GPU tests of the touched kernels and
    # the model (PDL on, the default), then the batch-1 decode step of bf16 / FP8 engines, PDL off vs on
    # in one process (bench/pdl_bench.py, ~3 min)
    pdl) stage pdl-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_pdl.py \
        tests/kernels/test_kernels_gpu.py tests/kernels/test_fp8_gpu.py tests/kernels/test_gemv.py \
        tests/worker/test_gpu_model.py
      stage pdl-bench 330 python3 bench/pdl_bench.py --out "$OUT/pdl.json" ;;
    tests) stage gpu-tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/worker/test_gpu_model.py ;;
    kernels) stage kernels 170 python3 bench/kernels/bench_kernels.py --out "$OUT/kernels.json" ;;
    # issue 19 part 2: every attention config variant checked against torch SDPA, then timed beside
    # SDPA cuDNN / flash; prints the best per shape, writes kernels-sweep.json and the winners as an
    # override file attn-best.json (a later run: RADIXRT_ATTN_CONFIG=FILE, or kernels-best below)
    kernels-sweep) stage kernels-sweep 240 python3 bench/kernels/sweep_kernels.py --budget-s 185 \
        --out "$OUT/kernels-sweep.json" --best-out "$OUT/attn-best.json" ;;
    # bench_kernels with the sweep's winners applied (the file of this call's kernels-sweep, else
    # bench/results/attn-best.json when committed), for the same-run table against the peers
    kernels-best) best="$OUT/attn-best.json"; [ -f "$best" ] || best=bench/results/attn-best.json
      use=(); [ -f "$best" ] && use=(--use-best "$best")
      stage kernels-best 200 python3 bench/kernels/bench_kernels.py "${use[@]}" --out "$OUT/kernels-best.json" ;;
    gemv) stage gemv-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py \
        tests/worker/test_gpu_model.py
      stage gemv 150 python3 bench/kernels/bench_gemv.py --out "$OUT/gemv.json" ;;
    gemv-mlarge) stage gemv-mlarge 200 python3 bench/kernels/bench_gemv.py --mlarge-only --out "$OUT/gemv-mlarge.json" ;;
    engine) stage engine 250 python3 bench/gpu_engine.py --only profile,idle,random,shared-prefix,multi-turn,kernels \
        --out "$OUT/engine.json" ;;
    engine-workloads) stage engine-workloads 200 python3 bench/gpu_engine.py --only random,shared-prefix,multi-turn \
        --out "$OUT/engine-workloads.json" ;;
    engine-sp) stage engine-sp 200 python3 bench/gpu_engine.py --only shared-prefix,kernels --out "$OUT/engine-sp.json" ;;
    engine-b1) RADIXRT_SKINNY_GEMM=0 stage engine-b1-torch 120 python3 bench/gpu_engine.py --only profile \
        --out "$OUT/engine-b1-torch.json"
      RADIXRT_SKINNY_GEMM=1 stage engine-b1-skinny 120 python3 bench/gpu_engine.py --only profile \
        --out "$OUT/engine-b1-skinny.json" ;;
    # shellcheck disable=SC2086  # word splitting of the argument strings is intended
    peers-shared) stage peers-shared 300 $PEERS $SHARED --repeat 3 --output-json "$OUT/peers-shared.json" ;;
    # shellcheck disable=SC2086
    peers-random) stage peers-random 260 $PEERS $RANDOM_WL --baselines hf_generate --repeat 3 \
        --output-json "$OUT/peers-random.json" ;;
    serving) stage serving 560 python3 bench/gpu_serving.py --out-dir "$OUT/serving" --budget-s 530 ;;
    # issue 19 part 3: HTTP vs Engine tok/s (random, shared-prefix, multi-turn), TTFT c1 / c16, short
    # p99 TTFT beside 32K prefills, default config; one table of goal ratios (~300 s)
    # issue 19 part 3: CPU time and py-spy samples of scheduler / tokenizer / worker / load generator per
    # workload (needs .whl-extra with py-spy; bench/lab/serving_profile.py)
    serving-profile) PATH=/tmp/site/bin:$PATH stage serving-profile 330 python3 bench/lab/serving_profile.py \
        --out-dir "$OUT/profile" ;;
    # issue 19 part 3: pass-by-pass traces of the Engine and the server on the three throughput workloads,
    # side by side (RADIXRT_PASS_TRACE; bench/lab/pass_timeline.py, ~200 s)
    pass-timeline) stage pass-timeline 330 python3 bench/lab/pass_timeline.py --out-dir "$OUT/timeline" ;;
    pass-timeline-httpx) stage pass-timeline-httpx 330 python3 bench/lab/pass_timeline.py --transport httpx \
        --out-dir "$OUT/timeline-httpx" ;;
    pass-timeline-close) stage pass-timeline-close 330 python3 bench/lab/pass_timeline.py --connections close \
        --out-dir "$OUT/timeline-close" ;;
    # the load generator alone: a shared-prefix burst to a no-op server (bench/lab/client_burst.py, ~20 s)
    client-burst) stage client-burst 120 bash -c "python3 bench/lab/client_burst.py --rounds 5; \
        python3 bench/lab/client_burst.py --rounds 5 --connections keep-alive" ;;
    # issue 19: the batch-1 decode step kernel by kernel, bf16 / FP8, PDL off / on (~2 min)
    step-profile) stage step-profile 330 python3 bench/lab/decode_step_profile.py --out "$OUT/step_profile.json" ;;
    # issue 19: the FP8 int GEMV's M = 1 grid with PDL, then bf16 / FP8 / FP8-retuned engines (~90 s)
    fp8-retune) stage fp8-retune 330 env OUT="$OUT" python3 bench/lab/fp8_int_retune.py --rounds 4 ;;
    # issue 19: FP8 `random` against bf16 in three alternated rounds (medians; ~4.5 min), the fused
    # SiLU / norm quantization GPU tests first (~15 s)
    fp8-rounds) stage fused-quant-tests 90 python3 -m pytest -q -p no:cacheprovider \
        tests/kernels/test_fused_quant.py tests/kernels/test_fp8_gpu.py tests/worker/test_gpu_model.py -k "fused or silu"
      stage fp8-rounds 330 python3 bench/lab/fp8_random_profile.py --only engines --engines bf16,fp8_kv8 \
        --rounds 3 --budget-s 270 --out "$OUT/fp8-rounds.json" ;;
    # issue 19: kv_dot "f16v8" (V loaded in 8-byte pieces: no 2-way bank conflicts on its fp16 stores)
    # against "f16v" and the defaults over the FP8 pool at `random`'s shapes and 64 x 4K / 128 x 2K (~1 min)
    fp8-v8) stage fp8-v8 150 python3 bench/lab/decode_rules.py --pools fp8 \
        --shapes 256x512,256x768,64x4096,128x2048 \
        --rules "f16v,f16v 64x4w3s,f16v8 64x4w3s,f16v8 128x4w3s" --out "$OUT/decode-rules-v8.json" ;;
    # issue 19: FP8-pool decode at 1-4 KV splits for configs that fit 4 programs per SM (~1 min)
    fp8-decode-splits) stage fp8-decode-splits 150 python3 bench/lab/decode_fp8_occupancy.py --splits \
        --out "$OUT/decode-fp8-splits.json" ;;
    # issue 19: FP8-pool decode with V stored transposed within each page (bench/lab/decode_vt.py: five
    # forms x six block configs against the bf16 and FP8 defaults, same run; ~3 min)
    decode-vt) stage decode-vt 290 python3 bench/lab/decode_vt.py --out "$OUT/decode-vt.json" ;;
    # issue 19: decode with the whole key blocks unmasked (PEEL_TAIL 1 / 2, not the default) against
    # the default, both pools (~50 s)
    decode-peel) stage decode-peel 150 python3 bench/lab/decode_rules.py --rules peel,peel2 \
        --shapes 1x512,1x2048,1x8192,16x2048,64x4096,128x2048,128x2208,256x512,256x768 \
        --out "$OUT/decode-rules-peel.json" ;;
    # issue 19: bf16 decode against cuDNN (1.04x): the lab kernel on the bf16 pool (v_bf16), the
    # engine's loop inside the lab's launch (eng / eng_bf16), cuDNN and pages in order in the same run;
    # then Nsight Compute on the bf16 default, the lab forms and cuDNN at 64 x 4,096 (~5 min)
    decode-gap) stage decode-gap 270 python3 bench/lab/decode_vt.py --peers --forms v_bf16,eng_bf16,v_f16,eng \
        --configs 128x8w2s,128x4w3s,64x4w3s,128x8w3s,64x8w3s --shapes 64x4096,128x2048 --out "$OUT/decode-gap.json"
      stage decode-gap-ncu 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats --launch-count 12 \
        -k regex:'_decode_split|_decode_vt|_decode_eng|cudnn|sdpa|fmha' \
        python3 bench/lab/ncu_decode.py --pool bf16 --batch 64 --ctx 4096 --calls 2 --cudnn \
        --lab v_bf16:128x8w2s,eng_bf16:128x8w2s ;;
    # issue 19: keys split across the warps of a program (cuDNN's 1 x 4 x 1 warp tile; bench/lab/
    # decode_vt.py ws_bf16 / ws_f16: batched dots, P never leaves its warp), beside cuDNN (~3 min)
    decode-ws) stage decode-ws 300 python3 bench/lab/decode_vt.py --peers --forms ws_bf16,ws_f16,ws_f16v \
        --configs 128x4w2s,128x4w3s,64x4w3s,64x4w2s,64x2w3s,32x2w3s,128x8w2s,256x8w2s \
        --shapes 64x4096,128x2048 --out "$OUT/decode-ws.json" ;;
    # issue 19: the warp-split FP8 form over V^T pages (decode_vt.py "ws_vt": V through ldmatrix, no
    # one-byte shared-memory loads) beside "ws_f16", the defaults and cuDNN (~3 min)
    decode-wsvt) stage decode-wsvt 300 python3 bench/lab/decode_vt.py --peers --forms ws_f16,ws_vt \
        --configs 64x2w3s,64x2w4s,128x2w3s,128x4w3s,64x4w3s,32x2w3s,128x4w2s --shapes 64x4096,128x2048,256x768,256x512 \
        --out "$OUT/decode-wsvt.json" ;;
    # issue 19: the warp-split FP8 forms with block n + 1's scores computed before block n's softmax
    # (decode_vt.py "ws_f16p" / "ws_vtp", S_AHEAD) beside ws_f16 / ws_vt and the defaults (~3 min)
    decode-wsp) stage decode-wsp 300 python3 bench/lab/decode_vt.py --forms ws_f16,ws_f16p,ws_vt,ws_vtp \
        --configs 64x2w3s,64x2w4s,64x4w3s,32x2w3s,32x2w4s,128x4w3s --shapes 64x4096,128x2048,256x768 \
        --out "$OUT/decode-wsp.json" ;;
    # issue 19: Nsight Compute on the FP8 pool at 64 x 4,096: the default ("long" warp-split config), the
    # lab's ws_f16 and ws_vt (V^T pages) at 64 x 2w3s and ws_vt at 64 x 4w3s (~2 min)
    decode-ws-ncu) stage decode-ws-ncu 240 ncu --clock-control none --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --launch-skip 1 --launch-count 7 \
        -k regex:'_decode_split|_decode_ws' python3 bench/lab/ncu_decode.py --pool fp8 --batch 64 --ctx 4096 \
        --calls 2 --lab ws_f16:64x2w3s,ws_vt:64x2w3s,ws_vt:64x4w3s ;;
    # issue 19: the warp-split FP8 form with K and / or V widened by integer instructions (decode_vt.py
    # "ws_f16i*", e4m3_to_f16_x256th) beside "ws_f16" / "ws_f16v", then the FP8 warp-split rules (~7 min)
    decode-wsi) stage decode-wsi 330 python3 bench/lab/decode_vt.py --forms ws_f16,ws_f16v,ws_f16i,ws_f16ik,ws_f16ii \
        --configs 64x2w3s,64x2w4s,64x4w3s,32x2w3s,128x4w3s --shapes 64x4096,128x2048,256x768 \
        --out "$OUT/decode-wsi.json"
      stage decode-wsi-rules 150 python3 bench/lab/decode_rules.py --pools fp8 \
        --rules "ws 64x2w3s,ws 64x2w3s occ4,ws 64x2w3s occ8,ws 64x2w4s" --shapes 64x4096,128x2048,256x768 \
        --out "$OUT/decode-wsi-rules.json" ;;
    # issue 19: the warp-split loop in decode_attention (kernels/paged_loop.py paged_attn_loop_ws) as
    # whole rules at the engine's shapes, both pools, beside the defaults and cuDNN (~5 min)
    decode-ws-rules) WS_BF16=$(python3 -c "import sys; sys.path.insert(0, 'bench/lab'); import decode_rules as d; \
print(','.join(n for n in d.BF16_RULES if n.startswith('ws')))")
      WS_FP8=$(python3 -c "import sys; sys.path.insert(0, 'bench/lab'); import decode_rules as d; \
print(','.join(n for n in d.FP8_RULES if n.startswith('ws')))")
      stage decode-ws-bf16 280 python3 bench/lab/decode_rules.py --pools bf16 --rules "$WS_BF16" \
        --out "$OUT/decode-ws-bf16.json"
      stage decode-ws-fp8 280 python3 bench/lab/decode_rules.py --pools fp8 --rules "$WS_FP8" \
        --out "$OUT/decode-ws-fp8.json" ;;
    # issue 19: an FP8 pool's splits of >= 512 keys take the warp-split config (decode_fp8 "long"):
    # the kernel GPU tests (fp8-long only), then the default against the rule before it, both pools,
    # more shapes (~4 min; fp8-long-rules ~1 min)
    fp8-long) stage kernel-gpu-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels ;;&
    fp8-long|fp8-long-rules) stage fp8-long-rules 200 python3 bench/lab/decode_rules.py --pools bf16,fp8 --rules "no long" \
        --shapes 1x512,1x2048,1x8192,8x8192,16x2048,32x4096,64x4096,128x2048,128x2208,256x512,256x768 \
        --out "$OUT/fp8-long-rules.json" ;;
    # ... and in the engine: bf16 and FP8 + FP8 KV `random` at the defaults, then FP8 + FP8 KV with
    # the rule before (RADIXRT_ATTN_CONFIG, a process of its own; ~5 min)
    fp8-long-engine) printf '%s' '{"decode_fp8": {"d128": {"long_min_tokens": 0}}}' > "$OUT/nolong.json"
      stage fp8-engine-default 230 python3 bench/lab/fp8_random_profile.py --only engines --engines bf16,fp8_kv8 \
        --budget-s 200 --out "$OUT/fp8-engine-default.json"
      stage fp8-engine-nolong 200 env RADIXRT_ATTN_CONFIG="$OUT/nolong.json" python3 bench/lab/fp8_random_profile.py \
        --only engines --engines fp8_kv8 --budget-s 170 --out "$OUT/fp8-engine-nolong.json" ;;
    # issue 19: decode's DRAM stream (ncu, 2026-12-04: cuDNN 89% of DRAM peak, radixrt 85%): every
    # cp.async with the .L2::128B / 256B prefetch size (a PTX hook), each in its own process and Triton
    # cache, beside the unhinted defaults and cuDNN (~1.5 min)
    decode-l2) for n in 0 128 256; do
        stage decode-l2hint$n 150 env TRITON_CACHE_DIR=/tmp/tc$n python3 bench/lab/decode_vt.py --peers \
          --cp-async-l2 $n --forms eng_bf16,eng --configs 128x8w2s,64x4w3s,128x4w3s \
          --shapes 64x4096,128x2048 --out "$OUT/decode-l2hint$n.json"
      done ;;
    # issue 19: why the lab kernel's "f16" loop beats decode_attention's at 64 x 4K (95 against 101
    # us): its acc update and its masks, one at a time (bench/lab/decode_vt.py v_f16a / v_f16l; ~1 min)
    decode-vt-forms) stage decode-vt-forms 150 python3 bench/lab/decode_vt.py --quick \
        --forms v_f16,v_f16a,v_f16l,v_f16m --shapes 64x4096,128x2048,256x512 --out "$OUT/decode-vt-forms.json" ;;
    # issue 19: FP8 + FP8-KV `random` with decode's PEEL_TAIL 2 on every pool (RADIXRT_ATTN_CONFIG,
    # read at import, so a second process) after the same pair at the defaults (~3.5 min)
    fp8-peel2-engine) printf '%s' '{"decode": {"d128": {"peel_tail": 2}}, "decode_fp8": {"d128": {"peel_tail": 2}}}' \
        > "$OUT/peel2.json"
      stage fp8-engine-default 200 python3 bench/lab/fp8_random_profile.py --only engines --engines bf16,fp8_kv8 \
        --budget-s 170 --out "$OUT/fp8-engine-default.json"
      stage fp8-engine-peel2 200 env RADIXRT_ATTN_CONFIG="$OUT/peel2.json" python3 bench/lab/fp8_random_profile.py \
        --only engines --engines bf16,fp8_kv8 --budget-s 170 --out "$OUT/fp8-engine-peel2.json" ;;
    # issue 19 (shared-prefix): the cascade prefix kernel with its rows recomputed after the loop
    # (config "cascade" remat_rows: no register spills) against the default, as a kernel (cold L2)
    # and in the engine's shared-prefix, each in a process of its own (RADIXRT_ATTN_CONFIG; ~4 min)
    cascade-remat) printf '%s' '{"cascade": {"d128": {"remat_rows": true}}}' > "$OUT/remat.json"
      stage cascade-kernel-default 100 python3 bench/lab/sweep_attention.py --part cascade --cold-l2 \
        --out "$OUT/cascade-default.json"
      stage cascade-kernel-remat 100 env RADIXRT_ATTN_CONFIG="$OUT/remat.json" python3 bench/lab/sweep_attention.py \
        --part cascade --cold-l2 --out "$OUT/cascade-remat.json"
      stage sp-default 120 python3 bench/gpu_engine.py --only shared-prefix --out "$OUT/sp-default.json"
      stage sp-remat 120 env RADIXRT_ATTN_CONFIG="$OUT/remat.json" python3 bench/gpu_engine.py --only shared-prefix \
        --out "$OUT/sp-remat.json" ;;
    # issue 19 (FP8 batch-1): the int GEMV at M = 1 against its own loop without the conversion / with
    # loads only, and W8A8 on the tensor cores (pointer loads / TMA); then ncu's counters (~5 min)
    # issue 19: the batch-1 FP8 MLP as one persistent kernel (a lab kernel in bench/lab/fused_mlp_m1.py) against its
    # three launches, norm included, over a grid of its configs (~3 min)
    fused-mlp) stage fused-mlp 280 python3 bench/lab/fused_mlp_m1.py --budget-s 220 --configs 2 --out "$OUT/fused-mlp.json" ;;
    # issue 19 part 4: cascade's prefix stage on a side stream beside the suffix stage (~30 s)
    cascade-overlap) stage cascade-overlap 200 python3 bench/lab/cascade_overlap.py --out "$OUT/cascade-overlap.json" ;;
    # issue 19 part 4: a decode graph's padded groups and cascade stage A's grid order (row blocks
    # first / last): the kernel (1 and 8 groups), then shared-prefix in the Engine with each order,
    # one process apiece (~3 min)
    cascade-walk) stage cascade-walk 150 python3 bench/lab/cascade_overlap.py --walk --out "$OUT/cascade-walk.json"
      echo '{"cascade": {"d128": {"blocks_last": true}}}' > /tmp/last.json
      stage sp-last 200 env RADIXRT_ATTN_CONFIG=/tmp/last.json python3 bench/gpu_engine.py --only shared-prefix \
        --out "$OUT/sp-last.json"
      stage sp-first 200 python3 bench/gpu_engine.py --only shared-prefix --out "$OUT/sp-first.json" ;;
    # issue 19 parts 2 / 4: the Gluon decode-batch GEMM (kernels/gemm_ws.py): its GPU tests, then the lab
    # and its ModelRunner test, then the lab against F.linear at the 7B decode linears (GEMM_M rows,
    # GEMM_BUDGET s of sweeping) and gate_up with its SiLU three ways (~5 min)
    gemm-ws) stage gemm-ws-tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemm_ws_gpu.py \
        tests/worker/test_gpu_model.py::test_decode_graph_linears_take_the_gluon_gemm
      stage gemm-ws 230 python3 bench/lab/gemm_ws.py --m "${GEMM_M:-128,64,100}" --budget-s "${GEMM_BUDGET:-190}" \
        --out "$OUT/gemm-ws.json" --tuned-out "$OUT/gemm-ws-tuned.json" ;;
    # the bf16 noise of a 64-request decode step's logits per path (graph / eager, Gluon route on / off)
    # against a float32 runner: the scale the Gluon routes' GPU tests compare at (~1.5 min)
    graph-noise) stage graph-noise 150 python3 bench/lab/graph_eager_noise.py --out "$OUT/graph-noise.json" ;;
    # rotary + K/V store in one launch against the two it replaced, 28 calls per graph (~30 s)
    rope-store) stage rope-store 90 python3 bench/lab/rope_store.py --out "$OUT/rope-store.json" ;;
    # the batch-1 step of bf16 and FP8 Engines with the fused kernel (default) and with the two kernels
    # (RADIXRT_ROPE_STORE=0), four alternated rounds (~2 min: four engines)
    rope-store-step) stage rope-store-step 200 python3 bench/lab/fp8_step_without.py --rounds 4 \
        --variants "fp8;bf16 two kernels;fp8 two kernels" --out "$OUT/rope-store-step.json" ;;
    # the Engine's shared-prefix and random with the decode-graph linears of 17..128 rows that a `gemm-ws`
    # stage earlier in the same call found faster ($OUT/gemm-ws-tuned.json: RADIXRT_GEMM_WS=auto with that
    # TUNED file) against cuBLAS (=0), one process each, GEMM_ENGINE_ROUNDS alternated rounds (1 by
    # default: ~3-4 min with both workloads; GEMM_ENGINE_ONLY=shared-prefix for less). Without a winner
    # (or when the lab failed) the stage is skipped, unless GEMM_ENGINE_ROUTE=all routes every shape.
    gemm-ws-engine) if [ "${GEMM_ENGINE_ROUTE:-}" = all ]; then ROUTE="RADIXRT_GEMM_WS=all"
      elif python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) else 1)" \
          "$OUT/gemm-ws-tuned.json" 2>/dev/null; then
        ROUTE="RADIXRT_GEMM_WS=auto RADIXRT_GEMM_WS_TUNED=$OUT/gemm-ws-tuned.json"
      else ROUTE=""; echo "gemm-ws-engine skipped: no winner in $OUT/gemm-ws-tuned.json (GEMM_ENGINE_ROUTE=all forces)"; fi
      if [ -n "$ROUTE" ]; then
        echo "gemm-ws-engine routed process: $ROUTE"; cat "$OUT/gemm-ws-tuned.json" 2>/dev/null
        for r in $(seq "${GEMM_ENGINE_ROUNDS:-1}"); do
          stage "gemm-ws-engine-on-$r" 200 env $ROUTE python3 bench/gpu_engine.py \
            --only "${GEMM_ENGINE_ONLY:-shared-prefix,random}" --out "$OUT/gemm-ws-engine-on-$r.json"
          stage "gemm-ws-engine-off-$r" 200 env RADIXRT_GEMM_WS=0 python3 bench/gpu_engine.py \
            --only "${GEMM_ENGINE_ONLY:-shared-prefix,random}" --out "$OUT/gemm-ws-engine-off-$r.json"
        done
      fi ;;
    # the decode step at 48 / 64 / 128 requests of a bf16 Engine with the Gluon GEMM's TUNED / TUNED_GATED shapes
    # routed (RADIXRT_GEMM_WS=auto, the default) against cuBLAS alone, four alternated rounds (~2-3 min)
    gemm-ws-step) stage gemm-ws-step 300 python3 bench/lab/gemm_ws_step.py --rounds 4 --out "$OUT/gemm-ws-step.json" ;;
    # issue 19 part 4: the shared-prefix batch-128 decode pass kernel by kernel, cascade on and off (~3 min)
    sp-pass) stage sp-pass 300 python3 bench/lab/shared_prefix_pass.py --out "$OUT/sp-pass.json" ;;
    fp8-m1) stage fp8-m1 300 python3 bench/lab/fp8_m1_lab.py --budget-s 230 --out "$OUT/fp8-m1.json" ;;
    fp8-m1-ncu) stage fp8-m1-ncu 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats -k regex:'_fp8_int_gemv|_lab_int|_w8a8_tma' \
        python3 bench/lab/fp8_m1_lab.py --ncu --shapes o,gate_up,down ;;
    # issue 19: decode with programmatic dependent launch off (RADIXRT_PDL=0, a process of its own)
    # against on, both pools, and the lab control without it (~1.5 min): the bench launches cuDNN
    # without PDL, and the lab's kernel, 4-6% faster than the engine's at 64 x 4K, has none
    decode-pdl) stage decode-pdl-on 120 python3 bench/lab/decode_rules.py --rules default \
        --shapes 1x8192,16x2048,64x4096,128x2048,256x512 --out "$OUT/decode-pdl-on.json"
      stage decode-pdl-off 120 env RADIXRT_PDL=0 python3 bench/lab/decode_rules.py --rules default \
        --shapes 1x8192,16x2048,64x4096,128x2048,256x512 --out "$OUT/decode-pdl-off.json"
      stage decode-vt-nopdl 120 env RADIXRT_PDL=0 python3 bench/lab/decode_vt.py --quick --forms v_f16 \
        --shapes 64x4096,128x2048 --out "$OUT/decode-vt-nopdl.json" ;;
    # issue 19 (FP8 batch-1): the int GEMV with split-K at M = 1 (down runs at ~67% of DRAM peak with
    # 896 programs), PDL on; then the batch-1 step of bf16, FP8 and FP8 with the grid's winners (~6 min)
    fp8-int-split) stage fp8-int-grid 200 python3 bench/lab/fp8_m1_lab.py --int-grid --shapes down,o,qkv,gate_up \
        --budget-s 150 --out "$OUT/fp8-int-grid.json"
      stage fp8-int-engines 330 env OUT="$OUT" python3 bench/lab/fp8_int_retune.py --rounds 4 \
        --from-grid "$OUT/fp8-int-grid.json" ;;
    # issue 19 (batch-1 step): does a GEMV read weights faster after a side-stream kernel streamed them
    # into L2 while other kernels ran (bench/lab/l2_prefetch_lab.py; ~1 min)
    # the RMSNorm split across the FP8 int GEMVs (kernels/gemv_fp8_int.py NORM_OUT / NORM_IN): its GPU
    # tests, then the kernel chains and the batch-1 step of bf16 / FP8 / FP8 fused-norm engines
    fused-norm) stage fused-norm-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/kernels/test_fp8_gpu.py tests/worker/test_gpu_model.py -k "fused_norm"
      stage fused-norm 330 python3 bench/lab/fp8_fused_norm.py --rounds 4 --out "$OUT/fused-norm.json" ;;
    # issue 19 (FP8 batch-1): o / qkv with one chunk of every row's K (block_k4 1,024 >= K / 4), i.e. all of
    # a program's weight words loaded before the PDL wait, in the engine (the chain after attention)
    fp8-preload) stage fp8-preload 420 env OUT="$OUT" python3 bench/lab/fp8_int_retune.py --rounds 4 \
        --configs o=8x1024 --configs o=8x1024w8 --configs o=4x1024 --configs o=8x1024,qkv=8x1024 \
        --configs o=16x1024w8,qkv=16x1024w8 ;;
    # the same for down / gate_up: more bytes per loop step (down reads at ~67% of DRAM peak)
    fp8-preload-mlp) stage fp8-preload-mlp 420 env OUT="$OUT" python3 bench/lab/fp8_int_retune.py --rounds 4 \
        --configs down=4x1024 --configs down=4x1024w8 --configs down=2x1024 --configs down=8x1024w8 \
        --configs gate_up=8x256 --configs gate_up=16x256w8 ;;
    # issue 19 (decode against cuDNN, FP8-KV / bf16): pages in random order against pages in order, and the
    # head-major pool in order (cuDNN's memory), bf16 and FP8 pools (~1 min)
    decode-page-order) stage decode-page-order 200 python3 bench/lab/decode_page_order.py --rounds 3 \
        --out "$OUT/decode-page-order.json" ;;
    # issue 19 (FP8 batch-1): the step without rotary / the K/V store / the merge (bounds of fusions; ~2 min)
    step-without) stage step-without 300 python3 bench/lab/fp8_step_without.py --rounds 4 \
        --out "$OUT/fp8-step-without.json" ;;
    # issue 19 (extend against cuDNN): the warp-specialized Gluon extend lab (bench/lab/gluon_extend.py),
    # checked against SDPA, timed beside radixrt's Triton extend and cuDNN / flash SDPA (~1-2 min)
    gluon-extend) stage gluon-extend-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/kernels/test_extend_ws_gpu.py
      stage gluon-extend 240 python3 bench/lab/gluon_extend.py --out "$OUT" ${GLUON_ARGS:-} ;;
    # cascade stage A in the Gluon kernel: its GPU tests, the kernel against Triton's (~1 min), then
    # `shared-prefix` through the Engine with it on / off in two processes (~3 min)
    cascade-ws) stage cascade-ws-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/kernels/test_cascade_ws_gpu.py tests/kernels/test_extend_ws_gpu.py
      stage cascade-ws 200 python3 bench/lab/cascade_overlap.py --ws --out "$OUT/cascade-ws.json" ;;
    cascade-ws-engine) stage sp-ws-on 250 env RADIXRT_CASCADE_WS=1 python3 bench/gpu_engine.py --only shared-prefix \
        --out "$OUT/sp-ws-on.json"
      stage sp-ws-off 250 env RADIXRT_CASCADE_WS=0 python3 bench/gpu_engine.py --only shared-prefix \
        --out "$OUT/sp-ws-off.json" ;;
    # the warp-specialized Gluon decode lab (bf16 pool) against the Triton decode kernel (~1 min; first run)
    # (GLUON_CONFIGS: SUBxSTAGES[xWARPS[xMAXNREG]], each in its own process under 45 s: one that hangs
    # costs only itself; GLUON_ARGS e.g. --fp8)
    gluon-decode) stage gluon-decode-base 120 python3 bench/lab/gluon_decode.py --out "$OUT" --configs "" \
        ${GLUON_ARGS:-}
      for c in $(echo "${GLUON_CONFIGS:-16x2,16x4,32x2}" | tr , ' '); do
        stage "gluon-decode-$c" 45 python3 bench/lab/gluon_decode.py --out "$OUT" --no-baseline --configs "$c" \
          ${GLUON_ARGS:-}
      done ;;
    # the Engine's prefill with the Gluon extend kernel on / off, alternated processes (~3 min)
    gluon-extend-engine) stage gluon-extend-engine 420 python3 bench/lab/extend_ws_engine.py --rounds 2 \
        --out "$OUT/extend-ws-engine.json" ;;
    l2-prefetch) stage l2-prefetch 150 python3 bench/lab/l2_prefetch_lab.py --out "$OUT/l2-prefetch.json" ;;
    # issue 19 (batch-1 step): the model's L2 weight prefetch (RADIXRT_L2_PREFETCH; off by default; H200
    # 2026-12-03 at 24 MB: bf16 step 2.1% slower, FP8 unchanged): its GPU test, then the batch-1 step of
    # bf16 / FP8 engines without and with it (~3 min)
    l2-engine) stage l2-tests 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/worker/test_gpu_model.py \
        -k l2_prefetch
      stage l2-engine 230 python3 bench/lab/l2_prefetch_engine.py --budgets-mb 24 --rounds 3 \
        --out "$OUT/l2-prefetch-engine.json" ;;
    serving-goals) stage serving-goals 500 python3 bench/serving_goals.py --out "$OUT/serving-goals.json" ;;
    serving-ls) stage serving-ls 300 python3 bench/gpu_serving.py --configs A,B,E,C --phases long_short \
        --out-dir "$OUT/serving-ls" --budget-s 280 ;;
    serving-tp) stage serving-tp 420 python3 bench/gpu_serving.py --configs A,D --phases overlap,throughput \
        --out-dir "$OUT/serving-tp" --budget-s 400 ;;
    lab-sweep-attention) stage lab-sweep-attention 420 python3 bench/lab/sweep_attention.py \
        --out "$OUT/sweep-attention.json" ;;
    lab-sweep-attention-cold) stage lab-sweep-attention-cold 300 python3 bench/lab/sweep_attention.py --part cascade \
        --cold-l2 --out "$OUT/sweep-attention-cold.json" ;;
    lab-gemm-layouts) stage lab-gemm-layouts 150 python3 bench/lab/gemm_layouts.py --out "$OUT/gemm-layouts.json" ;;
    # issue 18: two replicas behind smg on one GPU: the fleet default (prefix_hash, 64 tokens) vs cache_aware
    # vs round_robin (alternating, 2 rounds) vs one server (needs .whl-extra: smg, setproctitle, pyyaml, psutil)
    fleet) stage fleet 330 python3 bench/fleet_bench.py --out "$OUT/fleet.json" ;;
    # issue 21: the soak harness at concurrency 256, Qwen2.5-7B shape with dummy weights (needs psutil)
    soak-gpu) python3 -c "from bench.dummy_tokenizer import make_dummy_model_dir as m; \
m('bench/configs/qwen2.5-7b-instruct', '/tmp/qwen7b-dummy')"
      stage soak-gpu 250 python3 -m bench.soak --launch --num-requests 3000 --concurrency 256 --max-tokens 64 \
        --long-words 300 --json "$OUT/soak_gpu.json" -- --model-path /tmp/qwen7b-dummy --load-format dummy \
        --device cuda --max-running-requests 256 --served-model-name SmolLM2-135M-Instruct ;;
    *) echo "unknown stage $s" ;;
  esac
done
rm -f radixrt/kernels radixrt/tokenizer_proc
