#!/usr/bin/env bash
# The GPU runs recorded in benchmarks/RESULTS.md, one step per command on the GPU machine (10 minutes
# a command there; carry and install the users' GPU stack first: benchmarks/stage_gpu_stack.sh says how). Each step logs to
# $OUT/<step>.log, with a GPU timeline (nvidia-smi once a second, summarised per 10 s by
# benchmarks/gpu_timeline.py, beside the engines' own log lines) at its end.
#
# The full-size models are their published shapes with random weights (benchmarks/random_weights.py,
# a folder each): MODEL_SOURCE=<folder>, loaded with ENGINE={"engine_kwargs": {"load_format": "dummy"}},
# which bench_pipeline.run_settings adds. Engine settings are keys of the notebooks' ENGINE parameter.
#
#   bash benchmarks/on_gpu.sh prep          # the offline text model and the full-size shapes (random weights);
#                                           # prep8b, prep49 and prep70b: the same
#   bash benchmarks/on_gpu.sh notebooks     # both notebooks as `make job` runs them (PRESET "auto", the offline
#                                           # models, every GPU of the machine): durations, summaries, settings
#   bash benchmarks/on_gpu.sh text8b-raw    # warm-up of both sides, then raw vLLM: 100,000 prompts, 8B shape
#   bash benchmarks/on_gpu.sh text8b-kit    # the kit against that raw side: auto (2 replicas, fixed pool)
#   bash benchmarks/on_gpu.sh text8b-kit3   # the same with 3 replicas on the GPU (ENGINE replicas_per_gpu 3)
#   bash benchmarks/on_gpu.sh text8b-kit1   # the same with 1 replica (replicas_per_gpu 1)
#   bash benchmarks/on_gpu.sh text8b-kit-s1 # the same as text8b-kit with each light stage holding 1 CPU (stage_cpus 1)
#   bash benchmarks/on_gpu.sh text8b-stage-cpus  # the kit alone at 100,000 prompts: the default stage CPUs, 1, the default
#                                           # (STAGE_RUNS="warm default one default2 one2": names starting
#                                           # "one" hold 1 CPU, "warm" is LIMIT 2000, the rest the default)
#   bash benchmarks/on_gpu.sh profile8b     # the text notebook's cells before the pipeline, timed and
#                                           # profiled (benchmarks/profile_cells.py), 100,000 prompts, 8B shape
#   bash benchmarks/on_gpu.sh vl3b-raw      # warm-up, then raw vLLM: 10,000 images, Qwen2.5-VL-3B shape
#   bash benchmarks/on_gpu.sh vl3b-kit      # the kit against that raw side: auto (1 replica)
#   bash benchmarks/on_gpu.sh vl3b-kit2     # the kit with 2 replicas on the GPU against the same raw side
#   bash benchmarks/on_gpu.sh vl3b-short    # 500 images on 2 engines: the kit, a control with max_concurrent_batches 72
#                                           # (Ray's rule: a ready replica takes up to 144), the kit (SHORT_IMAGES=N: N images)
#   bash benchmarks/on_gpu.sh smol          # SmolLM2, 100,000 prompts, warm-up first, both sides
#   bash benchmarks/on_gpu.sh text8b-1m-kit # the kit's notebook on 1,000,000 prompts (auto), its cells' times
#                                           # (text8b-1m-kit.cells.json) and its Ray logs' engine lines
#                                           # (text8b-1m-kit.ray.txt, text8b-1m-kit.raylogs.tgz)
#   RAW_ROWS=N bash benchmarks/on_gpu.sh text8b-1m-raw  # raw vLLM on the first N of those prompts, compared
#                                           # row by row with the kit's answers to them
# Several GPUs of one host: the kit alone, `PRESET="auto"`, each run on the GPUs it names through
# CUDA_VISIBLE_DEVICES (the rest of the machine's GPUs idle, and shown so in the per-GPU timeline):
#   bash benchmarks/on_gpu.sh text8b-warm   # 2,000 prompts on GPU 0 (compiles the 8B engine once; not a measurement)
#   bash benchmarks/on_gpu.sh text8b-gpus1  # 100,000 prompts (ROWS), 8B shape, on GPU 0
#   bash benchmarks/on_gpu.sh text8b-gpus2  # the same on GPUs 0,1
#   bash benchmarks/on_gpu.sh text8b-gpus4  # the same on GPUs 0,1,2,3 (text8b-gpusN: the first N GPUs)
#   bash benchmarks/on_gpu.sh text70b-auto  # 10,000 prompts (ROWS), 70B shape, GPUs 0-3, "auto" (4 x H100: tp=4 x 1;
#                                           # 4 x H200: tp=2 x 2)
#   bash benchmarks/on_gpu.sh text70b-tp4   # the same with the preset text-llama70b-h100-tp4, ENGINE concurrency 1
#                                           # (tp=4 x 1), max_model_len 256, accelerator_type the machine's (H100 or H200)
#   bash benchmarks/on_gpu.sh text70b-tp2x2 # the same with ENGINE tensor_parallel_size 2, concurrency 2 (tp=2 x 2),
#                                           # max_model_len 256
#   bash benchmarks/on_gpu.sh text70b-fp8-tp2  # 10,000 prompts (ROWS), 70B shape, the preset text-llama70b-a100-fp8
#                                           # on GPUs 0,1 (accelerator_type the machine's, concurrency 1: tp=2 x 1, fp8)
#   bash benchmarks/on_gpu.sh text8b-cold   # the first 8B engine on the machine: 20,000 prompts (ROWS) on GPU 0
#   bash benchmarks/on_gpu.sh engine-start  # one vllm.LLM engine per setting (ENGINE_SETTINGS; bench_engine_start.py)
#   bash benchmarks/on_gpu.sh text8b-conf1  # text8b-gpus1 with CONFIDENCE on (text8b-confN: text8b-gpusN's GPUs);
#                                           # KIT_PARAMS='{"ENGINE": {"replicas_per_gpu": 3}}' adds parameters to
#                                           # any text step run through kit_alone
#   bash benchmarks/on_gpu.sh logprobs      # one vllm.LLM engine, 8B shape, GPU 0: each way of asking for
#                                           # log-probabilities (benchmarks/bench_logprobs.py), ROWS prompts each
#   bash benchmarks/on_gpu.sh vlm-engine    # one vllm.LLM engine of the offline VLM on GPU 0, 4 small images, with the
#                                           # engine arguments and requests of the captioning notebook (bench_pipeline's
#                                           # raw side)
#   bash benchmarks/on_gpu.sh vl3b-gpus2    # captions: 10,000 small images (IMAGES), 3B VL shape, GPUs 0,1, auto
#   bash benchmarks/on_gpu.sh twonode8b     # two Ray nodes on this host (GPU 0 the head's, GPU 1 the worker's, in
#                                           # a mount namespace of its own), the text notebook joining them (RAY_ADDRESS)
#   bash benchmarks/on_gpu.sh text8b-compiled  # text8b-gpus1 with ENGINE torch_compile True (vLLM's torch.compile)
#   bash benchmarks/on_gpu.sh importtime    # `import vllm` and vLLM's engine-core module in fresh processes, twice:
#                                           # wall time and the slowest modules (python -X importtime)
#   bash benchmarks/on_gpu.sh gpu-detect    # the GPUs as the kit reads them from CUDA's driver (cluster.local_gpus)
#                                           # beside torch's numbers; then with no GPU visible
#   bash benchmarks/on_gpu.sh kept8b        # the kit's kept engines against Ray Data LLM's per-run processor
#                                           # (bench_kept_engines.py): ROWS prompts (100,000) each, 8B shape, GPUS (1) GPUs,
#                                           # SIDES in order (per-run,kept; kept-batch: the kit's engines, a batch per
#                                           # call; kept: Serve LLM; echo: Serve's path with no model), 3 short re-runs
#                                           # on each side's kept engines; CONFIDENCE=1: with each answer's
#                                           # confidence (the per-run and kept-batch sides); ENGINE='{"replicas_per_gpu": 3}':
#                                           # engine settings (JSON); PROFILE=SIDE,...: py-spy on those sides
#   bash benchmarks/on_gpu.sh text8b-second # a second run in the same kernel (bench_second_run.py): the text
#                                           # notebook run twice in one live kernel (engines kept), the prompt changed
#                                           # between; 20,000 prompts (ROWS) each, 8B shape, GPUS (1) GPUs;
#                                           # KIT_PARAMS as kit_alone's; Ray's task timeline: $step.ray-timeline.json
# Each kit step also prints its start marks: its cells before the pipeline, and its first result file,
# in seconds from the notebook's first cell.
# Each prints the timings, rows/s in steady state, the row accounting, each GPU's busy share and memory
# over the results' span (never averaged over GPUs), vLLM's KV cache per engine beside the kit's
# estimate, and the settings table as the notebook's configuration makes it (what auto chose, and why).
# Beside its log: $step.smi.csv (each GPU per second) and $step.top.txt (the 12 busiest processes per 5 s).
#
# Steps longer than a command's 10 minutes run back to back, detached, on one warm machine, polled by
# later calls that copy the results into $OUT, e.g. (RESULTS.md names the steps of each recorded session):
#   setsid bash -c 'for s in prep text8b-raw text8b-kit text8b-kit3; do OUT=/root/res bash benchmarks/on_gpu.sh $s; done' &
# (not /root/out: that was $OUT there, emptied at the start of every command.) Several GPUs of one host
# ran with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0.
set -euo pipefail
step="$1"
out="${OUT:-/tmp}"
work=/root/bench
export VLLM_LOGGING_LEVEL=INFO
# A model's folder with random weights (built once, a few seconds; benchmarks/random_weights.py).
shape() { python3 benchmarks/random_weights.py "$1"; }
case "$step" in  # the folders the step loads, built before its timeline starts
  prep*|importtime|gpu-detect|smol|notebooks|vlm-engine) ;;
  vl3b*) qwen=$(shape Qwen/Qwen2.5-VL-3B-Instruct) ;;
  text70b*) llama70=$(shape meta-llama/Llama-3.1-70B-Instruct) ;;
  *) llama=$(shape unsloth/Llama-3.1-8B-Instruct) ;;
