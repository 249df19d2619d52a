"""Fitting a preset to the hardware and the parameters: ``PRESET="auto"``, parameter overrides, the
decisions left to the kit (dtype, tokenize stage, blocks; short runs: :mod:`helpers.short_runs`), and
the settings table that says why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from helpers import short_runs, topology
from helpers.models import OFFLINE
from helpers.gpus import (GPUS, RAY_STEP_TOKENS_NOTE, cpu_dtype, kv_cache_estimate, memory_budget,
                          offline_engine_defaults)
from helpers.presets import CPU_PRESET, DEFAULT_GPU_PRESET, PRESETS, Preset, names


class AutoPresetError(RuntimeError):
    """``PRESET="auto"`` cannot choose safely from what the cluster shows; the message says what to do."""


def _auto(task: str, cluster: Mapping[str, Any], model_source: str | None, replicas_per_gpu: int | None = None,
          max_model_len: int | None = None, accelerator_type: str | None = None) -> Preset:
    """The run configuration that fits ``cluster`` (see :func:`select`)."""
    import math

    from helpers.shapes import GIB, model_shape

    choice = topology.choose(cluster, accelerator_type)
    if choice.gpus == 0:
        if accelerator_type is not None and cluster.get("GPU"):
            raise AutoPresetError(f"ACCELERATOR_TYPE={accelerator_type!r}: the cluster has no such GPUs "
                                  f"({topology.choose(cluster).describe()}). Set ACCELERATOR_TYPE=None to plan for "
                                  "the GPUs it has, or name the type Ray labels them with.")
        if cluster.get("remote"):
            raise AutoPresetError(
                "PRESET='auto' found no GPUs on the Ray cluster (one that scales from zero, like job.yaml's "
                "min_nodes: 0, shows none until work asks for them), and will not fall back to the CPU preset "
                "there. Set ACCELERATOR_TYPE to the GPU type its nodes have, as Ray labels them (e.g. 'L4'), and "
                "'auto' asks the autoscaler for them (CONCURRENCY of them, else one) and plans on what comes; or name "
                f"a preset for the GPUs you want, e.g. PRESET={DEFAULT_GPU_PRESET[task]!r} (presets: {names(task)[1:]}).")
        return PRESETS[CPU_PRESET[task]].override(description="auto: no GPU visible, so the offline CPU preset")
    gpu_type = choice.gpu_type
    base = PRESETS[DEFAULT_GPU_PRESET[task]]
    # The offline model unless you name one: the defaults run wherever they run, with no download.
    # It is fitted as the tutorial's model (the safe side: a tiny model needs less of everything).
    model = model_source if model_source not in (None, OFFLINE) else base.model_source
    memory = choice.memory_gib
    reasons = {}
    if model_source is None:
        reasons["model_source"] = (f"the offline model, so the defaults run anywhere with no download; set MODEL_SOURCE "
                                   f"to a hub id or folder for a real one (the tutorial's: {base.model_source}). The "
                                   f"settings below are sized for {base.model_source}, which needs more than the offline one")
    reasons["accelerator_type"] = f"planned for {choice.describe()}"
    if memory is None:
        memory = min(g.memory_gib for g in GPUS.values())
        reasons["accelerator_type"] += f"; the smallest known memory ({memory:g} GiB) is assumed"
    shape = model_shape(model)
    budget = memory_budget(memory, base.gpu_memory_utilization)
    tp = shape.tensor_parallel_size(budget, choice.largest_node) if shape is not None else 1
    if tp is None and model_source is None:  # the offline model is what runs: it fits any GPU
        shape, tp = None, 1
        reasons["model_source"] = (f"the offline model, so the defaults run anywhere with no download; {base.model_source} "
                                   f"(the tutorial's) would not fit {choice.describe()}, so the settings are not sized for it")
    if tp is None:
        raise AutoPresetError(_refusal(task, model, shape, choice, memory))
    if replicas_per_gpu is not None and replicas_per_gpu > 1 and tp > 1:
        raise AutoPresetError(f"REPLICAS_PER_GPU={replicas_per_gpu}: {model} needs {tp} GPUs per replica (tensor "
                              "parallelism), and a replica that spans GPUs cannot share them with another. "
                              "Set REPLICAS_PER_GPU=None.")
    length = max_model_len or base.max_model_len  # the run's, when known: the KV cache holds that many tokens a row
    share, why_share = _replicas_per_gpu(task, shape, budget, tp, length, model)
    if replicas_per_gpu is not None:  # yours: the replicas and memory below follow it
        share, why_share = replicas_per_gpu, "your parameter"
    gpus = choice.gpus
    replicas = choice.replicas(tp) * share
    reasons["concurrency"] = (f"{choice.replicas(tp)} replicas of {tp} GPUs, each inside one node" if tp > 1 else
                              f"{share} replicas on each of {gpus} GPUs" if share > 1 else f"one replica per GPU ({gpus})")
    reasons["replicas_per_gpu"] = why_share
    if tp > 1:
        reasons["tensor_parallel_size"] = f"{model}'s weights do not fit one {gpu_type} with room for a KV cache"
    step_tokens, max_num_seqs = offline_engine_defaults(gpu_type or "", memory)
    reasons["max_num_batched_tokens"] = (f"what vllm.LLM takes per step on a {memory:.0f} GiB {gpu_type or 'GPU'} "
                                         f"({RAY_STEP_TOKENS_NOTE})")
    reasons["max_num_seqs"] = f"what vllm.LLM runs at once on a {memory:.0f} GiB {gpu_type or 'GPU'}"
    if share > 1:
        max_num_seqs //= share
        reasons["max_num_seqs"] = f"{reasons['max_num_seqs']}, shared by its {share} replicas"
    if shape is not None:
        free = kv_cache_estimate(shape, memory, base.override(replicas_per_gpu=share).memory_share, tp)
        fits = int(free / (shape.kv_bytes_per_token * length / tp))
        cap = max_num_seqs
        max_num_seqs = max(1, min(cap, 2 ** int(math.log2(max(fits, 1)))))
        reasons["max_num_seqs"] = (f"~{free / GIB:.1f} GiB of KV cache per replica (the kit's estimate) holds {fits} "
                                   f"full-length sequences of {length} tokens; capped at {cap}, "
                                   f"{reasons['max_num_seqs']}")
    # Ray's engine stage admits 1.1 x max_num_seqs requests at a time: keep twice that many rows queued
    # per replica, so a finished batch's place is already taken when the engine asks for more.
    slots = math.ceil(1.1 * max_num_seqs)
    in_flight = 2 * -(-slots // base.batch_size)
    if in_flight > base.max_concurrent_batches:
        reasons["max_concurrent_batches"] = (f"twice the batches of {base.batch_size} that fill the engine's "
                                             f"{slots} request slots (1.1 x max_num_seqs)")
    num_blocks = max(base.num_blocks, 4 * replicas)
    reasons["num_blocks"] = f"at least 4 per replica, and the {base.name} preset's {base.num_blocks}"
    return base.override(
        name=f"auto ({gpus}x{gpu_type})", model_source=model_source or OFFLINE, accelerator_type=gpu_type,
        concurrency=replicas, tensor_parallel_size=tp,
        replicas_per_gpu=share, gpu_memory_gib=choice.memory_gib if choice.memory_basis == "measured" else None,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=step_tokens, num_blocks=num_blocks,
        max_concurrent_batches=max(base.max_concurrent_batches, in_flight),
        description=f"auto: chosen for {gpus} x {gpu_type}, from {base.name}", reasons=tuple(reasons.items()))


def _refusal(task: str, model: str, shape: Any, choice: topology.GpuChoice, memory: float) -> str:
    """Why "auto" cannot place ``model`` on ``choice``, and the named presets that would run there: those
    of the model whose replicas fit one node (and, where the memory is known, whose weights fit it)."""
    from helpers.shapes import GIB

    known = choice.memory_gib is not None
    working = []
    for p in PRESETS.values():
        world = p.tensor_parallel_size * p.pipeline_parallel_size
        fits = p.pipeline_parallel_size == 1 and world <= choice.largest_node and shape.divides(world)
        if p.task == task and p.model_source == model and fits and (not known or (
                shape.weight_bytes(p.quantization) / world <= 0.8 * memory_budget(memory, p.memory_share))):
            working.append(f"PRESET={p.name!r}, ACCELERATOR_TYPE={choice.gpu_type!r}, CONCURRENCY={choice.replicas(world)}")
    where = (f"{shape.weight_bytes() / GIB:.0f} GiB of 16-bit weights do not fit {choice.describe()} "
             f"in tensor-parallel groups inside one node ({choice.largest_node} GPUs at most"
             f"{f', and {shape.attention_heads} attention heads to divide' if shape.attention_heads else ''})")
    if not known:
        where += f": the kit does not know {choice.gpu_type!r} and assumed {memory:g} GiB"
    if working:
        return f"PRESET='auto': {model}'s {where}. {'These run' if known else 'Named presets need no memory table'}: {'; '.join(working)}."
    return (f"PRESET='auto': {model}'s {where}, nor does any preset of it. Use GPUs with more memory or more "
            f"of them on one node, or a quantized checkpoint as MODEL_SOURCE (presets: {names(task)[1:]}).")


#: Replicas that share a GPU when one engine cannot keep it busy (:func:`_replicas_per_gpu`).
SHARED_GPU_REPLICAS = 2


#: Requests this short (prompt + answer tokens) are where one engine's CPU side is the bottleneck.
SHORT_REQUEST_TOKENS = 1024


def _replicas_per_gpu(task: str, shape: Any, budget: float, tp: int, max_model_len: int,
                      model: str) -> tuple[int, str]:
    """How many engine replicas share each GPU, and why. Two, for short requests (text with a
    structured choice, captions of at most :data:`SHORT_REQUEST_TOKENS` tokens in all) of a model
    whose two copies take at most half the memory: one engine's CPU side (scheduling, structured-
    output masks, request intake, image preparation) cannot keep a GPU busy there. Measured on an
    H100 (benchmarks/RESULTS.md), each engine with its stated KV cache (:attr:`Preset.kv_cache_budget`):
    8B shape, 100,000 prompts, in steady state against one raw vLLM engine: 2 engines 1.69x, 3 engines
    1.34x (GPU 90% busy, but each of the three holds 6.9 GiB of KV cache, 128 sequences at once);
    Qwen2.5-VL-3B shape, 10,000 images: 2 engines 2.46x, 1 engine 1.15x. Otherwise one: long
    requests, a model that needs the memory or spans GPUs, or one of unknown size."""
    from helpers.shapes import GIB

    if tp > 1:
        return 1, "the model spans several GPUs (tensor parallelism)"
    if shape is None:
        return 1, f"the size of {model} is unknown"
    weights = shape.parameters * 2
    if SHARED_GPU_REPLICAS * weights > budget / 2:
        return 1, f"{SHARED_GPU_REPLICAS} copies of {model}'s weights ({weights / GIB:.0f} GiB each) would leave too little KV cache"
    if max_model_len > SHORT_REQUEST_TOKENS:
        return 1, f"requests up to {max_model_len} tokens keep one engine's GPU busy"
    measured = ("H100, 8B: 2 engines 1.69x one raw engine in steady state; 3 engines only 1.34x, each "
                "with a third of the KV cache" if task == "text" else
                "H100, Qwen2.5-VL-3B, 10,000 images: 2 engines 2.46x one raw engine in steady state, 1 engine 1.15x")
    return SHARED_GPU_REPLICAS, (f"short requests (<= {max_model_len} tokens) leave one engine's CPU side the bottleneck; "
                                 f"{SHARED_GPU_REPLICAS} copies of the weights ({weights / GIB:.1f} GiB each) fit with "
                                 f"room for KV cache ({measured})")


def select(name: str, task: str, *, cluster: Mapping[str, Any] | None = None, **overrides: Any) -> Preset:
    """The preset called ``name``, with ``overrides`` applied field by field.

    ``"auto"`` chooses from ``cluster`` (``ray.cluster_resources()``-like; :func:`visible_cluster`
    reads it; ``None``: no GPU): without GPUs, the offline CPU preset, except on a remote cluster
    (``"remote": True``), where it raises :class:`AutoPresetError` instead of silently running on
    CPUs. With GPUs: the task's GPU preset adapted to them, with the offline model unless
    ``model_source`` names one (fitted as the preset's model): the GPU type and memory (known types, or
    ``gpu_memory_gib`` measured), tensor parallelism only when the model (``model_source`` in
    ``overrides``, else the preset's) does not fit one GPU, one replica per ``tp`` GPUs, and
    ``max_num_seqs`` that fits the KV cache. The preset's ``reasons`` say why, field by field.
    ``tokenize_stage`` left at None is decided here: on for text on a GPU, off on a CPU and for images;
    ``stage_cpus`` left at None too (:func:`_stage_cpus_default`), and ``num_blocks`` raised so that
    several replicas all get blocks (:func:`with_blocks_for_every_replica`).
    """
    if task not in CPU_PRESET:
        raise ValueError(f"task must be one of {sorted(CPU_PRESET)}, got {task!r}")
    if name == "auto":
        preset = _auto(task, cluster or {}, overrides.get("model_source"), overrides.get("replicas_per_gpu"),
                       overrides.get("max_model_len"), overrides.get("accelerator_type"))
    elif name in PRESETS:
        preset = PRESETS[name]
    else:
        raise KeyError(f"no preset {name!r}; presets: {sorted(PRESETS)}")
    if preset.task != task:
        raise ValueError(f"preset {name!r} is for the {preset.task} task, not {task}")
    preset = preset.override(**overrides) if overrides else preset
    world = preset.tensor_parallel_size * preset.pipeline_parallel_size
    if world > 1 and preset.replicas_per_gpu > 1:
        raise ValueError(f"REPLICAS_PER_GPU={preset.replicas_per_gpu} with preset {preset.name!r}, whose replicas span "
                         f"{world} GPUs each: a replica over several GPUs cannot share them. Set REPLICAS_PER_GPU=None.")
    if "num_blocks" not in overrides:  # a NUM_BLOCKS you give is kept
        preset = with_blocks_for_every_replica(preset)
    if preset.stage_cpus is None:
        preset = preset.override(stage_cpus=_stage_cpus_default(preset)[0])
    return _resolve_dtype(_resolve_tokenize_stage(preset))


def _resolve_dtype(preset: Preset) -> Preset:
    """``dtype`` decided for a CPU preset that leaves it to the kit (:func:`cpu_dtype`)."""
    if preset.dtype is not None or preset.accelerator_type is not None:
        return preset
    dtype, why = cpu_dtype()
    return preset.override(dtype=dtype, reasons=(*preset.reasons, ("dtype", why)))


def _tokenize_stage_default(preset: Preset) -> tuple[bool, str]:
    """Whether text is tokenized in a stage of its own when the preset leaves it to the kit, and why
    (shown in the settings table)."""
    if preset.task == "vision":
        return False, "images: vLLM's own prompt processing places the image tokens"
    if preset.accelerator_type is None:
        return False, "a CPU: one more actor would compete with the engine for the cores"
    return True, "a GPU: the engine actor's one thread only feeds the engine; a stage of its own tokenizes whole batches"


def _stage_cpus_default(preset: Preset) -> tuple[float, str]:
    """Ray CPUs each light stage holds when the preset leaves it to the kit, and why (shown in the
    settings table). Measured on an H100 (benchmarks/RESULTS.md): at 0.1 CPU a 16-core node ran up to
    160 light tasks at once, each in a worker process Ray had to start, and the read cell took twice
    as long."""
    if preset.accelerator_type is None:
        return 0.1, "a CPU: the light stages share the cores the engine leaves"
    return 1.0, ("a GPU: one light task per core, so Ray starts fewer worker processes "
                 "(the read cell took half as long on an H100)")


def _resolve_tokenize_stage(preset: Preset) -> Preset:
    """``tokenize_stage`` decided: ``None`` becomes :func:`_tokenize_stage_default`'s choice; on for
    images is an error (vLLM must place the image tokens itself)."""
    if preset.task == "vision" and preset.tokenize_stage:
        raise ValueError("tokenize_stage is for text prompts; image prompts need vLLM's own processing")
    if preset.tokenize_stage is not None:
        return preset
    return preset.override(tokenize_stage=_tokenize_stage_default(preset)[0])


#: Notebook parameters that default to ``None``, meaning "take this field from PRESET".
PARAMETER_FIELDS: dict[str, str] = {
    "MODEL_SOURCE": "model_source", "ACCELERATOR_TYPE": "accelerator_type", "CONCURRENCY": "concurrency",
    "REPLICAS_PER_GPU": "replicas_per_gpu",
    "BATCH_SIZE": "batch_size", "MAX_CONCURRENT_BATCHES": "max_concurrent_batches", "MAX_MODEL_LEN": "max_model_len",
    "NUM_BLOCKS": "num_blocks", "ENFORCE_EAGER": "enforce_eager", "TORCH_COMPILE": "torch_compile",
    "TOKENIZE_STAGE": "tokenize_stage", "CPU_STAGE_CPUS": "stage_cpus",
}


def from_parameters(task: str, parameters: Mapping[str, Any], *, cluster: Mapping[str, Any] | None = None,
                    input_rows: int | None = None) -> Preset:
    """The run configuration a notebook's parameters ask for: ``PRESET``, then every preset-backed
    parameter that is not ``None`` on top of it, field by field; then, for a run whose rows are known
    before reading (``LIMIT``, or ``input_rows``: the input's rows where counted),
    :func:`helpers.short_runs.fit`."""
    from helpers.engine import concurrency_arg

    overrides = {field: parameters[name] for name, field in PARAMETER_FIELDS.items()
                 if parameters.get(name) is not None}
    if "concurrency" in overrides:  # papermill and YAML turn a (min, max) pair into a list
        overrides["concurrency"] = concurrency_arg(overrides["concurrency"])
    preset = select(parameters["PRESET"], task, cluster=cluster, **overrides)
    return short_runs.fit(preset, short_runs.known_rows(parameters, input_rows), given=set(overrides))


def with_blocks_for_every_replica(preset: Preset) -> Preset:
    """At least twice as many blocks as all engine replicas hold at once, when there are several.

    Ray Data sends each replica up to ``2 x max_concurrent_batches`` blocks (Ray Data LLM's default
    ``max_tasks_in_flight_per_actor``) as soon as it is ready. The light stages often finish before
    the engines start, so the replica that starts first took every block there was, and Ray stopped
    the others as idle once the input was all handed out ("consumed all inputs"): on an H100, two
    engines for 10,000 images ran as one (64 blocks, 72 a replica; benchmarks/RESULTS.md). With twice
    the blocks all replicas hold, the first takes a quarter of them, the rest wait for the others."""
    from helpers import engine

    replicas = engine.max_replicas(preset.concurrency)
    held = engine.blocks_held_per_replica(preset.max_concurrent_batches)
    wanted = engine.blocks_for_every_replica(preset.concurrency, preset.max_concurrent_batches)
    if replicas < 2 or preset.num_blocks >= wanted:
        return preset
    why = (f"{wanted}: twice the blocks the {replicas} replicas hold at once ({held} each, 2 x max_concurrent_batches), "
           "so the replica that starts first does not take them all")
    return preset.override(num_blocks=wanted, reasons=(*preset.reasons, ("num_blocks", why)))


def describe(preset: Preset, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per preset-backed setting: its value, whether it came from the preset or a parameter,
    and (for ``PRESET="auto"``) why that value was chosen; the replicas row always says the pool Ray
    runs (fixed, or autoscaling for your pair)."""
    from helpers.engine import describe_pool

    why = {"max_num_batched_tokens": f"what vllm.LLM takes per step on this hardware ({RAY_STEP_TOKENS_NOTE})",
           "tokenize_stage": _tokenize_stage_default(preset)[1], "stage_cpus": _stage_cpus_default(preset)[1],
           "torch_compile": preset.torch_compile_why,
           **dict(preset.reasons)}
    pool = describe_pool(preset.concurrency)
    why["concurrency"] = f"{why['concurrency']}; {pool}" if why.get("concurrency") else pool
    rows = []
    for name, field in PARAMETER_FIELDS.items():
        if name not in parameters:
            continue
        chosen = parameters[name] is not None
        rows.append({"parameter": name, "value": repr(getattr(preset, field)),
                     "from": "your parameter" if chosen else f"preset {preset.name}",
                     "why": (pool if chosen else why[field]) if field == "concurrency" else
                     ("" if chosen else why.get(field, ""))})
    if preset.replicas_per_gpu > 1:
        why.setdefault("gpu_memory_utilization", f"{preset.gpu_memory_utilization} of the GPU shared by "
                                                 f"{preset.replicas_per_gpu} replicas, less 0.01 each for its CUDA context")
    why.setdefault("cudagraph_capture_sizes", "CUDA graphs for these step sizes only (vLLM's default: 51 sizes to 512, "
                                              "seconds more of each engine's start); a step between two runs padded")
    if preset.kv_cache_budget is not None:
        why.setdefault("kv_cache_memory_bytes", f"the kit's estimate of {preset.kv_cache_budget / 2**30:.1f} GiB for each of "
                                                f"the {preset.replicas_per_gpu} engines that share a GPU: vLLM's own "
                                                "measurement counts the other engines' memory when they start together")
    engine = {"max_num_seqs": preset.max_num_seqs, "max_num_batched_tokens": preset.step_tokens, "dtype": preset.dtype,
              "gpu_memory_utilization": preset.memory_share if preset.accelerator_type else None,
              "kv_cache_memory_bytes": preset.kv_cache_budget,
              "tensor_parallel_size": preset.tensor_parallel_size,
              "pipeline_parallel_size": preset.pipeline_parallel_size, "quantization": preset.quantization,
              "distributed_executor_backend": preset.engine_kwargs().get("distributed_executor_backend"),
              "max_tasks_in_flight_per_actor": preset.max_tasks_in_flight_per_actor,
              "cudagraph_capture_sizes": preset.cudagraph_capture_sizes}
    for field, value in engine.items():
        if value is None and field in ("kv_cache_memory_bytes", "distributed_executor_backend",
                                       "max_tasks_in_flight_per_actor", "cudagraph_capture_sizes"):  # vLLM's or Ray's own
            continue
        rows.append({"parameter": field, "value": repr(value), "from": f"preset {preset.name}",
                     "why": why.get(field, "")})
    return rows
