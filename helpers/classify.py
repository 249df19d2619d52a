"""Structured-choice classification: prompts, the label token budget and post-processing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from helpers.outputs import result_row

DEFAULT_LABELS: tuple[str, ...] = (
    "Law Firm", "Healthcare", "Technology", "Retail", "Consulting",
    "Manufacturing", "Finance", "Real Estate", "Other",
)
PREDICTION = "predicted_label"


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


#: Stands in for the row's text while the chat template is rendered once (a private-use character).
_MARKER = "\ue000text\ue000"


@dataclass(frozen=True)
class PromptTemplate:
    """The chat-templated prompt, split around the row's text: ``prefix + text + suffix``.

    Every row shares the system message and the label list; only the text differs. Rendering the
    model's chat template once and concatenating per row gives the same prompt as applying the
    template to each row, without a chat-template stage in the pipeline.
    """

    prefix: str
    suffix: str

    def render(self, text: str) -> str:
        return self.prefix + text + self.suffix


def prompt_template(tokenizer: Any, labels: Sequence[str], task: str, user_template: str,
                    check_texts: Sequence[str]) -> PromptTemplate | None:
    """Render the chat template once around a marker, then check it against the real template on
    ``check_texts``. ``None`` when the template does not pass the text through unchanged (it trims,
    escapes or repeats it): then apply the template per row instead."""

    def templated(text: str) -> str:
        return tokenizer.apply_chat_template(build_messages(text, labels, task, user_template),
                                             tokenize=False, add_generation_prompt=True)

    rendered = templated(_MARKER)
    if rendered.count(_MARKER) != 1:
        return None
    prefix, suffix = rendered.split(_MARKER)
    template = PromptTemplate(prefix, suffix)
    checks = [str(t) for t in check_texts] or ["Walmart"]
    if any(template.render(t) != templated(t) for t in checks):
        return None
    return template


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


def make_preprocess(*, text_column: str, labels: Sequence[str], task: str, user_template: str,
                    max_tokens: int, temperature: float, template: PromptTemplate | None = None):
    """Return the processor's ``preprocess``: row -> row + the request + sampling_params.

    With ``template`` the request is the finished ``prompt`` (no chat-template stage needed);
    without, it is chat ``messages`` for the processor's chat-template stage.
    """
    labels = list(labels)

    def request(text: str) -> dict[str, Any]:
        if template is not None:
            return {"prompt": template.render(text)}
        return {"messages": build_messages(text, labels, task, user_template)}

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {
            **row,
            **request(str(row[text_column])),
            "sampling_params": {
                "temperature": temperature,
                "max_tokens": max_tokens,
                # Constrained decoding: the engine can only emit one of the labels.
                "structured_outputs": {"choice": labels},
            },
        }

    return preprocess


def make_postprocess(keep_columns: Sequence[str]):
    """Return the processor's ``postprocess``: keep the input columns, add the label and token counts."""
    keep = list(keep_columns)

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return result_row(row, keep, **{PREDICTION: row["generated_text"].strip()})

    return postprocess


def output_defaults() -> dict[str, Any]:
    """What an engine-error row carries in this task's output column (the aligner adds the rest)."""
    return {PREDICTION: ""}