esac
dummy="'engine_kwargs': {'load_format': 'dummy'}"  # for the commands that take ENGINE as it is (no run_settings)
bench() { python3 benchmarks/bench_pipeline.py "$@"; }
# FOLDER/companies.csv, N distinct companies (bench_pipeline.text_input), made once; prints its path.
#   companies N FOLDER
companies() { python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import bench_pipeline as b
csv = Path('$2') / 'companies.csv'
print(csv if csv.exists() else b.text_input($1, csv.parent))"; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE 'H100|H200' || echo H100)  # named presets' type here
# The kit's text notebook alone on ROWS prompts (one input per row count, made once under $work), timed
# through bench_pipeline's own functions; then the configuration the notebook made for the same parameters.
#   kit_alone FOLDER MODEL ROWS '{"NAME": value, ...}'   (notebook parameters beyond the benchmark's, JSON)
kit_alone() { python3 - "$@" <<'PY'
import json, os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import bench_pipeline as b
from helpers import plans
from helpers.presets import GIB
work, model, rows, extra = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
extra.update(json.loads(os.environ.get("KIT_PARAMS") or "{}"))  # more parameters for one run, e.g. its ENGINE
devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
settings = b.run_settings("text", {"MODEL_SOURCE": model, **extra})
csv = work.parent / f"input-{rows}" / "companies.csv"
if not csv.exists():
    b.text_input(rows, csv.parent)
print(f"kit alone, {rows:,} prompts of {csv}, CUDA_VISIBLE_DEVICES={devices}, parameters {settings}", flush=True)
timing, folder, seen = b.kit_timing("text_classification", {**settings, "INPUT_PATH": str(csv)}, work)
summary = json.loads((folder / "summary.json").read_text())
written, rate = summary["rows written in this run"], summary["rows/s steady state"]
print(f"RESULT {devices}: whole {timing.whole_s:.1f} s, pipeline {timing.pipeline_s:.1f} s, steady state "
      f"{timing.generate_s:.1f} s ({rate} rows/s; {summary['steady state']}); rows written {written} of {rows}")
print("accounting: " + ", ".join(f"{k} {summary[k]}" for k in ("rows read", "rejected before the model", "classified",
                                                                "engine errors", "postprocess errors") if k in summary)
      + f"; checks {dict((k, v) for k, v in summary.items() if v is True or v is False)}")
for line in b.gpu_lines(seen["gpu"]):
    print(f"per GPU over the results' span, {line}")
print("kit notebook, slowest cells (s): " + "; ".join(f"{t:.1f} {line}" for t, line in seen["cells"]))
print(f"start marks (s from the first cell): {seen['marks']}")
# The configuration the notebook made (its settings table), fitted again for the same parameters and GPUs.
plan = b.text_setup(csv, settings).plan
print(plan.table().to_string())
print(f"engine arguments: {plan.engine_args}; Ray pool {plan.actor_pool}")
print(f"KV cache per engine, {b.kv_line('kit', seen['kv_cache_tokens'], plan)}")
if plan.kv_bytes is not None:  # each GPU's memory beside the kit's budget
    weights = plan.shape.weight_bytes(plan.quantization) / plan.world
    print(f"memory per GPU, the kit's plan: {plan.replicas_per_gpu} engine(s) x gpu_memory_utilization {plan.memory_share} "
          f"of {plan.gpu_memory:.1f} GiB, of which weights {plan.replicas_per_gpu * weights / GIB:.1f} GiB and KV cache "
          f"~{plan.replicas_per_gpu * plan.kv_bytes / GIB:.1f} GiB; measured: see the per-GPU lines above")
PY
}
# The kit's captioning notebook alone on IMAGES small images (made once under $work), through
# bench_pipeline's own functions: timings, per-GPU use, batches per engine process, the configuration.
#   caption_alone FOLDER MODEL IMAGES '{"NAME": value, ...}'
caption_alone() { python3 - "$@" <<'PY'
import json, os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import bench_pipeline as b
from helpers import plans
work, model, count, extra = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
images = b.image_input(count, work.parent / f"images-{count}", "small")
settings = b.run_settings("vision", {"MODEL_SOURCE": model, **extra})
params = {**settings, "INPUT_PATH": str(images), "INPUT_FORMAT": "images"}
print(f"kit alone, {count:,} images of {images}, CUDA_VISIBLE_DEVICES={devices}, parameters {params}", flush=True)
timing, folder, seen = b.kit_timing("vlm_captioning", params, work)
summary = json.loads((folder / "summary.json").read_text())
print(f"RESULT {devices}: whole {timing.whole_s:.1f} s, pipeline {timing.pipeline_s:.1f} s, steady state "
      f"{timing.generate_s:.1f} s ({summary.get('rows/s steady state')} images/s; {summary.get('steady state')})")
print("summary: " + json.dumps(summary, default=str)[:2500])
print(f"batch lines per engine process: {b.batches_per_engine()}")
for line in b.gpu_lines(seen["gpu"]):
    print(f"per GPU over the results' span, {line}")
print("kit notebook, slowest cells (s): " + "; ".join(f"{t:.1f} {line}" for t, line in seen["cells"]))
print(f"start marks (s from the first cell): {seen['marks']}")
plan = b.caption_setup(images, settings).plan
print(plan.table().to_string())
print(f"engine arguments: {plan.engine_args}; Ray pool {plan.actor_pool}")
PY
}
# Which node each of the run's actors ran on (Ray's state API; the cluster still up), and each node's GPUs.
engines_per_node() { python3 - "$1" <<'PY'
import collections, sys
import ray
# `ray start` turned token authentication on; Ray 2.60 internal: the rule Ray applies to a cluster it starts.
from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
ray.init(address=sys.argv[1], log_to_driver=False)
nodes = {n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']} GPUs {n['Resources'].get('GPU', 0):.0f}"
         for n in ray.nodes() if n["Alive"]}
# The head runs without a dashboard, so Ray's state API cannot answer: the GCS's actor table (the run's
# actors, dead or alive, with the node each ran on).
table = ray._private.state.actors().values()
seen = collections.Counter((a["ActorClassName"], nodes.get(a["Address"]["NodeID"], a["Address"]["NodeID"])) for a in table)
for (name, node), n in sorted(seen.items()):
    print(f"actors {name} on node {node}: {n}")
PY
}
mkdir -p "$out"
# A step cut by a time limit can leave an engine holding its share of the GPU: end those first.
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
  echo "ending a leftover GPU process $pid"; kill -9 "$pid" 2>/dev/null || true
done
smi="$out/$step.smi.csv"
# One line per GPU and second (index first): gpu_timeline.py reads each GPU on its own, never averaged.
nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$smi" &
sampler=$!
# Each process's share of a core per 5 s (top's own interval), the 12 busiest: which one sets the pace.
top -b -c -d 5 -w 220 | awk '/^top -/ {n = 0} n++ < 19' > "$out/$step.top.txt" &
cpus=$!
set -o pipefail
{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "cores: $(nproc); CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
  date -u
  case "$step" in
    prep|prep8b|prep49|prep70b) python3 -c "from helpers import models; print(models.prepare_smollm2())"
      shape unsloth/Llama-3.1-8B-Instruct; shape meta-llama/Llama-3.1-70B-Instruct; shape Qwen/Qwen2.5-VL-3B-Instruct ;;
    text8b-raw) bench --task text --rows 100000 --workdir $work/8b --side raw --warmup 1000 -p MODEL_SOURCE "$llama" ;;
    text8b-kit) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" ;;
    text8b-kit3) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" \
      -p ENGINE "{'replicas_per_gpu': 3}" ;;
    text8b-kit1) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" \
      -p ENGINE "{'replicas_per_gpu': 1}" ;;
    text8b-kit-s1) bench --task text --rows 100000 --workdir $work/8b --side kit -p MODEL_SOURCE "$llama" \
      -p ENGINE "{'stage_cpus': 1}" ;;
    # The kit alone, 100,000 prompts: a 2,000-prompt warm-up, then the default stage CPUs, 1, the default again
    # (or the runs STAGE_RUNS names); each run's cell times and summary in $out/$step.cells.txt.
    text8b-stage-cpus) companies 100000 $work/stage
      for name in ${STAGE_RUNS:-warm default one default2}; do
        case "$name" in warm) extra=(-p LIMIT 2000) ;; *) extra=() ;; esac
        cpus=""; [[ "$name" == one* ]] && cpus=", 'stage_cpus': 1"
        echo "$name start $(date -u +%T)"
        python3 scripts/run_notebooks.py --only text_classification --out "$work/stage/$name" -p MODEL_SOURCE "$llama" \
          -p INPUT_PATH "$work/stage/companies.csv" -p RESUME False -p ENGINE "{$dummy$cpus}" "${extra[@]}"
        echo "$name end $(date -u +%T)"
        python3 - "$work/stage/$name/text_classification" "$name" >> "$out/$step.cells.txt" <<'PY'
