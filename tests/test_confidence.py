"""Each answer's confidence (helpers/confidence.py): the label probabilities from the answer's
log-probabilities, the columns rows without an answer get, the review table, and a check against
vLLM itself."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import confidence

LABELS = ["Law Firm", "Real Estate", "Retail", "Tech", "Technology"]


def step(**tokens):
    """One generated step: ``{token id: {"logprob", "rank", "decoded_token"}}`` as Ray returns it."""
    return {int(k[1:]): {"logprob": math.log(p) if p > 0 else -math.inf, "rank": 0, "decoded_token": text}
            for k, (text, p) in tokens.items()}


def test_labels_sharing_first_tokens_and_stop_tokens_get_their_branches_and_the_rest_is_unresolved():
    # "Real Estate" answered as "Real" + " Estate" + end: "Ret" leaves for Retail at step 0 (shared
    # "Re", then apart); "Re" and "Te" could still become two labels each: unresolved.
    steps = [step(t1=("Real", 0.6), t2=("Ret", 0.25), t3=("Re", 0.05), t4=("Te", 0.04), t5=("Law", 0.06)),
             step(t6=(" Estate", 0.9), t7=(" E", 0.1)),
             step(t0=("<|im_end|>", 1.0), t8=("x", 0.0))]  # a masked token in the top k: probability 0
    mass, unresolved, chosen = confidence.label_probabilities([1, 6, 0], steps, LABELS)
    assert chosen == "Real Estate"
    assert mass == pytest.approx({"Law Firm": 0.06, "Real Estate": 0.6, "Retail": 0.25, "Tech": 0, "Technology": 0})
    assert unresolved == pytest.approx(0.09)  # "Re" and "Te"; and " E" at step 1 is Real Estate's own: 0.54 + 0.06
    assert sum(mass.values()) + unresolved == pytest.approx(1)
    # A label that is the start of another: at "Tech", the end token and "nology" part ways.
    steps = [step(t4=("Tech", 0.9), t5=("Law", 0.1)), step(t0=("<|im_end|>", 0.7), t7=("nology", 0.3))]
    mass, unresolved, chosen = confidence.label_probabilities([4, 0], steps, LABELS)
    assert chosen == "Tech" and mass["Tech"] == pytest.approx(0.63) and mass["Technology"] == pytest.approx(0.27)
    assert sum(mass.values()) == pytest.approx(1) and unresolved == pytest.approx(0)


def test_columns_read_the_logprobs_as_ray_may_carry_them_and_say_nothing_without_them():
    # Arrow may carry the dicts as structs: text keys, and every other row's tokens as None.
    steps = [{"1": {"logprob": math.log(0.7), "rank": 1, "decoded_token": "Retail"}, "9": None,
              "2": {"logprob": math.log(0.3), "rank": 2, "decoded_token": "Law"}},
             {"0": {"logprob": 0.0, "rank": 1, "decoded_token": "</s>"}}]
    row = {"generated_text": "Retail", "generated_tokens": [1, 0], "logprobs": steps}
    assert confidence.columns(row, LABELS) == pytest.approx(
        {"confidence": 0.7, "runner_up": "Law Firm", "runner_up_confidence": 0.3, "confidence_unresolved": 0.0})
    nothing = {"confidence": None, "runner_up": None, "runner_up_confidence": None, "confidence_unresolved": None}
    assert confidence.columns({"generated_text": "Retail", "generated_tokens": [1, 0], "logprobs": None}, LABELS) == nothing
    assert confidence.columns({**row, "generated_tokens": [5, 0]}, LABELS) == nothing  # not the answer's tokens
    lone = {**row, "logprobs": [{"1": {"logprob": 0.0, "decoded_token": "Retail"}}, steps[1]]}
    assert confidence.columns(lone, LABELS)["runner_up"] is None  # no other label had any probability


def test_a_row_the_engine_failed_has_no_confidence_not_a_made_up_one():
    import pyarrow as pa

    from helpers.stages import finish

    table = pa.table({"x": ["a", "b"], "predicted_label": ["Retail", None], "confidence": [0.8, None],
                      "runner_up": ["Tech", None], "__inference_error__": ["", "RuntimeError: engine died"]})
    out = finish(table, carry=["x"], outputs={"predicted_label": "", **confidence.outputs()}).to_pandas()
    assert out["confidence"].tolist()[0] == 0.8 and out["runner_up"].tolist()[0] == "Tech"
    assert out["stage"].tolist() == ["", "engine"]
    assert out.loc[1, ["confidence", "runner_up", "runner_up_confidence", "confidence_unresolved"]].isna().all()
    assert pa.Table.from_pandas(out).schema.field("confidence").type == pa.float64()


def test_review_keeps_the_rows_under_the_threshold_least_confident_first(tmp_path):
    rows = pd.DataFrame({"row_id": list("abcde"), "confidence": [0.9, 0.2, None, 0.45, 0.5]})
    review = confidence.review(rows, 0.5, tmp_path / "review.parquet")
    assert review["row_id"].tolist() == ["b", "d"]
    assert pd.read_parquet(tmp_path / "review.parquet")["row_id"].tolist() == ["b", "d"]


def test_accuracy_above_thresholds_reliability_and_the_distribution():
    truth = pd.Series(["A", "A", "B", "B", "A"])
    predicted = pd.Series(["A", "B", "B", "B", "A"])
    conf = pd.Series([0.95, 0.4, 0.8, None, 0.6])
    table = confidence.above_thresholds(truth, predicted, conf, thresholds=(0.0, 0.5, 0.9))
    assert table["rows"].tolist() == [4, 3, 1]
    assert table["accuracy"].tolist() == pytest.approx([0.75, 1.0, 1.0])
    bins = confidence.reliability(truth, predicted, conf, bins=2)
    assert bins["rows"].tolist() == [1, 3] and bins["accuracy"].tolist() == pytest.approx([0.0, 1.0])
    summary = confidence.distribution(pd.DataFrame({"confidence": conf}))["confidence"]
    assert summary["rows with a confidence"] == 4 and summary["share under 0.5"] == 0.25 and summary["p50"] == 0.7


ENGINE_SCRIPT = """
import json, os, sys
from helpers import classify, confidence, engine, fitting, presets
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMOutputData
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

