import json

import pytest

from helpers import checks, classify, cluster, engine, fitting, gpus, presets, shapes
from helpers.presets import PRESETS


def test_seed_presets_are_as_published():
    text = PRESETS["text-llama8b-l4"]
    assert (text.model_source, text.accelerator_type, text.batch_size, text.max_model_len, text.concurrency) == \
        ("unsloth/Llama-3.1-8B-Instruct", "L4", 256, 256, 4)
    assert PRESETS["text-llama8b-l4-scaled"].concurrency == 10 and "1,000,000 rows" in PRESETS["text-llama8b-l4-scaled"].description
    assert not hasattr(PRESETS["text-llama8b-l4-scaled"], "limit")  # a run's rows are LIMIT's alone
    vision = PRESETS["vision-qwen3b-l4"]
    assert (vision.batch_size, vision.max_model_len, vision.concurrency) == (16, 8192, 4)
    big = PRESETS["vision-llama90b-h100-tp8-pp2"]
    assert big.gpus_per_replica == 16 and big.engine_kwargs()["distributed_executor_backend"] == "ray"
    assert {p.accelerator_type for p in PRESETS.values()} >= {None, "L4", "A10G", "A100-80G", "H100", "H200"}


def test_presets_are_frozen_and_overrides_are_checked():
    preset = PRESETS["text-llama8b-l4"]
    with pytest.raises(Exception):
        preset.batch_size = 1  # type: ignore[misc]
    assert preset.override(batch_size=128).batch_size == 128 and preset.batch_size == 256
    with pytest.raises(TypeError, match=r"unknown preset field\(s\) \['batch_sise'\]"):
        preset.override(batch_sise=128)


def test_auto_picks_cpu_without_gpu_and_gpu_preset_with_one():
    assert fitting.select("auto", "text").name == "text-cpu-offline"
    assert fitting.select("auto", "text", cluster={"CPU": 2.0}).name == "text-cpu-offline"
    assert fitting.select("auto", "vision", cluster={"CPU": 2.0}, batch_size=4).batch_size == 4
    with pytest.raises(KeyError, match="no preset 'nope'"):
        fitting.select("nope", "text")
    with pytest.raises(ValueError, match="is for the vision task"):
        fitting.select("vision-qwen3b-l4", "text")


def test_notebook_parameters_left_at_none_come_from_the_preset_and_given_ones_win():
    parameters = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto", "BATCH_SIZE": 32,
                                                                      "CONCURRENCY": [2, 4]}
    config = fitting.from_parameters("text", parameters, cluster={"GPU": 4.0, "accelerator_type:L4": 1.0})
    # MODEL_SOURCE None: the offline model on GPUs too (the defaults run anywhere), fitted as the 8B.
    assert config.name == "auto (4xL4)" and config.model_source == "offline"
    why = {row["parameter"]: row["why"] for row in fitting.describe(config, parameters)}
    assert "the offline model" in why["MODEL_SOURCE"] and "unsloth/Llama-3.1-8B-Instruct" in why["MODEL_SOURCE"]
    named = fitting.from_parameters("text", {**parameters, "MODEL_SOURCE": "unsloth/Llama-3.1-8B-Instruct"},
                                    cluster={"GPU": 4.0, "accelerator_type:L4": 1.0})
    assert named.model_source == "unsloth/Llama-3.1-8B-Instruct" and named.max_num_seqs == config.max_num_seqs
    assert fitting.select("text-llama8b-l4", "text").model_source == "unsloth/Llama-3.1-8B-Instruct"  # named: its model
    assert config.batch_size == 32 and config.concurrency == (2, 4) and config.num_blocks == 128
    sources = {row["parameter"]: row["from"] for row in fitting.describe(config, parameters)}
    assert sources["BATCH_SIZE"] == "your parameter" and sources["NUM_BLOCKS"] == "preset auto (4xL4)"
    assert sources["max_num_seqs"] == "preset auto (4xL4)"
    # A parameter the notebook doesn't have (the captioning notebook computes MAX_MODEL_LEN) is not listed.
    vision = {k: v for k, v in parameters.items() if k != "MAX_MODEL_LEN"} | {"PRESET": "vision-cpu-offline"}
    assert "MAX_MODEL_LEN" not in {r["parameter"] for r in fitting.describe(fitting.from_parameters("vision", vision), vision)}


def test_preset_names_and_overview_cover_each_task():
    assert presets.names("vision")[0] == "auto" and "vision-qwen3b-l4" in presets.names("vision")
    assert "text-cpu-offline" not in presets.names("vision")
    rows = {r["preset"]: r for r in presets.overview("text")}
    assert rows["text-llama70b-h100-tp4"]["GPUs per replica"] == 4 and rows["text-cpu-offline"]["GPU"] == "CPU"
    assert "1,000,000 rows" in rows["text-llama8b-l4-scaled"]["about"] and "rows" not in rows["text-llama8b-a100"]


def test_a_named_presets_checks_say_which_preset_and_hardware_they_are_about():
    """The captioning and text notebooks print the tutorial preset's checks in any run: on an H100 or
    a CPU, a warning about an L4 must not read as one about the run."""
    from helpers import plan

    lines = plan.check_named("text-llama8b-l4-scaled")
    assert lines[0] == "The preset 'text-llama8b-l4-scaled' on 10 x L4 (not this run): the checks find:"
    assert len(lines) > 1 and all(line.startswith("  warning: ") for line in lines[1:])
    assert "per L4" in lines[1]
    fixed = plan.check_named("text-llama8b-l4-scaled", max_model_len=128)
    assert fixed == ["The preset 'text-llama8b-l4-scaled' on 10 x L4, with max_model_len=128 (not this run): "
                     "the checks find nothing"]
    assert plan.check_named("vision-cpu-offline")[0].startswith("The preset 'vision-cpu-offline' on a CPU ")


def test_model_shape_from_a_folder_a_known_id_or_none(smollm2_path, monkeypatch):
    shape = shapes.model_shape(str(smollm2_path))
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (30, 3, 64)
    assert 1.2e8 < shape.parameters < 1.5e8  # SmolLM2-135M
    assert shapes.model_shape("unsloth/Llama-3.1-8B-Instruct") is shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert shapes.model_shape("someone/unknown-model") is None


