import pytest

from helpers import classify


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


def test_the_tables_show_confidence_columns_only_when_they_were_computed(repo):
    """With CONFIDENCE off the predictions table showed three empty confidence columns."""
    from helpers import confidence

    off = classify.shown_columns("Company", "Industry", False)
    assert off == ["Company", "Industry", classify.PREDICTION] and not set(confidence.SHOWN) & set(off)
    assert classify.shown_columns("Company", None, True) == ["Company", classify.PREDICTION, *confidence.SHOWN]
    source = (repo / "notebooks" / "text_classification.ipynb").read_text()
    assert source.count("classify.shown_columns(TEXT_COLUMN, LABEL_COLUMN, CONFIDENCE)") == 2
    assert "*classify.confidence.SHOWN" not in source
