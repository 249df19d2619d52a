"""Ray for a run: this machine's GPUs read from CUDA's driver (a stand-in for its library here, the
real one on the GPU machines), what the engines' environment holds, and how an autoscaler is told
from the records Ray keeps. Real clusters are in test_multinode.py, test_autoscaler.py, test_ray_job.py."""

import ctypes
import json

import pytest

from helpers import cluster
from helpers.presets import PRESETS

H100_BYTES = 85_031_714_816  # what CUDA reports for an H100 80GB HBM3


class Driver:
    """The five driver calls the kit makes, answering as a driver with ``count`` GPUs; ``fail``: one
    that returns an error code instead."""

    def __init__(self, count=2, name=b"NVIDIA H100 80GB HBM3", fail=None):
        self.count, self.name, self.fail = count, name, fail

    def _code(self, call):
        return 100 if call == self.fail else 0  # CUDA_ERROR_NO_DEVICE

    def cuInit(self, flags):
        return self._code("cuInit")

    def cuDeviceGetCount(self, count):
        count._obj.value = self.count
        return self._code("cuDeviceGetCount")

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return self._code("cuDeviceGet")

    def cuDeviceGetName(self, buffer, length, device):
        ctypes.memmove(buffer, self.name + b"\0", min(len(self.name) + 1, length.value))
        return self._code("cuDeviceGetName")

    def cuDeviceTotalMem_v2(self, total, device):
        total._obj.value = H100_BYTES
        return self._code("cuDeviceTotalMem_v2")


def test_the_gpus_are_read_from_the_driver_and_any_error_reads_as_none():
    count, name, memory = cluster.local_gpus(Driver())
    assert (count, name) == (2, "NVIDIA H100 80GB HBM3") and abs(memory - 79.19) < 0.01
    for call in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceTotalMem_v2"):
        assert cluster.local_gpus(Driver(fail=call)) == (0, None, None), call
    assert cluster.local_gpus(Driver(count=0)) == (0, None, None)
    assert cluster.local_gpus(object()) == (0, None, None)  # a library without the calls


def test_auto_sees_the_drivers_gpus_as_ray_labels_them(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "_driver", lambda: Driver(count=4))
    seen = cluster.visible()
    assert seen["GPU"] == 4.0 and seen["nodes"][0]["gpu_type"] == "H100" and abs(seen["nodes"][0]["memory_gib"] - 79.19) < 0.01
    assert cluster.choose(seen).describe() == "4 x H100 (79 GiB each, measured)"
    monkeypatch.setattr(cluster, "_driver", lambda: None)
    assert cluster.visible()["GPU"] == 0.0


@pytest.mark.parametrize("device, label", [
    ("NVIDIA L40S", "L40S"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
    ("NVIDIA L4", "L4"), ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"), ("NVIDIA A100-SXM4-80GB", "A100")])
def test_a_local_gpu_is_named_as_ray_names_it(device, label):
    """A substring match took an L40S for an L4 and a GH200 for an H200 (and their memory with it)."""
    assert cluster.gpu_label(device) == label


def test_the_engines_environment_holds_no_secret_and_leaves_the_jobs_variables_to_the_job(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "VLLM_LOGGING_LEVEL", "RAY_JOB_CONFIG_JSON_ENV_VAR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    cpu = PRESETS["text-cpu-offline"]
    env = cluster.engine_env(cpu, joined=False)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert "hf_secret" not in json.dumps(env) and "HF_HUB_OFFLINE" not in env
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert cluster.engine_env(cpu, joined=False)["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1"}}}))
    assert "HF_HUB_OFFLINE" not in cluster.engine_env(cpu, joined=True)  # Ray refuses to set it twice


def test_a_lone_local_cpu_engine_computes_on_every_core(monkeypatch):
    monkeypatch.setattr(cluster.os, "sched_getaffinity", lambda pid: {0, 1, 3}, raising=False)
    cpu = PRESETS["text-cpu-offline"]
    assert cluster.engine_env(cpu, joined=False)["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cluster.engine_env(cpu, joined=True)  # a cluster's cores, not ours
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cluster.engine_env(cpu.override(concurrency=2), joined=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cluster.engine_env(PRESETS["text-llama8b-l4"], joined=False)


def test_an_autoscaler_is_told_from_the_records_ray_keeps_in_the_gcs():
    now = 1_000.0

    def report(*types, at=now):
        return json.dumps({"time": at, "autoscaler_report": {"active_nodes": {t: 1 for t in types}}}).encode()

    assert cluster.autoscaler_kind(b"1", None, now) == "v2"
    assert cluster.autoscaler_kind(None, report("head", "gpu_worker"), now) == "v1"
    assert cluster.autoscaler_kind(None, report("node_" + "a" * 56), now) is None  # nothing can add a node
    assert cluster.autoscaler_kind(None, report("head", at=now - 600), now) == "unknown"  # a monitor that is gone
    assert cluster.autoscaler_kind(None, None, now) == "unknown"  # a platform's own autoscaler, perhaps


def test_a_runs_needs_ask_the_autoscaler_for_whole_shapes():
    cpu = cluster.Needs(replicas=1, stage_actors=1, stage_cpus=0.1)
    assert cpu.bundles() == [{"CPU": 1.0}, {"CPU": 0.1}, {"CPU": 1.0}] and cpu.reserved == pytest.approx(1.1)
