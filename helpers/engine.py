"""What each engine replica gets: its CPUs and GPU placement, the cores it computes on, its environment,
and the actor pool Ray runs (the part of the set-up that differs on CPU and GPU)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CpuBudget:
    """Ray's logical CPU budget for one pipeline.

    Ray schedules by logical CPUs, not by load. Actors hold their CPUs for the whole run; map,
    read and write tasks need theirs each time they start. If the actors' reservations leave less
    than one task's worth free, those tasks wait forever with no error (the silent back-pressure
    hang). ``ray_cpus`` therefore reserves room for every actor plus one default 1-CPU task.
    """

    engine_cpus: float
    engine_replicas: int
    stage_cpus: float
    stage_actors: int
    task_cpus: float = 1.0

    @property
    def reserved(self) -> float:
        return self.engine_cpus * self.engine_replicas + self.stage_cpus * self.stage_actors

    @property
    def ray_cpus(self) -> int:
        """Logical CPUs to start a local Ray with: the machine's cores, or more if the plan needs it."""
        return max(os.cpu_count() or 1, math.ceil(self.reserved + self.task_cpus))


def engine_placement(accelerator_type: str | None, engine_cpus: float = 1.0,
                     gpus_per_replica: float = 1.0) -> dict[str, Any]:
    """The processor-config fields that place the vLLM engine.

    On a GPU (``accelerator_type`` such as ``"L4"``), Ray's default is right for one or more whole
    GPUs per engine. Replicas that share a GPU (``gpus_per_replica`` below 1) each get a bundle with
    that share of it: Ray then places that many engines on each GPU. On a CPU, the engine must not
    ask for a GPU, so it gets a placement group with one CPU bundle and no accelerator.
    """
    if accelerator_type and gpus_per_replica < 1:
        return {"accelerator_type": accelerator_type,
                "placement_group_config": {"bundles": [{"GPU": gpus_per_replica, "CPU": engine_cpus}]}}
    if accelerator_type:
        return {"accelerator_type": accelerator_type}
    return {"accelerator_type": None, "placement_group_config": {"bundles": [{"CPU": engine_cpus}]}}


def cpu_threads_bind(accelerator_type: str | None, replicas: int, *, joined: bool = False) -> str | None:
    """The cores a lone CPU engine should compute on: all of this machine's (``"0,1"``), or
    ``None`` to leave vLLM's choice.

    vLLM's automatic binding keeps one core back for its scheduler process, which on a 2-core
    machine halves the compute: measured here, 2,000 SmolLM2 prompts took 1.8x as long. Only for a
    single CPU replica on a local Ray the run starts: replicas on one node would compete for the
    same cores, and on a cluster (:func:`cluster_address`) this machine's cores say nothing about
    the workers' or are shared with others.
    """
    if accelerator_type or replicas != 1 or joined:
        return None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cores) if len(cores) > 1 else None


