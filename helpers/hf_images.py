"""Images from a Hugging Face ``datasets`` object (what Ray's captioning tutorial loads with
``load_dataset``), as rows of the same shape :func:`helpers.image_data.read_images` gives."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pandas as pd
import pyarrow as pa
from ray.data import Datasource
from ray.data.block import BlockMetadata
from ray.data.datasource import ReadTask

from helpers.image_data import (ANY_IMAGE, SAMPLE_ID, check_layout, image_rows, image_values, path_reader,
                                relative_shard, webdataset_rows)

#: Each row's number in the dataset's order, added while reading: the id of rows without one.
ROW_NUMBER = "__kit_row_number"


def from_datasets(dataset, *, image_column: str = ANY_IMAGE, id_column: str | None = None, root: str = "",
                  num_cpus: float = 0.1, check_rows: int = 20):
    """The rows :func:`read_images` gives, from a Hugging Face ``datasets`` dataset you already have
    (``datasets.load_dataset(...)``, streaming or not), as a Ray dataset: use it in place of
    ``read_images`` in the captioning notebook's read cell.

    Image features are read undecoded (``{bytes, path}``, decoding switched off): the kit decodes and
    checks each image itself, so a broken file is that row's reason instead of an exception inside
    ``datasets``. A webdataset-style dataset (``__key__`` and ``__url__``, as ``load_dataset("webdataset",
    ...)`` gives) keeps the shard (its path under ``root``, else its file name) and key as each row's
    id, as :func:`read_images` does; other datasets take ``id_column``, else each row's number in the
    dataset's order (the first is ``"0"``): one id per row, identical images included, the same every
    time the same dataset is read, so a run resumes on them. A ``path`` without bytes (``imagefolder``
    datasets) is read from that file.

    Not through ``ray.data.from_huggingface``: it first looks for the same dataset's parquet files on the
    Hub. For a dataset in memory it calls ``load_dataset`` with the builder's name ("webdataset",
    "imagefolder"), which for local files globs the current folder recursively (200 s in the kit's
    folder, its virtual environment included); for a streaming one it asks the Hub's API, which raises
    ``ConnectionError`` offline, and where it finds files it reads them all, dropping the
    ``select_columns``, ``filter`` or ``take`` you applied. Here the dataset you pass is what is read: a
    dataset in memory through Ray's ``from_arrow`` (Ray's own way once its search finds nothing), a
    streaming one in one task, as Ray reads one. For many shards an ``hf://`` path is faster: Ray reads
    its files in parallel."""
    import datasets
    import ray

    for name, feature in (getattr(dataset, "features", None) or {}).items():
        if isinstance(feature, datasets.Image) and feature.decode:
            dataset = dataset.cast_column(name, datasets.Image(decode=False))
    streaming = isinstance(dataset, datasets.IterableDataset)
    if not streaming and not isinstance(dataset, datasets.Dataset):
        raise TypeError("from_datasets takes a datasets.Dataset or IterableDataset (one split, "
                        f"dataset['train']), got {type(dataset).__name__}")
    first = [dict(row) for row in (dataset.take(check_rows) if streaming
                                   else dataset.select(range(min(check_rows, len(dataset)))))]
    if not first:
        from helpers.data import EmptyInputError

        raise EmptyInputError("the dataset has no rows: nothing to caption.")
    webdataset = "__key__" in first[0] and "__url__" in first[0]
    check_layout(first, image_column, "webdataset" if webdataset else "parquet")
    if webdataset:
        fn, kwargs = _from_hf_webdataset, {"image_column": image_column, "root": root}
    else:
        fn, kwargs = _from_hf_rows, {"image_column": image_column, "id_column": id_column}
    if streaming:
        return ray.data.read_datasource(_Stream(dataset, functools.partial(fn, **kwargs)),
                                        ray_remote_args={"num_cpus": num_cpus})
    table = dataset.with_format("arrow")[:]
    table = table.append_column(ROW_NUMBER, pa.array(range(table.num_rows), pa.int64()))
    return ray.data.from_arrow(table).map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus)


class _Stream(Datasource):
    """A streaming ``datasets`` dataset read in one task, each batch turned into the kit's rows by
    ``to_rows`` as it comes. Its batches need not share columns (webdataset samples of ``jpg`` and of
    ``png``, in any order), which Ray's own reader of such a dataset cannot join into blocks
    (``ArrowInvalid: Schema at index 11 was different``); the kit's rows always have the same columns."""

    def __init__(self, dataset, to_rows: Callable[[pd.DataFrame], pd.DataFrame], batch_size: int = 256):
        self._dataset, self._to_rows, self._batch_size = dataset, to_rows, batch_size

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ReadTask]:
        meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [ReadTask(self._read, meta, per_task_row_limit=per_task_row_limit)]

    def _read(self) -> Iterator[pd.DataFrame]:
        first = 0
        for batch in self._dataset.iter(batch_size=self._batch_size):
            frame = pd.DataFrame(batch)
            yield self._to_rows(frame.assign(**{ROW_NUMBER: range(first, first + len(frame))}))
            first += len(frame)



def _from_hf_webdataset(batch: pd.DataFrame, image_column: str, root: str) -> pd.DataFrame:
    ids = [f"{relative_shard(str(url), root)}/{key}" for url, key in zip(batch["__url__"], batch["__key__"])]
    return webdataset_rows(batch.assign(**{SAMPLE_ID: ids}), image_column)


def _from_hf_rows(batch: pd.DataFrame, image_column: str, id_column: str | None) -> pd.DataFrame:
    from pyarrow import fs as pafs

    local = path_reader("", pafs.LocalFileSystem())  # paths datasets records for local image files
    pairs = image_values(batch, image_column, [local] * len(batch))
    ids = batch[id_column].astype(str).tolist() if id_column else [str(n) for n in batch[ROW_NUMBER]]
    out = image_rows(ids, [f"row:{i}" for i in ids], pairs)
    if id_column:
        out[id_column] = batch[id_column].to_numpy()
    return out
