"""Structured-choice classification: the text notebook's plan (:func:`plan`), the default labels, the
answer budget, and the messages of the notebook's ``preprocess`` for the benchmark's raw-vLLM side.
The notebook reaches each answer's confidence through it (``classify.confidence``, :mod:`helpers.confidence`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Protocol

from helpers import confidence, inputs  # noqa: F401  (confidence: the notebook's classify.confidence)
from helpers.plan import Plan, build

DEFAULT_LABELS: tuple[str, ...] = (
    "Law Firm", "Healthcare", "Technology", "Retail", "Consulting",
    "Manufacturing", "Finance", "Real Estate", "Other",
)
PREDICTION = "predicted_label"


def shown_columns(text_column: str, label_column: str | None, with_confidence: bool) -> list[str]:
    """The columns the notebook's tables show of each prediction: the text, the true label where your
    data has one, the answer, and the confidence columns only where ``CONFIDENCE`` computed them (a
    run without it has none, and showed them as empty)."""
    wanted = (text_column, label_column, PREDICTION, *(confidence.SHOWN if with_confidence else ()))
    return [c for c in wanted if c]


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def system_prompt(labels: Sequence[str], task: str) -> str:
    """The system message: the task and the closed list of answers."""
    return f"{task} Answer with exactly one of: {', '.join(labels)}."


def build_messages(text: str, labels: Sequence[str], task: str, user_template: str) -> list[dict[str, str]]:
    """Chat messages for one row: a system message with the labels, a user message with the row."""
    return [
        {"role": "system", "content": system_prompt(labels, task)},
        {"role": "user", "content": user_template.format(text=text)},
    ]


@dataclass(frozen=True)
class LabelBudget:
    """How many tokens an answer can take for one model.

    ``canonical`` is what the tokenizer produces for each label. Under a grammar, the model may
    spell a label with a finer, non-canonical split (e.g. one token per character), so
    ``finest`` counts the label character by character. ``max_tokens`` covers the finest spelling
    of the longest label plus the end-of-sequence token, so no answer is ever cut.
    """

    canonical: dict[str, int]
    finest: dict[str, int]

    @property
    def max_tokens(self) -> int:
        return max(self.finest.values()) + 1


def label_token_budget(tokenizer: Tokenizer, labels: Sequence[str]) -> LabelBudget:
    """Measure ``labels`` with the model's own tokenizer (see :class:`LabelBudget`)."""
    if not labels:
        raise ValueError("LABELS is empty")

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    canonical = {label: count(label) for label in labels}
    finest = {label: max(canonical[label], sum(count(ch) for ch in label)) for label in labels}
    return LabelBudget(canonical=canonical, finest=finest)


def plan(p: Mapping[str, Any]) -> Plan:
    """The text notebook's plan from its parameters (``globals()``): every parameter, the CSV's columns
    and encoding and ``OUTPUT_DIR`` checked first (:func:`helpers.inputs.check_text`, one error listing
    every problem), then :func:`helpers.plan.build`."""
    return build("text", p, inputs.check_text(p))