import json, sys
import nbformat
folder, name = sys.argv[1], sys.argv[2]
nb = nbformat.read(f"{folder}/text_classification.ipynb", as_version=4)
print("==", name, "whole", round(nb.metadata["papermill"]["duration"], 1))
for i, c in enumerate(nb.cells):
    if c.cell_type == "code":
        print(f"  cell {i:2d} {c.metadata['papermill']['duration']:7.2f} s {c.source.splitlines()[0][:60]}")
print("  summary:", json.dumps(json.load(open(f"{folder}/summary.json")), default=str)[:1500])
PY
      done ;;
    profile8b) companies 100000 $work/profile
      python3 benchmarks/profile_cells.py text_classification --top 25 -p MODEL_SOURCE "'$llama'" -p ENGINE "{$dummy}" \
        -p INPUT_PATH "'$work/profile/companies.csv'" -p OUTPUT_DIR "'$work/profile/out'" ;;
    vl3b-raw) bench --task caption --images 10000 --photos small --workdir $work/vl --side raw --warmup 500 -p MODEL_SOURCE "$qwen" ;;
    vl3b-kit) bench --task caption --images 10000 --photos small --workdir $work/vl --side kit -p MODEL_SOURCE "$qwen" ;;
    vl3b-kit2) bench --task caption --images 10000 --photos small --workdir $work/vl --side kit -p MODEL_SOURCE "$qwen" \
      -p ENGINE "{'replicas_per_gpu': 2}" ;;
    # A short run on two engines: 500 images (32 batches of 16; SHORT_IMAGES), the kit's defaults (each replica holds
    # at most its share, 16), then the control with max_concurrent_batches 72 given (Ray's rule: a ready replica takes
    # up to 144), then the kit again; each run's batch lines per engine process (Ray Data LLM's "Elapsed time for
    # batch" in the worker logs) and the batches the configuration lets each replica hold.
    vl3b-short) python3 - "$work/short-${SHORT_IMAGES:-500}" "$qwen" "${SHORT_IMAGES:-500}" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import bench_pipeline as b