def test_every_preset_passes_its_own_checks():
    for preset in PRESETS.values():
        warnings = checks.enforce(checks.check_preset(preset))  # no errors
        if preset.name not in ("text-llama8b-l4", "text-llama8b-l4-scaled", "text-llama8b-a10g",
                               "vision-qwen3b-l4", "vision-qwen3b-l4-scaled"):
            assert warnings == [], (preset.name, warnings)


def test_batching_rule_with_numbers():
    assert checks.batching(128, 4, 256) == []
    [finding] = checks.batching(64, 2, 256)
    assert finding.level == "warning" and "64 x 2 = 128 < max_num_seqs = 256" in finding.message


def test_memory_estimate_errors_when_weights_do_not_fit_and_warns_on_kv():
    seventy_b_on_one_l4 = PRESETS["text-llama8b-l4"].override(model_source="meta-llama/Llama-3.1-70B-Instruct")
    [finding] = checks.memory(seventy_b_on_one_l4, shapes.KNOWN_MODELS["meta-llama/Llama-3.1-70B-Instruct"])
    assert finding.level == "error" and "weights need 131.5 GiB per GPU" in finding.message
    long_context = PRESETS["text-llama8b-l4"].override(max_model_len=8192)
    [finding] = checks.memory(long_context, shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"])
    assert finding.level == "warning" and "256 sequences x 8192 tokens" in finding.message
    # The seed's own L4 run: the weights fit, but not 256 full-length sequences at once (~143 do).
    [seed] = checks.memory(PRESETS["text-llama8b-l4"], shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"])
    assert seed.level == "warning" and "only ~143 full-length sequences fit" in seed.message
    assert checks.memory(PRESETS["text-llama8b-a100"], shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"]) == []


def test_model_shape_from_config_matches_published_size():
    llama8b = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
    shape = shapes.ModelShape.from_config(llama8b)
    assert abs(shape.parameters - 8.03e9) / 8.03e9 < 0.01
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"].kv_bytes_per_token


MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-Instruct-v0.1's config.json (46.7e9 weights published)
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_mixture_of_experts_counts_every_expert():
    shape = shapes.ModelShape.from_config(MIXTRAL_8X7B)
    assert abs(shape.parameters - 46.7e9) / 46.7e9 < 0.01, shape.parameters  # was 7.2e9: one expert's worth
    dense = shapes.ModelShape.from_config({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"})
    assert dense.parameters < 7.5e9


def test_auto_gives_a_mixture_of_experts_model_the_gpus_its_weights_need(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL_8X7B))
    chosen = fitting.select("auto", "text", cluster={"GPU": 4.0, "accelerator_type:H100": 1.0},
                            model_source=str(tmp_path))
    assert chosen.tensor_parallel_size == 2 and chosen.concurrency == 2  # ~87 GiB of weights: two H100s each


def test_a_checkpoint_states_its_weight_count(tmp_path):
    import torch
    from safetensors.torch import save_file

    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"a": torch.zeros(1000, 64), "b": torch.zeros(3, 5)}, str(tmp_path / "model.safetensors"))
    assert shapes.checkpoint_parameters(tmp_path) == 64_015
    assert shapes.model_shape(str(tmp_path)).parameters == 64_015  # read, not the config's estimate
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00001.safetensors")
    index = {"metadata": {"total_size": 256_060}, "weight_map": {"a": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert shapes.checkpoint_parameters(tmp_path) == 64_015  # the shards' headers
    (tmp_path / "model-00001-of-00001.safetensors").unlink()
    assert shapes.checkpoint_parameters(tmp_path) == 128_030  # total_size / 2 bytes (bf16 by default)
    index["metadata"]["total_parameters"] = 99
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert shapes.checkpoint_parameters(tmp_path) == 99
    assert shapes.checkpoint_parameters(tmp_path / "nothing") is None


def test_tensor_parallel_over_pcie_is_warned():
    [finding] = checks.interconnect(PRESETS["text-llama8b-l4"].override(tensor_parallel_size=2))
    assert finding.level == "warning" and "PCIe" in finding.message
    assert checks.interconnect(PRESETS["text-llama70b-h100-tp4"]) == []


def test_blocks_rules():
    [idle] = checks.blocks(num_blocks=4, replicas=4, batch_size=256)
    assert "num_blocks=4 < 2 x 4 replicas" in idle.message
    # Big read blocks are no problem for the batches (the run cuts them to one batch each) ...
    assert checks.blocks(num_blocks=8, replicas=2, batch_size=128, rows=1_000_000) == []
    # ... but a block's batches reach the engine as one task: with fewer blocks than the replicas hold
    # (2 x max_concurrent_batches each, twice over), the replica ready first may take them all.
    [first] = checks.blocks(num_blocks=64, replicas=2, batch_size=16, rows=10_000, max_concurrent_batches=72)
    assert "num_blocks=64 < 576: the replica ready first may take every block" in first.message
    assert checks.blocks(num_blocks=576, replicas=2, batch_size=16, rows=10_000, max_concurrent_batches=72) == []
    assert checks.blocks(num_blocks=4, replicas=1, batch_size=16, rows=10_000, max_concurrent_batches=72) == []
    # ... but too few rows for the replicas are: 309 rows in batches of 256 feed 2 of 4 replicas.
    [few] = checks.blocks(num_blocks=16, replicas=4, batch_size=256, rows=309)
    assert "309 rows make 2 batches of 256: 2 of the 4 replicas get none" in few.message
    assert "BATCH_SIZE to about 77" in few.message
    assert checks.blocks(num_blocks=256, replicas=4, batch_size=128, rows=10_000) == []

def test_enforce_raises_all_errors_and_returns_warnings():
    findings = [checks.Finding("warning", "w"), checks.Finding("error", "e1"), checks.Finding("error", "e2")]
    with pytest.raises(checks.ConfigurationError, match="e1\n  - e2"):
        checks.enforce(findings)
    assert checks.enforce([checks.Finding("warning", "w")]) == ["w"]


def test_suggest_max_model_len_uses_the_models_template(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    companies = ["Apple", "Walmart", "Skadden, Arps, Slate, Meagher & Flom"] + [" ".join(f"w{i}" for i in range(400))]
    conversations = [classify.build_messages(c, classify.DEFAULT_LABELS, "Classify.", "Company: {text}")
                     for c in companies]
    suggestion = checks.suggest_max_model_len(tok, conversations, max_tokens=14, quantile=0.75)
    assert suggestion["p50"] < 100 < 400 < suggestion["max"]
    assert suggestion["max_model_len"] % 64 == 0 and suggestion["max_model_len"] < 200  # the outlier does not set it


def test_checks_take_an_autoscaling_concurrency_pair():
    # CONCURRENCY=[2, 5] (a documented form); papermill hands it over as a list, the preset keeps a tuple.
    # NUM_BLOCKS given: the kit keeps yours, and the check judges it.
    preset = fitting.from_parameters("text", {"PRESET": "text-cpu-offline", "CONCURRENCY": [2, 5], "NUM_BLOCKS": 8})
    assert preset.concurrency == (2, 5)
    messages = [f.message for f in checks.check_preset(preset, rows=1000)]
    assert any("num_blocks=8 < 2 x 5 replicas" in m for m in messages)  # judged at the pool's largest size


def _auto(task, **cluster):
    return fitting.select("auto", task, cluster=cluster)


def test_auto_fits_one_h100():
    # The bug: any GPU meant the 4 x L4 tutorial preset, which cannot be scheduled on one H100.
    text, vision = _auto("text", GPU=1.0, **{"accelerator_type:H100": 1.0}), _auto("vision", GPU=1.0, **{"accelerator_type:H100": 1.0})
    for p in (text, vision):
        assert p.accelerator_type == "H100" and p.tensor_parallel_size == 1 and p.gpus == 1
    # Short text requests: two engines share the GPU, each with its share of memory and sequences.
    assert (text.concurrency, text.replicas_per_gpu, text.gpus_per_replica) == (2, 2, 0.5)
    assert text.engine_kwargs()["gpu_memory_utilization"] == 0.44 and text.max_num_seqs == 512
    assert (vision.concurrency, vision.replicas_per_gpu, vision.engine_kwargs()["gpu_memory_utilization"]) == (1, 1, 0.9)
    assert dict(text.reasons)["accelerator_type"] == "planned for 1 x H100 (80 GiB each, not measured: the kit's table for H100)"
    # What vllm.LLM would take per step there; Ray's engine stage alone gets vLLM's generic 2048.
    assert text.engine_kwargs()["max_num_batched_tokens"] == 16384
    # Rows queued per replica cover twice the engine stage's 1.1 x max_num_seqs request slots.
    assert text.batch_size * text.max_concurrent_batches >= 2 * 1.1 * text.max_num_seqs
    assert checks.enforce(checks.check_preset(text)) == [] or all("blocks" in w for w in checks.enforce(checks.check_preset(text)))


def test_auto_on_8_a100s_runs_8_replicas():
    p = _auto("text", GPU=8.0, **{"accelerator_type:A100-80G": 1.0})
    assert (p.accelerator_type, p.concurrency, p.tensor_parallel_size, p.gpus) == ("A100-80G", 16, 1, 8)
    assert p.num_blocks >= 4 * 16 and "2 replicas on each of 8 GPUs" in dict(p.reasons)["concurrency"]
    one = fitting.select("auto", "text", cluster={"GPU": 8.0, "accelerator_type:A100-80G": 1.0}, replicas_per_gpu=1)
    assert one.concurrency == 8 and "one replica per GPU (8)" in dict(one.reasons)["concurrency"]


def test_auto_on_4_l4s_and_2_t4s_uses_tensor_parallelism_only_where_the_model_does_not_fit():
    l4 = _auto("text", GPU=4.0, **{"accelerator_type:L4": 1.0})
    assert (l4.concurrency, l4.tensor_parallel_size) == (4, 1)  # 8B in 16 bits fits a 24 GB L4
    assert l4.max_num_seqs < 256  # but not 256 full-length sequences of KV cache (the checks' warning)
    assert not [f for f in checks.check_preset(l4) if f.level == "warning" and "KV cache" in f.message]
    t4 = _auto("text", GPU=2.0, **{"accelerator_type:T4": 1.0})
    assert (t4.concurrency, t4.tensor_parallel_size) == (1, 2)  # 15 GiB of weights > a 16 GB T4's share
    assert "do not fit one T4" in dict(t4.reasons)["tensor_parallel_size"]


def test_auto_on_an_unknown_gpu_type_uses_measured_memory_or_says_what_to_do():
    p = _auto("text", GPU=2.0, gpu_memory_gib=192.0, **{"accelerator_type:B300": 1.0})
    assert (p.accelerator_type, p.concurrency, p.tensor_parallel_size, p.gpus) == ("B300", 4, 1, 2)
    # The offline model runs on any GPU: not refused for the tutorial model's size (which it is not).
    offline = _auto("text", GPU=1.0, **{"accelerator_type:B300": 1.0})
    assert (offline.accelerator_type, offline.concurrency, offline.tensor_parallel_size) == ("B300", 1, 1)
    assert "would not fit 1 x B300" in dict(offline.reasons)["model_source"]
    # A named model on a type of unknown memory: refused, naming a setting that runs there.
    llama = "unsloth/Llama-3.1-8B-Instruct"
    with pytest.raises(fitting.AutoPresetError, match="does not know 'B300'") as err:
        fitting.select("auto", "text", cluster={"GPU": 1.0, "accelerator_type:B300": 1.0}, model_source=llama)
    assert "PRESET='text-llama8b-h100', ACCELERATOR_TYPE='B300', CONCURRENCY=1" in str(err.value)
    named = fitting.select("text-llama8b-h100", "text", accelerator_type="B300", concurrency=1)
    assert cluster.schedulability_problems({"GPU": 1.0, "CPU": 16.0, "accelerator_type:B300": 1.0},
                                           engine.CpuBudget(1, 1, 1.0, 1), named.accelerator_type) == []
    assert [f.level for f in checks.memory(named, shapes.model_shape(llama))] == ["warning"]  # memory unknown


def test_auto_never_falls_back_to_cpus_on_a_remote_cluster_without_gpus_yet():
    with pytest.raises(fitting.AutoPresetError, match="min_nodes: 0.*Set ACCELERATOR_TYPE to the GPU type.*or name a preset"):
        _auto("text", CPU=8.0, remote=True)
    assert _auto("text", CPU=8.0).name == "text-cpu-offline"  # a local machine without a GPU: the CPU preset


def test_auto_sizes_the_offline_model_from_its_folder(smollm2_path):
    p = fitting.select("auto", "text", cluster={"GPU": 1.0, "accelerator_type:H100": 1.0},
                       model_source=str(smollm2_path))
    assert p.model_source == str(smollm2_path) and p.concurrency == 2 and p.max_num_seqs == 512  # two share the GPU
    assert "(0.3 GiB each)" in dict(p.reasons)["replicas_per_gpu"]


@pytest.mark.parametrize("device_name, label", [
    ("NVIDIA L40S", "L40S"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H200", "H200"), ("NVIDIA L4", "L4"), ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
])
def test_a_local_gpu_is_named_as_ray_names_it(device_name, label):
    """A substring match took an L40S for an L4 and a GH200 for an H200 (and their memory with it)."""
    assert gpus.gpu_label(device_name) == label


def test_auto_on_a_gpu_it_does_not_know_by_name_uses_the_measured_memory():
    l40s = _auto("text", GPU=1.0, gpu_memory_gib=44.4, **{"accelerator_type:L40S": 1.0})
    assert l40s.accelerator_type == "L40S" and "44 GiB" in dict(l40s.reasons)["accelerator_type"]
    gh200 = _auto("text", GPU=1.0, gpu_memory_gib=94.2, **{"accelerator_type:GH200": 1.0})
    assert gh200.accelerator_type == "GH200" and "94 GiB" in dict(gh200.reasons)["accelerator_type"]
    a100 = _auto("text", GPU=1.0, gpu_memory_gib=79.1, **{"accelerator_type:A100": 1.0})
    assert "79 GiB" in dict(a100.reasons)["accelerator_type"]  # measured, not the table's smaller A100
    assert "40 GiB" in dict(_auto("text", GPU=1.0, **{"accelerator_type:A100": 1.0}).reasons)["accelerator_type"]


@pytest.mark.parametrize("gpu, memory_gib, name", [
    ("H100", 79.2, "NVIDIA H100 80GB HBM3"), ("H200", 139.8, "NVIDIA H200"), ("A100-80G", 79.1, "NVIDIA A100-SXM4-80GB"),
    ("L4", 22.0, "NVIDIA L4"), ("T4", 14.6, "Tesla T4"), ("B200", 178.4, "NVIDIA B200"), (None, 0.0, "cpu"),
])
def test_engine_defaults_are_what_vllm_llm_uses_there(monkeypatch, gpu, memory_gib, name):
    """The kit's copy of vLLM's offline batch defaults matches the installed vLLM's own rule, fed each
    GPU's reported memory and name (a vLLM upgrade that changes the rule fails here)."""
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    platform = arg_utils.current_platform
    monkeypatch.setattr(platform, "get_device_total_memory", lambda *a, **k: int(memory_gib * 1024**3), raising=False)
    monkeypatch.setattr(platform, "get_device_name", lambda *a, **k: name, raising=False)
    monkeypatch.setattr(platform, "is_cpu", lambda: gpu is None)
    monkeypatch.setattr(platform, "is_tpu", lambda: False)
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    expected = (tokens[UsageContext.LLM_CLASS], seqs[UsageContext.LLM_CLASS])
    assert gpus.offline_engine_defaults(gpu, None if gpu in gpus.GPUS else memory_gib) == expected
    # and what Ray's engine stage gets without them: vLLM's generic default, far less on a big GPU
    assert tokens.get(None, arg_utils.SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS) == 2048


def test_every_preset_asks_for_the_offline_step_size():
    for p in presets.PRESETS.values():
        world = p.tensor_parallel_size * p.pipeline_parallel_size
        assert p.engine_kwargs()["max_num_batched_tokens"] == gpus.offline_engine_defaults(p.accelerator_type,
                                                                                             world_size=world)[0]
    assert presets.PRESETS["text-cpu-offline"].override(max_num_batched_tokens=512).engine_kwargs()[
        "max_num_batched_tokens"] == 512


def test_every_preset_skips_vllms_statistics_as_vllm_llm_does():
    """Ray's engine stage builds vLLM from AsyncEngineArgs, which records statistics per step and request
    (on the H100, on the engine actor's saturated thread); ``vllm.LLM`` turns them off by default."""
    import dataclasses
    import inspect

    from vllm import LLM
    from vllm.engine.arg_utils import AsyncEngineArgs

    defaults = {f.name: f.default for f in dataclasses.fields(AsyncEngineArgs)}  # no model lookup, offline
    assert defaults["disable_log_stats"] is False
    assert 'kwargs["disable_log_stats"] = True' in inspect.getsource(LLM.__init__)
    for p in presets.PRESETS.values():
        assert p.engine_kwargs()["disable_log_stats"] is True


def test_settings_table_says_why():
    p = _auto("text", GPU=1.0, **{"accelerator_type:H100": 1.0})
    rows = {r["parameter"]: r for r in fitting.describe(p, {"ACCELERATOR_TYPE": None, "CONCURRENCY": None})}
    assert rows["ACCELERATOR_TYPE"]["why"].startswith("planned for 1 x H100")
    assert rows["CONCURRENCY"]["why"] and rows["max_num_seqs"]["why"]
    assert rows["max_num_batched_tokens"]["value"] == "16384" and "vllm.LLM" in rows["max_num_batched_tokens"]["why"]


def test_light_stages_hold_a_cpu_each_on_a_gpu_and_a_tenth_on_a_cpu_unless_you_say():
    """On an H100 a light stage at 0.1 CPU let a 16-core node run ~160 light tasks at once, each in a
    worker process Ray started for it; at 1 CPU the read cell took half as long (benchmarks/RESULTS.md).
    On a CPU the stages must fit beside the engine on a few cores."""
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0}
    assert fitting.select("auto", "text", cluster=h100).stage_cpus == 1.0
    assert fitting.select("auto", "vision", cluster=h100).stage_cpus == 1.0
    assert fitting.select("text-llama8b-l4", "text").stage_cpus == 1.0
    assert fitting.select("auto", "text").stage_cpus == 0.1  # no GPU: the CPU preset
    assert fitting.select("vision-cpu-offline", "vision").stage_cpus == 0.1
    base = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto"}
    rows = {r["parameter"]: r for r in fitting.describe(fitting.from_parameters("text", base, cluster=h100), base)}
    assert rows["CPU_STAGE_CPUS"]["value"] == "1.0" and rows["CPU_STAGE_CPUS"]["why"].startswith("a GPU")
    mine = {**base, "CPU_STAGE_CPUS": 0.25}
    row = {r["parameter"]: r for r in fitting.describe(fitting.from_parameters("text", mine, cluster=h100), mine)}[
        "CPU_STAGE_CPUS"]
    assert (row["value"], row["from"]) == ("0.25", "your parameter")  # yours wins


def test_text_on_a_gpu_tokenizes_in_a_stage_of_its_own_and_nothing_else_does():
    """On an H100 the engine actor's thread holds a fast model back, tokenizing 21% of it
    (benchmarks/RESULTS.md): text on a GPU tokenizes in Ray's stage; a CPU and images do not."""
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0}
    assert fitting.select("auto", "text", cluster=h100).tokenize_stage is True
    assert fitting.select("text-llama8b-l4", "text").tokenize_stage is True
    assert fitting.select("auto", "text").tokenize_stage is False  # no GPU: the CPU preset
    assert fitting.select("auto", "vision", cluster=h100).tokenize_stage is False
    assert fitting.select("auto", "text", cluster=h100, tokenize_stage=False).tokenize_stage is False  # yours wins
    assert fitting.select("auto", "text", tokenize_stage=True).tokenize_stage is True
    with pytest.raises(ValueError, match="image prompts need vLLM's own processing"):
        fitting.select("vision-qwen3b-l4", "vision", tokenize_stage=True)
    base = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto"}
    rows = {r["parameter"]: r for r in fitting.describe(fitting.from_parameters("text", base, cluster=h100), base)}
    assert rows["TOKENIZE_STAGE"]["value"] == "True" and rows["TOKENIZE_STAGE"]["why"].startswith("a GPU")
    mine = fitting.from_parameters("text", {**base, "TOKENIZE_STAGE": False}, cluster=h100)
    rows = {r["parameter"]: r for r in fitting.describe(mine, {**base, "TOKENIZE_STAGE": False})}
    assert rows["TOKENIZE_STAGE"] == {"parameter": "TOKENIZE_STAGE", "value": "False", "from": "your parameter",
                                      "why": ""}


def test_short_gpu_runs_skip_compilation_and_long_or_unknown_ones_keep_it():
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0}
    base = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto", "INPUT_PATH": None, "LIMIT": None}

    def eager(task="text", counted=309, **changes):
        return fitting.from_parameters(task, {**base, **changes}, cluster=h100, input_rows=counted).enforce_eager

    sample = fitting.from_parameters("text", base, cluster=h100, input_rows=309)
    why = {r["parameter"]: r["why"] for r in fitting.describe(sample, base)}["ENFORCE_EAGER"]
    assert sample.enforce_eager and why.startswith("309 rows (at most 1,000)")
    assert eager("vision", counted=24)  # the bundled images
    assert not eager(counted=5_000)  # a bigger input compiles
    assert not eager(counted=None)  # an input estimated or not sized: compile
    assert eager(counted=None, LIMIT=1_000) and not eager(counted=None, LIMIT=1_001)
    assert eager(LIMIT=50_000)  # the input is still small
    assert not eager(ENFORCE_EAGER=False)  # yours wins
    assert not eager(TORCH_COMPILE=True)  # compiling is asked for: the engine is not made eager
    assert eager(TORCH_COMPILE=False)  # not compiling: a short run still skips the graphs
    assert not fitting.from_parameters("text", base, cluster=h100).enforce_eager  # no rows given: unknown
    cpu = fitting.from_parameters("text", base, cluster={"CPU": 2.0}, input_rows=309)
    assert cpu.enforce_eager and "enforce_eager" not in dict(cpu.reasons)  # a CPU runs eagerly anyway


def test_a_run_is_fitted_to_the_rows_counted_before_reading(repo, smollm2_path, tmp_path):
    """The plan sizes the input before it fits the preset: your own input whose rows are counted (a
    CSV read whole, parquet footers, a folder of images) is a short run where it is small, as the
    bundled samples are; an estimate is not a count."""
    import pandas as pd

    from helpers import classify, data

    nb = json.loads((repo / "notebooks" / "text_classification.ipynb").read_text())
    namespace: dict = {}
    exec("".join(next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))["source"]), namespace)
    p = {k: v for k, v in namespace.items() if k.isupper()} | {"PRESET": "text-cpu-offline",
                                                                "MODEL_SOURCE": str(smollm2_path)}
    rows = pd.read_csv(data.sample_customers_path())
    rows.head(50).to_csv(tmp_path / "fifty.csv", index=False)
    (tmp_path / "parts").mkdir()
    for n in range(3):  # 3 files: their rows are estimated from the first (60 in all, as it happens)
        rows.iloc[20 * n:20 * (n + 1)].to_csv(tmp_path / "parts" / f"part-{n}.csv", index=False)

    def fitted(path):
        return classify.plan({**p, "INPUT_PATH": str(path), "OUTPUT_DIR": str(tmp_path / "out")})

    fifty = fitted(tmp_path / "fifty.csv")
    assert fifty.input_size.rows == 50 and fifty.config.one_process
    assert dict(fifty.config.reasons)["distributed_executor_backend"].startswith("50 rows (at most 100)")
    parts = fitted(tmp_path / "parts")
    assert parts.input_size.estimated and parts.input_size.rows <= 100 and not parts.config.one_process
    assert not fitted(data.sample_customers_path()).config.one_process  # 309 rows: over 100


def test_the_bundled_samples_are_counted_as_they_are():
    import pandas as pd

    from helpers import data, sample_images

    assert data.sample_size() == len(pd.read_csv(data.sample_customers_path())) > 0
    assert sample_images.sample_size() == len(sample_images.sample_files()) > 0


def test_a_cpu_without_bfloat16_instructions_runs_the_engine_in_float32(monkeypatch):
    assert gpus.cpu_dtype({"avx2", "fma"})[0] == "float32"
    assert gpus.cpu_dtype({"avx512f", "avx512_bf16"}) == (
        "auto", "this CPU computes bfloat16 natively (avx512_bf16): the checkpoint's bfloat16")
    assert gpus.cpu_dtype({"amx_bf16"})[0] == "auto"
    monkeypatch.setattr(fitting, "cpu_dtype", lambda: ("float32", "no bf16 here"))
    cpu = fitting.select("text-cpu-offline", "text")
    assert cpu.engine_kwargs()["dtype"] == "float32" and ("dtype", "no bf16 here") in cpu.reasons
    assert fitting.select("text-cpu-offline", "text", dtype="bfloat16").engine_kwargs()["dtype"] == "bfloat16"
    gpu = fitting.select("text-llama8b-l4", "text")
    assert gpu.dtype is None and "dtype" not in gpu.engine_kwargs()  # GPUs: the checkpoint's dtype
    table = {r["parameter"]: r for r in fitting.describe(cpu, {})}
    assert table["dtype"]["value"] == "'float32'" and table["dtype"]["why"] == "no bf16 here"


def test_replicas_share_a_gpu_only_where_one_engine_cannot_fill_it():
    h100 = {"GPU": 2.0, "accelerator_type:H100": 1.0}
    text = _auto("text", **h100)
    assert (text.concurrency, text.gpus) == (4, 2) and "CPU side" in dict(text.reasons)["replicas_per_gpu"]
    assert "2 replicas on each of 2 GPUs" in dict(text.reasons)["concurrency"]
    # Where two copies of the weights would crowd out the KV cache (8B on a 24 GB L4), one engine per GPU.
    l4 = _auto("text", GPU=4.0, **{"accelerator_type:L4": 1.0})
    assert (l4.concurrency, l4.replicas_per_gpu) == (4, 1) and "KV cache" in dict(l4.reasons)["replicas_per_gpu"]
    # Long requests, images, or a model over several GPUs: one.
    assert fitting.select("auto", "text", cluster=h100, max_model_len=4096).replicas_per_gpu == 1
    assert _auto("vision", **h100).replicas_per_gpu == 1
    # Your REPLICAS_PER_GPU wins, and the replicas and memory follow it.
    one = fitting.from_parameters("text", {"PRESET": "auto", "REPLICAS_PER_GPU": 1}, cluster=h100)
    assert (one.concurrency, one.max_num_seqs, one.engine_kwargs()["gpu_memory_utilization"]) == (2, 1024, 0.9)
    assert dict(one.reasons)["replicas_per_gpu"] == "your parameter"
    three = fitting.from_parameters("text", {"PRESET": "auto", "REPLICAS_PER_GPU": 3}, cluster=h100)
    assert (three.concurrency, three.gpus, three.engine_kwargs()["gpu_memory_utilization"]) == (6, 2, 0.29)
    rows = {r["parameter"]: r for r in fitting.describe(text, {"REPLICAS_PER_GPU": None})}
    assert rows["REPLICAS_PER_GPU"]["value"] == "2" and "0.9 of the GPU shared by 2" in rows["gpu_memory_utilization"]["why"]


def test_shared_gpus_are_placed_as_fractions_and_checked_against_the_cluster():
    placement = engine.engine_placement("H100", gpus_per_replica=0.5)
    assert placement == {"accelerator_type": "H100", "placement_group_config": {"bundles": [{"GPU": 0.5, "CPU": 1.0}]}}
    assert engine.engine_placement("H100", gpus_per_replica=4) == {"accelerator_type": "H100"}  # tp: Ray's default
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=4, stage_cpus=0.1, stage_actors=8)
    cluster.check_schedulable({"CPU": 16, "GPU": 2, "accelerator_type:H100": 1}, budget, "H100", 0.5)  # 4 x 0.5 = 2
    with pytest.raises(cluster.UnschedulableError, match="4 engine replicas x 0.5 GPU need 2 GPUs"):
        cluster.check_schedulable({"CPU": 16, "GPU": 1, "accelerator_type:H100": 1}, budget, "H100", 0.5)