def main():
    os.environ.update(engine.engine_env(1))
    folder, cases, p = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    kwargs = fitting.select(presets.CPU_PRESET["text"], "text", model_source=folder).engine_kwargs()
    llm = LLM(model=folder, **kwargs, max_logprobs=p["FULL"], seed=0)
    results = []
    for names, labels in cases:
        max_tokens = classify.label_token_budget(llm.get_tokenizer(), labels).max_tokens
        messages = [classify.build_messages(n, labels, p["TASK"], p["USER_TEMPLATE"]) for n in names]
        choice = StructuredOutputsParams(choice=labels)
        def chat(**sampling):
            params = SamplingParams(max_tokens=max_tokens, structured_outputs=choice, **sampling)
            return llm.chat(messages, params, use_tqdm=False)
        kit, full = chat(temperature=0.0, logprobs=confidence.TOP_LOGPROBS), chat(temperature=0.0, logprobs=p["FULL"])
        sampled = chat(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, n=p["SAMPLES"], seed=0)
        for name, k, f, s in zip(names, kit, full, sampled):
            row = vLLMOutputData.from_vllm_engine_output(k).model_dump()  # what Ray's engine stage returns
            f = vLLMOutputData.from_vllm_engine_output(f).model_dump()
            mass, unresolved, chosen = confidence.label_probabilities(f["generated_tokens"], f["logprobs"], labels)
            found, _ = confidence.branches(f["generated_tokens"], f["logprobs"], labels)
            results.append({"name": name, "labels": labels, "kit": confidence.columns(row, labels),
                            "answer": row["generated_text"], "full": mass, "full_unresolved": unresolved,
                            "full_chosen": chosen, "shared": [(t, q) for t, q, label in found if label is None],
                            "allowed": [sum(1 for e in st.values() if e["logprob"] > float("-inf")) for st in f["logprobs"]],
                            "step_sums": [sum(2.718281828459045 ** e["logprob"] for e in st.values()) for st in f["logprobs"]],
                            "samples": [o.text for o in s.outputs]})
    print("RESULT " + json.dumps(results), flush=True)

if __name__ == "__main__":
    main()
