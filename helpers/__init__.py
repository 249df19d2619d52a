"""Helpers the batch-inference notebooks share, one module per concept, none with side effects at import.

- ``data``: the text notebook's CSV input; ``image_data``: the captioning notebook's images; ``images``:
  one image checked and resized to a vision model's grid.
- ``presets``: the named configurations; ``config``: one fitted to your GPUs and rows, with its reasons.
- ``cluster``: Ray started or joined, the GPUs read, the autoscaler asked; ``models``: the offline models.
- ``run_folder``: ``OUTPUT_DIR``'s life; ``pipeline``: your functions guarded, the write, the tables.
- ``progress``: what a running pipeline shows; ``report``: accuracy, charts and the summary;
  ``labels``: the labels' token budget and each answer's confidence.
- ``storage``: paths, buckets and the Hub; ``parameters``: the parameters' shared checks.
"""
