#!/usr/bin/env bash
# On the GPU machine, after the pieces of benchmarks/stage_gpu_stack.sh were moved to /root/stage:
# check and join them, install the wheels into /tmp/site (ahead of the image's packages through
# benchmarks/gpu_env.sh), and import what the kit's GPU path needs.
set -euo pipefail
cd /root/stage
sha256sum -c --quiet SHA256SUMS
t0=$(date +%s)
mkdir -p /root/wheels && cat $(ls wheels.tar.* | sort) | tar -x -C /root/wheels
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site /root/wheels/*.whl
# torch finds its CUDA libraries beside it (RPATH $ORIGIN/../../nvidia/<lib>/lib): the image's own
# for each one not carried (NCCL is).
image=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')  # before gpu_env.sh
for d in "$image"/nvidia/*/; do
  name=$(basename "$d"); [ -e "/tmp/site/nvidia/$name" ] || ln -s "$d" "/tmp/site/nvidia/$name"
done
echo "installed in $(( $(date +%s) - t0 )) s: $(du -sh /tmp/site | cut -f1) in /tmp/site"
cd - >/dev/null
source benchmarks/gpu_env.sh
python3 - <<'PY'
import importlib
for name in ("torch", "triton", "torchvision", "transformers", "vllm", "ray", "ray.data.llm", "ray.serve.llm",
             "xgrammar", "flashinfer", "papermill", "helpers.plans",
             "ray.llm._internal.serve.engines.vllm.vllm_engine"):  # Serve LLM's engine (bench_kept_engines)
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
import torch
print(f"CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}, cuDNN {torch.backends.cudnn.version()}, "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
