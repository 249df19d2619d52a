"""Asking a Ray cluster's autoscaler for the nodes a run needs and waiting for them, or saying at once that they cannot come."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from helpers.engine import CpuBudget
from helpers.progress import interactive, log_stream

#: The node types Ray's monitor gives the nodes of a cluster it cannot grow (no ``--autoscaling-config``:
#: its "readonly" provider mirrors the nodes there are, ``node_<node id>``, none of which it can add).
READONLY_NODE_TYPE = re.compile(r"node_[0-9a-f]{56}")
#: A status the monitor wrote longer ago than this is a monitor that is gone (it writes every 5 s).
STATUS_FRESH_S = 60


def bundles(budget: CpuBudget, accelerator_type: str | None, gpus_per_replica: float = 1) -> list[dict[str, float]]:
    """The resource shapes the run takes, as ``request_resources`` gets them: one per engine replica (its
    GPUs of ``accelerator_type`` and its CPU; on CPUs, its CPU), one per light stage actor, one for the
    short tasks. Ray's autoscaler adds the nodes these shapes need beyond what the cluster has."""
    engine: list[dict[str, float]] = [{"CPU": budget.engine_cpus}]
    if accelerator_type:  # as Ray Data LLM places a replica: its actor, then one bundle per GPU worker
        workers = 1 if gpus_per_replica <= 1 else round(gpus_per_replica)  # tp x pp workers of one GPU each
        gpu = {"GPU": min(gpus_per_replica or 1.0, 1.0), f"accelerator_type:{accelerator_type}": 0.001}
        engine = [{**engine[0], **gpu}] + [dict(gpu) for _ in range(workers - 1)]
    light = [{"CPU": budget.stage_cpus}] * budget.stage_actors if budget.stage_cpus else []
    return ([dict(b) for _ in range(budget.engine_replicas) for b in engine] + [dict(b) for b in light]
            + [{"CPU": budget.task_cpus}])


def describe_bundles(shapes: list[dict[str, float]]) -> str:
    """``shapes`` in a few words: "1 x {CPU: 1}, 2 x {CPU: 0.1}"."""
    counts = Counter(tuple(sorted(s.items())) for s in shapes)
    return ", ".join(f"{n} x {{{', '.join(f'{k}: {v:g}' for k, v in shape)}}}" for shape, n in counts.items())


def describe_resources(cluster: dict[str, Any]) -> str:
    """The cluster's CPUs, GPUs and GPU types, as the waiting lines show them."""
    types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
    return (f"{cluster.get('CPU', 0):g} CPUs and {cluster.get('GPU', 0):g} GPUs"
            + (f" ({', '.join(types)})" if types else "") + f" on {_alive_nodes()} nodes")


def autoscaler_from(v2_enabled: bytes | None, status: bytes | None, now: float) -> str | None:
    """What the GCS's records say of the cluster's autoscaler: ``"v2"`` (it marks itself enabled there),
    ``"v1"`` (the report Ray's monitor writes every few seconds, ``ray status``'s source, names the node
    types of a cluster configuration), ``None``: none (a fresh report of only the ``node_<id>`` types of a
    cluster started without ``--autoscaling-config``: nothing can add a node), or ``"unknown"`` (no report,
    a stale one, or a monitor's first round still to come: a platform's own autoscaler may be at work)."""
    if v2_enabled == b"1":
        return "v2"
    try:
        report = json.loads(status or b"")
    except ValueError:
        return "unknown"
    summary = report.get("autoscaler_report") if now - float(report.get("time", 0)) <= STATUS_FRESH_S else None
    if not summary:
        return "unknown"
    types = {*(summary.get("active_nodes") or {}), *(summary.get("idle_nodes") or {}),
             *(summary.get("pending_launches") or {}), *(node[1] for node in summary.get("pending_nodes") or [])}
    if not types:  # no node on time yet
        return "unknown"
    return "v1" if any(not READONLY_NODE_TYPE.fullmatch(t) for t in types) else None


def detect(wait_s: float = 12, poll_s: float = 2) -> str | None:
    """:func:`autoscaler_from` on this cluster's GCS, waiting up to ``wait_s`` for a monitor's first report."""
    import ray._raylet as raylet
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    deadline = time.monotonic() + wait_s
    while True:
        kind = autoscaler_from(
            _internal_kv_get(raylet.GCS_AUTOSCALER_V2_ENABLED_KEY, namespace=raylet.GCS_AUTOSCALER_STATE_NAMESPACE),
            _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS), time.time())
        if kind != "unknown" or time.monotonic() >= deadline:
            return kind
        time.sleep(poll_s)


def _cluster_status() -> Any:
    """Autoscaler v2's reply to the GCS's GetClusterStatus (the raw message: it holds what the
    ``ClusterStatus`` of ``ray.autoscaler.v2.sdk`` leaves out, the infeasible requests)."""
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    reply = GetClusterStatusReply()
    reply.ParseFromString(internal_kv_get_gcs_client().get_cluster_status(timeout_s=10))
    return reply


