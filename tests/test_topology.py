"""Plans that fit the clusters users have: GPU types, nodes of few GPUs, Ray's labels, tensor parallelism.

Each cluster is described as the kit reads one (:func:`helpers.topology.read_cluster`: Ray's summed
resources plus its GPU nodes); the last test reads a real Ray cluster of several nodes with
advertised GPUs (``ray start --num-gpus``), as a remote cluster is read.
"""

import re

import pytest

from helpers import autoscale, checks, engine, fitting, gpus, shapes, topology
from helpers.presets import PRESETS

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA_8B = "unsloth/Llama-3.1-8B-Instruct"


def cluster(*nodes, **extra):
    """A cluster description: ``(type, gpus[, measured GiB])`` per node."""
    described = {"GPU": float(sum(n[1] for n in nodes)), **extra,
                 topology.NODES: [{"gpu_type": n[0], "gpus": n[1], "memory_gib": n[2] if len(n) > 2 else None}
                                  for n in nodes]}
    for node in nodes:
        described[f"accelerator_type:{node[0]}"] = 1.0
    return described


def runs_on(preset, described) -> bool:
    """Whether ``preset``'s replicas all fit ``described`` node by node and its weights fit its GPUs."""
    replicas = engine.max_replicas(preset.concurrency)
    placed = not topology.gpu_problems(described, preset.accelerator_type, preset.gpus_per_replica, replicas)
    shape = shapes.model_shape(preset.model_source)
    return placed and not [f for f in checks.memory(preset, shape) if f.level == "error"]


def refused_then_followed(described, **overrides):
    """Auto's refusal on ``described``, and each named setting it offers, checked to run there."""
    with pytest.raises(fitting.AutoPresetError) as err:
        fitting.select("auto", "text", cluster=described, **overrides)
    message = str(err.value)
    offered = re.findall(r"PRESET='([^']+)', ACCELERATOR_TYPE='([^']+)', CONCURRENCY=(\d+)", message)
    for name, gpu_type, replicas in offered:
        preset = fitting.select(name, "text", accelerator_type=gpu_type, concurrency=int(replicas))
        assert runs_on(preset, described), (name, message)
    return message, offered


def test_70b_on_three_h100s_is_not_planned_over_four_and_the_refusal_names_what_runs():
    described = cluster(("H100", 3))
    message, offered = refused_then_followed(described, model_source=LLAMA_70B)
    assert "inside one node (3 GPUs at most" in message
    assert offered == [("text-llama70b-a100-fp8", "H100", "1")]  # fp8, 2 GPUs a replica: runs here


def test_70b_on_four_h100s_is_tp4_and_replicas_per_gpu_with_it_is_refused_with_the_reason():
    planned = fitting.select("auto", "text", cluster=cluster(("H100", 4)), model_source=LLAMA_70B)
    assert (planned.tensor_parallel_size, planned.concurrency, planned.gpus_per_replica) == (4, 1, 4)
    with pytest.raises(fitting.AutoPresetError, match="REPLICAS_PER_GPU=2: .* Set REPLICAS_PER_GPU=None"):
        fitting.select("auto", "text", cluster=cluster(("H100", 4)), model_source=LLAMA_70B, replicas_per_gpu=2)
    # A named preset too: a replica over 4 GPUs got {"GPU": 0.5} bundles before.
    with pytest.raises(ValueError, match="REPLICAS_PER_GPU=2 with preset 'text-llama70b-h100-tp4'.*span 4 GPUs"):
        fitting.select("text-llama70b-h100-tp4", "text", replicas_per_gpu=2)


def test_a_tensor_parallel_group_stays_inside_one_node():
    # 2 nodes of 2 H100s: 4 GPUs in all, but no node holds a tp=4 group.
    described = cluster(("H100", 2), ("H100", 2))
    message, offered = refused_then_followed(described, model_source=LLAMA_70B)
    assert "on 2 nodes (2 + 2)" in message and offered == [("text-llama70b-a100-fp8", "H100", "2")]
    # The 8B fits one GPU: a replica per GPU (2 on each) on every node.
    small = fitting.select("auto", "text", cluster=described, model_source=LLAMA_8B, replicas_per_gpu=1)
    assert (small.tensor_parallel_size, small.concurrency) == (1, 4)


