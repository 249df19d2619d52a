"""The notebooks' parameters: the shared checks each concept runs on its own before anything starts,
and errors that Jupyter shows as their message alone."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Sequence
from typing import Any


class Explained(Exception):
    """An error whose message names the problem and the fix: Jupyter shows the message alone, not
    a hundred lines of Ray's and the kit's stack (IPython's ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class ParameterError(Explained, ValueError):
    """One or more parameters are invalid; the message lists every problem."""


def raise_if(problems: Sequence[str]) -> None:
    if problems:
        raise ParameterError("Invalid parameters:\n  - " + "\n  - ".join(problems))


def literal(value: Any) -> Any:
    """A value papermill passed as text (``-p ENGINE "{'concurrency': 2}"``, ``-p X "(2, 2)"``) as the
    literal it spells; anything else as it is."""
    if isinstance(value, str) and value.strip()[:1] in "{[(":
        try:
            return ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            return value
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flag(name: str, value: Any, optional: bool = False) -> list[str]:
    """True or False (``optional``: or None). ``-p RESUME false`` reaches the notebook as the string
    'false', which Python reads as true: refused, with how to write it."""
    if isinstance(value, bool) or (optional and value is None):
        return []
    hint = " (a string; on the command line write True or False, capitalised)" if isinstance(value, str) else ""
    return [f"{name} must be True or False{' or None' if optional else ''}, got {value!r}{hint}"]


def positive_int(name: str, value: Any, optional: bool = False) -> list[str]:
    if (optional and value is None) or (is_int(value) and value >= 1):
        return []
    return [f"{name} must be a positive integer{' or None' if optional else ''}, got {value!r}"]


def text(name: str, value: Any, optional: bool = False) -> list[str]:
    if (optional and value is None) or (isinstance(value, str) and value.strip()):
        return []
    return [f"{name} must be a non-empty string{' or None' if optional else ''}, got {value!r}"]


def number_in(name: str, value: Any, low: float, high: float) -> list[str]:
    if is_number(value) and low <= value <= high:
        return []
    return [f"{name} must be a number from {low:g} to {high:g}, got {value!r}"]


def closest(name: str, known: Iterable[str]) -> str:
    """``"did you mean X?"`` for the known name closest to ``name``, or the list of known names."""
    by_upper = {k.upper(): k for k in known}
    close = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=0.6)
    return f"did you mean {by_upper[close[0]]}?" if close else f"known: {', '.join(sorted(by_upper.values()))}"
