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
    before = set(sys.modules)
    exec(compile(source, first_line, "exec"), namespace)
    if "processor" in found and ".plan(" not in source:
        main |= set(sys.modules) - before
found["main"] = sorted(main)
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