def test_the_kv_cache_estimate_is_the_memory_share_less_activations_and_weights():
    shape = shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"]
    estimate = gpus.kv_cache_estimate(shape, 80, 0.9)
    assert estimate == pytest.approx(80 * shapes.GIB * 0.9 * 0.9 - shape.parameters * 2)
    assert gpus.kv_cache_estimate(shape, 80, 0.44) < estimate / 2


LLAMA_8B = "unsloth/Llama-3.1-8B-Instruct"


def test_replicas_that_share_a_gpu_get_a_stated_kv_cache(tmp_path):
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0, "gpu_memory_gib": 79.2}
    shape = shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"]
    # Two (or three) engines on one GPU: each gets the kit's estimate for its share, not what vLLM
    # would measure while the other engines load (that counts their memory as its own).
    for share, memory_share in ((2, 0.44), (3, 0.29)):
        p = fitting.select("auto", "text", cluster=h100, replicas_per_gpu=share, model_source=LLAMA_8B)
        kwargs = p.engine_kwargs()
        expected = gpus.kv_cache_estimate(shape, 79.2, memory_share)
        assert kwargs["gpu_memory_utilization"] == memory_share
        assert expected - 2**20 < kwargs["kv_cache_memory_bytes"] <= expected
        assert kwargs["kv_cache_memory_bytes"] % 2**20 == 0
        rows = {r["parameter"]: r for r in fitting.describe(p, {"REPLICAS_PER_GPU": share})}
        assert f"{share} engines that share a GPU" in rows["kv_cache_memory_bytes"]["why"]
    # One engine per GPU, a CPU, an unknown model: vLLM measures its cache itself, as alone it can.
    one = fitting.select("auto", "text", cluster=h100, replicas_per_gpu=1, model_source=LLAMA_8B)
    assert "kv_cache_memory_bytes" not in one.engine_kwargs() and one.kv_cache_budget is None
    assert "kv_cache_memory_bytes" not in {r["parameter"] for r in fitting.describe(one, {})}
    assert PRESETS["text-cpu-offline"].kv_cache_budget is None
    assert fitting.select("auto", "text", cluster=h100, replicas_per_gpu=2,
                          model_source=str(tmp_path / "no-such-model")).kv_cache_budget is None
    # A named preset with a shared GPU uses the type's memory.
    named = fitting.select("text-llama8b-h100", "text", replicas_per_gpu=2)
    assert named.kv_cache_budget == pytest.approx(gpus.kv_cache_estimate(shape, 80, 0.44), abs=2**20)


