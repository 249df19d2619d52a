"""Write ``helpers/sample_data/tiny-qwen2-vl/``: the offline vision model of the captioning notebook.

A Qwen2-VL with two small layers and random weights (seed 0), a byte-level BPE tokenizer trained on
a few sentences with Qwen2-VL's special tokens, and a chat template that places the image. vLLM runs
every stage of the real pipeline with it (image processor, vision encoder, generation); its captions
are noise. A test regenerates the folder and fails if the committed copy drifts.

Run: ``python scripts/make_tiny_vlm.py`` (``--check`` compares instead of writing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "helpers" / "sample_data" / "tiny-qwen2-vl"
TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
          "<|video_pad|>")
#: ChatML with Qwen2-VL's image placeholder for any part that is not text.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = ("A photo of a cat sitting on a sofa. An astronaut in a white suit. A cup of coffee on a table. "
          "A rocket on the launch pad. Describe this image in one sentence. The picture shows a person, "
          "a street, trees, the sky, a dog, a bird, a car, a building, water, mountains and a field. ")


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=list(TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([CORPUS] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: Path) -> None:
    import torch
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor,
                              Qwen2VLVideoProcessor)

    torch.manual_seed(0)
    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in TOKENS}
    config = Qwen2VLConfig(
        text_config={"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
                     # the multimodal rotary embedding splits head_dim / 2 (16) over time, height and width
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
                     "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
                     "bos_token_id": ids["<|endoftext|>"]},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14,
                       "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = ids["<|im_end|>"], ids["<|endoftext|>"]
    model.save_pretrained(out)
    Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=1024 * 28 * 28), tokenizer=tok,
                     video_processor=Qwen2VLVideoProcessor(), chat_template=CHAT_TEMPLATE).save_pretrained(out)
    tok.save_pretrained(out)


def render() -> dict[str, bytes]:
    """The folder's files, ``{name: bytes}``."""
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed folder differs")
    args = parser.parse_args()
    files = render()
    if args.check:
        committed = {p.name: p.read_bytes() for p in sorted(OUT.iterdir())} if OUT.is_dir() else {}
        if committed != files:
            print(f"{OUT} is out of date: run python scripts/make_tiny_vlm.py")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (OUT / name).write_bytes(content)
    print(f"wrote {OUT} ({sum(map(len, files.values())):,} bytes in {len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
