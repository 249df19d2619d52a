"""Full-size model shapes with random weights, for the GPU benchmarks: a folder with a model's published
``config.json`` dimensions and the offline model's tokenizer, which vLLM loads with
``load_format="dummy"`` (it makes the weights up). No download, no weights on disk: memory, step time
and the pipeline's costs are the real model's; the answers are noise. The kit runs such a folder as any
other: ``MODEL_SOURCE=<folder>`` with ``ENGINE={"engine_kwargs": {"load_format": "dummy"}}``
(:func:`engine` adds that; ``bench_pipeline.run_settings`` uses it).

Only ``vocab_size`` differs from the published model: it is the offline tokenizer's (SmolLM2's 49,152
for text, the tiny Qwen2-VL's for vision), which takes ~0.6B weights off Llama-3.1-8B and ~0.3B off
Qwen2.5-VL-3B; the folder's ``random_weights.json`` says so.

    python benchmarks/random_weights.py unsloth/Llama-3.1-8B-Instruct   # builds it once, prints its folder
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from helpers import models

NOTE = "random_weights.json"  # in every folder this builds: what it is, and that vLLM must make the weights up
DUMMY = {"load_format": "dummy"}

_LLAMA_31_8B = {  # unsloth/Llama-3.1-8B-Instruct's config.json (the same as meta-llama's), Hugging Face Hub
    "architecture": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
#: The presets' models as published: every dimension that decides memory and speed, from each model's
#: ``config.json`` on the Hugging Face Hub. (Not Llama-3.2-90B-Vision: vLLM 0.29 no longer runs its
#: architecture, MllamaForConditionalGeneration, removed after vLLM 0.10.2.)
PUBLISHED: dict[str, dict[str, Any]] = {
    "unsloth/Llama-3.1-8B-Instruct": _LLAMA_31_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA_31_8B,
    "meta-llama/Llama-3.1-70B-Instruct": {  # its config.json; rope as the 8B's
        **_LLAMA_31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64},
    "Qwen/Qwen2.5-VL-3B-Instruct": {  # its config.json
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


def prepare(model: str, cache: Path | None = None, *, shrink: dict[str, Any] | None = None) -> Path:
    """The folder of ``model``'s shape with random weights, built once under ``cache`` (default: the kit's
    cache, ``random-weights/``; a few seconds, no weights written). ``shrink`` replaces dimensions (tests
    build tiny copies of the same architecture for a CPU)."""
    if model not in PUBLISHED:
        raise ValueError(f"no published shape for {model!r}; known: {sorted(PUBLISHED)}")
    dims = {**PUBLISHED[model], **(shrink or {})}
    name = model.split("/")[-1] + "".join(f"-{k}{v}" for k, v in sorted((shrink or {}).items()) if not isinstance(v, dict))
    return models.build_once((cache or models.cache_root()) / "random-weights" / name, lambda out: _build(out, model, dims))


def _build(out: Path, model: str, dims: dict[str, Any]) -> dict:
    import transformers
    from transformers import AutoTokenizer

    dims = dict(dims)
    architecture = dims.pop("architecture")
    if architecture == "llama":
        from transformers import GenerationConfig, LlamaConfig

        source = models.prepare_smollm2()
        tokenizer = AutoTokenizer.from_pretrained(source)
        offline = json.loads((source / "config.json").read_text())
        config = LlamaConfig(**{**dims, "vocab_size": len(tokenizer)}, bos_token_id=offline.get("bos_token_id"),
                             eos_token_id=offline.get("eos_token_id"), pad_token_id=offline.get("pad_token_id"))
        config.architectures = ["LlamaForCausalLM"]
        tokenizer.save_pretrained(out)
        GenerationConfig.from_pretrained(source).save_pretrained(out)
        tokenizer_from = "SmolLM2-135M-Instruct's (the offline text model)"
    elif architecture == "qwen2_5_vl":
        from transformers import AutoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLProcessor

        source = models.tiny_vlm()
        tiny = AutoProcessor.from_pretrained(source)
        tokenizer = tiny.tokenizer
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<|image_pad|>",
                                                               "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
        vision = dims.pop("vision_config")
        config = Qwen2_5_VLConfig(
            text_config={**dims, "vocab_size": len(tokenizer), "eos_token_id": ids["<|im_end|>"],
                         "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|endoftext|>"]},
            vision_config=vision, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=dims.get("tie_word_embeddings", True))
        config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
        Qwen2_5_VLProcessor(image_processor=tiny.image_processor, tokenizer=tokenizer, video_processor=tiny.video_processor,
                            chat_template=tiny.chat_template).save_pretrained(out)
        tokenizer_from = "the tiny Qwen2-VL's (the offline vision model's tokenizer and image processor)"
    else:
        raise ValueError(f"no builder for architecture {architecture!r}")
    config.dtype = "bfloat16"
    config.save_pretrained(out)
    note = {"model": model, "weights": "random (vLLM load_format='dummy'): answers are noise",
            "dimensions": "as published (benchmarks/random_weights.py PUBLISHED), except vocab_size",
            "vocab_size": f"{len(tokenizer)}, the tokenizer's, not the published {PUBLISHED[model]['vocab_size']}",
            "tokenizer": tokenizer_from, "transformers": transformers.__version__}
    (out / NOTE).write_text(json.dumps(note, indent=2))
    return note


def note(folder: str | Path | None) -> dict | None:
    """What :func:`prepare` wrote in ``folder`` (the model it has the shape of), None for any other."""
    path = Path(str(folder or "")).expanduser() / NOTE
    return json.loads(path.read_text()) if folder and path.is_file() else None


def engine(model_source: str | None, engine: dict[str, Any]) -> dict[str, Any]:
    """``ENGINE`` for ``MODEL_SOURCE``: with ``load_format="dummy"`` added where the source is a folder
    :func:`prepare` built (vLLM would find no weights there); as it is for any other."""
    if note(model_source) is None:
        return engine
    return {**engine, "engine_kwargs": {**DUMMY, **(engine.get("engine_kwargs") or {})}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", choices=sorted(PUBLISHED))
    for model in parser.parse_args(argv).models:
        print(prepare(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
