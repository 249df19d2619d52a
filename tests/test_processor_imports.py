"""The plan imports what Ray's processor needs in a thread of its own while the notebook goes on to
Ray (:func:`helpers.plan.import_processor_modules`): run on the text notebook's own cells, so a
generated project, which carries neither the notebook's benchmarks nor this file, does not take it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The text notebook's cells up to its processor cell, in this process as a kernel runs them, with the
#: plan's import of the processor's modules made at once (not in its thread) to see what it brings;
#: argv: what to record ("main": what the notebook's own cells import after the plan; "processor":
#: what that import brings, then whether Ray's build_processor imports any vLLM module beyond it).
NOTEBOOK_IMPORTS = r"""
import importlib, json, os, sys
sys.path[:0] = ["benchmarks", "."]
import profile_cells
from helpers import plan
mode, found = sys.argv[1], {}

def imported_at_once(modules=plan.PROCESSOR_MODULES):
    for name in plan.SHARED_MODULES:
        importlib.import_module(name)
    before = set(sys.modules)
    if mode == "processor":
        for name in modules:
            importlib.import_module(name)
    found["processor"] = sorted(set(sys.modules) - before)

plan.import_processor_modules = imported_at_once
cells = profile_cells.code_cells("text_classification", {"OUTPUT_DIR": repr(sys.argv[2])})
os.chdir("notebooks")
namespace, main = {"__name__": "__main__"}, set()
for first_line, source in cells:
    if source.startswith("config = vLLMEngineProcessorConfig") or (mode == "processor" and "processor" in found):
        break
    if "run_plan.tokenizer" in source:  # the tokenizer waits for that thread: the cells from here run after it
        found["main"] = sorted(main)
    before = set(sys.modules)
    exec(compile(source, first_line, "exec"), namespace)
    if "processor" in found and ".plan(" not in source:
        main |= set(sys.modules) - before
found.setdefault("main", sorted(main))
if mode == "processor":
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    ray.init(num_cpus=1, log_to_driver=False)
    before = set(sys.modules)
    build_processor(vLLMEngineProcessorConfig(model_source=namespace["run_plan"].model_path, batch_size=16,
                                              concurrency=1))
    found["late"] = sorted(name for name in set(sys.modules) - before if name.split(".")[0] == "vllm")
print("FOUND " + json.dumps(found))
"""


def test_the_plan_imports_what_rays_processor_needs_while_the_notebook_goes_on(tmp_path):
    """Ray's build_processor imports vLLM (7-8 s of the processor cell on a GPU machine): the plan starts
    that import in a thread of its own, so it runs while the notebook waits on Ray's start and the
    read. Building the processor afterwards imports no vLLM module that import did not (it fails if
    Ray starts importing vLLM elsewhere: PROCESSOR_MODULES must follow). The notebook's own cells
    meanwhile import nothing that import does, once SHARED_MODULES are imported first: two threads
    importing one module at once can leave one with a module half imported. A module that cannot be
    imported ends the thread quietly: the processor cell raises its error where it is used."""
    import json
    import subprocess
    import sys
    import threading

    from helpers import plan

    found = {}
    for mode in ("processor", "main"):
        done = subprocess.run([sys.executable, "-c", NOTEBOOK_IMPORTS, mode, str(tmp_path / mode)], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        found[mode] = json.loads(done.stdout.split("FOUND ")[-1])
    brought = set(found["processor"]["processor"])
    assert set(plan.PROCESSOR_MODULES) <= brought and any(m.split(".")[0] == "vllm" for m in brought)
    assert found["processor"]["late"] == [], found["processor"]["late"]
    assert found["main"]["main"], "the notebook's cells after the plan import Ray's start's modules"
    assert not brought & set(found["main"]["main"]), sorted(brought & set(found["main"]["main"]))

    seen = []
    hook, threading.excepthook = threading.excepthook, seen.append
    try:
        plan.import_processor_modules(["helpers.no_such_module"]).join(timeout=60)
    finally:
        threading.excepthook = hook
    assert not seen


#: The text notebook's plan with its default parameters, the plan's import thread left out: what the plan
#: cell itself imports, then the tokenizer a later cell asks for.
PLAN_ALONE = r"""
import json, sys
from helpers import classify, plan
plan.import_processor_modules = lambda *a, **k: None
sys.path.insert(0, "benchmarks")
import profile_cells
namespace = {}
exec(profile_cells.code_cells("text_classification", {"OUTPUT_DIR": repr(sys.argv[1])})[1][1], namespace)
run_plan = classify.plan(namespace)
seen = {"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}
seen["tokens"] = classify.label_token_budget(run_plan.tokenizer, namespace["LABELS"]).max_tokens
print("SEEN " + json.dumps(seen))
"""


def test_the_text_plan_leaves_torch_and_transformers_to_the_import_thread(tmp_path):
    """The text notebook's plan cell imports neither torch (the GPUs are read from CUDA's driver:
    helpers.local_gpus) nor transformers (the tokenizer loads when the prompt cell first uses it):
    on GPU machines those imports took 5-8 s of the plan cell, one after the other with Ray's start;
    the plan's thread imports them while Ray starts. The tokenizer still loads when asked for."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PLAN_ALONE, str(tmp_path / "out")], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.split("SEEN ")[-1])
    assert seen == {"torch": False, "transformers": False, "tokens": seen["tokens"]} and seen["tokens"] > 1, seen


def test_the_tokenizer_waits_for_the_import_thread(tmp_path, monkeypatch):
    """A cell that asks for the plan's tokenizer first waits for the plan's import thread, so that the
    notebook's thread never imports transformers while that thread does (a module half imported)."""
    import sys
    import time

    from helpers import plan

    (tmp_path / "slow_import_for_test.py").write_text("import time\ntime.sleep(1.5)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = []
    monkeypatch.setattr(plan, "_tokenizer", lambda path, trust: loaded.append(
        "slow_import_for_test" in sys.modules and getattr(sys.modules["slow_import_for_test"], "DONE", False)) or "tok")
    thread = plan.import_processor_modules(["slow_import_for_test"])
    started = time.perf_counter()
    made = plan.Plan("text", None, None, "model", False, None, [])
    assert made.tokenizer == "tok" and made.tokenizer == "tok"  # loaded once, then cached
    assert loaded == [True] and not thread.is_alive() and time.perf_counter() - started > 1.0
