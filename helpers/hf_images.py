"""Images from a Hugging Face ``datasets`` object (what Ray's captioning tutorial loads with
``load_dataset``), as rows of the same shape :func:`helpers.image_data.read_images` gives."""

from __future__ import annotations

import pandas as pd

from helpers.image_data import (ANY_IMAGE, SAMPLE_ID, check_layout, content_ids, image_rows, image_values,
                                path_reader, relative_shard, webdataset_rows)


def from_datasets(dataset, *, image_column: str = ANY_IMAGE, id_column: str | None = None, root: str = "",
                  num_cpus: float = 0.1, check_rows: int = 20):
    """The rows :func:`read_images` gives, from a Hugging Face ``datasets`` dataset you already have
    (``datasets.load_dataset(...)``, streaming or not), through ``ray.data.from_huggingface``: use it
    in place of ``read_images`` in the captioning notebook's read cell.

    Image features are read undecoded (``{bytes, path}``, decoding switched off): the kit decodes and
    checks each image itself, so a broken file is that row's reason instead of an exception inside
    ``datasets``. A webdataset-style dataset (``__key__`` and ``__url__``, as ``load_dataset("webdataset",
    ...)`` gives) keeps the shard (its path under ``root``, else its file name) and key as each row's
    id, as :func:`read_images` does; other datasets take ``id_column``, else a hash of the image. A
    ``path`` without bytes (``imagefolder`` datasets) is read from that file."""
    import ray
    from datasets import Image as ImageFeature

    for name, feature in (getattr(dataset, "features", None) or {}).items():
        if isinstance(feature, ImageFeature) and feature.decode:
            dataset = dataset.cast_column(name, ImageFeature(decode=False))
    ds = ray.data.from_huggingface(dataset)
    first = ds.take(check_rows)
    if not first:
        from helpers.data import EmptyInputError

        raise EmptyInputError("the dataset has no rows: nothing to caption.")
    webdataset = "__key__" in first[0] and "__url__" in first[0]
    check_layout(first, image_column, "webdataset" if webdataset else "parquet")
    if webdataset:
        fn, kwargs = _from_hf_webdataset, {"image_column": image_column, "root": root}
    else:
        fn, kwargs = _from_hf_rows, {"image_column": image_column, "id_column": id_column}
    return ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus)


def _from_hf_webdataset(batch: pd.DataFrame, image_column: str, root: str) -> pd.DataFrame:
    ids = [f"{relative_shard(str(url), root)}/{key}" for url, key in zip(batch["__url__"], batch["__key__"])]
    return webdataset_rows(batch.assign(**{SAMPLE_ID: ids}), image_column)


def _from_hf_rows(batch: pd.DataFrame, image_column: str, id_column: str | None) -> pd.DataFrame:
    from pyarrow import fs as pafs

    local = path_reader("", pafs.LocalFileSystem())  # paths datasets records for local image files
    pairs = image_values(batch, image_column, [local] * len(batch))
    ids = batch[id_column].astype(str).tolist() if id_column else content_ids([data for data, _ in pairs])
    out = image_rows(ids, [f"row:{i}" for i in ids], pairs)
    if id_column:
        out[id_column] = batch[id_column].to_numpy()
    return out