def test_the_budget_is_sized_for_the_folder_vllm_loads(tmp_path):
    # A local folder (and so the random-weights folder the kit builds, with its smaller vocabulary):
    # its own config, not the published model's.
    config = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 49152, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0, "gpu_memory_gib": 79.2}
    p = fitting.select("auto", "text", cluster=h100, replicas_per_gpu=2, model_source=str(tmp_path))
    shape = shapes.ModelShape.from_config(config)
    assert p.kv_cache_budget == pytest.approx(gpus.kv_cache_estimate(shape, 79.2, 0.44), abs=2**20)
    published = gpus.kv_cache_estimate(shapes.KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"], 79.2, 0.44)
    assert p.kv_cache_budget > published  # ~0.6B fewer weights: more room for the cache


def test_vllm_and_rays_engine_stage_take_the_kv_cache_budget():
    # vLLM 0.26 (the GPU stack) and 0.29 (this one) both have kv_cache_memory_bytes; Ray's engine
    # stage passes engine_kwargs on to vllm.AsyncEngineArgs unchanged.
    import dataclasses
    from types import SimpleNamespace

    from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert "kv_cache_memory_bytes" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    kwargs = {"kv_cache_memory_bytes": 3 * 2**30, "gpu_memory_utilization": 0.44}
    assert vLLMEngineStageUDF.normalize_engine_kwargs(SimpleNamespace(model="m"), kwargs) == kwargs


def test_a_short_cpu_run_runs_the_model_in_vllms_engine_process(smollm2_path):
    """A CPU run of a few known rows runs the model in vLLM's engine-core process (its engine starts
    ~18 s sooner on 2 cores); longer runs, runs of unknown length and GPUs keep vLLM's worker process
    (it computes faster). vLLM itself resolves the kit's arguments to its single-process executor;
    without them its CPU platform picks the multiprocess one."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    base = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto", "INPUT_PATH": None, "LIMIT": None}

    def run_config(task, sample, **given):
        return fitting.from_parameters(task, {**base, **given}, input_rows=sample)

    def backend(task, sample, **given):
        return run_config(task, sample, **given).engine_kwargs().get("distributed_executor_backend")

    assert backend("text", 309) is None  # the bundled sample: over ONE_PROCESS_ROWS["text"]
    assert backend("text", 309, LIMIT=100) == backend("text", 309, LIMIT=12) == presets.CPU_EXECUTOR
    assert backend("text", 309, LIMIT=101) is None
    assert backend("vision", 24) == presets.CPU_EXECUTOR and backend("vision", 31) is None
    assert backend("vision", None, INPUT_PATH="s3://bucket/images") is None  # rows not counted: unknown
    assert backend("text", 309, LIMIT=12, PRESET="text-llama8b-l4") is None  # GPUs: Ray's choice
    short = base | {"LIMIT": 12}
    rows = {r["parameter"]: r for r in fitting.describe(run_config("text", 309, LIMIT=12), short)}
    assert rows["distributed_executor_backend"]["why"].startswith("12 rows (at most 100)")
    assert "distributed_executor_backend" not in {r["parameter"] for r in fitting.describe(run_config("text", 309), base)}

    kwargs = run_config("text", 309, LIMIT=12).engine_kwargs()
    assert Executor.get_class(AsyncEngineArgs(model=str(smollm2_path), **kwargs).create_engine_config()) is UniProcExecutor
    kwargs.pop("distributed_executor_backend")
    default = AsyncEngineArgs(model=str(smollm2_path), **kwargs).create_engine_config()
    assert Executor.get_class(default) is MultiprocExecutor


def test_a_short_run_on_several_replicas_shares_its_batches_among_them():
    """Ray Data hands a ready replica up to 2 x max_concurrent_batches batches: on an H100, 500 images
    (32 batches) ran on one of two engines. A run of known rows on a fixed pool caps what one replica
    holds at its share; long runs, one replica, an autoscaling pair and your MAX_CONCURRENT_BATCHES
    keep Ray's rule."""
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0, "gpu_memory_gib": 79.6, "CPU": 16.0}
    base = {name: None for name in fitting.PARAMETER_FIELDS} | {
        "PRESET": "auto", "INPUT_PATH": "/data/images", "LIMIT": 500, "MODEL_SOURCE": presets.QWEN_VL_3B,
        "MAX_MODEL_LEN": 1024}

    def run_config(**given):
        return fitting.from_parameters("vision", {**base, **given}, cluster=h100)

    short = run_config()
    assert (short.concurrency, short.batch_size) == (2, 16)  # two engines share the GPU: 32 batches
    assert (short.max_tasks_in_flight_per_actor, short.max_concurrent_batches) == (16, 16)
    assert 2 * run_config(LIMIT=None).max_concurrent_batches >= 32  # Ray's rule: one replica takes all 32
    rows = {r["parameter"]: r for r in fitting.describe(short, base)}
    assert rows["max_tasks_in_flight_per_actor"]["value"] == "16"
    assert rows["max_tasks_in_flight_per_actor"]["why"].startswith("500 rows make 32 batches of 16: at most 16 ")
    assert rows["MAX_CONCURRENT_BATCHES"]["why"].startswith("at most the 16 batches")
    long = run_config(LIMIT=10_000)
    assert long.max_tasks_in_flight_per_actor is None and long.max_concurrent_batches > 16
    assert "max_tasks_in_flight_per_actor" not in {r["parameter"] for r in fitting.describe(long, base)}
    assert run_config(LIMIT=None).max_tasks_in_flight_per_actor is None  # your data, rows unknown
    assert run_config(MAX_CONCURRENT_BATCHES=8).max_tasks_in_flight_per_actor is None  # yours wins
    assert run_config(CONCURRENCY=(1, 2)).max_tasks_in_flight_per_actor is None  # autoscaling: Ray's
    assert run_config(CONCURRENCY=1).max_tasks_in_flight_per_actor is None
    few = run_config(LIMIT=40, CONCURRENCY=4)  # 3 batches for 4 replicas: one each at most
    assert (few.max_tasks_in_flight_per_actor, few.max_concurrent_batches) == (1, 1)
    assert engine.batches_held_in_a_short_run(3, 4, batches=7) == 3  # ceil(7 / 3) < 2 x 4
    assert engine.batches_held_in_a_short_run(3, 4, batches=24) is None  # 8 a replica: Ray's 2 x 4 is fine
    assert engine.batches_held_in_a_short_run(2, 4, batches=0) == 1  # an empty input: Ray needs at least 1


