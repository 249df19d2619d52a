"""Image captioning: the messages of the notebook's ``preprocess`` (for the benchmark's raw side), the
columns carried to the results, and the context budget."""

from __future__ import annotations

from typing import Any

from helpers.data import ROW_ID
from helpers.image_data import SOURCE

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
