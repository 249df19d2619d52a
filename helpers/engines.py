"""vLLM's engines, kept up between runs in this kernel: ``AsyncLLMEngine`` in a Ray Serve deployment, a replica
per engine, placed as the plan says, with no HTTP route. A new model or engine setting restarts them and
says so; a new prompt never does. A run begins once one engine answers (the rest join as they start) and
sends each batch of requests in one call (Serve's cost is paid per batch, not per row), ``max_concurrent_batches``
an engine at once; back come Ray Data LLM's vLLM stage's fields: ``generated_text``, token counts, ``generated_tokens``, ``logprobs``.
They end with :func:`free`, or with the kernel."""

from __future__ import annotations

import atexit
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from helpers import cluster
from helpers.parameters import Explained
from helpers.pipeline import INFERENCE_ERROR  # set on a row: it skips the engines


class EngineStartError(Explained, RuntimeError):
    """The engines did not start, or not in time."""


@dataclass
class Engines:
    """This kernel's engines (started, or starting), the Serve application ``name``."""

    name: str
    settings: dict[str, Any]  # what needs new engines when it changes
    plan: Any
    started: float = field(default_factory=time.monotonic)

    def ready(self) -> Engines:
        """These engines once one answers (Serve sends requests to those running); else an error naming the cause."""
        if _kept.get(self.name) is not self:
            raise EngineStartError("These engines were stopped (the notebook's last cell frees them): run the cells again "
                                   "from 'Start Ray and the engines'.")
        late = self.started + self.plan.startup_timeout_s
        while (state := _state(self.name))[0] in STARTING and not state[1] and time.monotonic() < late:
            time.sleep(0.5)
        if not state[1]:  # no engine running
            _kept.pop(self.name, None)
            free(self.name, quiet=True)
            why = f"not ready in {self.plan.startup_timeout_s} s" if state[0] in STARTING else f"Serve: {state[0]}, {state[2][:2000]}"
            raise EngineStartError(f"The engines did not start ({why}). Ray's logs say why (VERBOSE=True shows them); "
                                   "for a big model or a cluster adding GPUs, raise ENGINE['startup_timeout_s'].")
        return self

    def changes(self, wanted: dict[str, Any], plan: Any) -> list[str]:
        """What needs new engines for ``plan`` (its settings ``wanted``): none where these serve it, as they are."""
        changed = sorted(k for k in {*wanted, *self.settings} if self.settings.get(k) != wanted.get(k))
        return [] if changed == ["max_model_len"] and self.plan.max_model_len >= plan.max_model_len else changed  # shorter fits


_kept: dict[str, Engines] = {}  # by application name
_marks: list[Any] = []  # this kernel's mark, held here: Ray ends an actor no one holds
STARTING = ("NOT_STARTED", "DEPLOYING")  # Serve's application status while no engine answers yet
MARKS = "notebook-kernels"  # the Ray namespace of the kernels' marks, each named by its kernel's Ray job id


def _state(name: str) -> tuple[str | None, int, str]:
    """Serve's word on application ``name``: its status (None: there is none), its engines running, why it failed."""
    from ray import serve

    app = serve.status().applications.get(name)
    engine = app.deployments.get(name) if app else None
    message = (engine.message if engine else "") or (app.message if app else "")
    return (app.status if app else None), (engine.replica_states.get("RUNNING", 0) if engine else 0), message


class Mark:
    """A kernel's mark: an actor Ray ends with the kernel that made it (killed, crashed, or done)."""


def _settings(plan: Any, env: dict[str, str]) -> dict[str, Any]:
    return {"model": plan.model_path, **plan.engine_args, "concurrency": plan.actor_pool, "gpus": plan.gpus_per_replica,
            "accelerator_type": plan.ray_type, "env": env, "max_concurrent_batches": plan.max_concurrent_batches}


