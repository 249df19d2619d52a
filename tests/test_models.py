import json

import pytest

from helpers import models


def test_build_once_is_idempotent(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")
        return {"v": 1}

    target = tmp_path / "m"
    assert models.build_once(target, build) == target
    assert models.build_once(target, build) == target
    assert len(calls) == 1
    assert json.loads((target / models.COMPLETE_MARKER).read_text()) == {"v": 1}
    models.build_once(target, build, rebuild=True)
    assert len(calls) == 2


def test_interrupted_build_leaves_nothing_a_later_run_trusts(tmp_path):
    target = tmp_path / "m"

    def crash(folder):
        (folder / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.build_once(target, crash)
    assert not target.exists()
    assert not list(tmp_path.glob(".m.tmp-*"))
    # A stale temporary folder (from a killed process) is cleaned up by the next build.
    (tmp_path / ".m.tmp-stale").mkdir()
    models.build_once(target, lambda f: (f / "config.json").write_text("{}") and {})
    assert models.is_complete(target) and not (tmp_path / ".m.tmp-stale").exists()


def test_incomplete_folder_is_rebuilt(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("half-written")
    models.build_once(target, lambda f: (f / "config.json").write_text("{}") and {})
    assert (target / "config.json").read_text() == "{}"


def test_resolve_model_source(tmp_path):
    assert models.resolve_model_source("unsloth/Llama-3.1-8B-Instruct") == "unsloth/Llama-3.1-8B-Instruct"
    assert models.resolve_model_source("offline", offline_builder=lambda: tmp_path) == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="without config.json"):
        models.resolve_model_source(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_model_source(str(tmp_path)) == str(tmp_path.resolve())


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_KIT_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path


def test_smollm2_conversion_is_a_loadable_llama(smollm2_path):
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert models.is_complete(smollm2_path)
    assert (smollm2_path / "model.safetensors").stat().st_size > 200_000_000
