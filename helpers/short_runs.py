"""What a run of few known rows changes: several replicas share its batches, a GPU engine skips
compilation, and a CPU engine runs the model in its own process."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from helpers import engine
from helpers.presets import Preset


#: A GPU run that will read at most this many rows runs eagerly (no CUDA-graph capture, nor
#: ``torch.compile`` where ``TORCH_COMPILE`` asks for it) when ``ENFORCE_EAGER`` and ``TORCH_COMPILE``
#: are None: they pay for themselves only over many rows (on the H100, compiling and capturing took
#: 23 s of a 157 s captioning pipeline for the 24 bundled images; benchmarks/RESULTS.md).
SHORT_RUN_ROWS = 1_000


#: A CPU run of at most this many known rows (:func:`known_rows`) runs the model in vLLM's
#: engine-core process (:attr:`helpers.presets.Preset.one_process`). On a 2-core machine the engine
#: then starts ~18 s sooner but computes more slowly: the bundled 309 rows took 147.6 and 131.6 s in
#: the pipeline against 135.8 and 129.7 s, the bundled 24 images 71.5 s against 76.5 s
#: (benchmarks/RESULTS.md).
ONE_PROCESS_ROWS = {"text": 100, "vision": 30}


def known_rows(parameters: Mapping[str, Any], input_rows: int | None) -> int | None:
    """Rows the run will read, when known before reading: the whole input's rows where they were
    counted (``input_rows``; the bundled samples are), at most ``LIMIT``; None for an input that was
    only estimated or could not be sized, without a ``LIMIT``."""
    limit = int(parameters["LIMIT"]) if parameters.get("LIMIT") else None
    known = [n for n in (input_rows, limit) if n is not None]
    return min(known) if known else None


def fit(preset: Preset, rows: int | None, given: Collection[str] = ()) -> Preset:
    """``preset`` for a run of ``rows`` known rows (None: not known, nothing changes); fields you
    ``given`` (their preset names) are kept. Each change adds its reason to the settings table; the
    batches are shared only on a fixed pool of several replicas (:func:`share_batches`)."""
    if rows is None:
        return preset
    if "max_concurrent_batches" not in given:
        preset = share_batches(preset, rows)
    compiles = preset.torch_compile and "torch_compile" in given  # your TORCH_COMPILE=True: not eager
    eager = preset.enforce_eager or "enforce_eager" in given or compiles
    if preset.accelerator_type and not eager and rows <= SHORT_RUN_ROWS:
        why = (f"{rows:,} rows (at most {SHORT_RUN_ROWS:,}): too few to repay CUDA-graph capture, so the "
               "engine runs eagerly")
        preset = preset.override(enforce_eager=True, reasons=(*preset.reasons, ("enforce_eager", why)))
    most = ONE_PROCESS_ROWS[preset.task]
    one_device = preset.tensor_parallel_size == preset.pipeline_parallel_size == 1
    if not preset.accelerator_type and one_device and rows <= most:
        why = (f"{rows:,} rows (at most {most}): the model runs in vLLM's engine process, which starts "
               "sooner and computes more slowly than a worker process of its own")
        preset = preset.override(one_process=True, reasons=(*preset.reasons, ("distributed_executor_backend", why)))
    return preset


def share_batches(preset: Preset, rows: int) -> Preset:
    """A short run's few batches shared by its replicas: Ray Data hands the replica ready first up to
    ``2 x max_concurrent_batches`` of them, which can be all there are (on an H100, 500 images in 32
    batches ran on one of two engines). Each replica then holds at most its share at once
    (:func:`helpers.engine.batches_held_in_a_short_run`), and queues no more than it holds."""
    batches = -(-rows // preset.batch_size)
    share = engine.batches_held_in_a_short_run(preset.concurrency, preset.max_concurrent_batches, batches)
    if share is None:
        return preset
    others = engine.max_replicas(preset.concurrency) - 1
    leaves = "the other one its" if others == 1 else f"the other {others} their"
    why = (f"{rows:,} rows make {batches} batch{'es' if batches > 1 else ''} of {preset.batch_size}: at most "
           f"{share} to a replica at once, so the replica ready first leaves {leaves} share")
    reasons = [("max_tasks_in_flight_per_actor", why)]
    if share < preset.max_concurrent_batches:
        held = f"at most the {share} batch{'es' if share > 1 else ''} a replica holds at once in this run"
        reasons.append(("max_concurrent_batches", held))
    return preset.override(max_tasks_in_flight_per_actor=share,
                           max_concurrent_batches=min(share, preset.max_concurrent_batches),
                           reasons=(*preset.reasons, *reasons))