work, qwen, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
images = b.image_input(count, work, "small")
for name, extra in (("kit", {}), ("control", {"max_concurrent_batches": 72}), ("kit-again", {})):
    settings = b.run_settings("vision", {"MODEL_SOURCE": qwen, "ENGINE": {"replicas_per_gpu": 2, **extra}})
    timing, folder, seen = b.kit_timing("vlm_captioning", {**settings, "INPUT_PATH": str(images), "INPUT_FORMAT": "images"},
                                        work / name)
    summary = json.loads((folder / "summary.json").read_text())
    print(f"{name}: whole {timing.whole_s:.1f} s, pipeline {timing.pipeline_s:.1f} s, captioned "
          f"{summary.get('captioned')}, batch lines per engine process {b.batches_per_engine()}; over the results' span: "
          + "; ".join(b.gpu_lines(seen["gpu"])), flush=True)
    plan = b.caption_setup(images, settings).plan
    why = dict(plan.reasons)
    print(f"  settings: max_concurrent_batches {plan.max_concurrent_batches} ({why.get('max_concurrent_batches', 'given')})",
          flush=True)
PY
    ;;
    # `make job` on this machine: both notebooks, defaults, every GPU; each one's time, summary and settings table.
    notebooks) python3 scripts/run_notebooks.py --out $work/notebooks
      python3 - $work/notebooks <<'PY'