def start(plan: Any, env: dict[str, str], notebook: str) -> Engines:
    """This kernel's engines for ``plan``: those running already if they serve it (the same settings, a
    context at least as long), else new ones, starting in the background while the next cells run. One
    application per notebook and kernel: two notebooks on one cluster never share engines. Engines whose
    kernel is gone (killed, or crashed, before freeing them) are freed: they held their GPUs."""
    import ray
    from ray import serve

    job = ray.get_runtime_context().get_job_id()
    name, wanted = f"{notebook}-engines-{job}", _settings(plan, env)
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
    if kept is not None:  # Serve must have kept them too, starting or running
        if not (changed := kept.changes(wanted, plan) if app in (*STARTING, "RUNNING") else [f"their state ({app})"]):
            print(f"the {plan.replicas} engine(s) started earlier are kept: a changed prompt needs no new ones")
            kept.plan = kept.plan.override(batch_size=plan.batch_size, stage_cpus=plan.stage_cpus)
            return kept
        print(f"restarting the engines: {', '.join(changed)} changed")
    free(name, quiet=True)
    serve.run_many([serve.RunTarget(_deployment(plan, env, name), name=name, route_prefix=None)],
                   wait_for_applications_running=False)  # Serve starts them while the next cells run
    if not _kept:
        atexit.register(lambda: [free(n, quiet=True) for n in list(_kept)])  # the kernel ends: the GPUs go back
    print(f"starting {plan.replicas} engine(s) in the background; the run cell waits for the first")
    _kept[name] = Engines(name, wanted, plan)
    return _kept[name]


def free(engines: Engines | str, quiet: bool = False) -> None:
    """The engines stopped (``engines``, or an application's name): their GPUs (or CPUs) go back."""
    import ray
    from ray import serve

    _kept.pop(name := getattr(engines, "name", engines), None)
    if ray.is_initialized() and name in serve.status().applications:
        serve.delete(name)
        quiet or print("the engines are stopped: they hold no GPU or CPU now")


