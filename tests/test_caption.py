import pytest

from helpers import caption, models


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
