"""This machine's GPUs read from CUDA's driver (helpers.local_gpus), without torch: a stand-in for the
driver's library here (no GPU in CI); the real library is read on the GPU machines (benchmarks/on_gpu.sh
`gpu-detect`, beside torch's numbers)."""

import ctypes

from helpers import cluster, local_gpus

H100_BYTES = 85_031_714_816  # what CUDA reports for an H100 80GB HBM3


class Driver:
    """The five driver calls the kit makes, answering as a driver with ``count`` GPUs does; ``fail``:
    a call that returns an error code instead."""

    def __init__(self, count=2, name=b"NVIDIA H100 80GB HBM3", total=H100_BYTES, fail=None):
        self.count, self.name, self.total, self.fail = count, name, total, fail

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
        total._obj.value = self.total
        return self._code("cuDeviceTotalMem_v2")


def test_the_gpus_are_read_from_the_driver():
    seen = local_gpus.read(Driver())
    assert seen.count == 2 and seen.name == "NVIDIA H100 80GB HBM3" and abs(seen.memory_gib - 79.19) < 0.01


def test_any_driver_error_reads_as_no_gpu():
    for call in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceTotalMem_v2"):
        assert local_gpus.read(Driver(fail=call)) == local_gpus.LocalGpus(0), call
    assert local_gpus.read(Driver(count=0)) == local_gpus.LocalGpus(0)
    assert local_gpus.read(object()) == local_gpus.LocalGpus(0)  # a library without the calls


def test_auto_sees_the_drivers_gpus_on_a_machine_without_ray(monkeypatch):
    """What PRESET="auto" fits to on this machine: the driver's count, type (Ray's label) and memory."""
    monkeypatch.setattr(local_gpus, "_driver", lambda: Driver(count=4))
    monkeypatch.setattr(cluster, "cluster_address", lambda: None)
    seen = cluster.visible_cluster()
    assert seen["GPU"] == 4.0 and seen["accelerator_type:H100"] == 1.0 and abs(seen["gpu_memory_gib"] - 79.19) < 0.01
    assert seen["nodes"] == [{"gpu_type": "H100", "gpus": 4, "memory_gib": seen["gpu_memory_gib"]}]
    monkeypatch.setattr(local_gpus, "_driver", lambda: None)  # no driver: the CPU alone
    assert "GPU" not in cluster.visible_cluster()
