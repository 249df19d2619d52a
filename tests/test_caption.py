import numpy as np
import pytest

from helpers import caption, models, outputs
from helpers.data import ROW_ID


@pytest.fixture(scope="module")
def tiny_vlm():
    return models.prepare_tiny_vlm()


def test_tiny_vlm_is_a_qwen2_vl_with_its_special_tokens(tiny_vlm):
    import json

    from transformers import AutoProcessor

    config = json.loads((tiny_vlm / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    processor = AutoProcessor.from_pretrained(tiny_vlm)
    tok = processor.tokenizer
    assert config["image_token_id"] == tok.convert_tokens_to_ids("<|image_pad|>")
    assert config["vision_start_token_id"] == tok.convert_tokens_to_ids("<|vision_start|>")
    messages = caption.build_messages("sys", "Describe.", image=None)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_max_model_len_counts_prompt_image_and_answer(tiny_vlm):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    small = caption.max_model_len(tok, "sys", "Describe.", image_tokens=64, max_tokens=32)
    big = caption.max_model_len(tok, "sys", "Describe.", image_tokens=1024, max_tokens=32)
    assert small % 64 == 0 and small >= 64 + 32 + 10
    assert big - small >= 1024 - 64 - 63


def test_preprocess_sends_an_image_pil_part_and_not_the_array():
    pre = caption.make_preprocess(system_prompt="sys", prompt="Describe.", max_tokens=8, temperature=0.3)
    row = {ROW_ID: "a", "source": "s:a", "width": 56, "height": 28, "vision_tokens": 2,
           "image": np.zeros((28, 56, 3), np.uint8), "reject_reason": ""}
    out = pre(row)
    assert "image" not in out and out[ROW_ID] == "a"
    part = out["messages"][1]["content"][1]
    assert part["type"] == "image_pil" and part["image_pil"].size == (56, 28)
    assert out["sampling_params"] == {"temperature": 0.3, "max_tokens": 8}


def test_postprocess_and_errors_keep_no_image():
    ok = caption.make_postprocess()({ROW_ID: "a", "source": "s", "width": 1, "height": 1, "vision_tokens": 1,
                              "generated_text": " A cat. ", "num_input_tokens": 80, "num_generated_tokens": 4,
                              "multimodal_data": {"image": [object()]}})
    failed = outputs.make_error_row_aligner(caption.CARRIED, caption.output_defaults())(
        {ROW_ID: "b", "source": "s", "width": 1, "height": 1, "vision_tokens": 1,
         "multimodal_data": {"image": [object()]}, "__inference_error__": "ValueError: boom"})
    assert ok[caption.CAPTION] == "A cat." and set(ok) == set(failed)
    assert "multimodal_data" not in failed and failed["error"] == "ValueError: boom"
