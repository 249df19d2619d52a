"""Each answer's confidence: the probability of the chosen label among the labels, and the runner-up,
from the engine's own log-probabilities along the answer it generated.

What vLLM returns. A request with ``logprobs=k`` gets, for every generated token, the log-probability
of the sampled token and of the ``k`` most likely ones. vLLM 0.29 applies the structured-output mask
to the logits before its sampler computes them (``gpu_model_runner.sample_tokens``), so even its
default ``raw_logprobs`` are over the tokens the labels allow: each step's distribution sums to 1
over them. They are the model's own distribution (temperature 1), whatever ``TEMPERATURE`` samples
with. Ray Data LLM passes ``logprobs`` on in the sampling parameters and returns them per row.

What is computed (:func:`label_probabilities`). A label's probability is the sum over every way of
spelling it of the product of its tokens' conditional probabilities, end token included. Walking
the generated answer, each alternative token at step ``t`` starts a branch whose whole probability,
``P(answer's first t tokens) * p(alternative)``, ends in the labels that branch's text can still
become. Where that is one label (or the label already complete, for a stop token), the branch
belongs to it, exactly: the chosen label's mass, and every label that leaves the answer's path at a
step, shared first tokens included. Not resolved, and reported as ``confidence_unresolved``: a
branch that several labels share beyond the step where it leaves the answer (their split is not in
the answer's logprobs), and the mass of tokens outside the top ``k``. So the labels' probabilities
plus the unresolved mass sum to 1; the chosen label's probability is exact up to that mass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Log-probabilities asked per generated token: vLLM's default ``max_logprobs`` cap.
TOP_LOGPROBS = 20
CONFIDENCE, RUNNER_UP, RUNNER_UP_CONFIDENCE, UNRESOLVED = (
    "confidence", "runner_up", "runner_up_confidence", "confidence_unresolved")


def outputs() -> dict[str, Any]:
    """The confidence columns' defaults for rows without an answer: typed nulls, never a made-up number."""
    import pyarrow as pa

    return {CONFIDENCE: pa.scalar(None, pa.float64()), RUNNER_UP: pa.scalar(None, pa.string()),
            RUNNER_UP_CONFIDENCE: pa.scalar(None, pa.float64()), UNRESOLVED: pa.scalar(None, pa.float64())}


def _steps(logprobs) -> list[dict[int, tuple[float, str]]]:
    """Each step's ``{token id: (logprob, text)}``, from the engine's dicts however Ray carried them
    (int or text keys; a struct's absent keys as None)."""
    steps = []
    for step in logprobs:
        entries = {}
        for token, entry in dict(step).items():
            if entry is None:
                continue
            lp = entry.get("logprob")
            if lp is None or math.isnan(lp) or lp == -math.inf:
                continue  # a masked token in the top k: probability 0
            entries[int(token)] = (float(lp), entry.get("decoded_token") or "")
        steps.append(entries)
    return steps