"""

#: Labels that share their first token ("Health"), beside two that do not.
SHARED = ["Health Care", "Health Insurance", "Technology", "Retail"]


@pytest.mark.slow
def test_the_kits_confidence_is_the_probability_vllm_gives_each_label_under_the_same_constraint(repo, smollm2_path, tmp_path):
    """One engine, SmolLM2, the notebook's prompt and choice constraint, three requests per company,
    for the notebook's labels and for labels sharing their first token:

    - the kit's: greedy with the notebook's ``logprobs``, read through Ray's own conversion of vLLM's
      output (``vLLMOutputData``) into the kit's columns;
    - every allowed token: ``logprobs`` beyond the number of tokens the mask allows at any step, so
      each step's probabilities sum to 1 over them (vLLM's logprobs are after the mask) and no
      branch is missing;
    - sampling at temperature 1 (no top-k/top-p), where the labels come at the frequencies the
      model gives them: an independent estimate, later-diverging labels and odd spellings included.
    """
    sys.path.insert(0, str(repo / "scripts"))
    import run_notebooks

    defaults = run_notebooks.defaults("text_classification")
    samples = 300
    cases = [(["Walmart", "Pfizer", "Zillow"], defaults["LABELS"]), (["Aetna", "Microsoft"], SHARED)]
    p = {k: defaults[k] for k in ("TASK", "USER_TEMPLATE")} | {"FULL": 400, "SAMPLES": samples}
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(smollm2_path), json.dumps(cases), json.dumps(p)],
                          capture_output=True, text=True, timeout=900, cwd=repo)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    rows = json.loads(lines[0].split(" ", 1)[1])
    print(json.dumps([{k: row[k] for k in ("name", "answer", "kit", "full", "full_unresolved", "shared")} | {
        "sampled": pd.Series(row["samples"]).value_counts().to_dict()} for row in rows], indent=1))
    for row in rows:
        name, labels, kit, full = row["name"], row["labels"], row["kit"], row["full"]
        assert all(n < p["FULL"] for n in row["allowed"]), row["allowed"]  # every allowed token came back
        assert row["step_sums"] == pytest.approx([1.0] * len(row["step_sums"]), abs=1e-3)  # after the mask
        assert sum(full.values()) + row["full_unresolved"] == pytest.approx(1, abs=1e-3)
        # With every allowed token back, all that is left unresolved is text two labels still share
        # ("R", "Re": Retail and Real Estate; "Health"), never a token the walk could not read.
        assert row["full_unresolved"] == pytest.approx(sum(q for _, q in row["shared"]), abs=2e-3)
        assert all(text and sum(label.startswith(text) for label in labels) >= 2 for text, _ in row["shared"]), row["shared"]
        if labels == SHARED and row["answer"].startswith("Health"):  # the other "Health" label leaves the path
            other = next(label for label in SHARED if label.startswith("Health") and label != row["answer"])
            assert full[other] > 0 and kit["runner_up"] is not None
        assert row["full_chosen"] == row["answer"] in labels
        # The kit's top 20 against every allowed token: the same numbers, up to the mass it left unresolved.
        slack = 1e-3 + kit["confidence_unresolved"]
        assert kit["confidence"] == pytest.approx(full[row["answer"]], abs=slack)
        assert kit["runner_up_confidence"] == pytest.approx(full[kit["runner_up"]] if kit["runner_up"] else 0, abs=slack)
        assert kit["runner_up_confidence"] == pytest.approx(max(full[l] for l in labels if l != row["answer"]), abs=slack)
        # Sampling agrees with every label's probability: 4 standard errors, plus the unresolved mass
        # (shared by labels, so the sampled frequencies may put it on either).
        counts = pd.Series(row["samples"]).value_counts()
        assert set(counts.index) <= set(labels)
        for label in labels:
            q = full[label]
            tolerance = 4 * math.sqrt(max(q * (1 - q), 0.01) / samples) + row["full_unresolved"]
            assert counts.get(label, 0) / samples == pytest.approx(q, abs=tolerance), (name, label, dict(counts), full)


def test_the_cost_benchmark_compares_the_on_run_with_the_mean_of_the_off_runs():
    from conftest import load_script

    bench = load_script("bench_confidence", folder="benchmarks")
    runs = [{"confidence": False, "steady rows/s": 10.0, "pipeline s": 100.0},
            {"confidence": True, "steady rows/s": 9.0, "pipeline s": 120.0},
            {"confidence": False, "steady rows/s": 8.0, "pipeline s": 140.0}]
    assert bench.ratio(runs, "steady rows/s") == pytest.approx(1.0)  # 9 against the off runs' mean 9
    assert bench.ratio(runs, "pipeline s") == pytest.approx(1.0)
    assert math.isnan(bench.ratio([{**runs[0], "steady rows/s": None}, runs[1]], "steady rows/s"))  # not measured
    with pytest.raises(SystemExit):
        bench.main(["--order", "on,on"])  # no off run to compare with
