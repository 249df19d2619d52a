"""Named configurations for the notebooks: the seeds' GPU runs, bigger GPUs, multi-GPU models, and
the offline CPU runs. Frozen dataclasses: a preset never changes under you, ``override`` returns a
new one, and an unknown field is an error that lists the valid ones.

``select("auto", task)`` picks the offline CPU preset when no GPU is visible and the task's default
GPU preset when one is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
    Gpu("T4", 16, False), Gpu("L4", 24, False), Gpu("A10G", 24, False),
    Gpu("A100-40G", 40, True), Gpu("A100-80G", 80, True), Gpu("H100", 80, True), Gpu("H200", 141, True),
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
    limit: int | None
    max_concurrent_batches: int = 4
    max_num_seqs: int = 256
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.90
    quantization: str | None = None
    enforce_eager: bool = False
    description: str = ""

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size if self.accelerator_type else 0

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
                                  "enforce_eager": self.enforce_eager}
        if self.accelerator_type:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = self.tensor_parallel_size
        if self.pipeline_parallel_size > 1:
            kwargs["pipeline_parallel_size"] = self.pipeline_parallel_size
            kwargs["distributed_executor_backend"] = "ray"  # stages on several nodes
        if self.quantization:
            kwargs["quantization"] = self.quantization
        return kwargs


LLAMA_8B = "unsloth/Llama-3.1-8B-Instruct"
QWEN_VL_3B = "Qwen/Qwen2.5-VL-3B-Instruct"

PRESETS: dict[str, Preset] = {p.name: p for p in [
    # Offline, on a CPU: the notebooks' defaults.
    Preset("text-cpu-offline", "text", "offline", None, 1, 64, 256, 8, None, max_num_seqs=64,
           enforce_eager=True, description="SmolLM2-135M from a PyPI wheel, on the CPU"),
    Preset("vision-cpu-offline", "vision", "offline", None, 1, 8, 192, 4, None, max_num_seqs=32,
           enforce_eager=True, description="a tiny random Qwen2-VL, on the CPU (captions are noise)"),
    # The seed tutorials, as published. The checks flag what the throughput guide would: on an L4,
    # not all 256 (or 64) full-length sequences fit the KV cache at once, and the scaled runs' blocks
    # are larger than a batch. Kept as published; override fields to follow the advice.
    Preset("text-llama8b-l4", "text", LLAMA_8B, "L4", 4, 256, 256, 128, 10_000,
           description="seed text run: 10,000 rows on 4 L4s"),
    Preset("text-llama8b-l4-scaled", "text", LLAMA_8B, "L4", 10, 256, 256, 256, 1_000_000,
           description="seed text scale-up: 1,000,000 rows on 10 L4s"),
    Preset("vision-qwen3b-l4", "vision", QWEN_VL_3B, "L4", 4, 16, 8192, 64, 10_000, max_num_seqs=64,
           description="seed vision run: 10,000 images on 4 L4s"),
    Preset("vision-qwen3b-l4-scaled", "vision", QWEN_VL_3B, "L4", 10, 16, 8192, 128, 1_000_000, max_num_seqs=64,
           description="seed vision scale-up: 1,000,000 images on 10 L4s"),
    # Bigger GPUs: more memory for KV cache, so more concurrent sequences per replica.
    Preset("text-llama8b-a10g", "text", LLAMA_8B, "A10G", 4, 256, 256, 128, None),
    Preset("text-llama8b-a100", "text", LLAMA_8B, "A100-80G", 4, 256, 1024, 128, None),
    Preset("text-llama8b-h100", "text", LLAMA_8B, "H100", 8, 256, 1024, 256, None),
    Preset("text-llama8b-h200", "text", LLAMA_8B, "H200", 8, 256, 2048, 256, None),
    # Models that need several GPUs per replica: tensor parallelism inside a node (NVLink),
    # pipeline parallelism across nodes.
    Preset("text-llama70b-h100-tp4", "text", "meta-llama/Llama-3.1-70B-Instruct", "H100", 2, 128, 2048, 256, None,
           max_num_seqs=128, tensor_parallel_size=4, description="70B in 16-bit (~140 GB) over 4 H100s per replica"),
    Preset("text-llama70b-a100-fp8", "text", "meta-llama/Llama-3.1-70B-Instruct", "A100-80G", 2, 128, 1024, 256,
           None, max_num_seqs=128, tensor_parallel_size=2, quantization="fp8", description="FP8 halves the weights: 2 GPUs per replica"),
    Preset("vision-llama90b-h100-tp8-pp2", "vision", "meta-llama/Llama-3.2-90B-Vision-Instruct", "H100", 1, 16,
           8192, 128, None, max_num_seqs=64, tensor_parallel_size=8, pipeline_parallel_size=2,
           description="the seed's 90B vision model: 2 nodes x 8 H100, tp=8, pp=2"),
]}

DEFAULT_GPU_PRESET = {"text": "text-llama8b-l4", "vision": "vision-qwen3b-l4"}
CPU_PRESET = {"text": "text-cpu-offline", "vision": "vision-cpu-offline"}


def gpu_visible() -> bool:
    """True when this process or its Ray cluster can see a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    try:
        import ray

        return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    except ImportError:
        return False


