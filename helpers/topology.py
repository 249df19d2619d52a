"""The GPUs of a cluster node by node, as ``PRESET="auto"`` plans on them.

Ray adds a cluster's GPUs up (``ray.cluster_resources()``), but an engine replica that spans GPUs
(tensor parallelism) lives inside one node, and a cluster may hold several GPU types. So "auto"
plans on one type (the one with the most GPUs, or ``ACCELERATOR_TYPE``) and counts replicas node by
node. Types are Ray's labels as Ray writes them (``accelerator_type:A100`` for both A100 sizes); a
type's memory is measured on one of its nodes where one is up, else taken from the kit's table, and
the plan says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The key of a cluster description (:func:`helpers.cluster.visible_cluster`) that lists its GPU nodes ...
NODES = "nodes"
#: ... and the one that lists every live node's CPUs.
NODE_CPUS = "node_cpus"


@dataclass(frozen=True)
class GpuNode:
    """One node's GPUs: Ray's label for their type, how many, and their memory where measured."""

    gpu_type: str | None
    gpus: int
    memory_gib: float | None = None


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs a plan is made for: one type, its GPUs on each node, and their memory."""

    gpu_type: str | None
    per_node: tuple[int, ...]
    memory_gib: float | None
    memory_basis: str  # "measured" or where the number comes from
    others: str = ""  # GPUs of other types left out, in words ("" when none)

    @property
    def gpus(self) -> int:
        return sum(self.per_node)

    @property
    def largest_node(self) -> int:
        """The most GPUs of this type on one node: the largest tensor-parallel group that fits."""
        return max(self.per_node, default=0)

    def replicas(self, gpus_per_replica: int) -> int:
        """Replicas of ``gpus_per_replica`` GPUs each that fit, none across nodes."""
        return sum(n // max(1, gpus_per_replica) for n in self.per_node)

    def describe(self) -> str:
        nodes = len(self.per_node)
        where = f" on {nodes} nodes ({' + '.join(map(str, self.per_node))})" if nodes > 1 else ""
        memory = "memory unknown" if self.memory_gib is None else f"{self.memory_gib:.0f} GiB each, {self.memory_basis}"
        return f"{self.gpus} x {self.gpu_type or 'GPU of no reported type'}{where} ({memory}){self.others}"


def nodes_of(cluster: Mapping[str, Any]) -> list[GpuNode]:
    """The GPU nodes of a cluster description: its :data:`NODES` where it lists them, else one node
    holding every GPU (a single machine), of the type it names (the first, by name, if several)."""
    listed = cluster.get(NODES)
    if listed is not None:
        nodes = [n if isinstance(n, GpuNode) else GpuNode(**n) for n in listed]
        return [n for n in nodes if n.gpus]
    gpus = int(cluster.get("GPU", 0))
    if not gpus:
        return []
    types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
    return [GpuNode(types[0] if types else None, gpus, cluster.get("gpu_memory_gib"))]


def ray_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:data:`NODES` from ``ray.nodes()``: each live node's GPUs and Ray's label for their type."""
    out = []
    for node in nodes:
        resources = node.get("Resources") or {}
        gpus = int(resources.get("GPU", 0))
        if node.get("Alive") and gpus:
            types = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
            out.append({"gpu_type": types[0] if types else None, "gpus": gpus})
    return out


def read_cluster() -> dict[str, Any]:
    """The running Ray cluster's resources (``ray.cluster_resources()``) with its GPU nodes under
    :data:`NODES`. Ray must be initialised."""
    import ray

    nodes = ray.nodes()
    return {**ray.cluster_resources(), NODES: ray_nodes(nodes),
            NODE_CPUS: [float((n.get("Resources") or {}).get("CPU", 0)) for n in nodes if n.get("Alive")]}


def cpu_problems(cluster: Mapping[str, Any], actors: Sequence[float], task_cpus: float) -> list[str]:
    """Whether the run's actors (``actors``: the CPUs each holds for the whole run) fit the cluster's
    nodes and still leave one node room for a light task of ``task_cpus``: a placement is looked for
    (largest first, each on the first node with room), as Ray places them one by one. [] where one is
    found, or where the description lists no nodes (then only the totals are checked)."""
    free = sorted(cluster.get(NODE_CPUS) or [], reverse=True)
    if not free:
        return []
    shown = " + ".join(f"{c:g}" for c in free)
    for need in sorted(actors, reverse=True):
        room = next((i for i, f in enumerate(free) if f + 1e-9 >= need), None)
        if room is None:
            return [f"an actor holding {need:g} CPUs fits on none of the nodes once the others are placed "
                    f"(nodes of {shown} CPUs)"]
        free[room] -= need
    if max(free) + 1e-9 < task_cpus:
        return [f"with the actors placed, no node keeps {task_cpus:g} CPU free for the pipeline's tasks "
                f"(nodes of {shown} CPUs; free after the actors: {' + '.join(f'{f:.2g}' for f in free)})"]
    return []


def gpu_problems(cluster: Mapping[str, Any], accelerator_type: str, gpus_per_replica: float, replicas: int) -> list[str]:
    """What ``cluster`` lacks for ``replicas`` engine replicas of ``gpus_per_replica`` GPUs of
    ``accelerator_type`` each, node by node: a replica's GPUs are on one node ([]: nothing)."""
    import math

    from helpers.gpus import ray_label

    label = ray_label(accelerator_type)
    if not any(k == f"accelerator_type:{label}" for k in cluster):
        types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
        return [f"ACCELERATOR_TYPE={accelerator_type!r} is not in the cluster (it has: {types or 'none'})"]
    choice = choose(cluster, label)
    if gpus_per_replica < 1:  # replicas sharing a GPU: each whole GPU holds 1 / share of them
        fit = sum(int(n / gpus_per_replica + 1e-9) for n in choice.per_node)
    else:
        fit = choice.replicas(math.ceil(gpus_per_replica - 1e-9))
    if fit >= replicas:
        return []
    needed = math.ceil(gpus_per_replica * replicas - 1e-9)
    return [f"{replicas} engine replicas x {gpus_per_replica:g} GPU need {needed} GPUs, but the cluster has "
            f"{choice.describe()}, which holds {fit} (a replica's GPUs are on one node)"]


def choose(cluster: Mapping[str, Any], accelerator_type: str | None = None) -> GpuChoice:
    """The GPU type to plan for: ``accelerator_type`` (Ray's label, see :func:`helpers.gpus.ray_label`)
    where given, else the type with the most GPUs (by name on a tie); its GPUs node by node and its
    memory: measured (the description's, or a node's), else the kit's table, else unknown."""
    from helpers.gpus import GPUS, ray_label

    nodes = nodes_of(cluster)
    totals: dict[str | None, int] = {}
    for node in nodes:
        totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.gpus
    if accelerator_type is not None:
        chosen: str | None = ray_label(accelerator_type)
    else:
        chosen = min(totals, key=lambda t: (-totals[t], t or "")) if totals else None
    mine = [n for n in nodes if n.gpu_type == chosen]
    measured = [n.memory_gib for n in mine if n.memory_gib]
    others = {t: c for t, c in totals.items() if t != chosen}
    left_out = "; left out: " + ", ".join(f"{c} x {t or 'untyped'}" for t, c in sorted(others.items(), key=str))
    left_out = left_out if others else ""
    if measured:
        memory, basis = min(measured), "measured"
    else:
        table = GPUS.get(accelerator_type or "") or GPUS.get(chosen or "")
        memory = table.memory_gib if table else None
        basis = f"not measured: the kit's table for {table.name}" if table else "unknown"
    return GpuChoice(chosen, tuple(n.gpus for n in mine), memory, basis, left_out)


def with_measured_memory(cluster: dict[str, Any]) -> dict[str, Any]:
    """``cluster`` (:func:`read_cluster`'s) with each GPU node's memory, measured once a type
    (:func:`measure_memory`)."""
    measured: dict[str | None, float | None] = {}
    for node in cluster[NODES]:
        if node["gpu_type"] not in measured:
            measured[node["gpu_type"]] = measure_memory(node["gpu_type"])
        node["memory_gib"] = measured[node["gpu_type"]]
    return cluster


def measure_memory(gpu_type: str | None, timeout_s: float = 30) -> float | None:
    """The memory of one GPU of ``gpu_type`` in GiB, measured by a small task on a node that has one
    (CUDA's own number, as a local GPU's is read); None where no GPU of that type is free within
    ``timeout_s`` (other work holds them) or the node has no CUDA (one that only advertises GPUs).
    Ray must be initialised."""
    import ray

    def total_memory() -> float | None:
        try:
            import torch

            if not torch.cuda.is_available():
                return None
            return torch.cuda.get_device_properties(0).total_memory / 1024**3
        except Exception:  # no torch, no driver: the kit's table stands
            return None

    resources = {f"accelerator_type:{gpu_type}": 0.001} if gpu_type else {}
    task = ray.remote(num_gpus=1, num_cpus=0, resources=resources, max_retries=0)(total_memory)
    ref = task.remote()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        return None
    try:
        return ray.get(ref)
    except Exception:
        return None
