# Source on the GPU machine, from the project's root, after benchmarks/install_gpu_stack.sh: the carried
# stack ahead of the image's packages, the project's root on the path of the driver, the papermill
# kernel and Ray's workers alike, nothing fetched from a hub, and NVLink multicast off (the machine's rule).
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
export JUPYTER_PATH=/tmp/site/share/jupyter
export LLM_KIT_CACHE=/root/.cache/llm-batch-kit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