#: Environment variables that are secrets: never shipped in a ``runtime_env``, never shown.
SECRET_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def engine_env(kv_cache_gib: float | None, log_level: str | None = None,
               threads_bind: str | None = None) -> dict[str, str]:
    """Environment variables for the engine workers (shipped through Ray's ``runtime_env``).

    ``VLLM_CPU_KVCACHE_SPACE`` caps vLLM's CPU KV cache in GiB (unset, it takes a large share of
    RAM); it is ignored on GPUs. ``threads_bind`` (see :func:`cpu_threads_bind`) sets
    ``VLLM_CPU_OMP_THREADS_BIND``, the cores a CPU engine computes on. ``HF_HUB_OFFLINE`` is set
    only when ``HF_HUB_OFFLINE`` is set here, so GPU users can still download models. vLLM logs
    at ``log_level``, else at the ``VLLM_LOGGING_LEVEL`` set here (``INFO`` shows its start-up
    steps with times in Ray's worker logs), else at ``WARNING``.

    Never a secret: Ray shows a ``runtime_env`` in its Dashboard and keeps it in the cluster's
    control store, so ``HF_TOKEN`` is not in it (:data:`SECRET_VARIABLES`). The engines read the
    token from their own environment: a local Ray's workers inherit this process's; a cluster's
    nodes get it from the cluster (your platform's secret store; docs/clusters-and-jobs.md).
    """
    log_level = log_level or os.environ.get("VLLM_LOGGING_LEVEL") or "WARNING"
    env = {"VLLM_LOGGING_LEVEL": log_level, "TOKENIZERS_PARALLELISM": "false"}
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    if threads_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    if os.environ.get("HF_HUB_OFFLINE"):
        env["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    # Inside a Ray job, the job's runtime_env already reaches every worker, and Ray refuses any
    # ray.init runtime_env (the processor calls ray.init too) that sets the same variables again.
    job_vars = job_env_vars()
    return {k: v for k, v in env.items() if k not in job_vars and k not in SECRET_VARIABLES}


def concurrency_arg(concurrency: int | str | list[int] | tuple[int, int]) -> int | tuple[int, int]:
    """Normalise ``CONCURRENCY``: papermill and YAML turn a tuple into a list, and papermill's ``-p``
    passes ``"(2, 2)"`` or ``"[2, 2]"`` as text; each becomes the tuple, a number stays a number.
    Text that is neither is returned as it is (the parameter checks name it)."""
    if isinstance(concurrency, str):
        import ast

        try:
            concurrency = ast.literal_eval(concurrency.strip())
        except (ValueError, SyntaxError):
            return concurrency  # type: ignore[return-value]
    return tuple(concurrency) if isinstance(concurrency, (list, tuple)) else concurrency  # type: ignore[return-value]


def actor_pool(concurrency: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    """``concurrency`` as Ray Data LLM should get it: ``(n, n)``, a fixed pool of ``n`` engine replicas,
    for a number ``n``; a ``(min, max)`` pair as it is (an autoscaling pool). Ray 2.60's processor
    turns a bare ``n`` into an autoscaling pool of 1 to ``n`` (``ProcessorConfig.get_concurrency``):
    on an H100, "2 replicas" then ran as one for two thirds of a run (benchmarks/RESULTS.md)."""
    value = concurrency_arg(concurrency)
    return value if isinstance(value, tuple) else (int(value), int(value))  # type: ignore[return-value]


def describe_pool(concurrency: int | list[int] | tuple[int, int]) -> str:
    """What Ray runs for ``concurrency``, in words, for the settings table."""
    low, high = actor_pool(concurrency)
    if low == high:
        return f"Ray gets ({low}, {high}): a fixed pool of {high} replica{'s' if high > 1 else ''}, all started at once"
    return f"Ray gets ({low}, {high}): an autoscaling pool from {low} to {high} replicas"


def max_replicas(concurrency: int | list[int] | tuple[int, int]) -> int:
    """The most engine replicas ``CONCURRENCY`` can scale to."""
    return int(concurrency[-1]) if isinstance(concurrency, (list, tuple)) else int(concurrency)


def blocks_held_per_replica(max_concurrent_batches: int) -> int:
    """The read blocks Ray Data sends one ready engine replica at once: Ray Data LLM leaves
    ``max_tasks_in_flight_per_actor`` unset, so Ray's ``2 x max_concurrency`` applies, and a read
    block's batches reach the engine as one task."""
    return 2 * max_concurrent_batches


def batches_held_in_a_short_run(concurrency: int | list[int] | tuple[int, int], max_concurrent_batches: int,
                                batches: int) -> int | None:
    """The batches Ray Data may hand one engine replica at once (``max_tasks_in_flight_per_actor``) in
    a run of ``batches`` known batches, so that the replica ready first leaves each other replica its
    share: ``ceil(batches / replicas)`` where that is fewer than :func:`blocks_held_per_replica`.
    None (Ray's own rule) for one replica, an autoscaling pool, or a run with enough batches."""
    low, high = actor_pool(concurrency)
    share = max(1, math.ceil(batches / high))  # an empty input still gets a valid setting
    return share if low == high > 1 and share < blocks_held_per_replica(max_concurrent_batches) else None


def blocks_for_every_replica(concurrency: int | list[int] | tuple[int, int], max_concurrent_batches: int) -> int:
    """The read blocks a run needs so that the replica ready first cannot take them all: twice what
    all replicas hold at once (:func:`blocks_held_per_replica`)."""
    return 2 * max_replicas(concurrency) * blocks_held_per_replica(max_concurrent_batches)


def job_runtime_env() -> dict[str, Any]:
    """The enclosing Ray job's ``runtime_env`` ({} outside a Ray job): what it already gives every
    worker, which a ``ray.init`` runtime_env must not set again (Ray refuses)."""
    try:
        return dict(json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {})
    except (ValueError, AttributeError, TypeError):
        return {}


def job_env_vars() -> dict[str, str]:
    """Environment variables the enclosing Ray job's runtime_env sets ({} outside a Ray job)."""
    try:
        return dict(job_runtime_env().get("env_vars") or {})
    except (ValueError, TypeError):
        return {}
