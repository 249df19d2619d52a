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



PROCESSOR_IMPORTS = r"""
import sys, threading
sys.path.insert(0, "scripts")
import run_notebooks
from helpers import classify
from helpers.plan import PROCESSOR_MODULES
run_plan = classify.plan({**run_notebooks.defaults("text_classification"), "OUTPUT_DIR": sys.argv[1]})
# the plan's thread imports what Ray's processor needs while the notebook goes on to Ray
[thread.join() for thread in threading.enumerate() if thread.name == "import-processor-modules"]
assert all(name in sys.modules for name in PROCESSOR_MODULES), PROCESSOR_MODULES
import ray
from ray.data.llm import build_processor, vLLMEngineProcessorConfig
ray.init(num_cpus=1, log_to_driver=False)
before = set(sys.modules)
build_processor(vLLMEngineProcessorConfig(model_source=run_plan.model_path, batch_size=16, concurrency=1))
print("LATE", sorted(name for name in set(sys.modules) - before if name.split(".")[0] == "vllm"))
"""


def test_the_plan_imports_what_rays_processor_needs_while_the_notebook_goes_on(tmp_path):
    """Ray's build_processor imports vLLM (7-8 s of the processor cell on a GPU machine): the plan starts
    that import in a thread of its own, so it runs while the notebook waits on Ray's start and the
    read. Building the processor afterwards imports no vLLM module the thread did not (it fails if Ray
    starts importing vLLM elsewhere: PROCESSOR_MODULES must follow). A module that cannot be imported
    ends the thread quietly: the processor cell raises its error where it is used."""
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from helpers import plan

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", PROCESSOR_IMPORTS, str(tmp_path / "out")], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "LATE []" in done.stdout, done.stdout[-2000:]

    seen = []
    hook, threading.excepthook = threading.excepthook, seen.append
    try:
        plan.import_processor_modules(["helpers.no_such_module"]).join(timeout=60)
    finally:
        threading.excepthook = hook
    assert not seen
