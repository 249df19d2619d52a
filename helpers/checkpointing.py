"""A checkpoint filter for Ray Data that also accepts pandas blocks.

Ray 2.60's ``NumpyArrayBasedCheckpointFilter`` asserts that every block it filters is an Arrow
table. ``read_webdataset`` yields pandas blocks, so resuming a webdataset read failed with a bare
``AssertionError``. This subclass converts such blocks to Arrow first and filters them the same way.
It is imported only when a resumable write is configured (it imports Ray).
"""

from __future__ import annotations

import pyarrow
from ray.data.block import Block, BlockAccessor
from ray.data.checkpoint.checkpoint_filter import NumpyArrayBasedCheckpointFilter


class AnyBlockCheckpointFilter(NumpyArrayBasedCheckpointFilter):
    """``NumpyArrayBasedCheckpointFilter`` for Arrow *and* pandas blocks."""

    def filter_rows_for_block(self, block: Block) -> Block:
        if not isinstance(block, pyarrow.Table) and len(block):
            block = BlockAccessor.for_block(block).to_arrow()
        return super().filter_rows_for_block(block)