def _deployment(plan: Any, env: dict[str, str], name: str) -> Any:
    """A replica per engine: on one GPU or a share of one, beside vLLM; over several, a placement group of them."""
    from ray import serve

    args = {**plan.engine_args, **({"limit_mm_per_prompt": {"image": 1}} if plan.task == "vision" else {})}
    actor: dict[str, Any] = {"num_cpus": 1, "accelerator_type": plan.ray_type, "runtime_env": {"env_vars": env}}
    low, high = plan.actor_pool  # (low, high): Serve adds engines while requests wait
    options: dict[str, Any] = {"num_replicas": high} if low == high else {"autoscaling_config": {
        "min_replicas": low, "max_replicas": high, "target_ongoing_requests": plan.max_concurrent_batches}}
    if plan.world > 1:  # Ray Serve LLM's bundles: the replica's CPU with the first GPU (vLLM's workers take no CPU)
        args["distributed_executor_backend"], kind = "ray", actor.pop("accelerator_type")  # the type goes on the GPUs
        gpu = {"GPU": 1} | ({f"accelerator_type:{kind}": 0.001} if kind else {})  # Ray's label resource
        options |= {"placement_group_bundles": [gpu | {"CPU": 1}] + [gpu] * (plan.world - 1),
                    "placement_group_strategy": "PACK" if plan.pipeline_parallel_size > 1 else "STRICT_PACK"}
    elif not plan.accelerator_type and (most := cluster.engines_per_node(plan.replicas)) < plan.replicas:
        options["max_replicas_per_node"] = most  # an engine replacing one on a lost node: never in the stages' room
    elif plan.accelerator_type:
        args.setdefault("distributed_executor_backend", "uni")
        actor["num_gpus"] = plan.gpus_per_replica
        if plan.gpus_per_replica < 1:  # vLLM asks a whole GPU unless told its share
            actor["runtime_env"] = {"env_vars": {**env, "VLLM_RAY_PER_WORKER_GPUS": str(plan.gpus_per_replica)}}

    # At most max_concurrent_batches at once: uncapped, Serve sent every batch to the first engine up, none to later ones.
    @serve.deployment(name=name, max_ongoing_requests=plan.max_concurrent_batches, ray_actor_options=actor,
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
            """The chat template applied as Ray Data LLM's stages apply it (images parsed by vLLM), then the answer."""
            import uuid

            from vllm import SamplingParams
            from vllm.entrypoints.chat_utils import parse_chat_messages_async
            from vllm.sampling_params import StructuredOutputsParams

            sampling = dict(request["sampling_params"])
            choice = sampling.pop("structured_outputs", None)
            params = SamplingParams(**sampling, structured_outputs=StructuredOutputsParams(**choice) if choice else None)
            system = [{**m, "content": m["content"] if isinstance(m["content"], str) else " ".join(
                p["text"] for p in m["content"] if p["type"] == "text")} for m in request["messages"] if m["role"] == "system"]
            chat, media, _ = await parse_chat_messages_async([m for m in request["messages"] if m["role"] != "system"],
                                                             self.llm.model_config, content_format="string")
            prompt = self.processor.apply_chat_template(system + chat, tokenize=False, add_generation_prompt=True)
            async for out in self.llm.generate({"prompt": prompt, **({"multi_modal_data": media} if media else {})}, params,
                                               request_id=uuid.uuid4().hex):
                pass
            return fields(out, self.processor)

    return Engine.bind(plan.model_path, args)


def fields(out: Any, tokenizer: Any) -> dict[str, Any]:
    """vLLM's ``RequestOutput`` as Ray Data LLM's vLLM stage gives it to ``postprocess``: ``generated_text`` (decoded
    here if vLLM did not), token counts, ``generated_tokens``, ``logprobs`` (``[{token_id: {"logprob": v}}]``, the masked left out)."""
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


class _Send:
    """A Ray Data stage: each batch's requests to the engines in one call; a row failed before passes by. A
    batch whose engine died (its node lost, its process killed) or hangs is sent again every few seconds, to
    the engines Serve has (it replaces a dead one), for ``timeout_s`` in all; its rows are failed rows after."""

    def __init__(self, name: str, timeout_s: float):
        from ray import serve

        self.engines, self.timeout_s = serve.get_deployment_handle(name, name), timeout_s

    async def __call__(self, batch):  # an async generator: Ray Data runs several batches at once in one actor
        import asyncio

        import pandas as pd

        rows = [dict(zip(batch, values)) for values in zip(*batch.values())]  # NumPy batches, as Ray Data LLM's stages
        asked = [row for row in rows if not row.get(INFERENCE_ERROR)]
        requests, answers = [_plain({k: row[k] for k in ("messages", "sampling_params")}) for row in asked], []
        late = time.monotonic() + self.timeout_s
        while asked and not answers:
            try:
                answers = await asyncio.wait_for(self.engines.generate.remote(requests), late - time.monotonic())
            except Exception as exc:  # the engines' failure is these rows' reason, never the run's
                if time.monotonic() + 5 < late:
                    await asyncio.sleep(5)
                    continue
                why = f"no engine answered in {self.timeout_s:g} s (ENGINE['stall_timeout_s']): {type(exc).__name__} {exc}"
                answers = [{INFERENCE_ERROR: why[:2000]}] * len(asked)
        for row, answer in zip(asked, answers):
            row.update(answer)
        yield pd.DataFrame(rows)


def answer(ds: Any, engines: Engines) -> Any:
    """``ds``'s requests (your ``preprocess``'s rows) answered by ``engines`` once one is ready: an actor per engine sends them."""
    import ray

    plan = engines.ready().plan
    # NumPy batches, as Ray Data LLM's stages: with pandas', Arrow aborted the process on a GPU ("Slice offset ...").
    return ds.map_batches(_Send, fn_constructor_args=(engines.name, plan.stall_timeout_s), batch_size=plan.batch_size, batch_format="numpy",
                          num_cpus=plan.stage_cpus, compute=ray.data.ActorPoolStrategy(
                              size=plan.actor_pool[1], max_concurrent_calls_per_actor=plan.max_concurrent_batches))