def unplaceable(status: Any = None) -> str:
    """What Ray waits to place that no node has room for now, with what each node has free, in words;
    "" when every pending request fits some node (or Ray does not say). ``status``: the GCS's
    :func:`_cluster_status` reply (read when not given). Ray Data submits a task only when the
    cluster as a whole has room, so a request that fits none of the nodes waits for good unless the
    cluster grows: two nodes with 0.9 CPUs free each never take a task that asks for 1."""
    try:
        state = (status or _cluster_status()).cluster_resource_state
    except Exception:  # the GCS slow to answer: asked again at the next poll
        return ""
    from ray.core.generated.autoscaler_pb2 import NodeStatus

    nodes = [(f"node {n.node_id.hex()[:8]}", dict(n.available_resources)) for n in state.node_states
             if n.status != NodeStatus.DEAD]
    waiting = []
    for pending in state.pending_resource_requests:
        shape = dict(pending.request.resources_bundle)
        if shape and not any(all(free.get(k, 0.0) + 1e-9 >= v for k, v in shape.items()) for _, free in nodes):
            waiting.append(f"{pending.count} x {{{', '.join(f'{k}: {v:g}' for k, v in sorted(shape.items()))}}}")
    if not waiting:
        return ""
    free = "; ".join(f"{ip}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(r.items()) if k in ("CPU", "GPU") or
                                            k.startswith("accelerator_type")) for ip, r in nodes)
    return f"Ray is waiting to place {', '.join(waiting)}, which no node has room for (free now: {free or 'no nodes'})"


def _request(kind: str, shapes: list[dict[str, float]]) -> int:
    """Ask the autoscaler for ``shapes`` (an empty list withdraws the request); for v2, the GCS's state
    version just after it, which the autoscaler has seen once it has weighed the request."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=shapes)
    return _cluster_status().cluster_resource_state.cluster_resource_state_version if kind == "v2" else 0


def _infeasible(kind: str, version: int) -> bool:
    """Whether the autoscaler has reported the request infeasible: no node type it may add can hold it.
    Only v2 reports it where a driver can read it; v1 writes it to its own log alone."""
    if kind != "v2":
        return False
    try:
        state = _cluster_status().autoscaling_state
    except Exception:  # the GCS slow to answer: asked again at the next poll
        return False
    return state.last_seen_cluster_resource_state_version >= version and bool(state.infeasible_cluster_resource_constraints)


def _resources() -> dict[str, Any]:
    from helpers.topology import read_cluster

    return read_cluster()


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def say(line: str) -> None:
    """Print ``line`` below the cell; in a headless run (papermill, a job) also to the job's log
    (:func:`helpers.progress.log_stream`), where a person watching a job that seems idle looks."""
    print(line, flush=True)
    if not interactive():
        print(f"[llm-batch-kit] {line}", file=log_stream(), flush=True)


def wait_for_gpus(cluster: dict[str, Any], wanted: tuple[str, int] | None, *, timeout_s: float,
                  poll_s: float = 5) -> dict[str, Any]:
    """A cluster that scales from zero shows no GPUs until work asks for them. With ``wanted`` (the
    type and count you named: ``ACCELERATOR_TYPE``, ``CONCURRENCY``), its autoscaler is asked for them,
    one GPU a bundle, and they are waited for as a named preset's are (:func:`wait_for`); without,
    GPU nodes that join within ``timeout_s`` are. Returns the cluster as it is then."""
    from helpers.topology import gpu_problems

    if wanted:
        gpu_type, count = wanted
        one = {"GPU": 1.0, f"accelerator_type:{gpu_type}": 0.001}
        return wait_for(cluster, [dict(one) for _ in range(count)], lambda c: gpu_problems(c, gpu_type, 1, count),
                        timeout_s=timeout_s, poll_s=poll_s)[0]
    deadline = time.monotonic() + timeout_s
    while not cluster.get("GPU") and time.monotonic() < deadline:
        time.sleep(poll_s)
        cluster = _resources()
    return cluster


def wait_for(cluster: dict[str, Any], shapes: list[dict[str, float]], problems: Callable[[dict[str, Any]], list[str]],
              *, timeout_s: float, poll_s: float = 5, say: Callable[[str], None] = say) -> tuple[dict[str, Any], str]:
    """On a cluster that lacks what the run needs (``problems(cluster)`` names it), ask its autoscaler for
    ``shapes`` and wait up to ``timeout_s`` for the nodes, saying what it waits for and then what came.

    Returns the cluster's resources and, where they still fall short, why: no autoscaler (Ray's monitor
    reports a cluster it cannot grow: refused at once), the autoscaler reports the request infeasible
    (v2), or the time ran out. A cluster whose autoscaler Ray does not report on (a platform's own) is
    asked and waited for all the same: only what Ray says cannot come is refused at once.
    The request is withdrawn before returning, whatever the outcome: Ray keeps it in the GCS until
    it is replaced, past this driver's end, and it would hold the nodes up for good; once they are up,
    the run's actors keep them busy, and Ray scales down only idle nodes.
    """
    kind = detect()
    if kind is None:
        return cluster, "The cluster has no autoscaler that could add nodes."
    started = time.monotonic()
    version = _request(kind, shapes)
    try:
        say(f"Waiting up to {timeout_s:g} s (STARTUP_TIMEOUT_S) for the cluster's autoscaler to add nodes: "
            f"{'; '.join(problems(cluster))}. Requested: {describe_bundles(shapes)}.")
        while True:
            cluster = _resources()
            waited = time.monotonic() - started
            if not problems(cluster):
                say(f"The autoscaler added them in {waited:.0f} s: the cluster has {describe_resources(cluster)} now.")
                return cluster, ""
            if _infeasible(kind, version):
                return cluster, "The cluster's autoscaler reports that none of its node types can provide them."
            if waited >= timeout_s:
                return cluster, (f"The cluster's autoscaler did not add them within STARTUP_TIMEOUT_S={timeout_s:g} s: "
                                 "see `ray status` for its node types, limits and failed launches.")
            time.sleep(poll_s)
    finally:
        try:
            _request(kind, [])
        except Exception:  # a cluster gone: nothing to withdraw from
            pass
