"""The throughput guide's rules as checks with numbers in their messages.

Each check returns findings (``error`` or ``warning``); :func:`enforce` raises on errors and
prints warnings. Memory is estimated from the model's shape (layers, KV heads, head size, weight
count and dtype): weights + the KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens
must fit ``gpu_memory_utilization`` of each GPU of a replica.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.engine import max_replicas
from helpers.presets import GPUS, Preset

GIB = 1024**3
BYTES_PER_WEIGHT = {None: 2.0, "fp8": 1.0, "awq": 0.5, "gptq": 0.5}


@dataclass(frozen=True)
class Finding:
    level: str  # "error" or "warning"
    message: str


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: weight count, and the KV cache's size per token."""

    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes: int = 2  # 16-bit KV cache

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes  # keys and values

    @classmethod
    def from_config(cls, config: Mapping[str, Any], parameters: float | None = None) -> ModelShape:
        """Estimate from a Hugging Face ``config.json`` (Llama/Qwen-style decoder; ``text_config`` if
        nested). ``parameters``, when known (:func:`checkpoint_parameters`), replaces the estimate.

        Mixture-of-experts layers count every expert (all of them sit in GPU memory, whichever few a
        token uses): ``num_local_experts`` (Mixtral), ``num_experts`` (Qwen-MoE) or ``n_routed_experts``
        (DeepSeek), each of ``moe_intermediate_size`` (else ``intermediate_size``), plus shared experts;
        DeepSeek's first ``first_k_dense_replace`` layers are dense."""
        c = dict(config.get("text_config") or config)
        hidden, layers = c["hidden_size"], c["num_hidden_layers"]
        heads = c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads", heads)
        head_dim = c.get("head_dim") or hidden // heads
        if parameters is None:
            attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
            dense_mlp = 3 * hidden * c["intermediate_size"]
            experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0
            if experts:
                expert = c.get("moe_intermediate_size") or c["intermediate_size"]
                shared = c.get("shared_expert_intermediate_size") or (c.get("n_shared_experts") or 0) * expert
                router = hidden * experts
                moe_mlp = 3 * hidden * (experts * expert + shared) + router
                dense_layers = min(layers, c.get("first_k_dense_replace") or 0)
                mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
            else:
                mlp_total = layers * dense_mlp
            tied = c.get("tie_word_embeddings", config.get("tie_word_embeddings"))
            embeddings = c["vocab_size"] * hidden * (1 if tied else 2)
            parameters = layers * attention + mlp_total + embeddings
        return cls(parameters=parameters, layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def checkpoint_parameters(folder: Path) -> float | None:
    """The weight count a local checkpoint states, or ``None`` when it states none.

    Read, never estimated: the tensor shapes in each ``*.safetensors`` file's header (a few KB read
    per file, no weights loaded), or a sharded checkpoint's index (``metadata.total_parameters``,
    else ``metadata.total_size`` in bytes over the size of the shapes' dtype)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        stated = json.loads(index.read_text())
        metadata = stated.get("metadata") or {}
        if metadata.get("total_parameters"):
            return float(metadata["total_parameters"])
        shards = sorted({folder / name for name in (stated.get("weight_map") or {}).values()})
        if shards and all(s.is_file() for s in shards):
            return sum(_safetensors_parameters(s) for s in shards)
        if metadata.get("total_size"):
            config = folder / "config.json"
            dtype = json.loads(config.read_text()).get("torch_dtype", "bfloat16") if config.is_file() else "bfloat16"
            return float(metadata["total_size"]) / (4 if dtype == "float32" else 2)
        return None
    files = sorted(folder.glob("*.safetensors"))
    return sum(_safetensors_parameters(f) for f in files) if files else None


def _safetensors_parameters(path: Path) -> float:
    import struct

    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return float(sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__"))


#: Shapes of the presets' models, from their published config.json files (weights in billions).
KNOWN_MODELS: dict[str, ModelShape] = {
    "unsloth/Llama-3.1-8B-Instruct": ModelShape(8.03e9, 32, 8, 128),
    "meta-llama/Llama-3.1-70B-Instruct": ModelShape(70.6e9, 80, 8, 128),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(3.75e9, 36, 2, 128),
    "meta-llama/Llama-3.2-90B-Vision-Instruct": ModelShape(88.6e9, 100, 8, 128),
}


def model_shape(model: str) -> ModelShape | None:
    """The shape of ``model``: a local folder's ``config.json`` (its weight count read from the
    checkpoint's own files), a known preset model, or the hub's config and safetensors headers (a
    few KB; needs the network). ``None`` when none of these is available: the memory
    check is then skipped."""
    config_file = Path(model) / "config.json"
    if config_file.is_file():
        return ModelShape.from_config(json.loads(config_file.read_text()), checkpoint_parameters(Path(model)))
    if model in KNOWN_MODELS:
        return KNOWN_MODELS[model]
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model).to_dict()
    except (OSError, ValueError, KeyError):
        return None
    try:  # the weight count the hub's safetensors headers state (a few KB each), else the estimate
        from huggingface_hub import get_safetensors_metadata

        stated = float(sum(get_safetensors_metadata(model).parameter_count.values()))
    except Exception:  # no network, no safetensors, an old hub client: the config's estimate stands
        stated = None
    return ModelShape.from_config(config, stated)


def batching(batch_size: int, max_concurrent_batches: int, max_num_seqs: int) -> list[Finding]:
    """Each replica holds ``batch_size x max_concurrent_batches`` rows; fewer than ``max_num_seqs``
    and the engine can never fill its running batch."""
    queued = batch_size * max_concurrent_batches
    if queued < max_num_seqs:
        # A warning, not an error: the run is correct, only slower (small batches help when testing).
        return [Finding("warning", f"batch_size x max_concurrent_batches = {batch_size} x {max_concurrent_batches} = "
                                   f"{queued} < max_num_seqs = {max_num_seqs}: the engine can never fill its batch; "
                                   f"raise batch_size or max_concurrent_batches, or lower max_num_seqs")]
    return []


def memory(preset: Preset, shape: ModelShape, overhead_fraction: float = 0.1) -> list[Finding]:
    """Weights and KV cache per GPU against ``gpu_memory_utilization`` of the preset's GPU."""
    if not preset.accelerator_type:
        return []
    gpu = GPUS.get(preset.accelerator_type)
    if gpu is None:
        return [Finding("warning", f"no memory data for GPU type {preset.accelerator_type!r}; "
                                   f"known: {sorted(GPUS)}")]
    shards = preset.tensor_parallel_size * preset.pipeline_parallel_size
    budget = gpu.memory_gib * GIB * preset.gpu_memory_utilization * (1 - overhead_fraction)
    weights = shape.parameters * BYTES_PER_WEIGHT.get(preset.quantization, 2.0) / shards
    kv = shape.kv_bytes_per_token * preset.max_num_seqs * preset.max_model_len / shards
    if weights > budget:
        return [Finding("error", f"weights need {weights / GIB:.1f} GiB per GPU but {gpu.name} offers "
                                 f"{budget / GIB:.1f} GiB (at gpu_memory_utilization={preset.gpu_memory_utilization}, "
                                 f"{overhead_fraction:.0%} kept for activations): use more GPUs per replica "
                                 f"(tensor_parallel_size) or quantization")]
    if weights + kv > budget:
        fits = int((budget - weights) / (shape.kv_bytes_per_token * preset.max_model_len / shards))
        return [Finding("warning", f"weights {weights / GIB:.1f} GiB + KV cache for {preset.max_num_seqs} sequences x "
                                   f"{preset.max_model_len} tokens {kv / GIB:.1f} GiB = {(weights + kv) / GIB:.1f} GiB "
                                   f"> {budget / GIB:.1f} GiB per {gpu.name}: only ~{fits} full-length sequences fit at "
                                   f"once (vLLM queues the rest); lower max_model_len or max_num_seqs to match")]
    return []


def interconnect(preset: Preset) -> list[Finding]:
    """Tensor parallelism exchanges activations every layer: over PCIe (no NVLink) it is slow."""
    gpu = GPUS.get(preset.accelerator_type or "")
    if preset.tensor_parallel_size > 1 and gpu is not None and not gpu.nvlink:
        return [Finding("warning", f"tensor_parallel_size={preset.tensor_parallel_size} on {gpu.name}, whose GPUs talk "
                                   f"over PCIe: prefer more replicas of a model that fits one GPU (or quantization)")]
    return []


def blocks(num_blocks: int, replicas: int, batch_size: int, rows: int | None = None) -> list[Finding]:
    """Enough blocks to keep every replica busy, and blocks no larger than a batch."""
    findings = []
    if num_blocks < 2 * replicas:
        findings.append(Finding("warning", f"num_blocks={num_blocks} < 2 x {replicas} replicas: some replicas will "
                                           f"idle; use {2 * replicas}-{4 * replicas} or more"))
    if rows is not None and num_blocks and math.ceil(rows / num_blocks) > batch_size:
        findings.append(Finding("warning", f"{rows} rows in {num_blocks} blocks is ~{math.ceil(rows / num_blocks)} rows "
                                           f"per block > batch_size={batch_size}: a block larger than a batch wins over "
                                           f"batch_size; use at least {math.ceil(rows / batch_size)} blocks"))
    return findings


def check_preset(preset: Preset, shape: ModelShape | None = None, rows: int | None = None) -> list[Finding]:
    """All checks for one preset (memory only when the model's shape is known)."""
    shape = shape or KNOWN_MODELS.get(preset.model_source)
    findings = batching(preset.batch_size, preset.max_concurrent_batches, preset.max_num_seqs)
    findings += memory(preset, shape) if shape else []
    findings += interconnect(preset)
    findings += blocks(preset.num_blocks, max_replicas(preset.concurrency), preset.batch_size,
                       rows if rows is not None else preset.limit)
    return findings


class ConfigurationError(ValueError):
    """A run configuration breaks a rule that would make it fail or waste its resources."""


def enforce(findings: Iterable[Finding]) -> list[str]:
    """Raise on errors (all of them in one message); return the warnings' messages."""
    findings = list(findings)
    errors = [f.message for f in findings if f.level == "error"]
    if errors:
        raise ConfigurationError("Configuration errors:\n  - " + "\n  - ".join(errors))
    return [f.message for f in findings if f.level == "warning"]


def _prompt_tokens(tokenizer: Any, conversation: list[dict[str, Any]]) -> int:
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def suggest_max_model_len(tokenizer: Any, conversations: Sequence[list[dict[str, Any]]], max_tokens: int,
                          quantile: float = 0.99, multiple: int = 64) -> dict[str, int]:
    """Token lengths of a sample of prompts (with the model's chat template), and a ``max_model_len``
    that holds the ``quantile`` prompt plus the answer, rounded up to ``multiple``.

    The guide's advice: size the context from the real P95/P99, not the model's 128K maximum.
    """
    if not conversations:
        raise ValueError("need at least one conversation to measure")
    lengths = sorted(_prompt_tokens(tokenizer, c) for c in conversations)

    def at(q: float) -> int:
        return lengths[min(len(lengths) - 1, math.ceil(q * len(lengths)) - 1)]

    needed = at(quantile) + max_tokens
    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "max": lengths[-1],
            "max_model_len": -(-needed // multiple) * multiple}
