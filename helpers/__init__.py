"""Helpers the batch-inference notebooks share, one module per concept, none with side effects at import.

- ``text_data``: the text notebook's CSV input; ``images``: the captioning notebook's images, one by one
  checked and resized to a vision model's grid, and read in their layouts.
- ``presets``: the named configurations; ``plans``: one fitted to your GPUs and rows, with its reasons.
- ``cluster``: Ray started or joined, the GPUs read, the autoscaler asked; ``models``: the offline models.
- ``engines``: Ray Data LLM's ``build_processor`` on vLLM engines kept up between runs; ``run_folder``:
  ``OUTPUT_DIR``'s life; ``pipeline``: your functions guarded, the write, the tables.
- ``progress``: what a running pipeline shows; ``report``: the summary that accounts for every row;
  ``labels``: the labels' token budget, each answer's confidence, accuracy and its charts.
- ``storage``: paths, buckets and the Hub; ``parameters``: the parameters' shared checks.
"""
