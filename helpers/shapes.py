"""Model shapes: what GPU memory depends on (weight count, KV-cache bytes per token).

Read from a local checkpoint (``config.json`` and the safetensors headers), from the shapes of the
presets' models, or from the hub (a few KB). Used by :mod:`helpers.presets` (what "auto" fits) and
:mod:`helpers.checks` (what must fit).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
BYTES_PER_WEIGHT = {None: 2.0, "fp8": 1.0, "awq": 0.5, "gptq": 0.5}


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: weight count, and the KV cache's size per token."""

    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes: int = 2  # 16-bit KV cache
    #: Query heads; tensor parallelism splits them, so its size must divide them (0: unknown).
    attention_heads: int = 0

    def weight_bytes(self, quantization: str | None = None) -> float:
        """Bytes the weights take in GPU memory: 16-bit, or as ``quantization`` stores them."""
        return self.parameters * BYTES_PER_WEIGHT.get(quantization, 2.0)

    def divides(self, tensor_parallel_size: int) -> bool:
        """Whether ``tensor_parallel_size`` splits the attention heads evenly (as vLLM requires)."""
        return not self.attention_heads or self.attention_heads % tensor_parallel_size == 0

    def tensor_parallel_size(self, budget: float, largest_node: int, quantization: str | None = None) -> int | None:
        """The fewest GPUs one replica needs: a power of two up to 8 whose share of the weights leaves
        a fifth of ``budget`` (one engine's bytes: :func:`helpers.gpus.memory_budget`) for the KV cache,
        at most the GPUs of one node (a tensor-parallel group does not span nodes) and a divisor of the
        attention heads; None where none fits."""
        for tp in (1, 2, 4, 8):
            if tp <= largest_node and self.divides(tp) and self.weight_bytes(quantization) / tp <= 0.8 * budget:
                return tp
        return None

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
            parameters = layers * attention + mlp_total + embeddings + _vision_parameters(config, hidden)
        return cls(parameters=parameters, layers=layers, kv_heads=kv_heads, head_dim=head_dim, attention_heads=heads)


def _vision_parameters(config: Mapping[str, Any], text_hidden: int) -> float:
    """An estimate of a vision-language model's image encoder (Qwen2-VL, Qwen2.5-VL and alike):
    its blocks (attention and MLP, gated where the config gives an ``intermediate_size``), the
    merger into the text model's width, and the patch embedding; 0 without a ``vision_config``.
    (Qwen2.5-VL-3B's: ~0.67B of its 3.75B weights.)"""
    v = config.get("vision_config")
    if not v:
        return 0.0
    width = v.get("embed_dim") or v["hidden_size"]
    depth = v.get("depth") or v.get("num_hidden_layers") or 0
    out = v.get("out_hidden_size") or text_hidden
    gated = "intermediate_size" in v
    inner = v.get("intermediate_size") or int(width * v.get("mlp_ratio", 4))
    blocks = depth * (4 * width * width + (3 if gated else 2) * width * inner)
    merged = v.get("spatial_merge_size", 1) ** 2 * width
    patch = v.get("in_channels", v.get("in_chans", 3)) * v.get("temporal_patch_size", 1) * v.get("patch_size", 14) ** 2
    return float(blocks + merged * merged + merged * out + patch * width)


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
    "unsloth/Llama-3.1-8B-Instruct": ModelShape(8.03e9, 32, 8, 128, attention_heads=32),
    "meta-llama/Llama-3.1-70B-Instruct": ModelShape(70.6e9, 80, 8, 128, attention_heads=64),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(3.75e9, 36, 2, 128, attention_heads=16),
    "meta-llama/Llama-3.2-90B-Vision-Instruct": ModelShape(88.6e9, 100, 8, 128, attention_heads=64),
}


#: A ``MODEL_SOURCE`` that starts with this builds the named model's shape with random weights
#: (:func:`helpers.models.prepare_random_weights`; vLLM's ``load_format="dummy"``): its memory and
#: speed, for benchmarks and "will my run fit?" checks, without downloading it. Answers are noise.
RANDOM_WEIGHTS = "random-weights:"

_LLAMA_31_8B = {  # unsloth/Llama-3.1-8B-Instruct's config.json (the same as meta-llama's), Hugging Face Hub
    "architecture": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
_LLAMA_31_70B = {  # meta-llama/Llama-3.1-70B-Instruct's config.json, Hugging Face Hub (rope: as the 8B's)
    "architecture": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_parameters": dict(_LLAMA_31_8B["rope_parameters"]),
}
#: The tutorials' models as published: every dimension that decides memory and speed, copied from
#: each model's ``config.json`` on the Hugging Face Hub (the source named beside each). Only
#: ``vocab_size`` changes when the kit builds one with random weights: it takes the offline
#: tokenizer's (:func:`helpers.models.prepare_random_weights` says so in the folder it builds).
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "unsloth/Llama-3.1-8B-Instruct": _LLAMA_31_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA_31_8B,
    "meta-llama/Llama-3.1-70B-Instruct": _LLAMA_31_70B,  # the presets' multi-GPU model (tensor parallelism)
    "Qwen/Qwen2.5-VL-3B-Instruct": {  # Qwen/Qwen2.5-VL-3B-Instruct's config.json, Hugging Face Hub
        "architecture": "qwen2_5_vl", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                          "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                          "hidden_act": "silu", "in_channels": 3},
    },
}


def random_weights_of(model_source: str | None) -> str | None:
    """The model id in a ``random-weights:`` ``MODEL_SOURCE`` (:data:`RANDOM_WEIGHTS`), else ``None``."""
    if model_source and model_source.startswith(RANDOM_WEIGHTS):
        return model_source[len(RANDOM_WEIGHTS):]
    return None


def model_shape(model: str) -> ModelShape | None:
    """The shape of ``model``: a local folder's ``config.json`` (its weight count read from the
    checkpoint's own files), a known preset model (also as ``random-weights:MODEL``), or the hub's
    config and safetensors headers (a few KB; needs the network). ``None`` when none of these is available: the memory
    check is then skipped."""
    model = random_weights_of(model) or model  # the same shape, with the published vocabulary (a little more)
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