def _branch(prefix: str, piece: str, labels: Sequence[str]) -> str | None:
    """The one label a branch with text ``prefix + piece`` ends in, or None (several, or unreadable)."""
    candidates = [label for label in labels if piece and label.startswith(prefix + piece)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates and prefix in labels:
        return prefix  # a stop token after a complete label
    return None


def branches(tokens: Sequence[int], logprobs, labels: Sequence[str]) -> tuple[list[tuple[str, float, str | None]], str | None]:
    """The answer's branches (see the module docstring): each alternative's text, its whole
    probability and the one label it ends in (None: several share it, or its text is no label's),
    the answer's own path last; and the label the answer spelled (None: none, and no path)."""
    found: list[tuple[str, float, str | None]] = []
    path, prefix, chosen = 0.0, "", None
    for token, step in zip(tokens, _steps(logprobs)):
        token = int(token)
        if token not in step:
            return found, None  # the answer's own token missing: nothing to say
        for other, (lp, piece) in step.items():
            if other != token:
                found.append((prefix + piece, math.exp(path + lp), _branch(prefix, piece, labels)))
        lp, piece = step[token]
        path += lp
        if prefix in labels and not (piece and any(label.startswith(prefix + piece) for label in labels)):
            chosen = prefix  # the answer's stop token
            break
        prefix += piece
    if chosen is None and prefix in labels and not any(label != prefix and label.startswith(prefix) for label in labels):
        chosen = prefix  # no stop token returned: the mask forces one after a label nothing extends
    if chosen is not None:
        found.append((chosen, math.exp(path), chosen))
    return found, chosen


def label_probabilities(tokens: Sequence[int], logprobs, labels: Sequence[str]) -> tuple[dict[str, float], float, str | None]:
    """Each label's probability from the answer's ``tokens`` and their ``logprobs`` (see the module
    docstring), the mass not resolved to one label, and the label the answer spelled (None: none)."""
    mass = dict.fromkeys(labels, 0.0)
    found, chosen = branches(tokens, logprobs, labels)
    for _, p, label in found:
        if label is not None and chosen is not None:
            mass[label] += p
    return mass, max(0.0, 1.0 - sum(mass.values())), chosen


def columns(row: Mapping[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    """The confidence columns of one answered row (``postprocess``): the chosen label's probability,
    the runner-up label and its probability, the unresolved mass. None where the engine returned no
    log-probabilities (``CONFIDENCE`` off) or the answer is not a label."""
    none = {CONFIDENCE: None, RUNNER_UP: None, RUNNER_UP_CONFIDENCE: None, UNRESOLVED: None}
    logprobs, tokens = row.get("logprobs"), row.get("generated_tokens")
    if logprobs is None or tokens is None or len(logprobs) == 0:
        return none
    mass, unresolved, chosen = label_probabilities(list(tokens), list(logprobs), labels)
    if chosen is None:
        return none
    others = sorted(((p, label) for label, p in mass.items() if label != chosen), reverse=True)
    second, runner = others[0] if others and others[0][0] > 0 else (0.0, None)
    return {CONFIDENCE: mass[chosen], RUNNER_UP: runner, RUNNER_UP_CONFIDENCE: second, UNRESOLVED: unresolved}


def distribution(predictions) -> dict[str, Any]:
    """The confidences' distribution for ``summary.json``: how many rows have one, quantiles, and the
    share of rows under 0.5 and 0.9."""
    values = predictions[CONFIDENCE].dropna() if CONFIDENCE in predictions else []
    if len(values) == 0:
        return {"confidence": {"rows with a confidence": 0}}
    quantiles = values.quantile([0.1, 0.25, 0.5, 0.75, 0.9])
    return {"confidence": {"rows with a confidence": int(len(values)), "mean": round(float(values.mean()), 4),
                           **{f"p{round(q * 100)}": round(float(v), 4) for q, v in quantiles.items()},
                           "share under 0.5": round(float((values < 0.5).mean()), 4),
                           "share under 0.9": round(float((values < 0.9).mean()), 4)}}


THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


def above_thresholds(truth, predicted, conf, thresholds: Sequence[float] = THRESHOLDS):
    """For each threshold, the rows whose confidence is at least it: how many, their share, and their
    accuracy against ``truth`` (what keeping only confident answers buys)."""
    import pandas as pd

    known = conf.notna()
    rows = []
    for t in thresholds:
        kept = known & (conf >= t)
        n = int(kept.sum())
        rows.append({"confidence at least": t, "rows": n, "share of rows": n / max(int(known.sum()), 1),
                     "accuracy": float((truth[kept] == predicted[kept]).mean()) if n else float("nan")})
    return pd.DataFrame(rows).set_index("confidence at least")


def reliability(truth, predicted, conf, bins: int = 10):
    """Accuracy per confidence bin (equal widths): a calibrated model's accuracy equals its confidence."""
    import numpy as np
    import pandas as pd

    known = conf.notna()
    edges = np.linspace(0, 1, bins + 1)
    which = pd.cut(conf[known], edges, include_lowest=True)
    right = (truth[known] == predicted[known]).astype(float)
    table = pd.DataFrame({"bin": which, "right": right, "confidence": conf[known]}).groupby("bin", observed=False)
    return pd.DataFrame({"rows": table.size(), "mean confidence": table["confidence"].mean(),
                         "accuracy": table["right"].mean()})


def plot_reliability(table, path=None, title: str = "Confidence against accuracy"):
    """The reliability chart of :func:`reliability`'s table: accuracy per bin against the diagonal."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    shown = table[table["rows"] > 0]
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="calibrated")
    ax.plot(shown["mean confidence"], shown["accuracy"], marker="o", label="this run")
    for _, row in shown.iterrows():
        ax.annotate(f"{int(row['rows'])}", (row["mean confidence"], row["accuracy"]), textcoords="offset points",
                    xytext=(4, -10), fontsize=8)
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="confidence (mean per bin; rows per bin marked)", ylabel="accuracy",
           title=title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    plt.show()
    return fig


def review(predictions, below: float, path=None):
    """The rows whose confidence is under ``below``, least confident first, written to ``path``
    (``review.parquet``); rows without a confidence are not in it."""
    rows = predictions[predictions[CONFIDENCE].notna() & (predictions[CONFIDENCE] < below)]
    rows = rows.sort_values(CONFIDENCE, kind="stable").reset_index(drop=True)
    if path is not None:
        rows.to_parquet(path, index=False)
    return rows


#: The confidence columns a table of predictions shows.
SHOWN = (CONFIDENCE, RUNNER_UP, RUNNER_UP_CONFIDENCE)


def worth(predictions, truth_column: str, prediction_column: str, path=None, title: str = "Confidence against accuracy"):
    """What the confidences are worth against the true labels: the reliability chart (to ``path``)
    and the table of accuracy and rows above each threshold (returned)."""
    truth, predicted, conf = predictions[truth_column], predictions[prediction_column], predictions[CONFIDENCE]
    plot_reliability(reliability(truth, predicted, conf), path, title=title)
    return above_thresholds(truth, predicted, conf)