import json, sys
from pathlib import Path
import nbformat
for folder in sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_dir()):
    nb = nbformat.read(folder / f"{folder.name}.ipynb", as_version=4)
    print(f"== {folder.name}: {nb.metadata['papermill']['duration']:.1f} s")
    print("summary:", json.dumps(json.loads((folder / "summary.json").read_text()), default=str)[:2000])
    for cell in nb.cells:  # the settings table the check cell showed
        text = "".join(o.get("text") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))
        if "why" in text and "setting" in text:
            print(text[:3000])
PY
      # What the last notebook's engines said when they failed (Ray's worker logs; they go with the machine).
      grep -h -A40 -E "Traceback|Error" /tmp/ray/session_latest/logs/worker*.err /tmp/ray/session_latest/logs/worker*.out \
        2>/dev/null | tail -600 > "$out/$step.errors.txt" || true
      ;;
    smol) bench --task text --rows 100000 --workdir $work/smol --warmup 2000 ;;
    # The kit alone, through bench_pipeline's own functions (its --side kit needs the raw side first).
    text8b-1m-kit) python3 - "$work/1m" "$llama" "$out/$step" <<'PY'
import json, sys, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
import nbformat
import bench_pipeline as b
work, llama, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
settings = b.run_settings("text", {"MODEL_SOURCE": llama})
made = time.perf_counter()
csv = b.text_input(1_000_000, work / "text")
print(f"input: {csv} in {time.perf_counter() - made:.0f} s", flush=True)
print(f"kit notebook starts at {time.time():.3f}", flush=True)
timing, folder, seen = b.kit_timing("text_classification", {**settings, "INPUT_PATH": str(csv)}, work / "text")
summary = json.loads((folder / "summary.json").read_text())
rows = summary["rows written in this run"]
print(f"kit, 1,000,000 prompts: whole {timing.whole_s:.1f} s, pipeline {timing.pipeline_s:.1f} s, "
      f"steady state {timing.generate_s:.1f} s ({summary['rows/s steady state']} rows/s; {summary['steady state']}); "
      f"rows written {rows}; whole minus pipeline {timing.whole_s - timing.pipeline_s:.1f} s")
for line in b.gpu_lines(seen["gpu"]):
    print(f"kit in steady state, {line}")
print(f"kit KV cache per engine (vLLM's log): {seen['kv_cache_tokens']}")
print(f"kit summary: {json.dumps(summary, default=str)[:3000]}")
# Every cell's start, end and duration as papermill recorded them, and the end of its printed output.
cells = []
for index, cell in enumerate(nbformat.read(folder / "text_classification.ipynb", as_version=4).cells):
    if cell.cell_type != "code":
        continue
    pm = cell.metadata.get("papermill") or {}
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    cells.append({"cell": index, "first_line": (cell.source.strip().splitlines() or [""])[0][:100],
                  "start": pm.get("start_time"), "end": pm.get("end_time"), "duration_s": pm.get("duration"),
                  "output_tail": text[-1500:]})
Path(prefix + ".cells.json").write_text(json.dumps({"folder": str(folder), "whole_s": timing.whole_s,
                                                    "pipeline_s": timing.pipeline_s, "cells": cells}, indent=1))
for c in cells:
    print(f"cell {c['cell']:2d} {c['duration_s'] or 0:7.1f} s  {c['start']}  {c['first_line']}")