def test_the_tensor_parallel_size_divides_the_attention_heads():
    shape = shapes.ModelShape(30e9, 40, 8, 128, attention_heads=14)  # needs 4 GPUs of 24 GiB; 4 and 8 do not divide 14
    budget = gpus.memory_budget(24, 0.9)
    assert shape.tensor_parallel_size(budget, largest_node=8) is None
    assert shapes.ModelShape(30e9, 40, 8, 128, attention_heads=64).tensor_parallel_size(budget, 8) == 4


def test_a_mixed_cluster_is_planned_for_its_most_numerous_type_or_the_one_you_name():
    described = cluster(("A10G", 1), ("L4", 4))
    planned = fitting.select("auto", "text", cluster=described, model_source=LLAMA_8B)
    assert (planned.accelerator_type, planned.concurrency, planned.gpus) == ("L4", 4, 4)
    assert "left out: 1 x A10G" in dict(planned.reasons)["accelerator_type"]
    named = fitting.select("auto", "text", cluster=described, model_source=LLAMA_8B, accelerator_type="A10G")
    assert (named.accelerator_type, named.concurrency) == ("A10G", 1)
    with pytest.raises(fitting.AutoPresetError, match="ACCELERATOR_TYPE='H100': the cluster has no such GPUs"):
        fitting.select("auto", "text", cluster=described, accelerator_type="H100")


def test_a100_nodes_as_ray_labels_them_measured_or_assumed():
    # Ray labels an A100-80GB node "A100": measured, 70B fits 4 of them; assumed (40 GiB), it does not.
    measured = fitting.select("auto", "text", cluster=cluster(("A100", 4, 79.3)), model_source=LLAMA_70B)
    assert (measured.accelerator_type, measured.tensor_parallel_size, measured.gpu_memory_gib) == ("A100", 4, 79.3)
    assert "79 GiB each, measured" in dict(measured.reasons)["accelerator_type"]
    with pytest.raises(fitting.AutoPresetError, match="not measured: the kit's table for A100"):
        fitting.select("auto", "text", cluster=cluster(("A100", 4)), model_source=LLAMA_70B)
    # The named A100 presets schedule on the nodes Ray labelled, and the autoscaler is asked for those.
    assert gpus.ray_label(PRESETS["text-llama70b-a100-fp8"].accelerator_type) == "A100"
    assert runs_on(PRESETS["text-llama70b-a100-fp8"], cluster(("A100", 4, 79.3)))
    assert not topology.gpu_problems(cluster(("A100", 4)), "A100-80G", 2, 2)
    # ... and a measured 40 GiB A100 is too small for the preset that needs 80.
    small = fitting.select("text-llama8b-a100", "text", concurrency=1, gpu_memory_gib=39.4)
    assert checks.memory(small.override(max_model_len=8192, max_num_seqs=256), shapes.model_shape(LLAMA_8B))


def test_tensor_parallel_replicas_ask_the_autoscaler_for_one_gpu_bundle_per_worker():
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=2, stage_cpus=1, stage_actors=2)
    shapes_asked = autoscale.bundles(budget, "H100", gpus_per_replica=4)
    gpu_bundles = [b for b in shapes_asked if "GPU" in b]
    assert len(gpu_bundles) == 8 and all(b["GPU"] == 1 for b in gpu_bundles)  # never one {"GPU": 4}
    assert sum(b.get("CPU", 0) for b in gpu_bundles) == 2  # each replica's actor holds its CPU
    shared = autoscale.bundles(budget, "H100", gpus_per_replica=0.5)
    assert [b["GPU"] for b in shared if "GPU" in b] == [0.5, 0.5]


def test_one_memory_budget_measured_memory_first():
    shape = shapes.model_shape(LLAMA_8B)
    preset = fitting.select("text-llama8b-h100", "text", gpu_memory_gib=94.0, replicas_per_gpu=2)
    assert preset.gpu_memory == 94.0
    assert preset.kv_cache_budget == pytest.approx(gpus.kv_cache_estimate(shape, 94.0, preset.memory_share), abs=2**20)
    assert gpus.kv_cache_estimate(shape, 94.0, 0.44) == gpus.memory_budget(94.0, 0.44) - shape.weight_bytes()
    # The check reads the same memory: 79 GiB measured on an "80 GiB" type is what it uses.
    too_long = fitting.select("text-llama8b-h100", "text", gpu_memory_gib=30.0, max_model_len=8192)
    [finding] = checks.memory(too_long, shape)
    assert "H100 (30 GiB, measured)" in finding.message


