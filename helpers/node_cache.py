"""What a run's tasks read from the kit's cache, prepared on every node that runs them.

That is the offline models and the bundled sample images. The driver prepares them in its cache
(``~/.cache/llm-batch-kit``, ``LLM_KIT_CACHE``) and hands the engine and the read tasks their
absolute paths. Those tasks may run on any node of a cluster, nodes an autoscaler adds later included,
and another machine's cache is not the driver's. So each ``prepare_*`` function records what it
prepared (:func:`record`), and :func:`runtime_env` makes every Ray worker of the run prepare the
same at the same absolute path on its own node when it starts (Ray's ``worker_process_setup_hook``):
once per node, under a file lock, and a stat when it is there already. Before anything reads,
:func:`check_every_node_has` does it on each node the cluster has, and stops the run with
:class:`NodeCacheError`, naming the node and the path, where a node cannot.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers.engine import job_runtime_env
from helpers.errors import Explained

#: The environment variable (in the run's ``runtime_env``) that tells each worker what to prepare.
ENV = "LLM_KIT_NODE_CACHE"
#: Ray's ``worker_process_setup_hook``: a function every worker of the run calls when it starts.
HOOK = f"{__name__}.prepare_this_node"

_recorded: list[dict[str, Any]] = []


def record(builder: Callable[..., Any], cache: Path, what: str, **kwargs: Any) -> None:
    """Note that this process prepared ``builder(cache=cache, **kwargs)`` (``what``, in words): a Ray
    started after this prepares it on every node (:func:`runtime_env`). ``kwargs`` must be JSON."""
    spec = {"builder": f"{builder.__module__}.{builder.__qualname__}", "cache": str(Path(cache).expanduser().resolve()),
            "what": what, "kwargs": kwargs}
    if spec not in _recorded:
        _recorded.append(spec)


def recorded() -> list[dict[str, Any]]:
    """What this process prepared, in the order it did (:func:`record`)."""
    return [dict(spec) for spec in _recorded]


class NodeCacheError(Explained, RuntimeError):
    """A node of the cluster cannot prepare what the run's tasks read there (a model, the sample images)."""


def _node() -> str:
    """This node, in words: its address and the start of its Ray id."""
    try:
        import ray

        if ray.is_initialized():
            return f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"
    except Exception:  # outside Ray, or Ray half-started: the host name still says which machine
        pass
    import socket

    return socket.gethostname()


def _explain(spec: Mapping[str, Any], node: str, exc: BaseException) -> str:
    """Why ``node`` cannot prepare ``spec``, and what to do: the error's own ``remedy`` where it has one
    (a package not installed there: :class:`helpers.models.NotInstalledError`), else the folder's."""
    remedy = getattr(exc, "remedy", None) or (
        "Make that folder writable on every node, or set LLM_KIT_CACHE (before starting the notebook) to a folder "
        "every node can write, at the same path on each")
    return (f"the node {node} cannot prepare {spec['what']} in {spec['cache']}: {type(exc).__name__}: {exc}. The "
            "engine and the read tasks load it from that path on whichever node runs them, so every node that runs "
            f"them prepares it there when it starts. {remedy}")


def prepare(specs: Sequence[Mapping[str, Any]]) -> None:
    """Prepare each of ``specs`` (:func:`record`'s) on this node at its recorded path; raise
    :class:`NodeCacheError` naming this node and the path where it cannot."""
    for spec in specs:
        module, _, name = spec["builder"].rpartition(".")
        try:
            getattr(importlib.import_module(module), name)(cache=Path(spec["cache"]), **spec.get("kwargs", {}))
        except Exception as exc:
            raise NodeCacheError(_explain(spec, _node(), exc)) from exc


def prepare_this_node() -> None:
    """Ray's ``worker_process_setup_hook`` for a run (:data:`HOOK`): prepare what the driver prepared
    (:data:`ENV`) on the node this worker runs on, before the worker takes any task."""
    raw = os.environ.get(ENV)
    if raw:
        prepare(json.loads(raw))


def runtime_env(base: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (a ``runtime_env`` for ``ray.init``) with what makes every worker of the run prepare
    :func:`recorded` on its node first; ``base`` itself when nothing was recorded. ``job``: the
    enclosing Ray job's ``runtime_env`` (default: read from the job), where a setup hook of its own
    wins (Ray refuses two): then only :func:`check_every_node_has` prepares the nodes."""
    specs = recorded()
    job = job_runtime_env() if job is None else job
    if not specs or "worker_process_setup_hook" in job or ENV in (job.get("env_vars") or {}):
        return dict(base)
    return {**base, "env_vars": {**(base.get("env_vars") or {}), ENV: json.dumps(specs)},
            "worker_process_setup_hook": HOOK}


def _prepare_here(specs: Sequence[Mapping[str, Any]]) -> str:
    """On one node: prepare ``specs``; "" when done, else why not (:func:`_explain`)."""
    try:
        prepare(specs)
    except NodeCacheError as exc:
        return str(exc)
    return ""


def on_each_node(fn: Callable[..., Any], args: Sequence[Any], nodes: Sequence[Mapping[str, Any]], timeout_s: float,
                 runtime_env: Mapping[str, Any] | None = None) -> list[Any]:
    """Run ``fn(*args)`` once on each of ``nodes`` (entries of ``ray.nodes()``), all at once, each a
    zero-CPU task pinned to its node and never retried; return what each returned, in ``nodes``'
    order, or the Ray error it failed with (a ``GetTimeoutError`` once ``timeout_s`` have passed).
    The one way the kit asks every node something (:func:`check_every_node_has`,
    :func:`helpers.output_dir.check_every_node_sees`)."""
    import time

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    options = {"runtime_env": dict(runtime_env)} if runtime_env else {}
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False), **options)
            .remote(*args) for n in nodes]
    deadline = time.monotonic() + timeout_s
    answers: list[Any] = []
    for ref in refs:
        try:
            answers.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            answers.append(exc)
    return answers


def check_every_node_has(timeout_s: float = 900) -> int:
    """Prepare :func:`recorded` on every alive node of the cluster but the driver's own (where it was
    prepared), one zero-CPU task each (:func:`on_each_node`), and wait for them: the run then starts
    with every node ready. Raise :class:`NodeCacheError` naming each node that cannot, and its path;
    return how many nodes were prepared. Nodes that join later prepare when their first worker starts
    (:func:`runtime_env`). ``timeout_s``: a model is converted in about 30 s on a small machine.

    The check's own workers skip the setup hook (it would end them before they could answer: Ray
    ends a worker whose hook fails, and its task fails with no reason); they prepare in the task."""
    import ray

    specs = recorded()
    if not specs or not ray.is_initialized():
        return 0
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR as SETUP_HOOK

    here = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    answers = on_each_node(_prepare_here, [specs], nodes, timeout_s, runtime_env={"env_vars": {SETUP_HOOK: ""}})
    problems = []
    for node, answer in zip(nodes, answers):
        if isinstance(answer, BaseException):
            name = f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})"
            problems += [_explain(spec, name, answer) for spec in specs]
        elif answer:
            problems.append(answer)
    if problems:
        raise NodeCacheError(f"This run cannot start: {len(problems)} of what the run's tasks read cannot be prepared "
                             "on the Ray cluster's nodes.\n- " + "\n- ".join(problems))
    return len(nodes)