PY
      # The engine actors' lines, with their times: the first 400 lines of every worker's log (actor
      # start, vLLM's import and engine start), Ray's own lines on actors and workers, Ray Data's log.
      python3 - /tmp/ray/session_latest/logs "$out/$step.ray.txt" <<'PY'
import re, sys
from pathlib import Path
logs, target = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
lines = [f"# {logs}"]
for f in sorted(logs.rglob("*")):
    if not f.is_file():
        continue
    name = str(f.relative_to(logs))
    try:
        text = f.read_text(errors="replace").splitlines()
    except OSError:
        continue
    if name.startswith("worker-") and f.suffix in (".out", ".err"):
        keep = text[:400]
    elif name.startswith("python-core-worker-"):
        keep = text[:15] + [l for l in text[15:] if re.search(r"actor|Actor", l)][:40]
    elif name.startswith(("gcs_server", "raylet")):
        keep = [l for l in text if re.search(r"[Aa]ctor|[Ww]orker.*(start|regist)|placement", l)][:400]
    elif "ray-data" in name:
        keep = text[:1500]
    else:
        continue
    if keep:
        lines.append(f"===== {name} ({len(text)} lines)")
        lines += [l[:400] for l in keep]
target.write_text("\n".join(lines) + "\n")
print(f"{target}: {len(lines)} lines from {logs}")
PY
      tar -C /tmp/ray/session_latest/logs -czf "$out/$step.raylogs.tgz" --exclude='*.pb' . 2>/dev/null || true
      [ "$(stat -c %s "$out/$step.raylogs.tgz")" -lt 15000000 ] || rm -f "$out/$step.raylogs.tgz" ;;
    text8b-1m-raw) python3 - "$work/1m" "$llama" "${RAW_ROWS:?RAW_ROWS: how many of the prompts raw vLLM runs}" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import pandas as pd
import bench_pipeline as b
work, llama, rows = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
settings = b.run_settings("text", {"MODEL_SOURCE": llama})
csv = b.text_input(rows, work / "raw")
whole_input = pd.read_csv(work / "text" / "companies.csv", nrows=rows)
assert whole_input.equals(pd.read_csv(csv)), "the raw side's rows are not the first rows of the kit's input"
setup = b.text_setup(csv, settings)  # as bench_text: one engine with the whole GPU
timing, raw = b.run_raw("text", setup.spec, work / "raw")
print(f"raw vLLM, {rows:,} prompts ({setup.name}): whole {timing.whole_s:.1f} s, pipeline {timing.pipeline_s:.1f} s, "
      f"steady state (chat) {timing.generate_s:.1f} s = {rows / timing.generate_s:,.0f} prompts/s; "
      f"engine start {raw['start_s']:.1f} s")
print(f"raw tokens/s in steady state: {raw['output_tokens'] / timing.generate_s:,.0f} generated, "
      f"{(raw['input_tokens'] + raw['output_tokens']) / timing.generate_s:,.0f} in all")
for line in b.gpu_lines(raw["gpu"]):
    print(f"raw in steady state, {line}")
print(f"raw KV cache {raw['kv_cache_tokens']}")
print(f"raw settings: {setup.spec['engine_kwargs']}")
kit = b.kit_results(work / "text" / "kit" / "text_classification", "predictions.parquet", "Customer Id",
                    lambda r: r["predicted_label"])
ids = pd.read_csv(csv)["Customer Id"].tolist()
mine = {**kit, **{k: {i: kit[k][i] for i in ids if i in kit[k]} for k in ("answers", "digests")}}
checked = b.agreement(raw, mine, ids)
print(f"raw vs the kit's answers to the same {rows:,} prompts (the kit ran all 1,000,000; "
      f"{len(kit['answers']):,} answered):" + "".join(f"\n  {line}" for line in checked.lines()))
