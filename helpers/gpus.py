"""The hardware the kit knows: GPU types and their memory, vLLM's per-hardware step defaults, the KV
cache an engine gets on a GPU, and the dtype a CPU computes fastest in."""

from __future__ import annotations

from typing import Any
from dataclasses import dataclass


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


def ray_label(accelerator_type: str) -> str:
    """The label Ray gives nodes of ``accelerator_type`` (``accelerator_type:<label>``), what the engines
    are scheduled on: Ray names a GPU by its NVML model token (:func:`gpu_label`), which does not say
    an A100's memory, so both A100 sizes are labelled ``A100`` (Ray's ``A100-80G`` constant is never
    added to a node: ray.util.accelerators). The kit's ``A100-40G``/``A100-80G`` say the memory a preset
    needs; they schedule on ``A100`` nodes."""
    return "A100" if accelerator_type.upper().startswith("A100") else accelerator_type


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


def gpu_label(device_name: str) -> str:
    """The ``accelerator_type`` a Ray node advertises for a CUDA device called ``device_name``:
    Ray's own rule (the NVML name's model token), so that "auto" names the GPU type exactly as the
    local Ray will schedule it. "NVIDIA L40S" is an L40S and "NVIDIA GH200 480GB" a GH200, never an
    L4 or an H200 (a substring match took them for those, with their memory)."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(device_name) or "unknown"


#: CPU instructions that compute bfloat16 natively (Linux's names in /proc/cpuinfo).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_dtype(cpu_flags: set[str] | None = None) -> tuple[str, str]:
    """The dtype a CPU engine runs fastest with, and why: the checkpoint's bfloat16 where the CPU
    has bfloat16 instructions, else float32. Without them bfloat16 is emulated: on a 2-core AVX2
    machine, 64 rows took 88 s in bfloat16 and 14 s in float32 (docs/processor-settings.md).
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


#: The share of an engine's memory the kit's plans keep for activations (vLLM measures them instead).
ACTIVATIONS = 0.1


def memory_of(accelerator_type: str | None, measured_gib: float | None = None) -> float | None:
    """GiB of one GPU: ``measured_gib`` where measured, else the kit's table for the type; None if neither."""
    known = GPUS.get(accelerator_type or "")
    return measured_gib or (known.memory_gib if known else None)


def memory_budget(memory_gib: float, memory_share: float) -> float:
    """Bytes one engine may fill with weights and KV cache on a GPU of ``memory_gib``: its share of
    the memory (``gpu_memory_utilization``) less :data:`ACTIVATIONS`. The one budget behind "auto",
    the KV-cache estimate and the memory check."""
    from helpers.shapes import GIB

    return memory_gib * GIB * memory_share * (1 - ACTIVATIONS)


def kv_cache_estimate(shape: Any, memory_gib: float, memory_share: float, shards: int = 1,
                      quantization: str | None = None) -> float:
    """Bytes of KV cache one engine gets on a GPU of ``memory_gib``: :func:`memory_budget` less its
    weights (as ``quantization`` stores them, split over ``shards`` GPUs). vLLM measures the
    activations instead; RESULTS.md compares this estimate with the cache vLLM reports."""
    return memory_budget(memory_gib, memory_share) - shape.weight_bytes(quantization) / shards
