"""Ray Data LLM's ``build_processor`` on vLLM engines kept up between runs in this kernel.

    from ray.data.llm import vLLMEngineProcessorConfig
    from helpers.engines import build_processor  # Ray's own, new engines each run: from ray.data.llm import build_processor

It takes Ray's own ``vLLMEngineProcessorConfig`` and the same arguments as Ray's, and ``processor(ds)`` gives
``postprocess`` the fields Ray's vLLM stages give: ``generated_text``, token counts, ``generated_tokens``,
``logprobs``. Underneath, the engines are vLLM's ``AsyncLLMEngine`` in a Ray Serve deployment, a replica per
engine, no HTTP route: built once, they answer every later run in seconds. A changed model or engine setting
restarts them and says so; a changed prompt never does. A run begins once one engine answers (the rest join
as they start); each batch of requests goes in one call. They end with :func:`free`, or with the kernel.

Two waits of the kit's own come in the config's ``runtime_env`` variables: ``KIT_STARTUP_TIMEOUT_S`` (the
first engine's start) and ``KIT_STALL_TIMEOUT_S`` (a batch unanswered this long is sent again, to the
engines Serve has, until this long in all)."""

from __future__ import annotations

import atexit
import functools
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from helpers import cluster
from helpers.parameters import Explained
from helpers.pipeline import INFERENCE_ERROR  # set on a row: it skips the engines

STARTUP, STALL = "KIT_STARTUP_TIMEOUT_S", "KIT_STALL_TIMEOUT_S"  # the kit's waits, in the runtime_env's variables
STARTING = ("NOT_STARTED", "DEPLOYING")  # Serve's application status while no engine answers yet
MARKS = "notebook-kernels"  # the Ray namespace of the kernels' marks, each named by its kernel's Ray job id
STAGES = ("chat_template_stage", "tokenize_stage", "detokenize_stage", "prepare_multimodal_stage")  # in the engine here


class EngineStartError(Explained, RuntimeError):
    """The engines did not start, or not in time."""


class UnsupportedConfigError(Explained, ValueError):
    """A field of the processor's config that the kept engines cannot honour."""


@dataclass
class Engines:
    """This kernel's engines (started, or starting), the Serve application ``name``."""

    name: str
    settings: dict[str, Any]  # what needs new engines when it changes
    startup_timeout_s: float = 600
    started: float = field(default_factory=time.monotonic)

    def ready(self) -> Engines:
        """These engines once one answers (Serve sends requests to those running); else an error naming the cause."""
        if _kept.get(self.name) is not self:
            raise EngineStartError("These engines were stopped (the notebook's last cell frees them): run the cells again "
                                   "from 'Start Ray and the engines'.")
        late = self.started + self.startup_timeout_s
        while (state := _state(self.name))[0] in STARTING and not state[1] and time.monotonic() < late:
            time.sleep(0.5)
        if not state[1]:  # no engine running
            _kept.pop(self.name, None)
            free(self.name, quiet=True)
            why = f"not ready in {self.startup_timeout_s:g} s" if state[0] in STARTING else f"Serve: {state[0]}, {state[2][:2000]}"
            raise EngineStartError(f"The engines did not start ({why}). Ray's logs say why (VERBOSE=True shows them); "
                                   "for a big model or a cluster adding GPUs, raise ENGINE['startup_timeout_s'].")
        return self

    def changes(self, wanted: dict[str, Any]) -> list[str]:
        """What needs new engines for the settings ``wanted``: none where these serve them, as they are."""
        changed = sorted(k for k in {*wanted, *self.settings} if self.settings.get(k) != wanted.get(k))
        shorter = changed == ["max_model_len"] and self.settings["max_model_len"] >= wanted["max_model_len"]
        return [] if shorter else changed  # a shorter context fits in a longer one


_kept: dict[str, Engines] = {}  # by application name
_marks: list[Any] = []  # this kernel's mark, held here: Ray ends an actor no one holds