sys.exit(0 if checked.ok else 1)
PY
      ;;
    kept8b) CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((${GPUS:-1} - 1))) python3 benchmarks/bench_kept_engines.py --rows "${ROWS:-100000}" --sides "${SIDES:-per-run,kept}" \
      --workdir $work/kept --params "{\"MODEL_SOURCE\": \"$llama\"${CONFIDENCE:+, \"CONFIDENCE\": true}${ENGINE:+, \"ENGINE\": $ENGINE}}" \
      ${PROFILE:+--profile "$PROFILE" --profile-after "${PROFILE_AFTER:-20}" --out "$out"} ;;
    text8b-warm) CUDA_VISIBLE_DEVICES=0 kit_alone $work/scale/warm "$llama" 2000 '{}' ;;
    text8b-gpus[1-9]) n=${step#text8b-gpus}
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) kit_alone $work/scale/gpus$n "$llama" "${ROWS:-100000}" '{}' ;;
    text70b-auto) CUDA_VISIBLE_DEVICES=0,1,2,3 kit_alone $work/scale/70b-auto "$llama70" "${ROWS:-10000}" '{}' ;;
    text70b-tp4) CUDA_VISIBLE_DEVICES=0,1,2,3 kit_alone $work/scale/70b-tp4 "$llama70" "${ROWS:-10000}" \
      "{\"PRESET\": \"text-llama70b-h100-tp4\", \"ENGINE\": {\"accelerator_type\": \"$gpu\", \"concurrency\": 1, \"max_model_len\": 256}}" ;;
    text70b-tp2x2) CUDA_VISIBLE_DEVICES=0,1,2,3 kit_alone $work/scale/70b-tp2x2 "$llama70" "${ROWS:-10000}" \
      '{"ENGINE": {"tensor_parallel_size": 2, "concurrency": 2, "max_model_len": 256}}' ;;
    text70b-fp8-tp2) CUDA_VISIBLE_DEVICES=0,1 kit_alone $work/scale/70b-fp8 "$llama70" "${ROWS:-10000}" \
      "{\"PRESET\": \"text-llama70b-a100-fp8\", \"ENGINE\": {\"accelerator_type\": \"$gpu\", \"concurrency\": 1}}" ;;
    # The kit's first 8B engine on this machine (torch.compile's cache cold): the start marks, 20,000 prompts.
    text8b-cold) CUDA_VISIBLE_DEVICES=0 kit_alone $work/scale/cold "$llama" "${ROWS:-20000}" '{}' ;;
    # One vllm.LLM engine per setting, each in a fresh process (benchmarks/bench_engine_start.py).
    engine-start) CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_engine_start.py "$llama" \
        ${ENGINE_SETTINGS:-default kit-sizes no-compile kit} --prompts "${PROMPTS:-10000}" ;;
    # The cost of CONFIDENCE on the GPU: the same 100,000 prompts with CONFIDENCE on (text8b-gpusN: off).
    text8b-conf[1-9]) n=${step#text8b-conf}
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) kit_alone $work/scale/conf$n "$llama" "${ROWS:-100000}" '{"CONFIDENCE": true}' ;;
    logprobs) CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_logprobs.py --model "$llama" --rows "${ROWS:-20000}" \
        --profile k20 --out "$out/logprobs" ;;
    # The offline VLM's engine alone (bench_pipeline's raw side: one vllm.LLM in a process of its own with the
    # notebook's engine arguments and requests): an engine that fails to start says why in this log (in a
    # notebook the reason is in Ray's worker logs).
    vlm-engine) CUDA_VISIBLE_DEVICES=0 bench --task caption --images 4 --photos small --side raw --workdir $work/vlm-engine ;;
    # Captions on GPUs 0,1: 10,000 small images (IMAGES), the 3B VL shape, auto.
    vl3b-gpus2) CUDA_VISIBLE_DEVICES=0,1 caption_alone $work/vl2/kit "$qwen" "${IMAGES:-10000}" '{}' ;;
    # Two Ray nodes on this host: a head with GPU 0 and a worker with GPU 1 in a mount namespace of its own
    # (a tmpfs over /root/node-disk, as the CPU two-node test); OUTPUT_DIR and the model's folder under /root,
    # which both see. The kit's text notebook joins the cluster `ray start` left running (RAY_ADDRESS), as a job would.
    twonode8b) rayc="python3 -m ray.scripts.scripts"  # the CLI, wherever pip put its script
      $rayc stop --force >/dev/null 2>&1 || true
      # `ray start` turns token authentication on: every node and the driver use the same token (a worker
      # started without RAY_AUTH_MODE=token was refused on 2026-11-27, and the run had the head alone).
      $rayc get-auth-token --generate >/dev/null 2>&1 || true; export RAY_AUTH_MODE=token
      half=$(( $(nproc) / 2 )); mkdir -p /root/node-disk
      CUDA_VISIBLE_DEVICES=0 $rayc start --head --node-ip-address 127.0.0.1 --port 6390 --num-gpus 1 --num-cpus $half \
        --disable-usage-stats --include-dashboard false --node-manager-port 6410 --object-manager-port 6411 \
        --dashboard-agent-listen-port 6412 --dashboard-agent-grpc-port 6413 --metrics-export-port 6414 \
        --runtime-env-agent-port 6415
      worker="$rayc start --address 127.0.0.1:6390 --node-ip-address 127.0.0.1 --num-gpus 1 --num-cpus $half \
        --disable-usage-stats --node-manager-port 6420 --object-manager-port 6421 --dashboard-agent-listen-port 6422 \
        --dashboard-agent-grpc-port 6423 --metrics-export-port 6424 --runtime-env-agent-port 6425"
      if unshare -m true 2>/dev/null; then
        CUDA_VISIBLE_DEVICES=1 unshare -m --propagation private sh -c "mount -t tmpfs node1 /root/node-disk && exec $worker"
        echo "worker node: its own mount namespace (tmpfs over /root/node-disk)"
      else
        CUDA_VISIBLE_DEVICES=1 sh -c "exec $worker"; echo "worker node: unshare -m not permitted here; same mounts"
      fi
      $rayc status || true
      nodes=$(python3 -c "
import ray
from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
maybe_enable_token_auth_if_token_available(warn_if_disabled=False)  # Ray 2.60 internal, as cluster.start does
ray.init(address='127.0.0.1:6390', log_to_driver=False); print(sum(1 for n in ray.nodes() if n['Alive']))")
      [ "$nodes" = 2 ] || { echo "two-node cluster: $nodes node(s) alive, not 2: stopping"; $rayc stop --force; exit 1; }
      RAY_ADDRESS=127.0.0.1:6390 kit_alone $work/twonode "$llama" "${ROWS:-100000}" '{}' || status=$?
      engines_per_node 127.0.0.1:6390 || true
      python3 -c "
import pandas as pd
p = pd.read_parquet('$work/twonode/kit/text_classification/predictions.parquet'); ids = p['Customer Id']
print(f'predictions: {len(p)} rows, {ids.nunique()} distinct ids')" || true
      $rayc stop --force >/dev/null 2>&1 || true
      exit "${status:-0}" ;;
    # The kit's GPU engines do not compile by default; this compiles (vLLM's torch.compile).
    text8b-compiled) CUDA_VISIBLE_DEVICES=0 kit_alone $work/scale/compiled "$llama" "${ROWS:-100000}" \
      '{"ENGINE": {"torch_compile": true}}' ;;
    # What importing vLLM costs each engine (its actor, then its engine-core process): two fresh processes.
    importtime) for i in 1 2; do
        python3 -X importtime -c "
