import json
from pathlib import Path

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


def test_random_weights_shapes_are_the_published_dimensions_with_the_offline_tokenizers(smollm2_path):
    from transformers import AutoConfig, AutoTokenizer

    from helpers import fitting, presets, shapes

    for model, offline in [("unsloth/Llama-3.1-8B-Instruct", smollm2_path),
                           ("meta-llama/Llama-3.1-70B-Instruct", smollm2_path),
                           ("Qwen/Qwen2.5-VL-3B-Instruct", models.prepare_tiny_vlm())]:
        folder = models.resolve_model_source(shapes.RANDOM_WEIGHTS + model)
        assert models.has_random_weights(folder) and not list(Path(folder).glob("*.safetensors"))  # no weights
        config = AutoConfig.from_pretrained(folder).to_dict()
        text = config.get("text_config") or config
        published = shapes.PUBLISHED_CONFIGS[model]
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings"):
            assert text[name] == published[name], name
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert text["vocab_size"] == len(tokenizer) == len(AutoTokenizer.from_pretrained(offline))
        note = json.loads((Path(folder) / models.RANDOM_WEIGHTS_NOTE).read_text())
        assert f"not the published {published['vocab_size']}" in note["vocab_size"] and "noise" in note["weights"]
        # The weight count the checks see: the published one less the smaller vocabulary's embeddings.
        embeddings = (published["vocab_size"] - len(tokenizer)) * published["hidden_size"]
        embeddings *= 1 if published["tie_word_embeddings"] else 2
        expected = shapes.KNOWN_MODELS[model].parameters - embeddings
        assert shapes.model_shape(folder).parameters == pytest.approx(expected, rel=0.02)
        # The kit tells vLLM to make the weights up: for the source and for the folder it built.
        task = "text" if "Llama" in model else "vision"
        for source in (shapes.RANDOM_WEIGHTS + model, folder):
            assert fitting.select(presets.CPU_PRESET[task], task, model_source=source).engine_kwargs()["load_format"] == "dummy"
    qwen = AutoConfig.from_pretrained(models.prepare_random_weights("Qwen/Qwen2.5-VL-3B-Instruct")).to_dict()
    assert qwen["vision_config"]["depth"] == 32 and qwen["vision_config"]["out_hidden_size"] == 2048
    tiny = models.prepare_tiny_vlm()
    assert qwen["image_token_id"] == AutoTokenizer.from_pretrained(tiny).convert_tokens_to_ids("<|image_pad|>")
    assert "load_format" not in fitting.select("text-cpu-offline", "text").engine_kwargs()  # real weights
    with pytest.raises(ValueError, match="no published shape"):
        models.prepare_random_weights("org/unknown")


def test_llama_70b_shape_is_the_published_one():
    """The 70B shape the kit builds with random weights (tensor-parallel runs on several GPUs) is the
    published config.json's: about 70.6e9 weights, 320 KiB of KV cache per token, the 8B's rope."""
    from helpers import shapes

    published = shapes.PUBLISHED_CONFIGS["meta-llama/Llama-3.1-70B-Instruct"]
    shape = shapes.ModelShape.from_config(published)
    assert shape.parameters == pytest.approx(70.6e9, rel=0.005)
    assert shape.parameters == pytest.approx(shapes.KNOWN_MODELS["meta-llama/Llama-3.1-70B-Instruct"].parameters, rel=0.005)
    assert shape.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert (published["hidden_size"], published["intermediate_size"], published["num_attention_heads"],
            published["vocab_size"], published["max_position_embeddings"]) == (8192, 28672, 64, 128256, 131072)
    assert published["rope_parameters"] == shapes.PUBLISHED_CONFIGS["unsloth/Llama-3.1-8B-Instruct"]["rope_parameters"]


#: Tiny copies of the two architectures, for vLLM on a CPU (head_dim 32: the CPU attention's smallest).
TINY_SHAPES = {
    "unsloth/Llama-3.1-8B-Instruct": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                          "fullatt_block_indexes": [1], "tokens_per_second": 2, "hidden_act": "silu", "in_channels": 3}},
}

LOAD_SCRIPT = """
import json, os, sys
from helpers import caption, engine, fitting, models, presets
from PIL import Image
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

def main():
    os.environ.update(engine.engine_env(1))
    model, task, shrink = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    folder = str(models.prepare_random_weights(model, shrink=shrink))
    kwargs = fitting.select(presets.CPU_PRESET[task], task, model_source=folder).engine_kwargs()
    if task == "text":
        llm = LLM(model=folder, **kwargs)
        sampling = SamplingParams(max_tokens=8, temperature=0, structured_outputs=StructuredOutputsParams(choice=["Retail", "Law Firm"]))
        out = llm.chat([[{"role": "user", "content": "Company: Walmart"}]] * 3, sampling, use_tqdm=False)
    else:
        llm = LLM(model=folder, **kwargs, limit_mm_per_prompt={"image": 1})
        messages = caption.build_messages("You describe images.", "Describe this image.", Image.new("RGB", (224, 224), "red"))
        out = llm.chat([messages] * 2, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False,
                       chat_template_content_format="string")
    print("ANSWERS " + json.dumps([[o.outputs[0].text, len(o.outputs[0].token_ids)] for o in out]), flush=True)

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.extended  # with the benchmarks it serves, outside CI's hour (make test-extended)
@pytest.mark.parametrize("model", sorted(TINY_SHAPES))
def test_random_weights_load_in_vllm_with_the_kits_engine_arguments(model, tmp_path):
    """The GPU benchmark's shapes, at a tiny size, through the same path: the kit's engine arguments
    (``load_format="dummy"``) and vLLM's CPU engine. Random weights answer noise, but structured
    choice still answers only labels."""
    import subprocess
    import sys

    script = tmp_path / "load.py"
    script.write_text(LOAD_SCRIPT)
    task = "text" if "Llama" in model else "vision"
    done = subprocess.run([sys.executable, str(script), model, task, json.dumps(TINY_SHAPES[model])],
                          capture_output=True, text=True, timeout=600, cwd=Path(models.__file__).parents[1])
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    answers = json.loads(lines[0].split(" ", 1)[1])
    if task == "text":
        assert len(answers) == 3 and all(text in ("Retail", "Law Firm") for text, _ in answers)
    else:
        assert len(answers) == 2 and all(tokens == 8 for _, tokens in answers)  # noise, 8 tokens of it
