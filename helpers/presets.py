"""Named run configurations, as data (Ray's tutorials' GPU runs, bigger GPUs, multi-GPU models, the
offline CPU runs), the GPU types and model shapes the kit knows, and what vLLM and Ray get from a
configuration. Fitting one to your GPUs and rows is :mod:`helpers.plans`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3
OFFLINE = "offline"  # the model source of the offline models the kit prepares (helpers.models)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float


GPUS: dict[str, Gpu] = {g.name: g for g in [
    Gpu("T4", 16), Gpu("L4", 24), Gpu("A10G", 24), Gpu("L40S", 48), Gpu("A100-40G", 40), Gpu("A100-80G", 80),
    Gpu("H100", 80), Gpu("H200", 141), Gpu("A100", 40),  # "A100": what Ray labels both; the smaller, unless measured
]}
#: The share of an engine's memory the kit's estimates keep for activations (vLLM measures them).
ACTIVATIONS = 0.1


def ray_label(accelerator_type: str) -> str:
    """The label Ray gives nodes of ``accelerator_type``: both A100 sizes are ``A100``."""
    return "A100" if accelerator_type.upper().startswith("A100") else accelerator_type


def engine_defaults(accelerator_type: str | None, memory_gib: float | None = None, world: int = 1) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm.LLM`` takes on this hardware (vLLM's
    ``get_batch_defaults``). Ray's engine stage would get vLLM's generic 2,048 tokens per step."""
    if accelerator_type is None:
        return 4096 * world, 256 * world
    memory_gib = memory_gib or (GPUS[accelerator_type].memory_gib if accelerator_type in GPUS else 0.0)
    if memory_gib >= 160 or (memory_gib >= 70 and "A100" not in accelerator_type.upper()):
        return 16384, 1024
    return 8192, 256


def memory_budget(memory_gib: float, share: float) -> float:
    """Bytes one engine may fill with weights and KV cache: its share of a GPU less activations."""
    return memory_gib * GIB * share * (1 - ACTIVATIONS)


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: the weights, and the KV cache per token."""

    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    attention_heads: int = 0  # tensor parallelism must divide them (0: unknown)

    def weight_bytes(self, quantization: str | None = None) -> float:
        return self.parameters * {"fp8": 1.0, "awq": 0.5, "gptq": 0.5}.get(quantization or "", 2.0)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # keys and values, 16-bit

    def divides(self, tp: int) -> bool:
        return not self.attention_heads or self.attention_heads % tp == 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a ``config.json`` (``text_config`` if nested): every expert of a mixture of experts counts
        (all sit in memory); a vision encoder does not (~0.7 of 3.75 billion in Qwen2.5-VL-3B)."""
        c = dict(config.get("text_config") or config)
        hidden, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
        kv_heads, head_dim = c.get("num_key_value_heads", heads), c.get("head_dim") or hidden // heads
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
        dense = 3 * hidden * c["intermediate_size"]
        experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0
        mlp = layers * dense
        if experts:
            size = c.get("moe_intermediate_size") or c["intermediate_size"]
            shared = c.get("shared_expert_intermediate_size") or (c.get("n_shared_experts") or 0) * size
            dense_layers = min(layers, c.get("first_k_dense_replace") or 0)
            mlp = dense_layers * dense + (layers - dense_layers) * (3 * hidden * (experts * size + shared) + hidden * experts)
        tied = c.get("tie_word_embeddings", config.get("tie_word_embeddings"))
        parameters = layers * attention + mlp + c["vocab_size"] * hidden * (1 if tied else 2)
        return cls(parameters, layers, kv_heads, head_dim, heads)


#: The presets' models as published (their config.json files on the Hugging Face Hub).
KNOWN_MODELS: dict[str, ModelShape] = {
    "unsloth/Llama-3.1-8B-Instruct": ModelShape(8.03e9, 32, 8, 128, 32),
    "meta-llama/Llama-3.1-70B-Instruct": ModelShape(70.6e9, 80, 8, 128, 64),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(3.75e9, 36, 2, 128, 16),
    "Qwen/Qwen2.5-VL-72B-Instruct": ModelShape(73.4e9, 80, 8, 128, 64),
}