import time; t = time.perf_counter(); import vllm; a = time.perf_counter(); import vllm.v1.engine.core, vllm.v1.engine.async_llm
print(f'import vllm {a - t:.1f} s; then its engine core and AsyncLLM {time.perf_counter() - a:.1f} s')" 2> "$out/importtime$i.txt"
        python3 - "$out/importtime$i.txt" <<'PY'
import re, sys
rows = [re.match(r"import time:\s*(\d+) \|\s*(\d+) \|(\s*)(\S+)", l) for l in open(sys.argv[1])]
rows = [(int(m[2]), len(m[3]) // 2, m[4]) for m in rows if m]
print(f"{len(rows)} modules; top-level packages by cumulative time:")
for us, depth, name in sorted((r for r in rows if r[1] <= 1), reverse=True)[:15]:
    print(f"  {us / 1e6:6.2f} s  {name}")
print("slowest modules at any depth (cumulative):")
for us, depth, name in sorted(rows, reverse=True)[:30]:
    print(f"  {us / 1e6:6.2f} s  {'  ' * min(depth, 6)}{name}")
PY
      done ;;
    # The GPUs read from CUDA's driver without torch (what "auto" plans on), beside torch's.
    gpu-detect) python3 -c "
import time; t = time.perf_counter()
from helpers import cluster
count, name, memory = cluster.local_gpus(); driver_s = time.perf_counter() - t
t = time.perf_counter(); import torch; imported_s = time.perf_counter() - t
t = time.perf_counter(); n = torch.cuda.device_count(); p = torch.cuda.get_device_properties(0); torch_s = time.perf_counter() - t
print(f'driver: {count} x {name}, {memory:.3f} GiB in {driver_s:.2f} s; torch: {n} x {p.name}, '
      f'{p.total_memory / 1024**3:.3f} GiB in {torch_s:.2f} s after {imported_s:.2f} s of import')
same = (count, name, round(memory, 3)) == (n, p.name, round(p.total_memory / 1024**3, 3))
print('the driver and torch agree' if same else 'THE DRIVER AND TORCH DIFFER')"
      CUDA_VISIBLE_DEVICES= python3 -c "from helpers import cluster; print('no GPU visible:', cluster.local_gpus())" ;;
    text8b-second) n=${ROWS:-20000}; csv=$(companies $n $work/scale/input-$n)
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((${GPUS:-1} - 1))) python3 benchmarks/bench_second_run.py --input "$csv" --workdir $work/second \
        -p MODEL_SOURCE "'$llama'" --params "${KIT_PARAMS:-}" --ray-timeline "$out/$step.ray-timeline.json" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
} 2>&1 | tee "$out/$step.log" || status=$?
kill "$sampler" "$cpus" 2>/dev/null || true
date -u | tee -a "$out/$step.log"
# The timeline: per 10 s, beside the engines' log lines (the kit's: Ray's session; raw's: its log).
case "$step" in
  text8b-warm) timeline_results=(--results $work/scale/warm) ;;
  text8b-cold) timeline_results=(--results $work/scale/cold) ;;
  text8b-conf*) timeline_results=(--results $work/scale/conf${step#text8b-conf}) ;;
  text8b-compiled) timeline_results=(--results $work/scale/compiled) ;;
  text8b-second) timeline_results=(--results $work/second/first --results $work/second/second) ;;
  vl3b-gpus2) timeline_results=(--results $work/vl2/kit) ;;
  twonode8b) timeline_results=(--results $work/twonode) ;;
  text8b-gpus*) timeline_results=(--results $work/scale/gpus${step#text8b-gpus}) ;;
  text70b-tp4) timeline_results=(--results $work/scale/70b-tp4) ;;
  text70b-auto) timeline_results=(--results $work/scale/70b-auto) ;;
  text70b-fp8-tp2) timeline_results=(--results $work/scale/70b-fp8) ;;
  text70b-tp2x2) timeline_results=(--results $work/scale/70b-tp2x2) ;;
  notebooks) timeline_results=(--results $work/notebooks/text_classification --results $work/notebooks/vlm_captioning) ;;
  *) timeline_results=(--results $work/8b/text/kit --results $work/vl/caption/kit --results $work/1m/text/kit) ;;
esac
python3 benchmarks/gpu_timeline.py "$smi" --logs /tmp/ray/session_latest/logs --logs $work \
  "${timeline_results[@]}" 2>&1 | tee -a "$out/$step.log"
exit "${status:-0}"
