"""The light Ray Data steps the run puts around the processor: rows cut into batches for the engine,
every result row given the same columns in plain types, and the engine's first batch marked for the
start-up watchdog. Each runs in Ray's tasks, a batch at a time."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.data import CARRIED_TYPES
from helpers.outputs import ENGINE_COLUMNS

#: Ray Data LLM's per-row error column: a row with a non-empty value skips every stage.
INFERENCE_ERROR = "__inference_error__"
#: Where a row stopped: "" (answered), or one of the stages below.
STAGE = "stage"
REJECTED = "rejected before the model"
ENGINE = "engine"
POSTPROCESS = "postprocess"


def batches_of(ds, rows: int, num_cpus: float):
    """``ds`` in blocks of ``rows`` rows as they stream (Ray's ``repartition(target_num_rows_per_block=)``),
    in an operator of its own whose tasks hold ``num_cpus`` like the other light stages.

    - The CPUs: Ray's public call gives the repartition's tasks no way to say, so they took its default
      of 1 CPU: on two nodes of 2 CPUs, each running an engine (1 CPU) and a light actor (0.1), no node
      had a whole CPU free, the first repartition task waited for good and no row was ever written. The
      operator carries ``ray_remote_args`` that Ray's planner passes on: set here.
    - Its own operator: Ray fuses a repartition into the ``map_batches`` before it (the notebooks' row
      ids), and then the light steps after it into that same task, whose output it merges again into
      blocks of up to 128 MiB: each read block reached the engine whole. On a 2-core CPU, 200,000 rows
      in 8 read blocks made 8 engine tasks of 25,000 rows, and none ended within the 10-minute
      start-up timeout. Ray never fuses an operator with a ``ray_remote_args_fn`` (its arguments are
      not known ahead): the same CPUs, given that way too, keep it apart. (Ray's ``strict`` repartition
      stays apart here too, but it joins rows of several read blocks into one block, and Arrow refused
      to join a block of same-size images, a tensor column, with one of objects: the captioning
      notebook failed.)
    """
    repartitioned = ds.repartition(target_num_rows_per_block=rows)
    op = repartitioned._logical_plan.dag
    if hasattr(op, "ray_remote_args_fn"):  # Ray 2.60's StreamingRepartition (frozen: set as __post_init__ does)
        object.__setattr__(op, "ray_remote_args", {**op.ray_remote_args, "num_cpus": num_cpus})
        object.__setattr__(op, "ray_remote_args_fn", functools.partial(dict, num_cpus=num_cpus))
    return repartitioned


#: Ray's Arrow type for values it could not give an Arrow type (it pickles them).
PICKLED = "ray.data.arrow_pickled_object"


def carried_column(column, name: str):
    """A carried column as the results keep it: in a plain Arrow type, never as pickled Python objects.

    Your ``postprocess`` runs in Ray's row map, which hands each value over as a Python object. Arrow
    types ints past int64 (Ray's uint64 ``row_hash``, half of its values) as nothing, so Ray pickled
    them, and such a column broke every table read from the results (pandas' IndexError selecting
    zero rows of it). Here those values get a type again: :data:`helpers.data.CARRIED_TYPES` where
    the kit knows it (the source's, so that resuming compares like with like), else the one Arrow
    infers, uint64 for non-negative ints past int64, or text as a last resort.
    """
    import pyarrow as pa

    wanted = pa.type_for_alias(CARRIED_TYPES[name]) if name in CARRIED_TYPES else None
    if isinstance(column.type, pa.ExtensionType) and column.type.extension_name == PICKLED:
        values = column.to_pylist()
        try:
            column = pa.array(values, type=wanted)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            if all(isinstance(v, int) and v >= 0 for v in values if v is not None):
                column = pa.array(values, type=pa.uint64())
            else:
                column = pa.array([None if v is None else str(v) for v in values], type=pa.string())
    return column.cast(wanted) if wanted else column


#: Where ``finish`` marks, in Ray's internal key-value store, that a run's first batch came out of the
#: engine (the key ends with the run's own id): what the start-up watchdog waits for.
FIRST_BATCH = "llm-batch-kit/first-batch/"
_marked: set[str] = set()  # keys this worker process has written


def first_batch_out(key: str) -> bool:
    """Whether a batch of the run whose :func:`finish` marks ``key`` has come out of the engine."""
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        return _internal_kv_get(key) is not None
    except Exception:  # the GCS slow to answer: asked again later
        return False


def finish(table, *, carry: Sequence[str], outputs: Mapping[str, Any], marker: str = ""):
    """Give every row of a batch the same columns, in order: ``carry``, the task's ``outputs``
    (their defaults on rows without an answer), the engine's columns, ``error`` and ``stage``.

    Rows that skipped the engine or failed in it come out of the processor in their raw shape with
    ``__inference_error__``; they get ``stage`` "rejected before the model" or "engine" and the
    message as ``error``. Works on Arrow batches (``map_batches(batch_format="pyarrow")``): the
    columns left behind (images, messages) are never converted. Carried columns keep a plain type
    (:func:`carried_column`). ``marker``: the key under which the first batch is marked
    (:func:`first_batch_out`), once per worker process.
    """
    if marker and marker not in _marked:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(marker, b"1")
        _marked.add(marker)
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    names = set(table.column_names)

    def text(name: str):
        if name not in names:
            return pa.array([""] * n, pa.string())
        return pc.fill_null(table.column(name).cast(pa.string()), "")

    failed = pc.not_equal(text(INFERENCE_ERROR), "")
    stage = pc.if_else(failed, pc.if_else(pc.equal(text(STAGE), ""), ENGINE, text(STAGE)), text(STAGE))
    error = pc.if_else(failed, text(INFERENCE_ERROR), text("error"))
    columns: dict[str, Any] = {c: carried_column(table.column(c), c) if c in names else pa.nulls(n) for c in carry}
    for name, default in {**outputs, **ENGINE_COLUMNS}.items():
        value = pa.scalar(default)
        if name not in names or pa.types.is_null(table.column(name).type):
            columns[name] = pa.array([default] * n, value.type)
            continue
        column = table.column(name).cast(value.type)
        columns[name] = pc.if_else(failed, value, pc.fill_null(column, value))
    columns["error"], columns[STAGE] = error, stage
    return pa.table(columns)


def forget_first_batch(key: str) -> None:
    """Remove a finished run's :data:`FIRST_BATCH` key from Ray's key-value store."""
    from ray.experimental.internal_kv import _internal_kv_del

    try:
        _internal_kv_del(key)
    except Exception:  # Ray already shut down: nothing to remove
        pass
