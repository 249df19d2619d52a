"""Image captioning: the captioning notebook's parameters checked and its plan (:func:`plan`), the
context budget, the columns carried to the results, and the messages of the notebook's ``preprocess``
for the benchmark's raw side."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from helpers import params, storage
from helpers.data import ROW_ID
from helpers.image_data import ID_OF, SOURCE, detect_format
from helpers.images import QWEN2_VL_GRID, fit_size
from helpers.inputs import Input, missing_columns, output_problems, parquet_columns, resolve
from helpers.models import prepare_tiny_vlm
from helpers.plan import Plan, build
from helpers.sample_images import prepare_sample_images

#: Image sizes the plan shows resized to the vision-token budget.
EXAMPLE_IMAGE_SIZES = ((640, 480), (4000, 3000), (1080, 1920))

CAPTION = "caption"
#: Columns carried from the prepared image rows to the results (never the image itself).
CARRIED = (ROW_ID, SOURCE, "width", "height", "vision_tokens")


def build_messages(system_prompt: str, prompt: str, image: Any) -> list[dict[str, Any]]:
    """A system message and a user message with a text part and an image part.

    ``image_pil`` is vLLM's part type for an in-memory Pillow image (older examples' ``{"type": "image"}``
    is no longer accepted); a ``{"type": "image_url", "image_url": {"url": "data:..."}}`` part works too.
    """
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": [{"type": "text", "text": prompt}, {"type": "image_pil", "image_pil": image}]},
    ]


def max_model_len(tokenizer: Any, system_prompt: str, prompt: str, image_tokens: int, max_tokens: int,
                  image_placeholder: str = "<|vision_start|><|image_pad|><|vision_end|>", multiple: int = 64) -> int:
    """Context the engine needs: the templated prompt (placeholder expanded to ``image_tokens``)
    plus the answer, rounded up to a multiple of ``multiple``.

    Measured with the model's own chat template instead of a guessed 8192: a smaller context
    leaves more KV-cache memory for concurrent sequences.
    """
    messages = [{"role": "system", "content": system_prompt},
                {"role": "user", "content": f"{prompt}{image_placeholder}"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    placeholder_tokens = len(tokenizer(image_placeholder, add_special_tokens=False)["input_ids"])
    needed = text_tokens - placeholder_tokens + 2 + image_tokens + max_tokens  # 2: vision start/end
    return -(-needed // multiple) * multiple


def check_parameters(p: Mapping[str, Any]) -> Input:
    """The captioning notebook's parameters, its input (there, its layout, ``ID_COLUMN`` honoured
    for parquet and refused for layouts whose ids come from the files) and ``OUTPUT_DIR``; raise
    listing every problem, or return what to read (:class:`Input`; the bundled sample is
    written on first use)."""
    problems = params.caption_problems(p)
    if p["INPUT_PATH"] is None:
        path, fs = str(prepare_sample_images()), None
    else:
        path, fs = resolve(p["INPUT_PATH"], problems)
    layout = p["INPUT_FORMAT"] if p["INPUT_FORMAT"] != "auto" else None
    if path is not None:
        try:
            layout = layout or detect_format(path, fs)
            if p["ID_COLUMN"] is not None and layout != "parquet":
                problems.append(f"ID_COLUMN={p['ID_COLUMN']!r} applies to parquet input only; this input is "
                                f"{layout}, where each image's id is {ID_OF[layout]}: set ID_COLUMN=None")
            elif isinstance(p["ID_COLUMN"], str):
                problems += missing_columns(parquet_columns(path, fs), {"ID_COLUMN": p["ID_COLUMN"]}, storage.redact(path))
        except (OSError, ValueError) as exc:
            problems.append(f"INPUT_PATH={storage.redact(path)!r} cannot be read: {exc}")
    problems += output_problems(p)
    params.validate(problems)
    return Input(path=path, fs=fs, format=layout)  # type: ignore[arg-type]


def plan(p: Mapping[str, Any]) -> Plan:
    """The captioning notebook's plan from its parameters (``globals()``): :func:`check_parameters`,
    then :func:`helpers.plan.build` with the context measured from your prompts and ``IMAGE_TOKENS``
    (:func:`max_model_len`)."""
    notes = []
    for width, height in EXAMPLE_IMAGE_SIZES:
        w, h = fit_size(width, height, p["IMAGE_TOKENS"], keep_aspect=p["KEEP_ASPECT"])
        notes.append(f"an image of {width} x {height} is sent as {w} x {h} = {QWEN2_VL_GRID.tokens(w, h)} vision tokens")

    def context(tokenizer: Any) -> int:
        return max_model_len(tokenizer, p["SYSTEM_PROMPT"], p["PROMPT"], p["IMAGE_TOKENS"], p["MAX_TOKENS"])

    return build("vision", p, check_parameters(p),
                 offline_builder=prepare_tiny_vlm, context=context, notes=notes)
