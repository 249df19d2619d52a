"""The run's configuration: a preset (:mod:`helpers.presets`) fitted to your GPUs and rows, with your
``ENGINE`` settings on top and a reason for every value the kit chose; the throughput guide's rules
checked with numbers; the context measured from the requests your ``preprocess`` really sends."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from helpers import cluster, models
from helpers.engines import chat
from helpers.parameters import Explained, closest, is_int, is_number, literal, positive_int, raise_if, text
from helpers.presets import (CPU_PRESET, DEFAULT_GPU_PRESET, GIB, GPUS, OFFLINE, PRESETS, Preset, engine_defaults,
                             memory_budget, model_shape, names)


#: What ``ENGINE`` may set: the preset's fields, each with its check.
ENGINE_KEYS = {
    "accelerator_type": lambda v: v is None or (isinstance(v, str) and bool(v)),
    "concurrency": lambda v: (is_int(v) and v >= 1) or (isinstance(v, (list, tuple)) and len(v) == 2  # n, or (min, max)
                                                       and all(is_int(x) for x in v) and 1 <= v[0] <= v[1]),
    "replicas_per_gpu": lambda v: is_int(v) and 1 <= v <= 8,
    **dict.fromkeys(("batch_size", "max_model_len", "num_blocks", "max_concurrent_batches", "max_num_seqs", "block_size",
                     "max_num_batched_tokens", "tensor_parallel_size", "pipeline_parallel_size"), lambda v: is_int(v) and v >= 1),
    **dict.fromkeys(("startup_timeout_s", "stall_timeout_s"), lambda v: is_int(v) and v >= 10),
    "gpu_memory_utilization": lambda v: is_number(v) and 0 < v <= 1,
    **dict.fromkeys(("quantization", "dtype"), lambda v: v is None or isinstance(v, str)),
    **dict.fromkeys(("enforce_eager", "torch_compile", "trust_remote_code"), lambda v: isinstance(v, bool)),
    "stage_cpus": lambda v: is_number(v) and 0 < v <= 8,
    "kv_cache_gib": lambda v: is_int(v) and v >= 1, "engine_kwargs": lambda v: isinstance(v, dict),
}


def check_engine(engine: Any) -> list[str]:
    """``ENGINE``'s problems: not a dict, an unknown key (with the closest one), a bad value."""
    engine = literal(engine)
    if not isinstance(engine, dict):
        return [f"ENGINE must be a dict of settings such as {{'concurrency': 2}}, got {engine!r}"]
    found = [f"ENGINE[{k!r}] is not a setting: {closest(str(k), ENGINE_KEYS)}" for k in engine if k not in ENGINE_KEYS]
    found += [f"ENGINE[{k!r}]={v!r} is not a valid value" for k, v in engine.items() if k in ENGINE_KEYS and not ENGINE_KEYS[k](literal(v))]
    if engine.get("enforce_eager") is True and engine.get("torch_compile") is True:
        found.append("ENGINE asks vLLM both to compile (torch_compile) and to run without compiling (enforce_eager)")
    return found


class ConfigurationError(Explained, ValueError):
    """A configuration that would fail or waste its resources; the message says which rule and why."""