def _state(name: str) -> tuple[str | None, int, str]:
    """Serve's word on application ``name``: its status (None: there is none), its engines running, why it failed."""
    from ray import serve

    app = serve.status().applications.get(name)
    engine = app.deployments.get(name) if app else None
    message = (engine.message if engine else "") or (app.message if app else "")
    return (app.status if app else None), (engine.replica_states.get("RUNNING", 0) if engine else 0), message


class Mark:
    """A kernel's mark: an actor Ray ends with the kernel that made it (killed, crashed, or done)."""


def _stage(value: Any) -> dict[str, Any]:
    """A stage's config (a bool, a dict or Ray's stage config class) as the fields set."""
    if isinstance(value, bool):
        return {"enabled": value}
    return dict(value) if isinstance(value, dict) else value.model_dump(exclude_unset=True)


def refused(config: Any, builder_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The fields of ``config`` the kept engines cannot honour, each with why ([]: none)."""
    out = [f"builder_kwargs {sorted(builder_kwargs)}"] if builder_kwargs else []
    if config.task_type != "generate":
        out.append(f"task_type={config.task_type!r} (they generate text)")
    if config.log_engine_metrics:
        out.append("log_engine_metrics=True (they export no metrics to Ray's; set it False)")
    named = ("dynamic_lora_loading_path", "max_pending_requests", "max_tasks_in_flight_per_actor")
    out += [f"{name}={getattr(config, name)!r}" for name in named if getattr(config, name) is not None]
    for name in STAGES:  # the engine applies the chat template, tokenizes, reads images and decodes: no stage of their own
        stage = _stage(getattr(config, name))
        out += [f"{name}['{k}']" for k in stage if k not in ("enabled", "num_cpus")]
        out += [f"{name} disabled (the engines take messages)"] if name == STAGES[0] and stage.get("enabled") is False else []
    known = {"model_source", "engine_kwargs", "runtime_env", "concurrency", "batch_size", "accelerator_type",
             "max_concurrent_batches", "placement_group_config", "should_continue_on_error", "task_type",
             "log_engine_metrics", *STAGES, *named}
    return out + [name for name in sorted(config.model_fields_set - known)]


def _settings(config: Any) -> dict[str, Any]:
    env = {k: v for k, v in ((config.runtime_env or {}).get("env_vars") or {}).items() if k not in (STARTUP, STALL)}
    return {"model": config.model_source, **config.engine_kwargs, "concurrency": tuple(config.get_concurrency().values()),
            "accelerator_type": config.accelerator_type, "placement": config.placement_group_config, "env": env,
            "max_concurrent_batches": config.max_concurrent_batches}


def _wait(config: Any, name: str, default: float) -> float:
    return float(((config.runtime_env or {}).get("env_vars") or {}).get(name, default))


def build_processor(config: Any, preprocess: Any = None, postprocess: Any = None, preprocess_map_kwargs: dict | None = None,
                    postprocess_map_kwargs: dict | None = None, builder_kwargs: dict | None = None) -> Processor:
    """Ray Data LLM's ``build_processor``, on this kernel's kept engines: those running already if they serve
    ``config`` (the same settings, a context at least as long), else new ones, starting in the background while
    the next cells run. Engines whose kernel is gone (killed, or crashed, before freeing them) are freed: they
    held their GPUs. A field the kept engines cannot honour is refused by name."""
    import ray
    from ray import serve

    if no := refused(config, builder_kwargs):
        raise UnsupportedConfigError(f"The kit's kept engines cannot honour {', '.join(no)}. Leave them out, or run Ray's "
                                     "own processor (engines started each run): from ray.data.llm import build_processor.")
    if not ray.is_initialized():
        raise EngineStartError("Ray is not running (the notebook's last cell stops it): run the cells again from "
                               "'Start Ray and the engines'.")
    job = ray.get_runtime_context().get_job_id()
    name, wanted = f"kit-engines-{job}", _settings(config)
    try:
        serve.start(proxy_location="Disabled")  # no HTTP proxy: the engines answer the runs' requests only
    except ray.exceptions.ActorAlreadyExistsError:  # another kernel started Serve as this one did: join it
        serve.start(proxy_location="Disabled")
    marks = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == MARKS}
    if job not in marks:  # this kernel's mark: an actor of no resources, held; Ray ends it with the kernel
        _marks.append(ray.remote(num_cpus=0)(Mark).options(name=job, namespace=MARKS).remote())
    for other in serve.status().applications:  # engines of a kernel killed before freeing them hold their GPUs
        if (dead := re.fullmatch(r".+-engines-([0-9a-f]+)", other)) and dead[1] not in {*marks, job}:
            print(f"freeing {other}: engines whose kernel is gone, holding their GPUs (or CPUs)")
            free(other, quiet=True)
    kept, (app, _, _) = _kept.get(name), _state(name)
    replicas = config.get_concurrency()["max_size"]
    if kept is not None and not (changed := kept.changes(wanted) if app in (*STARTING, "RUNNING") else [f"their state ({app})"]):
        print(f"the {replicas} engine(s) started earlier are kept: a changed prompt needs no new ones")
    else:
        if kept is not None:
            print(f"restarting the engines: {', '.join(changed)} changed")
        free(name, quiet=True)
        serve.run_many([serve.RunTarget(_deployment(config, name), name=name, route_prefix=None)],
                       wait_for_applications_running=False)  # Serve starts them while the next cells run
        if not _kept:
            atexit.register(free)  # the kernel ends: the GPUs go back
        print(f"starting {replicas} engine(s) in the background; the run waits for the first")
        kept = _kept[name] = Engines(name, wanted, _wait(config, STARTUP, 600))
    return Processor(kept, config, preprocess, postprocess, dict(preprocess_map_kwargs or {}), dict(postprocess_map_kwargs or {}))


@dataclass
class Processor:
    """``processor(ds)``: your ``preprocess``, the kept engines, your ``postprocess``, as Ray Data stages."""

    engines: Engines
    config: Any
    preprocess: Any = None
    postprocess: Any = None
    preprocess_map_kwargs: dict = field(default_factory=dict)
    postprocess_map_kwargs: dict = field(default_factory=dict)

    def __call__(self, ds: Any) -> Any:
        """``ds`` answered, lazily, once one engine answers (a first run waits here); NumPy batches, as Ray Data
        LLM's stages (with pandas', Arrow aborted the process on a GPU: "Slice offset ...")."""
        c, name = self.config, self.engines.ready().name
        tasks = c.get_concurrency()["max_size"] * c.max_concurrent_batches  # what the engines take at once: no batch waits
        # in Serve's queue (its wait would count against stall_timeout_s). Ray warns when a run has fewer batches than
        # that (a short run, a LIMIT) and advises more blocks, which does not apply: that one warning is not shown.
        warnings.filterwarnings("ignore", message=r"The maximum number of concurrent tasks for '[^']*MapBatches\(send\)'")
        if self.preprocess:  # what it returns goes on (Ray's carries your row's other columns too: return what postprocess needs)
            ds = ds.map(self.preprocess, **self.preprocess_map_kwargs)
        ds = ds.map_batches(send, fn_args=(name, _wait(c, STALL, 300), c.should_continue_on_error), batch_size=c.batch_size,
                            batch_format="numpy", concurrency=tasks,
                            num_cpus=(_stage(c.chat_template_stage).get("num_cpus") or 1) / c.max_concurrent_batches)
        if self.postprocess:  # as Ray's: a failed row passes your postprocess by, whole
            ds = ds.map(functools.wraps(self.postprocess)(lambda row: row if row.get(INFERENCE_ERROR) else self.postprocess(row)),
                        **self.postprocess_map_kwargs)
        return ds


def free(engines: Engines | str | None = None, quiet: bool = False) -> None:
    """The engines stopped (``engines``, an app's name, or None: this kernel's, and the Ray it started here): GPUs go back."""
    import ray
    from ray import serve

    for name in [getattr(engines, "name", engines)] if engines else list(_kept):
        _kept.pop(name, None)
        if ray.is_initialized() and name in serve.status().applications:
            serve.delete(name)
            quiet or print("the engines are stopped: they hold no GPU or CPU now")
    if engines is None:
        cluster.stop()


def _deployment(config: Any, name: str) -> Any:
    """A replica per engine: one bundle (a CPU, a GPU or a share) its own; several a placement group, its CPU first."""
    from ray import serve

    args = {k: v for k, v in config.engine_kwargs.items() if k != "task_type"}  # Ray's validator adds task_type
    env = dict((config.runtime_env or {}).get("env_vars") or {})
    world = args.get("tensor_parallel_size", 1) * args.get("pipeline_parallel_size", 1)
    gpu, placement = config.accelerator_type, config.placement_group_config or {}
    bundles = placement.get("bundles") or [placement.get("bundle_per_worker") or ({"GPU": 1} if gpu else {"CPU": 1})] * world
    low, high = config.get_concurrency().values()  # Serve adds engines while requests wait
    options: dict[str, Any] = {"num_replicas": high} if low == high else {"autoscaling_config": {
        "min_replicas": low, "max_replicas": high, "target_ongoing_requests": config.max_concurrent_batches}}
    actor: dict[str, Any] = {"runtime_env": {"env_vars": env}}
    if len(bundles) > 1:  # Ray Serve LLM's bundles: the replica's CPU with the first GPU (vLLM's workers take no CPU)
        label = {f"accelerator_type:{gpu}": 0.001} if gpu else {}  # Ray's label resource places them on that type
        args.setdefault("distributed_executor_backend", "ray")
        options |= {"placement_group_bundles": [{**b, **label, **({"CPU": 1} if i == 0 else {})} for i, b in enumerate(bundles)],
                    "placement_group_strategy": placement.get("strategy", "PACK")}
    else:
        share = bundles[0].get("GPU", 0)
        actor |= {"num_cpus": bundles[0].get("CPU", 1), "num_gpus": share, "accelerator_type": gpu}
        if gpu:
            args.setdefault("distributed_executor_backend", "uni")
        if 0 < share < 1:  # vLLM asks a whole GPU unless told its share
            env["VLLM_RAY_PER_WORKER_GPUS"] = str(share)
        if not share and (most := cluster.engines_per_node(high)) < high:
            options["max_replicas_per_node"] = most  # an engine replacing one on a lost node: never in the stages' room

    # At most max_concurrent_batches at once: uncapped, Serve sent every batch to the first engine up, none to later ones.
    @serve.deployment(name=name, max_ongoing_requests=config.max_concurrent_batches, ray_actor_options=actor,
                      health_check_period_s=2, **options)  # an engine whose vLLM core died: replaced in seconds
    class Engine:
        def __init__(self, model: str, args: dict[str, Any]):
            from transformers import AutoProcessor
            from vllm import AsyncEngineArgs, AsyncLLMEngine

            self.llm = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **args))
            self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=args.get("trust_remote_code", False))

        async def generate(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
            import asyncio

            done = await asyncio.gather(*map(self.one, requests), return_exceptions=True)
            await self.check_health()  # vLLM's core died: the batch is sent again, to another engine
            return [d if isinstance(d, dict) else {INFERENCE_ERROR: f"{type(d).__name__}: {d}"[:2000]} for d in done]

        async def check_health(self) -> None:  # Serve's: an engine whose vLLM core died is replaced
            await self.llm.check_health()

        async def one(self, request: dict[str, Any]) -> dict[str, Any]:
            """The chat template applied by the model's processor, its images to vLLM as ``multi_modal_data``, the answer."""
            import uuid

            from vllm import SamplingParams
            from vllm.sampling_params import StructuredOutputsParams

            sampling = dict(request["sampling_params"])
            choice = sampling.pop("structured_outputs", None)
            params = SamplingParams(**sampling, structured_outputs=StructuredOutputsParams(**choice) if choice else None)
            messages, images = chat(request["messages"])
            prompt = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            async for out in self.llm.generate({"prompt": prompt, **({"multi_modal_data": {"image": images}} if images else {})},
                                               params, request_id=uuid.uuid4().hex):
                pass
            return fields(out, self.processor)

    return Engine.bind(config.model_source, args)


