"""This machine's CUDA GPUs as CUDA counts them (those ``CUDA_VISIBLE_DEVICES`` leaves), read from the
NVIDIA driver's own library through ``ctypes``: the count, the first GPU's name and its memory.

Why not torch: importing it in the notebook's plan cell took 3-10 s on GPU machines, and reading a
GPU's properties through it starts CUDA in the kernel. The driver calls below are the ones torch's
numbers come from (``torch.cuda.device_count()``, ``get_device_properties(0).name`` and
``.total_memory``), and they create no CUDA context: the kernel holds no GPU memory. Why not a
library: NVML (``nvidia-ml-py``, which vLLM installs on CUDA machines) ignores ``CUDA_VISIBLE_DEVICES``
and counts memory the driver reserves; NVIDIA's ``cuda-python`` would be a new dependency for four
calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

#: Where the driver's library is, by the names Linux's loader knows it (torch loads the same file).
DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so")


@dataclass(frozen=True)
class LocalGpus:
    """What CUDA sees here: ``count`` GPUs, the first one's ``name`` (e.g. "NVIDIA H100 80GB HBM3")
    and memory in GiB; ``count`` 0 (and None) without a driver or a GPU."""

    count: int
    name: str | None = None
    memory_gib: float | None = None


def _driver() -> Any | None:
    for name in DRIVER_LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def read(driver: Any | None = None) -> LocalGpus:
    """The GPUs CUDA sees in this process. ``driver``: the library (found on the loader's path when
    None). Any driver error (no GPU, a driver older than the library, no device visible) reads as
    no GPU, as ``torch.cuda.is_available()`` reads it."""
    driver = _driver() if driver is None else driver
    if driver is None:
        return LocalGpus(0)
    count, device, memory = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_size_t(0)
    name = ctypes.create_string_buffer(256)
    try:
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return LocalGpus(0)
        if (driver.cuDeviceGet(ctypes.byref(device), 0) != 0
                or driver.cuDeviceGetName(name, ctypes.c_int(len(name)), device) != 0
                or driver.cuDeviceTotalMem_v2(ctypes.byref(memory), device) != 0):
            return LocalGpus(0)
    except AttributeError:  # a library without these symbols: not a CUDA driver
        return LocalGpus(0)
    return LocalGpus(count.value, name.value.decode(errors="replace"), memory.value / 1024**3)
