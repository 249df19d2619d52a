"""The kit's copies of vLLM's own rules, checked against the installed vLLM's internals: the first test to
fail on a vLLM upgrade that changes them. Kit-only: a copied project carries no vLLM or Ray internals
(scripts/new_project.py leaves out the tests that import them)."""

from __future__ import annotations

from helpers import cluster, presets
from helpers.presets import GIB, PRESETS


def test_the_engines_sample_without_flashinfers_sampler_which_vllm_compiles_with_nvcc_on_each_node(monkeypatch):
    """vLLM 0.29 reads the variable as the kit sets it: no FlashInfer sampler, so no nvcc build at an
    engine's first warm-up (minutes on a GPU node, and a failure where no CUDA toolkit is installed)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops import topk_topp_sampler

    env = cluster.engine_env(PRESETS["text-llama8b-l4"], joined=False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)  # as on a GPU node
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", env["VLLM_USE_FLASHINFER_SAMPLER"])
    assert topk_topp_sampler.flashinfer_sampler_supported() is False




def test_engine_defaults_are_what_vllm_llm_uses_there(monkeypatch):
    """The kit's copy of vLLM's offline batch defaults matches the installed vLLM's own rule."""
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    platform = arg_utils.current_platform
    for gpu, memory, name in [("H100", 79.2, "NVIDIA H100 80GB HBM3"), ("L4", 22.0, "NVIDIA L4"), (None, 0.0, "cpu")]:
        monkeypatch.setattr(platform, "get_device_total_memory", lambda *a, m=memory, **k: int(m * GIB), raising=False)
        monkeypatch.setattr(platform, "get_device_name", lambda *a, n=name, **k: n, raising=False)
        monkeypatch.setattr(platform, "is_cpu", lambda g=gpu: g is None)
        monkeypatch.setattr(platform, "is_tpu", lambda: False)
        tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
        assert presets.engine_defaults(gpu) == (tokens[UsageContext.LLM_CLASS], seqs[UsageContext.LLM_CLASS])
