#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): install the carried wheels, then run the named
# stages, each under its own time limit, writing results under $OUT. Usage from the repo root:
#   bash bench/h200_run.sh tests kernels engine         # stages: see the case list below
# Wheels come from ../shared/tools/device-wheels.sh (.whl/, carried with the call).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
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
for s in "$@"; do
  case $s in
    tests) stage gpu-tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/worker/test_gpu_model.py ;;
    kernels) stage kernels 170 python3 bench/kernels/bench_kernels.py --out "$OUT/kernels.json" ;;
    gemm-layouts) stage gemm-layouts 150 python3 bench/kernels/gemm_layouts.py --out "$OUT/gemm-layouts.json" ;;
    tune-cascade) stage tune-cascade 240 python3 bench/kernels/tune_cascade.py --out "$OUT/tune-cascade.json" ;;
    tune-pipelined-cold) stage tune-pipelined-cold 300 python3 bench/kernels/tune_pipelined.py --part cascade --cold-l2 \
        --out "$OUT/tune-pipelined-cold.json" ;;
    tune-pipelined) stage tune-pipelined 420 python3 bench/kernels/tune_pipelined.py --out "$OUT/tune-pipelined.json" ;;
    cascade-probe) stage cascade-probe 150 python3 bench/kernels/cascade_probe.py --out "$OUT/cascade-probe.json" ;;
    engine-sp) stage engine-sp 200 python3 bench/gpu_engine.py --only shared-prefix,kernels --out "$OUT/engine-sp.json" ;;
    engine-tiles) for t in 128,64,8,3:4 64,64,4,2:4 64,64,4,3:4; do
        stage "engine-tile-${t//[,:]/-}" 120 python3 bench/gpu_engine.py --only shared-prefix --repeat 3 \
          --cascade-tile "${t%%:*}" --cascade-prefix-splits "${t##*:}" --out "$OUT/engine-tile-${t//[,:]/-}.json"
      done ;;
    engine) stage engine 250 python3 bench/gpu_engine.py --only profile,idle,random,shared-prefix,multi-turn,kernels \
        --out "$OUT/engine.json" ;;
    peers-random) stage peers-random 300 python3 bench/peers.py run --model-config qwen2.5-7b --workload random \
        --num-prompts 256 --input-len 512 --output-len 256 --output-json "$OUT/peers-random.json" ;;
    peers-shared) stage peers-shared 200 python3 bench/peers.py run --model-config qwen2.5-7b --workload shared-prefix \
        --num-groups 1 --prompts-per-group 128 --system-prompt-len 2048 --question-len 128 --output-len 64 \
        --output-json "$OUT/peers-shared.json" ;;
    peers-shared-3) stage peers-shared-3 300 python3 bench/peers.py run --model-config qwen2.5-7b --workload shared-prefix \
        --num-groups 1 --prompts-per-group 128 --system-prompt-len 2048 --question-len 128 --output-len 64 \
        --repeat 3 --output-json "$OUT/peers-shared-3.json" ;;
    peers-shared-gen3) stage peers-shared-gen3 200 python3 bench/peers.py run --model-config qwen2.5-7b \
        --workload shared-prefix --num-groups 1 --prompts-per-group 128 --system-prompt-len 2048 --question-len 128 \
        --output-len 64 --baselines hf_generate --repeat 3 --output-json "$OUT/peers-shared-gen3.json" ;;
    peers-random-gen3) stage peers-random-gen3 260 python3 bench/peers.py run --model-config qwen2.5-7b \
        --workload random --num-prompts 256 --input-len 512 --output-len 256 --baselines hf_generate --repeat 3 \
        --output-json "$OUT/peers-random-gen3.json" ;;
    engine-workloads) stage engine-workloads 200 python3 bench/gpu_engine.py --only random,shared-prefix,multi-turn \
        --out "$OUT/engine-workloads.json" ;;
    gemv-mlarge) stage gemv-mlarge 200 python3 bench/kernels/bench_gemv.py --mlarge-only --out "$OUT/gemv-mlarge.json" ;;
    gemv) stage gemv-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py \
        tests/worker/test_gpu_model.py
      stage gemv 150 python3 bench/kernels/bench_gemv.py --out "$OUT/gemv.json" ;;
    engine-b1) RADIXRT_SKINNY_GEMM=0 stage engine-b1-torch 120 python3 bench/gpu_engine.py --only profile --out "$OUT/engine-b1-torch.json"
      RADIXRT_SKINNY_GEMM=1 stage engine-b1-skinny 120 python3 bench/gpu_engine.py --only profile \
        --out "$OUT/engine-b1-skinny.json" ;;
    engine-b1-skinny) stage engine-b1-skinny 120 python3 bench/gpu_engine.py --only profile \
        --out "$OUT/engine-b1-skinny.json" ;;
    serving-ls) stage serving-ls 300 python3 bench/gpu_serving.py --configs A,B,E,C --phases long_short \
        --out-dir "$OUT/serving-ls" --budget-s 280 ;;
    serving-tp) stage serving-tp 420 python3 bench/gpu_serving.py --configs A,D --phases overlap,throughput \
        --out-dir "$OUT/serving-tp" --budget-s 400 ;;
    serving-a-tp) stage serving-a-tp 200 python3 bench/gpu_serving.py --configs A --phases throughput \
        --out-dir "$OUT/serving-a-tp" --budget-s 180 ;;
    serving) stage serving 560 python3 bench/gpu_serving.py --out-dir "$OUT/serving" --budget-s 530 ;;
    *) echo "unknown stage $s" ;;
  esac
done
rm -f radixrt/kernels radixrt/tokenizer_proc
