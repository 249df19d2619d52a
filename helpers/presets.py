"""Named configurations for the notebooks: the GPU runs of Ray's tutorials, bigger GPUs, multi-GPU models, and
the offline CPU runs. Frozen dataclasses: a preset never changes under you, ``override`` returns a
new one, and an unknown field is an error that lists the valid ones.

``select("auto", task, cluster=...)`` fits the task's GPU preset to the GPUs the Ray cluster has
(or picks the offline CPU preset where there are none); see :func:`select`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from helpers.gpus import kv_cache_estimate, memory_of, offline_engine_defaults


#: The executor of a short CPU run (:attr:`Preset.one_process`): vLLM's single-process one, named by
#: its class. Ray's engine stage asks for "uni", but vLLM's CPU platform turns that name into "mp", a
#: worker process of its own that imports vLLM again before the engine is ready.
CPU_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"


#: The batch sizes the kit has vLLM capture CUDA graphs for (up to twice ``max_num_seqs``). vLLM's own
#: list has one every 8 to 256 and every 16 to 512 (51 at 512 sequences, captured twice: whole steps
#: and pieces), seconds of every engine's start; a step between two sizes runs padded to the next.
#: Steps that take prompts (thousands of tokens) run without a graph either way.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512)

#: vLLM's compilation settings for a GPU engine that does not compile (:attr:`Preset.torch_compile`
#: off): no torch.compile (mode 0), and CUDA graphs for the steps that only decode, the steps where
#: launching PyTorch's kernels one by one would cost most. An attention backend without such graphs
#: makes vLLM run those steps without them (it warns); it never fails.
NO_COMPILE = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}


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
    #: A GPU engine compiles its model with torch.compile (vLLM's default). Off, the kit's default: vLLM
    #: then runs each step as PyTorch's kernels, with CUDA graphs for the steps that only decode. In the
    #: kit on an H200 (8B shape, 100,000 prompts) an engine then initialised in 18.5 s instead of 38-40
    #: s on a fresh machine (3 s instead of 8 s warm) and ran 3-6% slower; the whole run took 153 s
    #: against 163 s warm and 187 s fresh (benchmarks/RESULTS.md).
    torch_compile: bool = False
    #: Tokenize prompts in a CPU stage of their own (Ray's tokenize stage), off the engine actor's
    #: thread; None until :func:`select` resolves it: on for text on a GPU, off on a CPU and for images.
    tokenize_stage: bool | None = None
    #: Ray CPUs each light stage holds (read, prompts, write); None until :func:`select` resolves it:
    #: 1 on a GPU (fewer light tasks at once, so fewer worker processes to start), 0.1 on a CPU (the
    #: stages must fit beside the engine on a few cores).
    stage_cpus: float | None = None
    #: The engine's weight and activation type; None: vLLM's "auto" (the checkpoint's, bfloat16 here)
    #: on GPUs, and on a CPU what that CPU computes fastest (:func:`cpu_dtype`), decided in :func:`select`.
    dtype: str | None = None
    #: The GPU's memory in GiB as measured (``"auto"`` on a local GPU); None: the known type's
    #: (:data:`GPUS`). Sizes the KV cache of replicas that share a GPU (:attr:`kv_cache_budget`).
    gpu_memory_gib: float | None = None
    #: A CPU engine that runs the model in vLLM's engine-core process (:data:`CPU_EXECUTOR`), not in a
    #: worker process of its own: ~18 s sooner to start on 2 cores, slower to compute; for short runs
    #: only, decided in :func:`helpers.short_runs.fit`.
    one_process: bool = False
    #: Batches Ray Data hands one replica at once; None: Ray's 2 x max_concurrent_batches. Set for a
    #: short run on several replicas (:func:`helpers.short_runs.share_batches`).
    max_tasks_in_flight_per_actor: int | None = None
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
    def gpu_memory(self) -> float | None:
        """GiB of one of its GPUs: measured (:attr:`gpu_memory_gib`), else the kit's table; None on a
        CPU or for a type the kit does not know."""
        return memory_of(self.accelerator_type, self.gpu_memory_gib) if self.accelerator_type else None

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
        memory = self.gpu_memory
        shape = _budget_shape(self.model_source, self.task)
        if memory is None or shape is None:
            return None
        budget = kv_cache_estimate(shape, memory, self.memory_share, self.tensor_parallel_size, self.quantization)
        mib = int(budget // 2**20)
        return mib * 2**20 if mib > 0 else None

    @property
    def cudagraph_capture_sizes(self) -> list[int] | None:
        """The batch sizes vLLM captures CUDA graphs for, on a GPU: :data:`CAPTURE_SIZES` up to vLLM's
        own ceiling (twice ``max_num_seqs``, at most 512); None on a CPU or eager."""
        if not self.accelerator_type or self.enforce_eager:
            return None
        ceiling = min(2 * self.max_num_seqs, 512)
        return sorted({*(s for s in CAPTURE_SIZES if s < ceiling), ceiling})

    @property
    def torch_compile_why(self) -> str:
        """Why the engine compiles or not, for the settings table."""
        if not self.accelerator_type:
            return "GPU engines only (a CPU engine here runs eagerly)"
        if self.enforce_eager:
            return "ENFORCE_EAGER: no compilation and no CUDA graphs"
        if self.torch_compile:
            return "compiled: the engine starts later (tens of seconds on a fresh machine)"
        return ("not compiled: an engine starts ~20 s sooner on a fresh GPU machine (~5 s warm) and runs 3-6% slower "
                "(H200, 8B); CUDA graphs for the steps that only decode")

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
        elif self.one_process:
            kwargs["distributed_executor_backend"] = CPU_EXECUTOR
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
        if (sizes := self.cudagraph_capture_sizes) is not None:
            kwargs["compilation_config"] = {"cudagraph_capture_sizes": sizes, **({} if self.torch_compile else NO_COMPILE)}
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


def names(task: str) -> list[str]:
    """The presets for ``task``, plus "auto"."""
    return ["auto", *sorted(n for n, p in PRESETS.items() if p.task == task)]


def overview(task: str) -> list[dict[str, Any]]:
    """One row per preset for ``task``, in short columns, for a table in a notebook."""
    return [{
        "preset": p.name, "model": p.model_source, "GPU": p.accelerator_type or "CPU", "replicas": p.concurrency,
        "GPUs per replica": p.gpus_per_replica, "batch": p.batch_size, "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs, "blocks": p.num_blocks,
        "about": p.description,
    } for p in PRESETS.values() if p.task == task]