def chat(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """OpenAI-style messages as a model's chat template takes them: a message of text parts as one text, an
    image part (``image_pil``: a PIL image) as ``{"type": "image"}``; and the images, in order."""
    out, images = [], []
    for message in messages:
        content = message["content"]
        if isinstance(content, str) or not any(p["type"] != "text" for p in content):
            out.append({**message, "content": content if isinstance(content, str) else " ".join(p["text"] for p in content)})
            continue
        parts = []
        for part in content:
            if part["type"] not in ("text", "image_pil"):
                raise ValueError(f"a message part of type {part['type']!r}: the kit's engines take text and image_pil parts")
            parts.append(part if part["type"] == "text" else {"type": "image"})
            images += [part["image_pil"]] if part["type"] == "image_pil" else []
        out.append({**message, "content": parts})
    return out, images


def fields(out: Any, tokenizer: Any) -> dict[str, Any]:
    """vLLM's ``RequestOutput`` as Ray Data LLM's vLLM stage gives it to ``postprocess``: ``generated_text`` (decoded
    here if vLLM did not), token counts, ``generated_tokens``, ``logprobs`` (``[{token_id: {"logprob": v}}]``, the
    masked left out). ``flat_logprobs`` (vLLM's ``FlatLogprobs``) come as flat lists with each step's start and end."""
    answer, steps = out.outputs[0], out.outputs[0].logprobs
    if hasattr(steps, "start_indices"):  # flat_logprobs: as lists
        steps = [zip(steps.token_ids[a:b], steps.logprobs[a:b]) for a, b in zip(steps.start_indices, steps.end_indices)]
    elif steps is not None:
        steps = [((t, c.logprob) for t, c in step.items()) for step in steps]
    return {"generated_text": answer.text or tokenizer.decode(answer.token_ids, skip_special_tokens=True),
            "num_input_tokens": len(out.prompt_token_ids), "num_generated_tokens": len(answer.token_ids),
            "generated_tokens": list(answer.token_ids), INFERENCE_ERROR: "",
            "logprobs": None if steps is None else [{t: {"logprob": v} for t, v in s if v != -math.inf} for s in steps]}


def _plain(value: Any) -> Any:
    """A request's value as plain Python: Ray hands lists as arrays, and structs with every field of their
    column (``None`` where a row has none)."""
    value = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def send(batch: dict[str, Any], name: str, timeout_s: float, go_on: bool = True) -> Any:
    """A Ray Data task: a batch's requests to the engines in one call (a row failed before passes by); sent again
    every few seconds while its engine is dead or hangs (Serve replaces it), for ``timeout_s`` in all, then its
    rows fail (or, with ``should_continue_on_error=False``, the run stops, as Ray Data LLM's does)."""
    import pandas as pd
    from ray import serve

    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]  # NumPy batches, as Ray Data LLM's stages
    asked = [row for row in rows if not row.get(INFERENCE_ERROR)]
    requests, answers = [_plain({k: row[k] for k in ("messages", "sampling_params")}) for row in asked], []
    engines, late = serve.get_deployment_handle(name, name), time.monotonic() + timeout_s
    while asked and not answers:
        try:
            answers = engines.generate.remote(requests).result(timeout_s=max(late - time.monotonic(), 1))
        except Exception as exc:  # the engines' failure is these rows' reason, never the run's
            if time.monotonic() + 5 < late:
                time.sleep(5)
                continue
            why = f"no engine answered in {timeout_s:g} s (ENGINE['stall_timeout_s']): {type(exc).__name__} {exc}"
            answers = [{INFERENCE_ERROR: why[:2000]}] * len(asked)
    if not go_on and (failed := next((a[INFERENCE_ERROR] for a in answers if a.get(INFERENCE_ERROR)), None)):
        raise RuntimeError(f"a row failed in the engine (should_continue_on_error=False): {failed}")
    for row, answer in zip(asked, answers):
        row.update(answer)
    return pd.DataFrame(rows)