def fit(task: str, preset: Any, model_source: Any, engine: Any, *, source: Any = None, limit: Any = None,
        gpus: Mapping[str, Any] | None = None) -> Preset:
    """``PRESET`` (``"auto"``: fitted to the GPUs found, or to ``gpus`` as :func:`helpers.cluster.visible`
    describes them) with ``MODEL_SOURCE`` and ``ENGINE`` on top, fitted to the run's rows (``LIMIT``,
    else the ``source``'s); the model prepared, the checks run (errors raise, warnings are printed)."""
    problems = [f"PRESET must be one of {names(task)}, got {preset!r}"] if preset not in names(task) else []
    problems += text("MODEL_SOURCE", model_source, optional=True) + positive_int("LIMIT", limit, optional=True)
    problems += check_engine(engine)
    raise_if(problems)
    given = {k: (tuple(literal(v)) if k == "concurrency" and isinstance(literal(v), (list, tuple)) else literal(v))
             for k, v in literal(engine).items()}
    if model_source is not None:
        given["model_source"] = model_source
    if preset == "auto":
        wanted = given.get("accelerator_type")
        count = given["concurrency"] if is_int(given.get("concurrency")) else 1
        seen = gpus if gpus is not None else cluster.visible(wait_s=given.get("startup_timeout_s", 600),
                                                             wanted=(wanted, count) if wanted else None)
        chosen = _auto(task, seen, given)
    else:
        chosen = PRESETS[preset]
    whole = getattr(source, "rows", None)
    rows = min(filter(None, (whole, limit)), default=None)
    estimated = bool(rows and rows == whole != limit and getattr(source, "rows_basis", "").startswith("estimated"))
    plan = _settle(chosen, given, rows, estimated)
    plan = plan.override(model_path=models.resolve(plan.model_source, task))
    print(f"preset {plan.name}: {plan.description}\nmodel: {plan.model_path}")
    for warning in check(plan, rows=rows):
        print(f"warning: {warning}")
    return plan