def select(name: str, task: str, *, has_gpu: bool | None = None, **overrides: Any) -> Preset:
    """The preset called ``name`` ("auto": CPU offline without a GPU, the task's GPU preset with
    one), with ``overrides`` applied field by field."""
    if task not in CPU_PRESET:
        raise ValueError(f"task must be one of {sorted(CPU_PRESET)}, got {task!r}")
    if name == "auto":
        name = DEFAULT_GPU_PRESET[task] if (gpu_visible() if has_gpu is None else has_gpu) else CPU_PRESET[task]
    if name not in PRESETS:
        raise KeyError(f"no preset {name!r}; presets: {sorted(PRESETS)}")
    preset = PRESETS[name]
    if preset.task != task:
        raise ValueError(f"preset {name!r} is for the {preset.task} task, not {task}")
    return preset.override(**overrides) if overrides else preset


#: Notebook parameters that default to ``None``, meaning "take this field from PRESET".
PARAMETER_FIELDS: dict[str, str] = {
    "MODEL_SOURCE": "model_source", "ACCELERATOR_TYPE": "accelerator_type", "CONCURRENCY": "concurrency",
    "BATCH_SIZE": "batch_size", "MAX_CONCURRENT_BATCHES": "max_concurrent_batches", "MAX_MODEL_LEN": "max_model_len",
    "NUM_BLOCKS": "num_blocks", "ENFORCE_EAGER": "enforce_eager",
}


def names(task: str) -> list[str]:
    """The presets for ``task``, plus "auto"."""
    return ["auto", *sorted(n for n, p in PRESETS.items() if p.task == task)]


def from_parameters(task: str, parameters: Mapping[str, Any], *, has_gpu: bool | None = None) -> Preset:
    """The run configuration a notebook's parameters ask for: ``PRESET``, then every preset-backed
    parameter that is not ``None`` on top of it, field by field."""
    from helpers.engine import concurrency_arg

    overrides = {field: parameters[name] for name, field in PARAMETER_FIELDS.items()
                 if parameters.get(name) is not None}
    if "concurrency" in overrides:  # papermill and YAML turn a (min, max) pair into a list
        overrides["concurrency"] = concurrency_arg(overrides["concurrency"])
    return select(parameters["PRESET"], task, has_gpu=has_gpu, **overrides)


def describe(preset: Preset, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per preset-backed setting: its value and whether it came from the preset or a parameter."""
    rows = []
    for name, field in PARAMETER_FIELDS.items():
        if name not in parameters:
            continue
        chosen = parameters[name] is not None
        rows.append({"parameter": name, "value": repr(getattr(preset, field)),
                     "from": "your parameter" if chosen else f"preset {preset.name}"})
    for field in ("max_num_seqs", "tensor_parallel_size", "pipeline_parallel_size", "quantization"):
        rows.append({"parameter": field, "value": repr(getattr(preset, field)), "from": f"preset {preset.name}"})
    return rows


def overview(task: str) -> list[dict[str, Any]]:
    """One row per preset for ``task``, in short columns, for a table in a notebook."""
    return [{
        "preset": p.name, "model": p.model_source, "GPU": p.accelerator_type or "CPU", "replicas": p.concurrency,
        "GPUs per replica": p.gpus_per_replica, "batch": p.batch_size, "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs, "blocks": p.num_blocks, "rows": f"{p.limit:,}" if p.limit else "all",
        "about": p.description,
    } for p in PRESETS.values() if p.task == task]
