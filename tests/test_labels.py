"""Labels: the prompt's parameters, the answer's token budget, and each answer's confidence from the
answer's log-probabilities, checked against vLLM itself."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import labels

LABELS = ["Law Firm", "Real Estate", "Retail", "Tech", "Technology"]
ABC = ["A", "B", "C"]


def step(**tokens):
    """One generated step: ``{token id: {"logprob", "rank", "decoded_token"}}`` as Ray returns it when
    vLLM does not decode (the notebook's ``"detokenize": False``)."""
    return {int(k[1:]): {"logprob": math.log(p) if p > 0 else -math.inf, "rank": 0, "decoded_token": None}
            for k, p in tokens.items()}


def test_per_label_table():
    truth, predicted = pd.Series(["A", "A", "B", "C"]), pd.Series(["A", "B", "B", "B"])
    table = labels.per_label_table(truth, predicted, ABC)
    assert table.loc["A", "recall"] == 0.5 and table.loc["B", "precision"] == pytest.approx(1 / 3)
    assert table.loc["all", "recall"] == 0.5 and table.loc["all", "support"] == 4


def test_a_classifications_checks_say_every_answer_is_a_label_its_accuracy_and_confidences():
    answered = pd.DataFrame({"label": ["A", "B", "A"], "truth": ["A", "A", "A"], "confidence": [0.9, 0.3, None]})
    found = labels.checks(answered, ABC, answer="label", truth="truth")
    assert found["every prediction is a label"] and found["accuracy"] == 0.6667 and found["per label"]["A"]["support"] == 3
    assert found["confidence"]["rows with a confidence"] == 2 and found["confidence"]["share under 0.5"] == 0.5
    outside = labels.checks(answered.assign(label="Z"), ABC, answer="label", truth=None)
    assert outside["predictions outside the labels"] == ["Z"] and not outside["every prediction is a label"]
    assert "accuracy" not in outside


def test_the_results_section_writes_its_charts_and_review_through_the_run(tmp_path):
    names: list[str] = []
    run = SimpleNamespace(plan=SimpleNamespace(model_source="m"), path=lambda name: names.append(name) or tmp_path / name)
    predictions = pd.DataFrame({"label": ["A", "B", "A", "C"], "truth": ["A", "A", "A", "C"],
                                "confidence": [0.9, 0.3, 0.6, None]})
    tables, checks = labels.evaluate(predictions, run, ABC, answer="label", truth="truth", review_below=0.5)
    assert checks == labels.checks(predictions, ABC, answer="label", truth="truth")  # what the summary records
    assert names == ["label_counts.png", "confusion_matrix.png", "reliability.png", "review.parquet"]
    assert all((tmp_path / n).stat().st_size > 0 for n in names)
    assert list(tables) == ["per label", "confusion matrix", "accuracy by confidence", "to review"]
    assert len(tables["to review"]) == 1
    names.clear()
    assert list(labels.evaluate(predictions.drop(columns="confidence"), run, ABC, answer="label", truth=None)[0]) == []
    assert names == ["label_counts.png"]


def test_the_confusion_matrix_has_the_truth_in_rows_and_the_predictions_in_columns():
    truth, predicted = pd.Series(["A", "A", "B", "C"]), pd.Series(["A", "B", "B", "B"])
    cm = labels.confusion_matrix(truth, predicted, ["A", "B", "C"])
    assert cm.loc["A", "B"] == 1 and cm.loc["C", "B"] == 1 and int(cm.values.sum()) == 4


def test_the_answer_budget_covers_the_finest_spelling_plus_the_stop(smollm2_path):
    class PerChar:
        def encode(self, text, add_special_tokens=False):
            return list(text) if len(text) == 1 else [text]

    assert labels.max_tokens(PerChar(), ["Retail", "Law Firm"]) == len("Law Firm") + 1
    from transformers import AutoTokenizer

    real = labels.max_tokens(AutoTokenizer.from_pretrained(smollm2_path), ["Manufacturing", "Retail"])
    assert real == len("Manufacturing") + 1  # SmolLM2 splits it into fewer tokens; the grammar may not


def test_labels_sharing_first_tokens_and_stop_tokens_get_their_branches_and_the_rest_is_unresolved():
    # "Real Estate" answered as "Real" + " Estate" + end: "Ret" leaves for Retail at step 0; "Re" and
    # "Te" could still become two labels each: unresolved.
    texts = {0: "", 1: "Real", 2: "Ret", 3: "Re", 4: "Te", 5: "Law", 6: " Estate", 7: " E", 8: "x"}  # 0: the end
    steps = [step(t1=0.6, t2=0.25, t3=0.05, t4=0.04, t5=0.06), step(t6=0.9, t7=0.1),
             step(t0=1.0, t8=0.0)]  # a masked token in the top k: probability 0
    mass, unresolved, chosen = labels.label_probabilities([1, 6, 0], steps, LABELS, texts)
    assert chosen == "Real Estate"
    assert mass == pytest.approx({"Law Firm": 0.06, "Real Estate": 0.6, "Retail": 0.25, "Tech": 0, "Technology": 0})
    assert unresolved == pytest.approx(0.09) and sum(mass.values()) + unresolved == pytest.approx(1)
    steps = [step(t4=0.9, t5=0.1), step(t0=0.7, t7=0.3)]
    mass, unresolved, chosen = labels.label_probabilities([4, 0], steps, LABELS, {0: "", 4: "Tech", 5: "Law", 7: "nology"})
    assert chosen == "Tech" and mass["Tech"] == pytest.approx(0.63) and mass["Technology"] == pytest.approx(0.27)


def test_the_columns_read_the_logprobs_as_ray_may_carry_them_and_say_nothing_without_them():
    steps = [{"1": {"logprob": math.log(0.7), "rank": 1, "decoded_token": None}, "9": None,
              "2": {"logprob": math.log(0.3), "rank": 2, "decoded_token": None}},
             {"0": {"logprob": 0.0, "rank": 1, "decoded_token": None}}]
    texts = {0: "", 1: "Retail", 2: "Law"}
    row = {"generated_text": "Retail", "generated_tokens": [1, 0], "logprobs": steps}
    assert labels.confidence(row, LABELS, texts) == pytest.approx(
        {"confidence": 0.7, "runner_up": "Law Firm", "runner_up_confidence": 0.3, "confidence_unresolved": 0.0})
    nothing = dict.fromkeys(["confidence", "runner_up", "runner_up_confidence", "confidence_unresolved"])
    assert labels.confidence({**row, "logprobs": None}, LABELS, texts) == nothing
    assert labels.confidence({**row, "generated_tokens": [5, 0]}, LABELS, texts) == nothing  # not the answer's tokens
    assert labels.confidence(row, LABELS, {0: "", 2: "Law"}) == nothing  # the answer's own token's text unknown
    unknown = labels.confidence(row, LABELS, {0: "", 1: "Retail"})  # a candidate's text unknown: unresolved
    assert unknown == pytest.approx({"confidence": 0.7, "runner_up": None, "runner_up_confidence": 0.0,
                                     "confidence_unresolved": 0.3})
    lone = {**row, "logprobs": [{"1": {"logprob": 0.0}}, steps[1]]}
    assert labels.confidence(lone, LABELS, texts)["runner_up"] is None


def test_the_label_pieces_are_every_token_a_label_can_be_spelled_with_and_the_special_ones(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    texts = labels.pieces(tokenizer, LABELS)
    for label in LABELS:
        ids = tokenizer.encode(label, add_special_tokens=False)
        assert "".join(texts[i] for i in ids) == label  # the tokenizer's own spelling
        assert all(tokenizer.convert_tokens_to_ids(ch) in texts for ch in label if ch != " ")  # and letter by letter
    assert all(texts[i] == "" for i in tokenizer.all_special_ids) and texts[tokenizer.convert_tokens_to_ids("<|im_end|>")] == ""
    assert tokenizer.encode(" the", add_special_tokens=False)[0] not in texts
    assert all(text == "" or any(text in label for label in LABELS) for text in texts.values())
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<unk>": 0, "▁Real": 1, "▁Estate": 2, "▁": 3, "Re": 4}, unk_token="<unk>"))
    words.pre_tokenizer, words.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    spm = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")  # a SentencePiece vocabulary, as Llama 2's
    assert spm.decode([2]) == "Estate" and labels.pieces(spm, LABELS) == {0: "", 2: " Estate", 3: " ", 4: "Re"}
    choices = labels.choices(tokenizer, LABELS, confidence=True)  # what the notebook's postprocess calls, shipped by Ray
    ids = tokenizer.encode("Retail", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    row = {"generated_tokens": ids, "logprobs": [{i: {"logprob": 0.0}} for i in ids]}
    assert pickle.loads(pickle.dumps(choices)).confidence(row) == labels.confidence(row, LABELS, texts) != labels.confidence(row, LABELS, {})
    assert choices.max_tokens == labels.max_tokens(tokenizer, LABELS)
    with pytest.raises(ValueError, match="without confidence"):
        labels.choices(tokenizer, LABELS).confidence(row)


def test_review_thresholds_reliability_and_the_distribution():
    rows = pd.DataFrame({"row_id": list("abcde"), "confidence": [0.9, 0.2, None, 0.45, 0.5]})
    assert labels.review(rows, 0.5)["row_id"].tolist() == ["b", "d"]
    truth, predicted = pd.Series(["A", "A", "B", "B", "A"]), pd.Series(["A", "B", "B", "B", "A"])
    conf = pd.Series([0.95, 0.4, 0.8, None, 0.6])
    table = labels.above_thresholds(truth, predicted, conf, thresholds=(0.0, 0.5, 0.9))
    assert table["rows"].tolist() == [4, 3, 1] and table["accuracy"].tolist() == pytest.approx([0.75, 1.0, 1.0])
    bins = labels.reliability(truth, predicted, conf, bins=2)
    assert bins["rows"].tolist() == [1, 3] and bins["accuracy"].tolist() == pytest.approx([0.0, 1.0])



ENGINE_SCRIPT = """
import json, os, sys
from helpers import cluster, engines, labels, plans
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

def main():
    folder, cases, p = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    plan = plans.fit("text", "auto", folder, {}, gpus={"CPU": 2.0, "GPU": 0.0, "nodes": []})
    os.environ.update(cluster.engine_env(plan, joined=False))
    llm = LLM(model=folder, **plan.engine_args, max_logprobs=p["FULL"], seed=0)
    results = []
    for names, choices in cases:
        max_tokens = labels.max_tokens(llm.get_tokenizer(), choices)
        messages = [[{"role": "system", "content": f"{p['TASK']} Answer with exactly one of: {', '.join(choices)}."},
                     {"role": "user", "content": p["USER_TEMPLATE"].format(text=n)}] for n in names]
        choice = StructuredOutputsParams(choice=choices)
        def chat(**sampling):
            return llm.chat(messages, SamplingParams(max_tokens=max_tokens, structured_outputs=choice, **sampling), use_tqdm=False)
        texts = labels.pieces(llm.get_tokenizer(), choices)
        # The notebook's request: vLLM decodes no candidate (nor the answer: the kit's engines do) and keeps
        # the candidates in flat lists; each answer read as the kit's engines read it for your postprocess.
        kit = chat(temperature=0.0, logprobs=labels.TOP_LOGPROBS, detokenize=False, flat_logprobs=True)
        full = chat(temperature=0.0, logprobs=p["FULL"])
        sampled = chat(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, n=p["SAMPLES"], seed=0)
        for name, k, f, s in zip(names, kit, full, sampled):
            assert k.outputs[0].text == "" and f.outputs[0].text  # vLLM decoded nothing for the kit's request
            row, f = engines.fields(k, llm.get_tokenizer()), engines.fields(f, llm.get_tokenizer())
            answer = row["generated_text"]
            assert answer == f["generated_text"]  # decoded by the kit as vLLM decodes it
            mass, unresolved, chosen = labels.label_probabilities(f["generated_tokens"], f["logprobs"], choices, texts)
            found, _ = labels.branches(f["generated_tokens"], f["logprobs"], choices, texts)
            results.append({"name": name, "labels": choices, "kit": labels.confidence(row, choices, texts),
                            "answer": answer, "full": mass, "full_unresolved": unresolved,
                            "full_chosen": chosen, "shared": [(t, q) for t, q, label in found if label is None],
                            "allowed": [sum(1 for e in st.values() if e["logprob"] > float("-inf")) for st in f["logprobs"]],
                            "step_sums": [sum(2.718281828459045 ** e["logprob"] for e in st.values()) for st in f["logprobs"]],
                            "samples": [o.text for o in s.outputs]})
    print("RESULT " + json.dumps(results), flush=True)

if __name__ == "__main__":
    main()
"""

SHARED = ["Health Care", "Health Insurance", "Technology", "Retail"]  # two share their first token


@pytest.mark.slow
@pytest.mark.extended  # 4 min on a 2-core machine: make test-extended
def test_the_kits_confidence_is_the_probability_vllm_gives_each_label_under_the_same_constraint(repo, smollm2_path, tmp_path):
    """One engine, SmolLM2, the notebook's prompt and choice constraint, three requests per company:
    the kit's (greedy, the notebook's logprobs, read as the kit's engines read vLLM's output); every
    allowed token (each step's probabilities then sum to 1: vLLM's logprobs are after the mask); and
    sampling at temperature 1, where labels come at the frequencies the model gives them."""
    from conftest import load_script

    defaults = load_script("run_notebooks").defaults("text_classification")
    samples = 300
    cases = [(["Walmart", "Zillow"], defaults["LABELS"]), (["Aetna"], SHARED)]
    p = {k: defaults[k] for k in ("TASK", "USER_TEMPLATE")} | {"FULL": 400, "SAMPLES": samples}
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(smollm2_path), json.dumps(cases), json.dumps(p)],
                          capture_output=True, text=True, timeout=900, cwd=repo)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    for row in json.loads(lines[0].split(" ", 1)[1]):
        choices, kit, full = row["labels"], row["kit"], row["full"]
        assert all(n < p["FULL"] for n in row["allowed"])  # every allowed token came back
        assert row["step_sums"] == pytest.approx([1.0] * len(row["step_sums"]), abs=1e-3)
        assert row["full_unresolved"] == pytest.approx(sum(q for _, q in row["shared"]), abs=2e-3)
        assert all(text and sum(c.startswith(text) for c in choices) >= 2 for text, _ in row["shared"])
        assert row["full_chosen"] == row["answer"] in choices
        slack = 1e-3 + kit["confidence_unresolved"]
        assert kit["confidence"] == pytest.approx(full[row["answer"]], abs=slack)
        assert kit["runner_up_confidence"] == pytest.approx(max(full[c] for c in choices if c != row["answer"]), abs=slack)
        counts = pd.Series(row["samples"]).value_counts()
        assert set(counts.index) <= set(choices)
        for choice in choices:
            q = full[choice]
            tolerance = 4 * math.sqrt(max(q * (1 - q), 0.01) / samples) + row["full_unresolved"]
            assert counts.get(choice, 0) / samples == pytest.approx(q, abs=tolerance), (row["name"], choice, dict(counts))