def _auto(task: str, seen: Mapping[str, Any], given: Mapping[str, Any], context: int | None = None) -> Preset:
    """The task's GPU preset fitted to ``seen`` and requests of ``context`` tokens (None: the preset's); no GPU: the CPU's."""
    gpus = cluster.choose(seen, given.get("accelerator_type"))
    if gpus.count == 0:
        if given.get("accelerator_type") and seen.get("GPU"):
            raise ConfigurationError(f"accelerator_type={given['accelerator_type']!r}: the cluster has no such GPUs "
                                     f"({cluster.choose(seen).describe()})")
        if seen.get("remote"):
            raise ConfigurationError(
                "PRESET='auto' found no GPUs on the Ray cluster (one that scales from zero shows none until work asks "
                "for them) and will not fall back to CPUs there: set ENGINE={'accelerator_type': 'L4'} (the type its "
                f"nodes have) and 'auto' asks the autoscaler for them, or name a preset such as {DEFAULT_GPU_PRESET[task]!r}")
        return PRESETS[CPU_PRESET[task]].override(description="auto: no GPU visible, so the offline CPU preset")
    base = PRESETS[DEFAULT_GPU_PRESET[task]]
    base = base.override(max_model_len=context) if context else base
    model = given.get("model_source") or base.model_source  # the offline model is fitted as the tutorial's
    memory = gpus.memory_gib or min(g.memory_gib for g in GPUS.values())
    reasons = {"accelerator_type": f"planned for {gpus.describe()}"}
    shape = model_shape(model)
    budget = memory_budget(memory, base.gpu_memory_utilization)
    tp = next((t for t in (1, 2, 4, 8) if t <= max(gpus.per_node, default=0) and shape.divides(t)
               and shape.weight_bytes() / t <= 0.8 * budget), None) if shape else 1
    if tp is None and "model_source" not in given:  # the offline model is what runs: it fits any GPU
        shape, tp = None, 1
    if tp is None:
        raise ConfigurationError(f"PRESET='auto': {model}'s {shape.weight_bytes() / GIB:.0f} GiB of weights do not fit "
                                 f"{gpus.describe()} in tensor-parallel groups inside one node. Use bigger GPUs, more "
                                 f"of them on a node, or a quantized checkpoint (presets: {names(task)[1:]})")
    step, seqs = engine_defaults(gpus.gpu_type or "", memory)
    trial = functools.partial(base.override, model_source=model, accelerator_type=gpus.gpu_type, tensor_parallel_size=tp,
                              gpu_memory_gib=memory)  # the plan with replicas_per_gpu=k, to size its KV cache
    why = "short requests leave one engine's CPU side (vLLM's frontend, its engine core) the bottleneck"
    cpus = min((n["cpus"] / n["gpus"] for n in seen["nodes"] if n["gpus"] and n["gpu_type"] == gpus.gpu_type), default=0)
    share, short = given.get("replicas_per_gpu") or 1, "replicas_per_gpu" not in given and shape and base.max_model_len <= 1024
    if tp > 1:
        reasons.update(tensor_parallel_size=f"{model}'s weights do not fit one {gpus.gpu_type} with room for a KV cache",
                       replicas_per_gpu="a replica spans several GPUs")
    elif short and task == "text" and cpus >= 12 and (trial(replicas_per_gpu=4).full_sequences or 0) >= seqs // 4:
        share = 4  # measured on H200s (8B, 16 cores a GPU): 1.17x two engines, CONFIDENCE 0.97-1.00x (two: 0.70-0.81x)
        reasons["replicas_per_gpu"] = f"{why}; four copies of the weights fit with their sequences, and 12 CPUs a GPU run them"
    elif short and 4 * shape.weight_bytes() <= budget:
        share = 2  # measured on an H100: 2 engines 1.69x one raw engine (8B text), 2.46x (3B captions); 3: 1.34x
        reasons["replicas_per_gpu"] = f"{why}, and two copies of the weights fit"
    replicas = gpus.replicas(tp) * share
    reasons["concurrency"] = f"{gpus.replicas(tp)} replicas of {tp} GPUs" if tp > 1 else f"{share} per GPU on {gpus.count} GPUs"
    reasons["max_num_batched_tokens"] = f"what vllm.LLM takes per step on a {memory:.0f} GiB GPU (Ray alone: 2048)"
    seqs //= share
    if shape is not None:
        fits = trial(replicas_per_gpu=share)
        seqs = max(1, min(seqs, 2 ** int(math.log2(max(fits.full_sequences, 1)))))  # a power of two that fits
        reasons["max_num_seqs"] = (f"~{fits.kv_bytes / GIB:.1f} GiB of KV cache per replica holds {fits.full_sequences} "
                                   "full-length sequences")
    # Ray's engine stage admits 1.1 x max_num_seqs requests: keep twice that many rows queued per replica.
    batches = max(base.max_concurrent_batches, 2 * -(-math.ceil(1.1 * seqs) // base.batch_size))
    if batches > base.max_concurrent_batches:
        reasons["max_concurrent_batches"] = "twice the batches that fill the engine's request slots (1.1 x max_num_seqs)"
    return base.override(name=f"auto ({gpus.count}x{gpus.gpu_type})", model_source=OFFLINE if "model_source" not in given else model,
                         accelerator_type=gpus.gpu_type, concurrency=replicas, tensor_parallel_size=tp, replicas_per_gpu=share,
                         gpu_memory_gib=gpus.memory_gib if gpus.memory_basis == "measured" else None, max_num_seqs=seqs,
                         max_num_batched_tokens=step, max_concurrent_batches=batches, fitted_to=seen,
                         description=f"auto: {gpus.count} x {gpus.gpu_type}, from {base.name}", reasons=tuple(reasons.items()))


def _settle(chosen: Preset, given: Mapping[str, Any], rows: int | None, estimated: bool) -> Preset:
    """``chosen`` with your ``ENGINE`` on top (refused where they contradict), and the kit's choices for ``rows``."""
    plan = chosen.override(**given, given=tuple(given))
    if plan.world > 1 and plan.replicas_per_gpu > 1:
        raise ConfigurationError(f"replicas_per_gpu={plan.replicas_per_gpu}: a replica over {plan.world} GPUs "
                                 "(tensor or pipeline parallelism) cannot share them")
    known = None if estimated else rows  # short-run choices only on rows known before reading
    return _decide(plan, set(given), known).override(rows=rows, rows_estimated=estimated)


def _cpu_dtype() -> tuple[str, str]:
    """The checkpoint's bfloat16 where the CPU computes it natively, else float32 (emulated bfloat16 took
    88 s for 64 rows against 14 s in float32 on a 2-core AVX2 machine)."""
    try:
        flags = {f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split()}
    except OSError:
        return "auto", "CPU instructions unknown: the checkpoint's own dtype"
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "auto", "this CPU computes bfloat16 natively: the checkpoint's bfloat16"
    return "float32", "this CPU has no bfloat16 instructions: float32 runs several times faster"


#: Runs of at most these rows: on a GPU, eager (CUDA-graph capture took 23 s of a 157 s H100 pipeline for 24
#: images); on a CPU, the model in vLLM's engine process (~18 s sooner to start on 2 cores, slower to compute).
SHORT_GPU_ROWS, ONE_PROCESS_ROWS = 1_000, {"text": 100, "vision": 30}


def _decide(p: Preset, given: set[str], rows: int | None) -> Preset:
    """The values the preset leaves to the kit, each with its reason, for a run of ``rows`` (if known)."""
    why = dict(p.reasons)
    changes: dict[str, Any] = {}
    if p.stage_cpus is None:
        changes["stage_cpus"] = 1.0 if p.accelerator_type else 0.1
        why["stage_cpus"] = ("a GPU: one light task per core, fewer worker processes to start" if p.accelerator_type
                             else "a CPU: the light stages share the cores the engine leaves")
    if rows and "batch_size" not in given and -(-rows // p.batch_size) < p.replicas:  # a short run: every engine works
        p = p.override(batch_size=-(-rows // p.replicas))
        why["batch_size"] = f"{rows:,} rows: a batch for each of the {p.replicas} engines"
    if p.dtype is None and not p.accelerator_type:
        changes["dtype"], why["dtype"] = _cpu_dtype()
    if p.block_size is None and not p.accelerator_type:  # vLLM's CPU blocks hold 128 tokens, a GPU's 16
        changes["block_size"], why["block_size"] = 32, "a CPU: short blocks, so every row reuses the system message's (prefix caching)"
    if rows is not None and p.accelerator_type and not ({"enforce_eager", "torch_compile"} & given) and rows <= SHORT_GPU_ROWS:
        changes["enforce_eager"], why["enforce_eager"] = True, f"{rows:,} rows: too few to repay CUDA-graph capture"
    if rows is not None and not p.accelerator_type and p.world == 1 and rows <= ONE_PROCESS_ROWS[p.task]:
        changes["one_process"] = True
        why["one_process"] = f"{rows:,} rows: the model runs in vLLM's engine process, sooner to start, slower to compute"
    if "num_blocks" not in given:
        # A file is read as one task handing Ray ~10 blocks a second (256 held 16 H200 engines to 800 rows/s). A GPU's block
        # holds 2 batches, one more per 4 engines beyond 8 (its results wait for all its batches); a CPU's a batch.
        per = p.batch_size * (max(2, -(-p.replicas // 4)) if p.accelerator_type else 1)
        wanted = (max(-(-rows // per), min(p.replicas, -(-rows // p.batch_size)), 0 if p.accelerator_type else p.num_blocks)
                  if rows else max(p.num_blocks, 2 * p.replicas))
        if wanted != p.num_blocks:
            changes["num_blocks"] = wanted
            why["num_blocks"] = f"blocks of up to {per:,} rows: a file is read a block at a time" if rows else "2 per engine"
    return p.override(**changes, reasons=tuple(why.items()))


def check(p: Preset, rows: int | None = None) -> list[str]:
    """The throughput guide's rules, with numbers: raise on what would fail, return what would waste."""
    errors, warnings = [], []
    if p.batch_size * p.max_concurrent_batches < p.max_num_seqs and not (rows and rows <= p.batch_size * p.replicas):
        warnings.append(f"batch_size x max_concurrent_batches = {p.batch_size * p.max_concurrent_batches} < max_num_seqs = "
                        f"{p.max_num_seqs}: the engine can never fill its batch")
    shape, memory = (p.shape, p.gpu_memory) if p.accelerator_type else (None, None)
    if p.accelerator_type and memory is None:
        warnings.append(f"no memory data for GPU type {p.accelerator_type!r}; known: {sorted(GPUS)}")
    elif p.accelerator_type and shape is not None:
        budget = memory_budget(memory, p.memory_share)
        weights = shape.weight_bytes(p.quantization) / p.world
        kv = shape.kv_bytes_per_token * p.max_num_seqs * p.max_model_len / p.world
        if weights > budget:
            errors.append(f"weights need {weights / GIB:.1f} GiB per GPU but a {p.accelerator_type} offers {budget / GIB:.1f} "
                          "GiB: use more GPUs per replica (tensor_parallel_size) or quantization")
        elif weights + kv > budget:
            warnings.append(f"weights {weights / GIB:.1f} GiB + KV cache for {p.max_num_seqs} sequences of {p.max_model_len} "
                            f"tokens {kv / GIB:.1f} GiB > {budget / GIB:.1f} GiB per {p.accelerator_type}: only ~{p.full_sequences} "
                            "full-length sequences fit at once; lower max_model_len or max_num_seqs")
    if p.num_blocks < p.replicas and not (rows and -(-rows // p.batch_size) <= p.num_blocks):  # a block per batch
        warnings.append(f"num_blocks={p.num_blocks} < {p.replicas} replicas: too few blocks to keep every engine busy")
    if rows and p.batch_size > 1 and -(-rows // p.batch_size) < p.replicas:
        warnings.append(f"{rows:,} rows make {-(-rows // p.batch_size)} batches for {p.replicas} replicas: lower batch_size")
    if errors:
        raise ConfigurationError("Configuration errors:\n  - " + "\n  - ".join(errors))
    return warnings


@functools.lru_cache(maxsize=4)
def _load(kind: str, model_path: str, trust_remote_code: bool):
    import transformers

    return getattr(transformers, kind).from_pretrained(model_path, trust_remote_code=trust_remote_code)


def tokenizer(p: Preset):
    """The model's tokenizer (transformers'), loaded once."""
    return _load("AutoTokenizer", p.model_path, p.trust_remote_code)


def request_tokens(p: Preset, request: Mapping[str, Any]) -> int:
    """Tokens of one request as the kit's engines see it (:func:`helpers.engines.chat`): the chat template
    applied, each image's vision tokens (the model's processor), and the answer's ``max_tokens``."""
    messages, images = chat(request["messages"])
    answer = int(request.get("sampling_params", {}).get("max_tokens") or 0)
    if not images:
        tok = tokenizer(p)
        return len(tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]) + answer
    processor = _load("AutoProcessor", p.model_path, p.trust_remote_code)
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(processor(text=[prompt], images=images)["input_ids"][0]) + answer


def fit_context(p: Preset, requests: Sequence[Mapping[str, Any]], quantile: float = 0.99) -> Preset:
    """``max_model_len`` from the requests your ``preprocess`` sends (their ``quantile``, the answer
    included, rounded up to 64): spare context costs KV cache, too little fails rows. Yours (``ENGINE``)
    is kept, or refused if too short; "auto" plans the GPUs again for it (engines per GPU, sequences)."""
    if not requests:
        return p
    lengths = sorted(request_tokens(p, r) for r in requests)
    needed = lengths[min(len(lengths) - 1, math.ceil(quantile * len(lengths)) - 1)]
    print(f"request tokens over {len(lengths)} rows, the answer included: median {lengths[len(lengths) // 2]}, "
          f"P{quantile * 100:g} {needed}, max {lengths[-1]}")
    if "max_model_len" in p.given:
        if needed > p.max_model_len:
            raise ConfigurationError(f"max_model_len={p.max_model_len} (ENGINE) is shorter than your requests need "
                                     f"({needed} tokens at P{quantile * 100:g}, the answer included): raise it, or shorten the prompt")
        return p
    length = -(-needed // 64) * 64
    if length == p.max_model_len:
        return p
    fitted = p.override(max_model_len=length)
    if p.fitted_to is not None:  # "auto": short requests may now take two engines per GPU (captions: 8192 -> 192)
        given = {name: getattr(p, name) for name in p.given}
        fitted = _settle(_auto(p.task, p.fitted_to, given, length), given, p.rows, p.rows_estimated).override(model_path=p.model_path)
        if fitted.actor_pool != p.actor_pool:
            print(f"auto, for requests of {length} tokens: {fitted.replicas} engines, {fitted.replicas_per_gpu} per GPU")
    why = f"P{quantile * 100:g} of your requests ({needed} tokens), rounded up to 64"
    fitted = fitted.override(reasons=(*fitted.reasons, ("max_model_len", why)))
    check(fitted)
    return fitted
