import pytest

from helpers import classify, outputs


class CharTokenizer:
    """Tokenizes words whole, anything else character by character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(text)] if len(text) == 1 else [hash(w) for w in text.split()]


def test_label_budget_covers_finest_spelling_plus_stop():
    budget = classify.label_token_budget(CharTokenizer(), ["Real Estate", "Other"])
    assert budget.canonical == {"Real Estate": 2, "Other": 1}
    assert budget.finest == {"Real Estate": 11, "Other": 5}
    assert budget.max_tokens == 12


def test_label_budget_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        classify.label_token_budget(CharTokenizer(), [])


def test_label_budget_with_real_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    budget = classify.label_token_budget(tok, classify.DEFAULT_LABELS)
    assert budget.canonical["Manufacturing"] < budget.finest["Manufacturing"] == len("Manufacturing")
    assert budget.max_tokens == len("Manufacturing") + 1


def test_preprocess_builds_constrained_request():
    pre = classify.make_preprocess(text_column="Company", labels=["A", "B"], task="Classify.",
                                   user_template="Company: {text}", max_tokens=5, temperature=0.0)
    row = pre({"Company": "Acme", "id": 1})
    assert row["id"] == 1 and row["Company"] == "Acme"
    assert row["messages"][0] == {"role": "system", "content": "Classify. Answer with exactly one of: A, B."}
    assert row["messages"][1] == {"role": "user", "content": "Company: Acme"}
    assert row["sampling_params"] == {"temperature": 0.0, "max_tokens": 5, "structured_outputs": {"choice": ["A", "B"]}}


def test_postprocess_and_error_alignment_share_one_schema():
    keep = ["Company", "row_id"]
    ok = classify.make_postprocess(keep)({"Company": "Acme", "row_id": "1", "generated_text": " Retail ",
                                          "num_input_tokens": 50, "num_generated_tokens": 3, "messages": []})
    align = outputs.make_error_row_aligner(keep, classify.output_defaults())
    ok_aligned = align({**ok, "__inference_error__": ""})
    failed = align({"Company": "X" * 10, "row_id": "2", "messages": [], "prompt": "...",
                    "__inference_error__": "VLLMValidationError: too long"})
    assert ok_aligned[classify.PREDICTION] == "Retail"
    assert set(ok_aligned) == set(failed)
    assert failed["error"].startswith("VLLMValidationError") and failed[classify.PREDICTION] == ""


TRICKY = ["Walmart", "  spaced  ", "Ünïcödé GmbH", "A & B <Ltd>", "{braces}", "line\nbreak", "quote's \"co\""]


def test_prompt_template_matches_the_models_chat_template(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    labels, task, user = list(classify.DEFAULT_LABELS), "Classify.", "Company: {text}"
    template = classify.prompt_template(tok, labels, task, user, check_texts=TRICKY)
    assert template is not None
    for text in TRICKY:
        expected = tok.apply_chat_template(classify.build_messages(text, labels, task, user), tokenize=False,
                                           add_generation_prompt=True)
        assert template.render(text) == expected


class Templating:
    """A tokenizer whose chat template does something to the user's text."""

    def __init__(self, change):
        self.change = change

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{self.change(m['content']) if m['role'] == 'user' else m['content']}"
                       for m in messages) + "<assistant>"


def test_prompt_template_refuses_templates_that_change_the_text():
    args = (["A", "B"], "Classify.", "Company: {text}")
    assert classify.prompt_template(Templating(lambda c: c), *args, check_texts=TRICKY) is not None
    assert classify.prompt_template(Templating(str.strip), *args, check_texts=["  spaced  "]) is None
    assert classify.prompt_template(Templating(lambda c: c + c), *args, check_texts=["x"]) is None
    assert classify.prompt_template(Templating(lambda c: c.replace("&", "&amp;")), *args,
                                    check_texts=["A & B"]) is None
    # Repeating the text in USER_TEMPLATE puts the marker in twice: no template.
    assert classify.prompt_template(Templating(lambda c: c), ["A", "B"], "Classify.", "{text} / {text}",
                                    check_texts=["x"]) is None


def test_preprocess_with_a_template_sends_the_finished_prompt():
    template = classify.PromptTemplate("<sys>Answer A or B<user>Company: ", "<assistant>")
    pre = classify.make_preprocess(text_column="Company", labels=["A", "B"], task="Classify.",
                                   user_template="Company: {text}", max_tokens=5, temperature=0.0, template=template)
    row = pre({"Company": "Acme"})
    assert row["prompt"] == "<sys>Answer A or B<user>Company: Acme<assistant>" and "messages" not in row
    assert row["sampling_params"]["structured_outputs"] == {"choice": ["A", "B"]}