def test_auto_shares_a_gpu_by_what_was_measured():
    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0, "gpu_memory_gib": 79.2}
    # Text: two engines, not three (3 measured 1.34x one raw engine where 2 did 1.69x).
    text = fitting.select("auto", "text", cluster=h100)
    assert text.replicas_per_gpu == 2 and "3 engines only 1.34x" in dict(text.reasons)["replicas_per_gpu"]
    # Captions as the notebook fits them (short): two engines of the 3B VLM share the GPU, each with
    # a stated KV cache; long requests keep one.
    vision = fitting.select("auto", "vision", cluster=h100, max_model_len=192)
    assert (vision.concurrency, vision.replicas_per_gpu, vision.actor_pool) == (2, 2, (2, 2))
    assert "2.46x" in dict(vision.reasons)["replicas_per_gpu"] and vision.kv_cache_budget > 20 * shapes.GIB
    assert fitting.select("auto", "vision", cluster=h100, max_model_len=8192).replicas_per_gpu == 1


def test_gpu_engines_capture_cuda_graphs_for_the_kits_few_step_sizes_only(smollm2_path):
    """vLLM captures a CUDA graph for 51 step sizes up to 512 by default (twice: whole steps and
    pieces), seconds of every engine's start. A compiling GPU engine gets the kit's sizes
    up to vLLM's own ceiling (twice max_num_seqs, at most 512), which vLLM's arguments keep as given;
    eager and CPU engines capture nothing and get none. The settings table shows the row."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    text = _auto("text", GPU=1.0, **{"accelerator_type:H100": 1.0})
    assert text.max_num_seqs == 512
    sizes = text.engine_kwargs()["compilation_config"]["cudagraph_capture_sizes"]
    assert sizes == list(presets.CAPTURE_SIZES) and len(sizes) < 20 and sizes[-1] == 512
    small = presets.PRESETS["vision-qwen3b-l4"]  # max_num_seqs 64: up to 128
    assert small.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 32, 64, 96, 128]
    odd = small.override(max_num_seqs=100)
    assert odd.cudagraph_capture_sizes[-1] == 200 and odd.cudagraph_capture_sizes == sorted(set(odd.cudagraph_capture_sizes))
    args = AsyncEngineArgs(model=str(smollm2_path), **{k: v for k, v in text.engine_kwargs().items() if k != "load_format"})
    assert args.compilation_config.cudagraph_capture_sizes == sizes
    for p in presets.PRESETS.values():
        kwargs = p.engine_kwargs()
        assert ("compilation_config" in kwargs) == (p.accelerator_type is not None and not p.enforce_eager), p.name
    assert "compilation_config" not in text.override(enforce_eager=True).engine_kwargs()
    rows = {r["parameter"]: r for r in fitting.describe(text, {})}
    assert rows["cudagraph_capture_sizes"]["value"] == repr(sizes) and "padded" in rows["cudagraph_capture_sizes"]["why"]
    assert "cudagraph_capture_sizes" not in {r["parameter"] for r in fitting.describe(presets.PRESETS["text-cpu-offline"], {})}


def test_gpu_engines_run_without_torch_compile_unless_asked(smollm2_path):
    """torch.compile took 20-27 s of a fresh GPU engine's start (benchmarks/RESULTS.md): a GPU engine
    gets vLLM's mode 0 with CUDA graphs for decode-only steps, which vLLM's own arguments keep as
    given; TORCH_COMPILE=True gives vLLM's default (compiled) with the kit's graph sizes, and the
    settings table says which and why (TORCH_COMPILE with ENFORCE_EAGER: tests/test_params.py)."""
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.engine.arg_utils import AsyncEngineArgs

    h100 = {"GPU": 1.0, "accelerator_type:H100": 1.0}
    base = {name: None for name in fitting.PARAMETER_FIELDS} | {"PRESET": "auto", "INPUT_PATH": None, "LIMIT": None}
    plain = fitting.from_parameters("text", base, cluster=h100)
    config = plain.engine_kwargs()["compilation_config"]
    assert config == {"cudagraph_capture_sizes": list(presets.CAPTURE_SIZES), **presets.NO_COMPILE}
    args = AsyncEngineArgs(model=str(smollm2_path), **{k: v for k, v in plain.engine_kwargs().items() if k != "load_format"})
    assert args.compilation_config.mode == CompilationMode.NONE
    assert args.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert not CUDAGraphMode.FULL_DECODE_ONLY.requires_piecewise_compilation()  # vLLM keeps it without compiling
    compiled = fitting.from_parameters("text", {**base, "TORCH_COMPILE": True}, cluster=h100)
    assert compiled.engine_kwargs()["compilation_config"] == {"cudagraph_capture_sizes": list(presets.CAPTURE_SIZES)}
    rows = {r["parameter"]: r for r in fitting.describe(plain, base)}
    assert rows["TORCH_COMPILE"]["value"] == "False" and rows["TORCH_COMPILE"]["why"].startswith("not compiled")
    mine = {r["parameter"]: r for r in fitting.describe(compiled, {**base, "TORCH_COMPILE": True})}
    assert mine["TORCH_COMPILE"] == {"parameter": "TORCH_COMPILE", "value": "True", "from": "your parameter", "why": ""}
    vision = fitting.from_parameters("vision", base, cluster=h100)
    assert presets.NO_COMPILE.items() <= vision.engine_kwargs()["compilation_config"].items()
    cpu = fitting.from_parameters("text", base, cluster={"CPU": 2.0})
    assert "compilation_config" not in cpu.engine_kwargs()
    assert {r["parameter"]: r for r in fitting.describe(cpu, base)}["TORCH_COMPILE"]["why"].startswith("GPU engines only")
