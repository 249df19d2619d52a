"""Named configurations for the notebooks: the GPU runs of Ray's tutorials, bigger GPUs, multi-GPU models, and
the offline CPU runs. Frozen dataclasses: a preset never changes under you, ``override`` returns a
new one, and an unknown field is an error that lists the valid ones.

``select("auto", task, cluster=...)`` fits the task's GPU preset to the GPUs the Ray cluster has
(or picks the offline CPU preset where there are none); see :func:`select`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gpu:
    """What the checks need to know about a GPU type."""

    name: str
    memory_gib: float
    #: NVLink/NVSwitch between the GPUs of a node; without it, tensor parallelism goes over PCIe.
    nvlink: bool


GPUS: dict[str, Gpu] = {g.name: g for g in [
    Gpu("T4", 16, False), Gpu("L4", 24, False), Gpu("A10G", 24, False), Gpu("L40S", 48, False),
    Gpu("A100-40G", 40, True), Gpu("A100-80G", 80, True), Gpu("H100", 80, True), Gpu("H200", 141, True),
    # What a node with A100s advertises (Ray labels GPUs by their NVML name, which does not say the
    # memory): the smaller of the two, unless the memory was measured.
    Gpu("A100", 40, True),
]}


@dataclass(frozen=True)
class Preset:
    """One run configuration; field names follow the notebooks' parameters (lower case)."""

    name: str
    task: str  # "text" or "vision"
    model_source: str
    accelerator_type: str | None
    concurrency: int | tuple[int, int]  # engine replicas; a pair (min, max) autoscales
    batch_size: int
    max_model_len: int
    num_blocks: int
    max_concurrent_batches: int = 4
    max_num_seqs: int = 256
    #: Prompt tokens the engine takes per step; None: what ``vllm.LLM`` uses on this hardware
    #: (:func:`offline_engine_defaults`), which Ray's engine stage would not get by itself.
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    #: Engine replicas that share one GPU, each with its share of the memory: where one engine's CPU
    #: side (scheduling, structured-output masks) cannot keep the GPU busy (short text requests).
    replicas_per_gpu: int = 1
    gpu_memory_utilization: float = 0.90  # of the GPU's memory, for all the replicas that share it
    quantization: str | None = None
    enforce_eager: bool = False
    #: Tokenize prompts in a CPU stage of their own (Ray's tokenize stage), off the engine actor's
    #: thread; None until :func:`select` resolves it: on for text on a GPU, off on a CPU and for images.
    tokenize_stage: bool | None = None
    #: The engine's weight and activation type; None: vLLM's "auto" (the checkpoint's, bfloat16 here)
    #: on GPUs, and on a CPU what that CPU computes fastest (:func:`cpu_dtype`), decided in :func:`select`.
    dtype: str | None = None
    #: The GPU's memory in GiB as measured (``"auto"`` on a local GPU); None: the known type's
    #: (:data:`GPUS`). Sizes the KV cache of replicas that share a GPU (:attr:`kv_cache_budget`).
    gpu_memory_gib: float | None = None
    description: str = ""
    #: For presets chosen by ``"auto"``: (field, why this value) pairs, shown in the settings table.
    reasons: tuple[tuple[str, str], ...] = ()

    @property
    def step_tokens(self) -> int:
        """Prompt tokens per engine step: ``max_num_batched_tokens``, else what ``vllm.LLM`` takes on
        this hardware (:func:`offline_engine_defaults`)."""
        world_size = self.tensor_parallel_size * self.pipeline_parallel_size
        return self.max_num_batched_tokens or offline_engine_defaults(self.accelerator_type, world_size=world_size)[0]

    @property
    def gpus_per_replica(self) -> float:
        """GPUs one engine replica holds: ``tp x pp``, or a share of one (``1 / replicas_per_gpu``)."""
        if not self.accelerator_type:
            return 0
        world_size = self.tensor_parallel_size * self.pipeline_parallel_size
        return world_size if self.replicas_per_gpu == 1 else 1 / self.replicas_per_gpu

    @property
    def gpus(self) -> int:
        """GPUs the run holds at most: replicas (the upper bound, if autoscaling) x GPUs per replica."""
        import math

        from helpers.engine import max_replicas

        return math.ceil(max_replicas(self.concurrency) * self.gpus_per_replica - 1e-9)

    @property
    def actor_pool(self) -> tuple[int, int]:
        """The processor's ``concurrency``: ``(n, n)``, a fixed pool of the ``n`` replicas planned, or
        your ``(min, max)`` pair (:func:`helpers.engine.actor_pool`; Ray reads a bare ``n`` as 1..n)."""
        from helpers.engine import actor_pool

        return actor_pool(self.concurrency)

    @property
    def memory_share(self) -> float:
        """``gpu_memory_utilization`` for one engine: all of it, or its share where replicas share a
        GPU, less 0.01 each for the CUDA context every engine process holds outside vLLM's budget."""
        import math

        if self.replicas_per_gpu == 1:
            return self.gpu_memory_utilization
        return math.floor(100 * self.gpu_memory_utilization / self.replicas_per_gpu - 1) / 100

    @property
    def kv_cache_budget(self) -> int | None:
        """Bytes of KV cache each engine gets where replicas share a GPU (vLLM's
        ``kv_cache_memory_bytes``): the kit's estimate (:func:`kv_cache_estimate`) for this engine's
        memory share; None with one engine per GPU, on a CPU, or where the model's size or the
        GPU's memory is unknown (vLLM then sizes its cache by profiling, as it does alone).

        Why: vLLM sizes its KV cache from the GPU's free memory as seen before and after its own
        profiling run (``determine_available_memory``; the NVML-level free memory, the whole
        device's). Engines that start together on one GPU load their weights and profile at the same
        time, so each counts what the others allocate meanwhile as its own overhead and keeps a
        smaller cache: on the H100 (8B shape), two engines started at once took 53 GiB in all where
        two started one after the other took 72 GiB; with three, an engine can find no memory left
        for a cache at all. A stated budget skips that measurement: every engine gets the same cache,
        however the starts overlap."""
        if not self.accelerator_type or self.replicas_per_gpu == 1:
            return None
        known = GPUS.get(self.accelerator_type)
        memory = self.gpu_memory_gib or (known.memory_gib if known else None)
        shape = _budget_shape(self.model_source, self.task)
        if memory is None or shape is None:
            return None
        budget = kv_cache_estimate(shape, memory, self.memory_share, self.tensor_parallel_size)
        mib = int(budget // 2**20)
        return mib * 2**20 if mib > 0 else None

    def override(self, **changes: Any) -> Preset:
        """A copy with ``changes``; unknown field names fail, listing the valid ones."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise TypeError(f"unknown preset field(s) {unknown}; valid fields: {sorted(valid)}")
        return dataclasses.replace(self, **changes)

    def engine_kwargs(self) -> dict[str, Any]:
        """The vLLM engine arguments this preset implies."""
        kwargs: dict[str, Any] = {"max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs,
                                  "max_num_batched_tokens": self.step_tokens, "enforce_eager": self.enforce_eager,
                                  # As vllm.LLM: Ray's engine (AsyncEngineArgs) would record vLLM's statistics
                                  # per step and request, on the engine actor's one thread.
                                  "disable_log_stats": True}
        if self.accelerator_type:
            kwargs["gpu_memory_utilization"] = self.memory_share
        if (budget := self.kv_cache_budget) is not None:  # replicas that share a GPU: a stated KV cache
            kwargs["kv_cache_memory_bytes"] = budget
        if self.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = self.tensor_parallel_size
        if self.pipeline_parallel_size > 1:
            kwargs["pipeline_parallel_size"] = self.pipeline_parallel_size
            kwargs["distributed_executor_backend"] = "ray"  # stages on several nodes
        if self.quantization:
            kwargs["quantization"] = self.quantization
        if self.dtype:
            kwargs["dtype"] = self.dtype
        if _random_weights(self.model_source):
            kwargs["load_format"] = "dummy"  # a shape with random weights: no weights to load
        return kwargs


def _random_weights(model_source: str | None) -> bool:
    """A ``random-weights:`` source, or a folder the kit built from one."""
    from pathlib import Path

    from helpers.models import OFFLINE, has_random_weights
    from helpers.shapes import random_weights_of

    if not model_source or model_source == OFFLINE:
        return False

    return bool(random_weights_of(model_source)) or has_random_weights(Path(model_source).expanduser())


def _budget_shape(model_source: str | None, task: str) -> Any:
    """The shape a KV-cache budget is computed from: the folder vLLM will load where it exists (a
    ``random-weights:`` model the kit built, the offline model, a local folder), else the named
    model's shape (:func:`helpers.shapes.model_shape`; None where unknown)."""
    from pathlib import Path

    from helpers import models
    from helpers.shapes import model_shape, random_weights_of

    if not model_source:
        return None
    if model_source == models.OFFLINE:
        folder = models.cache_root() / (models.SMOLLM2_DIRNAME if task == "text" else models.TINY_VLM_DIRNAME)
        return model_shape(str(folder)) if models.is_complete(folder) else None
    if shaped := random_weights_of(model_source):
        folder = models.cache_root() / models.RANDOM_WEIGHTS_DIRNAME / shaped.split("/")[-1]
        if models.is_complete(folder):  # the vocabulary the kit gave it (smaller than the published one)
            return model_shape(str(folder))
    if Path(model_source).expanduser().is_dir():
        return model_shape(str(Path(model_source).expanduser()))
    return _named_shape(model_source)


@functools.lru_cache(maxsize=32)
def _named_shape(model: str) -> Any:
    """:func:`helpers.shapes.model_shape` of a model id, once per process (it may ask the hub)."""
    from helpers.shapes import model_shape

    return model_shape(model)


#: Why a preset asks for a step size at all (shown in the settings table).
RAY_STEP_TOKENS_NOTE = "Ray's engine stage alone would take 2048"


def offline_engine_defaults(accelerator_type: str | None, memory_gib: float | None = None,
                            world_size: int = 1) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm.LLM`` uses on this hardware: vLLM's
    ``EngineArgs.get_batch_defaults`` for offline use (``UsageContext.LLM_CLASS``), by GPU memory
    (``memory_gib``, else the known type's) and name; ``accelerator_type=None``: a CPU.

    Ray's engine stage builds its engine with ``AsyncEngineArgs.create_engine_config()`` and no usage
    context, so without these it gets vLLM's generic 2,048 tokens per step on any hardware: on an
    H100, an eighth of the 16,384 that a plain ``vllm.LLM`` script gets (issue #11's steady-state gap).
    """
    if accelerator_type is None:
        return 4096 * world_size, 256 * world_size
    if memory_gib is None:
        known = GPUS.get(accelerator_type)
        memory_gib = known.memory_gib if known else 0.0
    if memory_gib >= 160 or (memory_gib >= 70 and "A100" not in accelerator_type.upper()):
        return 16384, 1024
    return 8192, 256


LLAMA_8B = "unsloth/Llama-3.1-8B-Instruct"
QWEN_VL_3B = "Qwen/Qwen2.5-VL-3B-Instruct"

PRESETS: dict[str, Preset] = {p.name: p for p in [
    # Offline, on a CPU: the notebooks' defaults.
    Preset("text-cpu-offline", "text", "offline", None, 1, 64, 256, 8, max_num_seqs=64,
           enforce_eager=True, description="SmolLM2-135M from a PyPI wheel, on the CPU"),
    Preset("vision-cpu-offline", "vision", "offline", None, 1, 8, 192, 4, max_num_seqs=32,
           enforce_eager=True, description="a tiny random Qwen2-VL, on the CPU (captions are noise)"),
    # Ray's LLM batch-inference tutorials, as published. The checks flag what the throughput guide would: on an L4,
    # not all 256 (or 64) full-length sequences fit the KV cache at once. Kept as published; override
    # fields to follow the advice. The row counts are the runs' LIMIT, a parameter of its own.
    Preset("text-llama8b-l4", "text", LLAMA_8B, "L4", 4, 256, 256, 128,
           description="Ray's tutorial, text: 10,000 rows on 4 L4s"),
    Preset("text-llama8b-l4-scaled", "text", LLAMA_8B, "L4", 10, 256, 256, 256,
           description="Ray's tutorial, text scale-up: 1,000,000 rows on 10 L4s"),
    Preset("vision-qwen3b-l4", "vision", QWEN_VL_3B, "L4", 4, 16, 8192, 64, max_num_seqs=64,
           description="Ray's tutorial, captions: 10,000 images on 4 L4s"),
    Preset("vision-qwen3b-l4-scaled", "vision", QWEN_VL_3B, "L4", 10, 16, 8192, 128, max_num_seqs=64,
           description="Ray's tutorial, captions scale-up: 1,000,000 images on 10 L4s"),
    # Bigger GPUs: more memory for KV cache, so more concurrent sequences per replica.
    Preset("text-llama8b-a10g", "text", LLAMA_8B, "A10G", 4, 256, 256, 128),
    Preset("text-llama8b-a100", "text", LLAMA_8B, "A100-80G", 4, 256, 1024, 128),
    Preset("text-llama8b-h100", "text", LLAMA_8B, "H100", 8, 256, 1024, 256),
    Preset("text-llama8b-h200", "text", LLAMA_8B, "H200", 8, 256, 2048, 256),
    # Models that need several GPUs per replica: tensor parallelism inside a node (NVLink),
    # pipeline parallelism across nodes.
    Preset("text-llama70b-h100-tp4", "text", "meta-llama/Llama-3.1-70B-Instruct", "H100", 2, 128, 2048, 256,
           max_num_seqs=128, tensor_parallel_size=4, description="70B in 16-bit (~140 GB) over 4 H100s per replica"),
    Preset("text-llama70b-a100-fp8", "text", "meta-llama/Llama-3.1-70B-Instruct", "A100-80G", 2, 128, 1024, 256,
           max_num_seqs=128, tensor_parallel_size=2, quantization="fp8",
           description="FP8 halves the weights: 2 GPUs per replica"),
    Preset("vision-llama90b-h100-tp8-pp2", "vision", "meta-llama/Llama-3.2-90B-Vision-Instruct", "H100", 1, 16,
           8192, 128, max_num_seqs=64, tensor_parallel_size=8, pipeline_parallel_size=2,
           description="the 90B vision model of Ray's tutorial: 2 nodes x 8 H100, tp=8, pp=2"),
]}

DEFAULT_GPU_PRESET = {"text": "text-llama8b-l4", "vision": "vision-qwen3b-l4"}
CPU_PRESET = {"text": "text-cpu-offline", "vision": "vision-cpu-offline"}


class AutoPresetError(RuntimeError):
    """``PRESET="auto"`` cannot choose safely from what the cluster shows; the message says what to do."""


def _gpu_label(device_name: str) -> str:
    """The ``accelerator_type`` a Ray node advertises for a CUDA device called ``device_name``:
    Ray's own rule (the NVML name's model token), so that "auto" names the GPU type exactly as the
    local Ray will schedule it. "NVIDIA L40S" is an L40S and "NVIDIA GH200 480GB" a GH200, never an
    L4 or an H200 (a substring match took them for those, with their memory)."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(device_name) or "unknown"


def visible_cluster(wait_s: float = 0, poll_s: float = 5) -> dict[str, Any]:
    """What ``PRESET="auto"`` chooses from, in the shape of ``ray.cluster_resources()``.

    On a Ray cluster the run joins (:func:`helpers.engine.cluster_address`): the cluster's
    resources. With ``RAY_ADDRESS`` set (a Ray job, a remote cluster), it waits up to ``wait_s`` for
    GPU workers to join (a cluster that scales from zero shows none at first) and marks the result
    ``"remote": True``; a cluster ``ray start`` left running on this machine is read as it is.
    Otherwise: this machine's CUDA GPUs (type, count and measured memory), which the local Ray will
    have. Before the run's own Ray start, so the run's CPU budget can follow the choice.
    """
    import os
    import time

    from helpers.engine import cluster_address, enable_token_auth_if_available

    address = cluster_address()
    if address:
        import ray

        if not ray.is_initialized():
            enable_token_auth_if_available()
            ray.init(address=address, log_to_driver=False)
        remote = bool(os.environ.get("RAY_ADDRESS"))
        deadline = time.monotonic() + (wait_s if remote else 0)
        resources = dict(ray.cluster_resources())
        while resources.get("GPU", 0) == 0 and time.monotonic() < deadline:
            time.sleep(poll_s)
            resources = dict(ray.cluster_resources())
        return {**resources, "remote": remote}
    cluster: dict[str, Any] = {"CPU": float(os.cpu_count() or 1)}
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count:
            props = torch.cuda.get_device_properties(0)
            memory = props.total_memory / 1024**3
            cluster.update({"GPU": float(count), f"accelerator_type:{_gpu_label(props.name)}": 1.0,
                            "gpu_memory_gib": memory})
    except ImportError:
        pass
    return cluster


def _auto(task: str, cluster: Mapping[str, Any], model_source: str | None,
          replicas_per_gpu: int | None = None, max_model_len: int | None = None) -> Preset:
    """The run configuration that fits ``cluster`` (see :func:`select`)."""
    import math

    from helpers.shapes import GIB, model_shape

    gpus = int(cluster.get("GPU", 0))
    if gpus == 0:
        if cluster.get("remote"):
            raise AutoPresetError(
                "PRESET='auto' found no GPUs on the Ray cluster (one that scales from zero, like job.yaml's "
                "min_nodes: 0, shows none until work asks for them), and will not fall back to the CPU preset "
                f"there. Name a preset for the GPUs you want, e.g. PRESET={DEFAULT_GPU_PRESET[task]!r} "
                f"(presets: {names(task)[1:]}).")
        return PRESETS[CPU_PRESET[task]].override(description="auto: no GPU visible, so the offline CPU preset")
    types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
    gpu_type = types[0] if types else None
    base = PRESETS[DEFAULT_GPU_PRESET[task]]
    model = model_source if model_source not in (None, "offline") else base.model_source
    known = GPUS.get(gpu_type or "")
    # Measured memory (a local GPU) first: the same type comes in several sizes (A100: 40 or 80 GiB).
    memory = cluster.get("gpu_memory_gib") or (known.memory_gib if known else None)
    reasons = {}
    if memory is None:
        memory = min(g.memory_gib for g in GPUS.values())
        reasons["accelerator_type"] = (f"detected {gpus} x {gpu_type or 'GPU of no reported type'}; memory unknown, "
                                       f"so the smallest known ({memory:g} GiB) is assumed")
    else:
        reasons["accelerator_type"] = f"detected {gpus} x {gpu_type} ({memory:.0f} GiB each)"
    shape = model_shape(model)
    budget = memory * GIB * base.gpu_memory_utilization * 0.9  # 10% for activations, as the checks assume
    tp = 1
    if shape is not None:
        # Tensor parallelism only when the weights do not fit one GPU with room for a KV cache.
        while shape.parameters * 2 / tp > 0.8 * budget and tp < min(gpus, 8):
            tp *= 2
        if shape.parameters * 2 / tp > 0.8 * budget:
            assumed = "" if known or cluster.get("gpu_memory_gib") else (
                f" (the kit does not know {gpu_type!r} and the cluster does not say its memory: "
                f"{memory:g} GiB was assumed; set ACCELERATOR_TYPE, CONCURRENCY and MAX_MODEL_LEN yourself)")
            raise AutoPresetError(f"PRESET='auto': {model} needs ~{shape.parameters * 2 / GIB:.0f} GiB of weights, "
                                  f"more than {gpus} x {gpu_type} can hold{assumed}. Name a preset with more GPUs "
                                  f"or quantization (presets: {names(task)[1:]}).")
    length = max_model_len or base.max_model_len  # the run's, when known: the KV cache holds that many tokens a row
    share, why_share = _replicas_per_gpu(task, shape, budget, tp, length, model)
    if replicas_per_gpu is not None:  # yours: the replicas and memory below follow it
        share, why_share = replicas_per_gpu, "your parameter"
    replicas = max(1, gpus // tp) * share
    reasons["concurrency"] = (f"{gpus} GPUs / {tp} per replica" if tp > 1 else
                              f"{share} replicas on each of {gpus} GPUs" if share > 1 else f"one replica per GPU ({gpus})")
    reasons["replicas_per_gpu"] = why_share
    if tp > 1:
        reasons["tensor_parallel_size"] = f"{model}'s weights do not fit one {gpu_type} with room for a KV cache"
    step_tokens, max_num_seqs = offline_engine_defaults(gpu_type or "", memory)
    reasons["max_num_batched_tokens"] = (f"what vllm.LLM takes per step on a {memory:.0f} GiB {gpu_type or 'GPU'} "
                                         f"({RAY_STEP_TOKENS_NOTE})")
    reasons["max_num_seqs"] = f"what vllm.LLM runs at once on a {memory:.0f} GiB {gpu_type or 'GPU'}"
    if share > 1:
        max_num_seqs //= share
        reasons["max_num_seqs"] = f"{reasons['max_num_seqs']}, shared by its {share} replicas"
    if shape is not None:
        free = kv_cache_estimate(shape, memory, base.override(replicas_per_gpu=share).memory_share, tp)
        fits = int(free / (shape.kv_bytes_per_token * length / tp))
        cap = max_num_seqs
        max_num_seqs = max(1, min(cap, 2 ** int(math.log2(max(fits, 1)))))
        reasons["max_num_seqs"] = (f"~{free / GIB:.1f} GiB of KV cache per replica (the kit's estimate) holds {fits} "
                                   f"full-length sequences of {length} tokens; capped at {cap}, "
                                   f"{reasons['max_num_seqs']}")
    # Ray's engine stage admits 1.1 x max_num_seqs requests at a time: keep twice that many rows queued
    # per replica, so a finished batch's place is already taken when the engine asks for more.
    slots = math.ceil(1.1 * max_num_seqs)
    in_flight = 2 * -(-slots // base.batch_size)
    if in_flight > base.max_concurrent_batches:
        reasons["max_concurrent_batches"] = (f"twice the batches of {base.batch_size} that fill the engine's "
                                             f"{slots} request slots (1.1 x max_num_seqs)")
    num_blocks = max(base.num_blocks, 4 * replicas)
    reasons["num_blocks"] = f"at least 4 per replica, and the {base.name} preset's {base.num_blocks}"
    return base.override(
        name=f"auto ({gpus}x{gpu_type})", accelerator_type=gpu_type, concurrency=replicas, tensor_parallel_size=tp,
        replicas_per_gpu=share, gpu_memory_gib=cluster.get("gpu_memory_gib"),
        max_num_seqs=max_num_seqs, max_num_batched_tokens=step_tokens, num_blocks=num_blocks,
        max_concurrent_batches=max(base.max_concurrent_batches, in_flight),
        description=f"auto: chosen for {gpus} x {gpu_type}, from {base.name}", reasons=tuple(reasons.items()))


#: Replicas that share a GPU when one engine cannot keep it busy (:func:`_replicas_per_gpu`).
SHARED_GPU_REPLICAS = 2
#: Requests this short (prompt + answer tokens) are where one engine's CPU side is the bottleneck.
SHORT_REQUEST_TOKENS = 1024


def kv_cache_estimate(shape: Any, memory_gib: float, memory_share: float, shards: int = 1,
                      overhead_fraction: float = 0.1) -> float:
    """Bytes of KV cache one engine gets on a GPU of ``memory_gib``: its share of the memory
    (``gpu_memory_utilization``), less ``overhead_fraction`` for activations, less its weights
    (16-bit, split over ``shards`` GPUs). vLLM measures the activations instead; RESULTS.md compares
    this estimate with the cache vLLM reports."""
    from helpers.shapes import GIB

    return memory_gib * GIB * memory_share * (1 - overhead_fraction) - shape.parameters * 2 / shards


def _replicas_per_gpu(task: str, shape: Any, budget: float, tp: int, max_model_len: int,
                      model: str) -> tuple[int, str]:
    """How many engine replicas share each GPU, and why. Two, for short requests (text with a
    structured choice, captions of at most :data:`SHORT_REQUEST_TOKENS` tokens in all) of a model
    whose two copies take at most half the memory: one engine's CPU side (scheduling, structured-
    output masks, request intake, image preparation) cannot keep a GPU busy there. Measured on an
    H100 (benchmarks/RESULTS.md), each engine with its stated KV cache (:attr:`Preset.kv_cache_budget`):
    8B shape, 100,000 prompts, in steady state against one raw vLLM engine: 2 engines 1.69x, 3 engines
    1.34x (GPU 90% busy, but each of the three holds 6.9 GiB of KV cache, 128 sequences at once);
    Qwen2.5-VL-3B shape, 10,000 images: 2 engines 2.46x, 1 engine 1.15x. Otherwise one: long
    requests, a model that needs the memory or spans GPUs, or one of unknown size."""
    from helpers.shapes import GIB

    if tp > 1:
        return 1, "the model spans several GPUs (tensor parallelism)"
    if shape is None:
        return 1, f"the size of {model} is unknown"
    weights = shape.parameters * 2
    if SHARED_GPU_REPLICAS * weights > budget / 2:
        return 1, f"{SHARED_GPU_REPLICAS} copies of {model}'s weights ({weights / GIB:.0f} GiB each) would leave too little KV cache"
    if max_model_len > SHORT_REQUEST_TOKENS:
        return 1, f"requests up to {max_model_len} tokens keep one engine's GPU busy"
    measured = ("H100, 8B: 2 engines 1.69x one raw engine in steady state; 3 engines only 1.34x, each "
                "with a third of the KV cache" if task == "text" else
                "H100, Qwen2.5-VL-3B, 10,000 images: 2 engines 2.46x one raw engine in steady state, 1 engine 1.15x")
    return SHARED_GPU_REPLICAS, (f"short requests (<= {max_model_len} tokens) leave one engine's CPU side the bottleneck; "
                                 f"{SHARED_GPU_REPLICAS} copies of the weights ({weights / GIB:.1f} GiB each) fit with "
                                 f"room for KV cache ({measured})")


def select(name: str, task: str, *, cluster: Mapping[str, Any] | None = None, **overrides: Any) -> Preset:
    """The preset called ``name``, with ``overrides`` applied field by field.

    ``"auto"`` chooses from ``cluster`` (``ray.cluster_resources()``-like; :func:`visible_cluster`
    reads it; ``None``: no GPU): without GPUs, the offline CPU preset, except on a remote cluster
    (``"remote": True``), where it raises :class:`AutoPresetError` instead of silently running on
    CPUs. With GPUs: the task's GPU preset adapted to them: the GPU type and memory (known types, or
    ``gpu_memory_gib`` measured), tensor parallelism only when the model (``model_source`` in
    ``overrides``, else the preset's) does not fit one GPU, one replica per ``tp`` GPUs, and
    ``max_num_seqs`` that fits the KV cache. The preset's ``reasons`` say why, field by field.
    ``tokenize_stage`` left at None is decided here: on for text on a GPU, off on a CPU and for images.
    """
    if task not in CPU_PRESET:
        raise ValueError(f"task must be one of {sorted(CPU_PRESET)}, got {task!r}")
    if name == "auto":
        preset = _auto(task, cluster or {}, overrides.get("model_source"), overrides.get("replicas_per_gpu"),
                       overrides.get("max_model_len"))
    elif name in PRESETS:
        preset = PRESETS[name]
    else:
        raise KeyError(f"no preset {name!r}; presets: {sorted(PRESETS)}")
    if preset.task != task:
        raise ValueError(f"preset {name!r} is for the {preset.task} task, not {task}")
    preset = preset.override(**overrides) if overrides else preset
    return _resolve_dtype(_resolve_tokenize_stage(preset))


#: CPU instructions that compute bfloat16 natively (Linux's names in /proc/cpuinfo).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_dtype(cpu_flags: set[str] | None = None) -> tuple[str, str]:
    """The dtype a CPU engine runs fastest with, and why: the checkpoint's bfloat16 where the CPU
    has bfloat16 instructions, else float32. Without them bfloat16 is emulated: on a 2-core AVX2
    machine, 64 rows took 88 s in bfloat16 and 14 s in float32 (README, "The processor's settings").
    ``cpu_flags``: this machine's, from /proc/cpuinfo, when not given."""
    if cpu_flags is None:
        try:
            text = open("/proc/cpuinfo").read()
        except OSError:
            return "auto", "CPU instructions unknown (no /proc/cpuinfo): the checkpoint's own dtype"
        cpu_flags = {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}
    native = [f for f in BF16_FLAGS if f in cpu_flags]
    if native:
        return "auto", f"this CPU computes bfloat16 natively ({', '.join(native)}): the checkpoint's bfloat16"
    return "float32", "this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16): float32 runs several times faster"


def _resolve_dtype(preset: Preset) -> Preset:
    """``dtype`` decided for a CPU preset that leaves it to the kit (:func:`cpu_dtype`)."""
    if preset.dtype is not None or preset.accelerator_type is not None:
        return preset
    dtype, why = cpu_dtype()
    return preset.override(dtype=dtype, reasons=(*preset.reasons, ("dtype", why)))


def _tokenize_stage_default(preset: Preset) -> tuple[bool, str]:
    """Whether text is tokenized in a stage of its own when the preset leaves it to the kit, and why
    (shown in the settings table)."""
    if preset.task == "vision":
        return False, "images: vLLM's own prompt processing places the image tokens"
    if preset.accelerator_type is None:
        return False, "a CPU: one more actor would compete with the engine for the cores"
    return True, "a GPU: the engine actor's one thread only feeds the engine; a stage of its own tokenizes whole batches"


def _resolve_tokenize_stage(preset: Preset) -> Preset:
    """``tokenize_stage`` decided: ``None`` becomes :func:`_tokenize_stage_default`'s choice; on for
    images is an error (vLLM must place the image tokens itself)."""
    if preset.task == "vision" and preset.tokenize_stage:
        raise ValueError("tokenize_stage is for text prompts; image prompts need vLLM's own processing")
    if preset.tokenize_stage is not None:
        return preset
    return preset.override(tokenize_stage=_tokenize_stage_default(preset)[0])


#: Notebook parameters that default to ``None``, meaning "take this field from PRESET".
PARAMETER_FIELDS: dict[str, str] = {
    "MODEL_SOURCE": "model_source", "ACCELERATOR_TYPE": "accelerator_type", "CONCURRENCY": "concurrency",
    "REPLICAS_PER_GPU": "replicas_per_gpu",
    "BATCH_SIZE": "batch_size", "MAX_CONCURRENT_BATCHES": "max_concurrent_batches", "MAX_MODEL_LEN": "max_model_len",
    "NUM_BLOCKS": "num_blocks", "ENFORCE_EAGER": "enforce_eager", "TOKENIZE_STAGE": "tokenize_stage",
}


def names(task: str) -> list[str]:
    """The presets for ``task``, plus "auto"."""
    return ["auto", *sorted(n for n, p in PRESETS.items() if p.task == task)]


#: A GPU run that will read at most this many rows skips ``torch.compile`` and CUDA-graph capture
#: when ``ENFORCE_EAGER`` is None: they pay for themselves only over many rows (on the H100, 23 s of a
#: 157 s captioning pipeline for the 24 bundled images; benchmarks/RESULTS.md).
SHORT_RUN_ROWS = 1_000


def known_rows(parameters: Mapping[str, Any], sample_size: Callable[[], int] | None) -> int | None:
    """Rows the run will read, when known before reading: the bundled sample's size
    (``sample_size()``) when ``INPUT_PATH`` is None, at most ``LIMIT``; None for your own data
    without a ``LIMIT``."""
    limit = int(parameters["LIMIT"]) if parameters.get("LIMIT") else None
    sample = sample_size() if sample_size is not None and parameters.get("INPUT_PATH") is None else None
    known = [n for n in (sample, limit) if n is not None]
    return min(known) if known else None


def from_parameters(task: str, parameters: Mapping[str, Any], *, cluster: Mapping[str, Any] | None = None,
                    sample_size: Callable[[], int] | None = None) -> Preset:
    """The run configuration a notebook's parameters ask for: ``PRESET``, then every preset-backed
    parameter that is not ``None`` on top of it, field by field. With ``ENFORCE_EAGER=None``, a GPU
    run of at most :data:`SHORT_RUN_ROWS` known rows (:func:`known_rows`; ``sample_size`` counts
    the bundled sample, called only then) runs eagerly."""
    from helpers.engine import concurrency_arg

    overrides = {field: parameters[name] for name, field in PARAMETER_FIELDS.items()
                 if parameters.get(name) is not None}
    if "concurrency" in overrides:  # papermill and YAML turn a (min, max) pair into a list
        overrides["concurrency"] = concurrency_arg(overrides["concurrency"])
    preset = select(parameters["PRESET"], task, cluster=cluster, **overrides)
    if preset.accelerator_type and not preset.enforce_eager and "enforce_eager" not in overrides:
        rows = known_rows(parameters, sample_size)
        if rows is not None and rows <= SHORT_RUN_ROWS:
            why = (f"{rows:,} rows (at most {SHORT_RUN_ROWS:,}): too few to repay compilation and CUDA-graph "
                   "capture, so the engine runs eagerly")
            preset = preset.override(enforce_eager=True, reasons=(*preset.reasons, ("enforce_eager", why)))
    return preset


def describe(preset: Preset, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per preset-backed setting: its value, whether it came from the preset or a parameter,
    and (for ``PRESET="auto"``) why that value was chosen; the replicas row always says the pool Ray
    runs (fixed, or autoscaling for your pair)."""
    from helpers.engine import describe_pool

    why = {"max_num_batched_tokens": f"what vllm.LLM takes per step on this hardware ({RAY_STEP_TOKENS_NOTE})",
           "tokenize_stage": _tokenize_stage_default(preset)[1],
           **dict(preset.reasons)}
    pool = describe_pool(preset.concurrency)
    why["concurrency"] = f"{why['concurrency']}; {pool}" if why.get("concurrency") else pool
    rows = []
    for name, field in PARAMETER_FIELDS.items():
        if name not in parameters:
            continue
        chosen = parameters[name] is not None
        rows.append({"parameter": name, "value": repr(getattr(preset, field)),
                     "from": "your parameter" if chosen else f"preset {preset.name}",
                     "why": (pool if chosen else why[field]) if field == "concurrency" else
                     ("" if chosen else why.get(field, ""))})
    if preset.replicas_per_gpu > 1:
        why.setdefault("gpu_memory_utilization", f"{preset.gpu_memory_utilization} of the GPU shared by "
                                                 f"{preset.replicas_per_gpu} replicas, less 0.01 each for its CUDA context")
    if preset.kv_cache_budget is not None:
        why.setdefault("kv_cache_memory_bytes", f"the kit's estimate of {preset.kv_cache_budget / 2**30:.1f} GiB for each of "
                                                f"the {preset.replicas_per_gpu} engines that share a GPU: vLLM's own "
                                                "measurement counts the other engines' memory when they start together")
    engine = {"max_num_seqs": preset.max_num_seqs, "max_num_batched_tokens": preset.step_tokens, "dtype": preset.dtype,
              "gpu_memory_utilization": preset.memory_share if preset.accelerator_type else None,
              "kv_cache_memory_bytes": preset.kv_cache_budget,
              "tensor_parallel_size": preset.tensor_parallel_size,
              "pipeline_parallel_size": preset.pipeline_parallel_size, "quantization": preset.quantization}
    for field, value in engine.items():
        if field == "kv_cache_memory_bytes" and value is None:  # vLLM measures it (one engine per GPU, a CPU)
            continue
        rows.append({"parameter": field, "value": repr(value), "from": f"preset {preset.name}",
                     "why": why.get(field, "")})
    return rows


def overview(task: str) -> list[dict[str, Any]]:
    """One row per preset for ``task``, in short columns, for a table in a notebook."""
    return [{
        "preset": p.name, "model": p.model_source, "GPU": p.accelerator_type or "CPU", "replicas": p.concurrency,
        "GPUs per replica": p.gpus_per_replica, "batch": p.batch_size, "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs, "blocks": p.num_blocks,
        "about": p.description,
    } for p in PRESETS.values() if p.task == task]