@functools.lru_cache(maxsize=32)
def model_shape(model: str) -> ModelShape | None:
    """From a local folder's ``config.json``, the presets' models, or the Hub's config (needs the
    network); None when none is at hand."""
    config = Path(model).expanduser() / "config.json"
    if model == OFFLINE:
        return None  # its folder's shape, once it is prepared (Preset.model_path)
    if config.is_file():
        return ModelShape.from_config(json.loads(config.read_text()))
    if model in KNOWN_MODELS:
        return KNOWN_MODELS[model]
    try:
        from transformers import AutoConfig

        return ModelShape.from_config(AutoConfig.from_pretrained(model).to_dict())
    except (OSError, ValueError, KeyError):
        return None


#: Batch sizes a GPU engine captures CUDA graphs for (vLLM's own list has 51 up to 512).
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512)
#: A GPU engine that does not compile: no torch.compile, CUDA graphs for decode-only steps.
NO_COMPILE = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}


SHOWN = ("model_source", "accelerator_type", "concurrency", "replicas_per_gpu", "tensor_parallel_size", "batch_size",
         "max_concurrent_batches", "num_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "dtype",
         "block_size", "enforce_eager", "torch_compile", "stage_cpus", "startup_timeout_s")  # the settings table's rows


@dataclass(frozen=True)
class Preset:
    """One run configuration. The fields after ``num_blocks`` are what ``ENGINE`` may set."""

    name: str
    task: str  # "text" or "vision"
    model_source: str
    accelerator_type: str | None  # a GPU type; None: the CPU
    concurrency: int | tuple[int, int]  # engine replicas; a pair (min, max) autoscales
    batch_size: int  # rows per inference task
    max_model_len: int  # prompt + answer tokens per row
    num_blocks: int  # blocks the read splits the input into
    max_concurrent_batches: int = 4
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: what vllm.LLM takes on this hardware
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    replicas_per_gpu: int = 1
    gpu_memory_utilization: float = 0.90  # of each GPU, for all the replicas on it
    quantization: str | None = None
    dtype: str | None = None  # None: the checkpoint's (a CPU: what it computes fastest, see config)
    block_size: int | None = None  # tokens per KV-cache block; None: vLLM's (a CPU: 32, see plans)
    enforce_eager: bool = False
    torch_compile: bool = False
    stage_cpus: float | None = None  # Ray CPUs per light stage; None: decided by plans.fit
    kv_cache_gib: int = 1  # a CPU engine's KV cache in GiB (vLLM would take a large share of RAM)
    trust_remote_code: bool = False
    startup_timeout_s: int = 600  # the GPUs (an autoscaler), then the engines' start
    stall_timeout_s: int = 300  # a batch unanswered this long is sent again; no row written this long stops the run
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to vLLM as they are
    one_process: bool = False
    gpu_memory_gib: float | None = None  # measured; None: the GPU table's
    fitted_to: Any = None  # "auto" on GPUs: the cluster it was planned for, planned again by plans.fit_context
    model_path: str = ""  # what vLLM loads, once the model source is prepared
    rows: int | None = None  # rows the run reads: LIMIT, or the input's where known
    rows_estimated: bool = False  # the input's rows were estimated from a sample
    description: str = ""
    reasons: tuple[tuple[str, str], ...] = ()  # (field, why the kit chose its value)
    given: tuple[str, ...] = ()  # the fields you set (MODEL_SOURCE, ENGINE)

    def override(self, **changes: Any) -> Preset:
        return dataclasses.replace(self, **changes)  # a TypeError names an unknown field

    def table(self) -> Any:
        """Each setting: its value, where it came from (the preset, ``ENGINE``, or the kit) and why (a pandas
        DataFrame; Jupyter shows a plan as this table)."""
        import pandas as pd

        why, rows = dict(self.reasons), []
        for name in SHOWN:
            value = self.step_tokens if name == "max_num_batched_tokens" else getattr(self, name)
            origin = ("MODEL_SOURCE" if name == "model_source" else "ENGINE") if name in self.given else (
                "the kit" if name in why else f"preset {self.name}")
            rows.append({"setting": name, "value": repr(value), "from": origin, "why": "" if name in self.given else why.get(name, "")})
        if self.engine_kwargs:
            rows.append({"setting": "engine_kwargs", "value": repr(self.engine_kwargs), "from": "ENGINE", "why": "passed to vLLM"})
        low, high = self.actor_pool
        rows[2]["why"] = (rows[2]["why"] + "; " if rows[2]["why"] else "") + (
            f"Ray gets ({low}, {high}): {'a fixed pool, all started at once' if low == high else 'an autoscaling pool'}")
        return pd.DataFrame(rows, columns=["setting", "value", "from", "why"]).set_index("setting")

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    @property
    def world(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def replicas(self) -> int:
        return int(self.concurrency[-1]) if isinstance(self.concurrency, (list, tuple)) else int(self.concurrency)

    @property
    def actor_pool(self) -> tuple[int, int]:
        """``concurrency`` as Ray Data LLM gets it: ``(n, n)``, since Ray 2.60 reads a bare ``n`` as an
        autoscaling pool of 1 to n (on an H100, "2 replicas" then ran as one for most of a run)."""
        c = self.concurrency
        return (int(c[0]), int(c[1])) if isinstance(c, (list, tuple)) else (int(c), int(c))

    @property
    def gpus_per_replica(self) -> float:
        if not self.accelerator_type:
            return 0
        return self.world if self.replicas_per_gpu == 1 else 1 / self.replicas_per_gpu

    @property
    def gpus(self) -> int:
        return math.ceil(self.replicas * self.gpus_per_replica - 1e-9)

    @property
    def gpu_memory(self) -> float | None:
        known = GPUS.get(self.accelerator_type or "")
        return self.gpu_memory_gib or (known.memory_gib if known else None) if self.accelerator_type else None

    @property
    def memory_share(self) -> float:
        """``gpu_memory_utilization`` for one engine: its share of a shared GPU, less 0.01 for the CUDA
        context each engine process holds outside vLLM's budget."""
        if self.replicas_per_gpu == 1:
            return self.gpu_memory_utilization
        return math.floor(100 * self.gpu_memory_utilization / self.replicas_per_gpu - 1) / 100

    @property
    def step_tokens(self) -> int:
        return self.max_num_batched_tokens or engine_defaults(self.accelerator_type, world=self.world)[0]

    @property
    def shape(self) -> ModelShape | None:
        return model_shape(self.model_path or self.model_source)

    @property
    def kv_bytes(self) -> float | None:
        """Bytes one engine has for its KV cache once its weights are in (None: GPU or model unknown)."""
        if not self.accelerator_type or self.gpu_memory is None or self.shape is None:
            return None
        return memory_budget(self.gpu_memory, self.memory_share) - self.shape.weight_bytes(self.quantization) / self.world

    @property
    def full_sequences(self) -> int | None:
        """Sequences of ``max_model_len`` tokens whose KV cache fits one engine at once."""
        free = self.kv_bytes
        return None if free is None else int(free / (self.shape.kv_bytes_per_token * self.max_model_len / self.world))

    @property
    def kv_cache_budget(self) -> int | None:
        """KV cache bytes for each engine that shares a GPU (``kv_cache_memory_bytes``): vLLM sizes its cache
        from the free memory it profiles, and engines started together count each other's as their own
        overhead (two 8B engines on one H100 took 53 GiB together, 72 GiB one after the other)."""
        mib = int(self.kv_bytes // 2**20) if self.replicas_per_gpu > 1 and self.kv_bytes is not None else 0
        return mib * 2**20 if mib > 0 else None

    @property
    def engine_args(self) -> dict[str, Any]:
        """The vLLM engine arguments (``engine_kwargs`` of the processor config)."""
        kwargs: dict[str, Any] = {"max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs,
                                  "max_num_batched_tokens": self.step_tokens, "enforce_eager": self.enforce_eager,
                                  "disable_log_stats": True, "trust_remote_code": self.trust_remote_code}
        if self.accelerator_type:
            kwargs["gpu_memory_utilization"] = self.memory_share
            if not self.enforce_eager:
                ceiling = min(2 * self.max_num_seqs, 512)
                kwargs["compilation_config"] = {"cudagraph_capture_sizes": sorted({*(s for s in CAPTURE_SIZES if s < ceiling), ceiling}),
                                                **({} if self.torch_compile else NO_COMPILE)}
        elif self.one_process:  # with VLLM_ENABLE_V1_MULTIPROCESSING=0 (cluster.engine_env): CPU vLLM keeps "uni"
            kwargs["distributed_executor_backend"] = "uni"
        if self.task == "vision":
            kwargs["limit_mm_per_prompt"] = {"image": 1}
        if self.kv_cache_budget is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_budget
        if self.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = self.tensor_parallel_size
        if self.pipeline_parallel_size > 1:
            kwargs.update(pipeline_parallel_size=self.pipeline_parallel_size, distributed_executor_backend="ray")
        kwargs |= {name: getattr(self, name) for name in ("quantization", "dtype", "block_size") if getattr(self, name)}
        return {**kwargs, **self.engine_kwargs}

    @property
    def placement_group_config(self) -> dict[str, Any]:
        """Ray Data LLM's ``placement_group_config``: each engine's bundles (a CPU; a GPU or a share of one;
        several GPUs, packed on one node unless pipeline-parallel)."""
        if not self.accelerator_type:
            return {"bundles": [{"CPU": 1}]}
        if self.world == 1:
            return {"bundles": [{"GPU": self.gpus_per_replica, "CPU": 1}]}
        return {"bundles": [{"GPU": 1, "CPU": 1}] + [{"GPU": 1}] * (self.world - 1),
                "strategy": "PACK" if self.pipeline_parallel_size > 1 else "STRICT_PACK"}

    @property
    def ray_type(self) -> str | None:
        """The GPU type as Ray labels its nodes, which places the engines there (None: CPUs)."""
        return ray_label(self.accelerator_type) if self.accelerator_type else None


LLAMA_8B, LLAMA_70B = "unsloth/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"
QWEN_VL_3B = "Qwen/Qwen2.5-VL-3B-Instruct"

PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("text-cpu-offline", "text", OFFLINE, None, 1, 64, 256, 8, max_num_seqs=64, enforce_eager=True,
           description="SmolLM2-135M from a PyPI wheel, on the CPU"),
    Preset("vision-cpu-offline", "vision", OFFLINE, None, 1, 8, 192, 4, max_num_seqs=32, enforce_eager=True,
           description="a tiny random Qwen2-VL, on the CPU (captions are noise)"),
    # Ray's tutorials as published; the checks say what the throughput guide would change.
    Preset("text-llama8b-l4", "text", LLAMA_8B, "L4", 4, 256, 256, 128,
           description="Ray's tutorial, text: 10,000 rows on 4 L4s"),
    Preset("text-llama8b-l4-scaled", "text", LLAMA_8B, "L4", 10, 256, 256, 256,
           description="Ray's tutorial, text scale-up: 1,000,000 rows on 10 L4s"),
    Preset("vision-qwen3b-l4", "vision", QWEN_VL_3B, "L4", 4, 16, 8192, 64, max_num_seqs=64,
           description="Ray's tutorial, captions: 10,000 images on 4 L4s"),
    Preset("vision-qwen3b-l4-scaled", "vision", QWEN_VL_3B, "L4", 10, 16, 8192, 128, max_num_seqs=64,
           description="Ray's tutorial, captions scale-up: 1,000,000 images on 10 L4s"),
    Preset("text-llama8b-a10g", "text", LLAMA_8B, "A10G", 4, 256, 256, 128),
    Preset("text-llama8b-a100", "text", LLAMA_8B, "A100-80G", 4, 256, 1024, 128),
    Preset("text-llama8b-h100", "text", LLAMA_8B, "H100", 8, 256, 1024, 256),
    Preset("text-llama8b-h200", "text", LLAMA_8B, "H200", 8, 256, 2048, 256),
    Preset("text-llama70b-h100-tp4", "text", LLAMA_70B, "H100", 2, 128, 2048, 256, max_num_seqs=128,
           tensor_parallel_size=4, description="70B in 16-bit (~140 GB) over 4 H100s per replica"),
    Preset("text-llama70b-a100-fp8", "text", LLAMA_70B, "A100-80G", 2, 128, 1024, 256, max_num_seqs=128,
           tensor_parallel_size=2, quantization="fp8", description="FP8 halves the weights: 2 GPUs per replica"),
    # Ray's tutorial runs Llama-3.2-90B-Vision so; vLLM 0.29 no longer runs that architecture (Mllama).
    Preset("vision-qwen72b-h100-tp8-pp2", "vision", "Qwen/Qwen2.5-VL-72B-Instruct", "H100", 1, 16,
           8192, 128, max_num_seqs=64, tensor_parallel_size=8, pipeline_parallel_size=2,
           description="the big vision model layout of Ray's tutorial: 2 nodes x 8 H100, tp=8, pp=2"),
]}
DEFAULT_GPU_PRESET = {"text": "text-llama8b-l4", "vision": "vision-qwen3b-l4"}
CPU_PRESET = {"text": "text-cpu-offline", "vision": "vision-cpu-offline"}


def names(task: str) -> list[str]:
    return ["auto", *sorted(n for n, p in PRESETS.items() if p.task == task)]