READ = """
import json
from helpers import cluster, fitting, topology
seen = cluster.visible_cluster()  # RAY_ADDRESS is set: a remote cluster, read node by node
planned = fitting.select("auto", "text", cluster=seen, model_source="unsloth/Llama-3.1-8B-Instruct", replicas_per_gpu=1)
print(json.dumps({"nodes": sorted(seen[topology.NODES], key=str), "remote": seen["remote"],
                  "type": planned.accelerator_type, "replicas": planned.concurrency,
                  "why": dict(planned.reasons)["accelerator_type"],
                  "tp2_on_l4": topology.gpu_problems(seen, "L4", 2, 1),
                  "a100_80g": topology.gpu_problems(seen, "A100-80G", 1, 2)}))
"""


@pytest.mark.slow
def test_a_real_cluster_is_read_node_by_node_with_rays_labels(tmp_path):
    """A head without GPUs and two GPU nodes (Ray's own ``--num-gpus`` and ``accelerator_type``
    resources, as Ray's GPU nodes advertise them): the kit sees each node's GPUs and type, plans for
    the type with the most GPUs, says its memory was not measured (these nodes have no CUDA, so the
    small task that measures a remote GPU finds none), never places a 2-GPU replica on a 1-GPU node,
    and schedules an A100-80G preset on the nodes Ray labelled A100."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    from test_ray_job import free_port, ray_start, stop_processes

    temp_dir = os.path.join(tempfile.mkdtemp(prefix="kitgpu-"), "ray")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    try:
        ray_start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(free_port()), "--num-cpus", "1",
                   "--num-gpus", "0", "--temp-dir", temp_dir, "--disable-usage-stats", "--include-dashboard", "false"],
                  env, temp_dir)
        gcs = open(os.path.join(temp_dir, "ray_current_cluster")).read().strip()
        for count, label in ((2, "A100"), (1, "L4")):
            ray_start(["--address", gcs, "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", str(count),
                       "--resources", json.dumps({f"accelerator_type:{label}": 1}), "--disable-usage-stats",
                       "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                       "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                       "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())],
                      env, temp_dir)
        done = subprocess.run([sys.executable, "-c", READ], env={**env, "RAY_ADDRESS": gcs}, capture_output=True,
                              text=True, timeout=300, cwd=os.getcwd())
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop_processes(temp_dir)
    assert seen["nodes"] == [{"gpu_type": "A100", "gpus": 2, "memory_gib": None},
                             {"gpu_type": "L4", "gpus": 1, "memory_gib": None}] and seen["remote"]
    assert (seen["type"], seen["replicas"]) == ("A100", 2)
    assert seen["why"].startswith("planned for 2 x A100 (40 GiB each, not measured: the kit's table for A100); "
                                  "left out: 1 x L4")
    assert "holds 0 (a replica's GPUs are on one node)" in seen["tp2_on_l4"][0]
    assert seen["a100_80g"] == []


def test_every_actor_is_placed_node_by_node_and_a_light_task_keeps_room():
    """The CPUs were checked in sum: an actor bigger than any node, or nodes each too full for a task,
    passed and then waited for good. Checked node by node before the pipeline starts."""
    from helpers import cluster as kit_cluster

    two = {"CPU": 4.0, topology.NODE_CPUS: [2.0, 2.0]}
    assert topology.cpu_problems(two, [1, 1, 0.1, 0.1], 0.1) == []  # the two nodes of 2 CPUs
    [problem] = topology.cpu_problems({"CPU": 4.0, topology.NODE_CPUS: [1.0] * 4}, [1.5], 0.1)
    assert "an actor holding 1.5 CPUs fits on none of the nodes" in problem and "nodes of 1 + 1 + 1 + 1 CPUs" in problem
    [problem] = topology.cpu_problems({"CPU": 3.0, topology.NODE_CPUS: [1.0, 1.0, 1.0]}, [1, 1, 1], 0.5)
    assert "no node keeps 0.5 CPU free for the pipeline's tasks" in problem
    assert topology.cpu_problems({"CPU": 4.0}, [3.0], 1.0) == []  # totals only: the sum's check stands
    budget = engine.CpuBudget(engine_cpus=1.5, engine_replicas=1, stage_cpus=0.1, stage_actors=1)
    problems = kit_cluster.schedulability_problems({"CPU": 4.0, topology.NODE_CPUS: [1.0] * 4}, budget, None)
    assert problems and "fits on none of the nodes" in problems[0]
