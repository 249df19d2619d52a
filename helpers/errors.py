"""The kit's errors that say all a person needs: in Jupyter they show as their message alone."""

from __future__ import annotations


class Explained(Exception):
    """Mixed into an error whose message names the problem and the fix. IPython (Jupyter, papermill's
    report) prints ``_render_traceback_``'s lines in place of the stack: the stack of Ray's and the
    kit's frames says nothing more, and hid the one sentence that matters under a hundred lines."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]
