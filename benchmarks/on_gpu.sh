#!/usr/bin/env bash
# The GPU runs recorded in benchmarks/RESULTS.md, one step per command on the GPU machine (10 minutes
# a command there; install the GPU stack first, as docs/gpus-and-presets.md says). Each step logs to
# $OUT/<step>.log, with a GPU timeline (nvidia-smi once a second, summarised per 10 s by
# benchmarks/gpu_timeline.py, beside the engines' own log lines) at its end.
#
#   bash benchmarks/on_gpu.sh prep          # offline models and the two full-size shapes (random weights)
#   bash benchmarks/on_gpu.sh text8b-raw    # warm-up of both sides, then raw vLLM: 100,000 prompts, 8B shape
#   bash benchmarks/on_gpu.sh text8b-kit    # the kit against that raw side: auto (2 replicas, fixed pool)
#   bash benchmarks/on_gpu.sh text8b-kit3   # the same with 3 replicas on the GPU (REPLICAS_PER_GPU=3)
#   bash benchmarks/on_gpu.sh text8b-kit1   # the same with 1 replica (REPLICAS_PER_GPU=1)
#   bash benchmarks/on_gpu.sh vl3b-raw      # warm-up, then raw vLLM: 10,000 images, Qwen2.5-VL-3B shape
#   bash benchmarks/on_gpu.sh vl3b-kit      # the kit against that raw side: auto (1 replica)
#   bash benchmarks/on_gpu.sh vl3b-raw2     # warm-up (the kit with 2 replicas), then raw vLLM: 10,000 images
#   bash benchmarks/on_gpu.sh vl3b-kit2     # the kit with 2 replicas on the GPU against that raw side
#   bash benchmarks/on_gpu.sh smol          # SmolLM2, 100,000 prompts, warm-up first, both sides
# Before 2026-11-24 (second round) text8b-3 ran 3 replicas at 50,000 prompts, both sides.
#
# Steps longer than a command's 10 minutes ran back to back, detached, on one warm machine, and later
# calls copied /root/out/* into $OUT:
#   setsid bash -c 'for s in text8b-raw text8b-kit text8b-kit3; do OUT=/root/res bash benchmarks/on_gpu.sh $s; done' &
#   setsid bash -c 'for s in vl3b-raw2 vl3b-kit2 vl3b-kit; do OUT=/root/res bash benchmarks/on_gpu.sh $s; done' &
# (not /root/out: that was $OUT there, emptied at the start of every command.) On
# 2026-11-24 a second text8b-kit run was cut by `timeout 280` just before its end (not recorded).
# vl3b-raw with vl3b-kit2 cannot share a raw side before bench_pipeline's fix of that day: use vl3b-raw2.
set -euo pipefail
step="$1"
out="${OUT:-/tmp}"
work=/root/bench
llama="random-weights:unsloth/Llama-3.1-8B-Instruct"
qwen="random-weights:Qwen/Qwen2.5-VL-3B-Instruct"
export VLLM_LOGGING_LEVEL=INFO
bench() { python3 benchmarks/bench_pipeline.py "$@"; }
mkdir -p "$out"
# A step cut by a time limit can leave an engine holding its share of the GPU: end those first.
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
  echo "ending a leftover GPU process $pid"; kill -9 "$pid" 2>/dev/null || true
done
smi="$out/$step.smi.csv"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$smi" &
sampler=$!
results=""
set -o pipefail
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  date -u
  case "$step" in
    prep) python3 -c "
from helpers import models
for folder in (models.prepare_smollm2(), models.prepare_tiny_vlm(),
               models.prepare_random_weights('unsloth/Llama-3.1-8B-Instruct'),
               models.prepare_random_weights('Qwen/Qwen2.5-VL-3B-Instruct')):
    print(folder)" ;;
    text8b-raw) bench --task text --rows 100000 --workdir $work/8b --side raw --warmup 1000 -p MODEL_SOURCE "$llama" ;;
    text8b-kit) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" ;;
    text8b-kit3) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" -p REPLICAS_PER_GPU 3 ;;
    text8b-kit1) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" -p REPLICAS_PER_GPU 1 ;;
    vl3b-raw) bench --task caption --images 10000 --photos small --workdir $work/vl --side raw --warmup 500 -p MODEL_SOURCE "$qwen" ;;
    vl3b-raw2) bench --task caption --images 10000 --photos small --workdir $work/vl --side raw --warmup 200 -p MODEL_SOURCE "$qwen" -p REPLICAS_PER_GPU 2 ;;
    vl3b-kit) bench --task caption --images 10000 --photos small --workdir $work/vl --side kit -p MODEL_SOURCE "$qwen" ;;
    vl3b-kit2) bench --task caption --images 10000 --photos small --workdir $work/vl --side kit -p MODEL_SOURCE "$qwen" -p REPLICAS_PER_GPU 2 ;;
    smol) bench --task text --rows 100000 --workdir $work/smol --warmup 2000 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
} 2>&1 | tee "$out/$step.log" || status=$?
kill "$sampler" 2>/dev/null || true
date -u | tee -a "$out/$step.log"
# The timeline: per 10 s, beside the engines' log lines (the kit's: Ray's session; raw's: its log).
python3 benchmarks/gpu_timeline.py "$smi" --logs /tmp/ray/session_latest/logs --logs $work \
  --results $work/8b/text/kit --results $work/vl/caption/kit 2>&1 | tee -a "$out/$step.log"
exit "${status:-0}"
