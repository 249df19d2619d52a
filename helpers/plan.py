"""What a run will do, decided before Ray starts: the preset fitted to the GPUs, the model found, the
input sized and the configuration checked (:func:`build`; each task's ``plan`` checks its parameters
first), and the presets' tables of "Going further"."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from helpers import checks, cluster, fitting, models, sizing
from helpers.gpus import ray_label
from helpers.inputs import Input
from helpers.presets import PRESETS, Preset
from helpers.shapes import model_shape
from helpers.sizing import InputSize

@dataclass(frozen=True)
class Plan:
    """One run's decisions: what it reads (``source``), the configuration (``config``, a preset fitted
    to the hardware and your parameters), the model folder or id vLLM loads (``model_path``) and its
    tokenizer (:attr:`tokenizer`, loaded when first used), the whole input's size, and the
    configuration checks' warnings."""

    task: str  # "text" or "vision"
    source: Input
    config: Preset
    model_path: str
    trust_remote_code: bool  # for the tokenizer, as for the engine
    input_size: InputSize  # rows (images) in the whole input, counted or estimated
    warnings: list[str]
    parameters: Mapping[str, Any] = field(repr=False, default_factory=dict)  # the notebook's, for the table
    notes: tuple[str, ...] = ()  # task-specific lines for describe()

    @cached_property
    def tokenizer(self) -> Any:
        """The model's tokenizer (transformers'), loaded the first time a cell uses it. Importing
        transformers (and torch under it) took 5-8 s of the plan cell on GPU machines: the plan's
        own thread imports them with the processor's modules while Ray starts and the input is read
        (:func:`import_processor_modules`), and this waits for that thread first, so that two
        threads never import them at once."""
        wait_for_processor_modules()
        return _tokenizer(self.model_path, self.trust_remote_code)

    def describe(self, *extra: str) -> str:
        """What was decided, a line each, then the checks' warnings (or that they passed)."""
        lines = [f"preset {self.config.name}: {self.config.description}", f"model: {self.model_path}",
                 f"input: {self.source.shown} ({self._layout()}; {self.input_size.basis})", *self.notes, *extra]
        lines += [f"warning: {w}" for w in self.warnings] or ["configuration checks passed"]
        return "\n".join(lines)

    def _layout(self) -> str:
        return self.source.encoding if self.source.format == "csv" else self.source.format

    def settings(self) -> pd.DataFrame:
        """The settings table: each preset-backed setting, where it came from and why
        (:func:`helpers.fitting.describe`)."""
        return pd.DataFrame(fitting.describe(self.config, self.parameters)).set_index("parameter")

    def prompt_lengths(self, conversations: Sequence[list[dict[str, Any]]], max_tokens: int) -> str:
        """Token lengths of sample prompts (your ``preprocess``'s messages) with the model's chat
        template, and the ``max_model_len`` they suggest (:func:`helpers.checks.suggest_max_model_len`)."""
        lengths = checks.suggest_max_model_len(self.tokenizer, conversations, max_tokens)
        return (f"prompt tokens over {len(conversations)} rows: P50 {lengths['p50']}, P99 {lengths['p99']}, max "
                f"{lengths['max']}; suggested max_model_len {lengths['max_model_len']} "
                f"(this run: {self.config.max_model_len})")


def _parameters(p: Mapping[str, Any]) -> dict[str, Any]:
    return {name: p[name] for name in fitting.PARAMETER_FIELDS if name in p}


def _seen(p: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The GPUs "auto" fits to (it waits for a cluster that scales from zero, asking its autoscaler for
    the GPUs ``ACCELERATOR_TYPE`` and ``CONCURRENCY`` name); None for a named preset."""
    if p["PRESET"] != "auto":
        return None
    count = p.get("CONCURRENCY") if isinstance(p.get("CONCURRENCY"), int) else 1
    wanted = (ray_label(p["ACCELERATOR_TYPE"]), count) if p.get("ACCELERATOR_TYPE") else None
    return cluster.visible_cluster(wait_s=p["STARTUP_TIMEOUT_S"], wanted=wanted)


def _tokenizer(model_path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def _checked(config: Preset, model_path: str, p: Mapping[str, Any], whole: InputSize) -> list[str]:
    return checks.enforce(checks.check_preset(config, model_shape(model_path), rows=p["LIMIT"] or whole.rows))


def build(task: str, p: Mapping[str, Any], source: Input, *,
          offline_builder: Callable[[], Any] | None = None, context: Callable[[Any], int] | None = None,
          notes: Sequence[str] = ()) -> Plan:
    """A plan from a notebook's parameters (``globals()``) and its checked ``source``: the input
    sized, the preset fitted to the GPUs "auto" sees and to the rows the run will read where they
    are known (counted, or ``LIMIT``), the model prepared (``offline_builder`` for the offline one),
    its tokenizer, the configuration checked (raises on errors). ``context``: the context length
    from the tokenizer, where the task measures it; "auto" then fits the engine to it."""
    whole = sizing.input_size(source.path, source.format, source.fs)
    counted = None if whole.estimated else whole.rows
    seen = _seen(p)
    config = fitting.from_parameters(task, p, cluster=seen, input_rows=counted)
    builder = {"offline_builder": offline_builder} if offline_builder else {}
    model_path = models.resolve_model_source(config.model_source, **builder)
    tokenizer = None
    if context is not None:  # the engine's context length needs the tokenizer now
        tokenizer = _tokenizer(model_path, p["TRUST_REMOTE_CODE"])
        config = fitting.from_parameters(task, {**p, "MAX_MODEL_LEN": context(tokenizer)}, cluster=seen,
                                         input_rows=counted)
    checked = _checked(config, model_path, p, whole)
    import_processor_modules()  # the checks passed: the run goes on to Ray and its processor
    made = Plan(task, source, config, model_path, p["TRUST_REMOTE_CODE"], whole, checked, _parameters(p), tuple(notes))
    if tokenizer is not None:
        vars(made)["tokenizer"] = tokenizer  # loaded already: the cached property's value
    return made


#: What Ray's ``build_processor`` imports for a vLLM processor (vLLM itself, through Ray's engine stage):
#: 7-8 s of the processor cell on a GPU machine, 5.6 s on a 2-core CPU; then what the plan's tokenizer
#: needs beyond it (vLLM imports transformers' tokenizers already).
PROCESSOR_MODULES = ("ray.llm._internal.batch.stages.vllm_engine_stage", "transformers.models.auto.tokenization_auto")
#: What both those imports and the notebook's next cells (Ray's start: its metrics and dashboard
#: clients) import, in 0.1 s: imported first, in the notebook's thread, so that the two threads never
#: import one module at once (Python hands one of two threads that wait on each other's imports a
#: module half imported). tests/test_processor_imports.py checks the two sets share nothing else.
SHARED_MODULES = ("anyio.to_thread", "sniffio", "http.server", "prometheus_client", "prometheus_client.asgi",
                  "wsgiref.simple_server", "pydantic.dataclasses", "click", "colorsys", "configparser", "ctypes.util")


_importing: list[threading.Thread] = []  # the thread import_processor_modules started, while it runs


def wait_for_processor_modules(timeout_s: float = 900) -> None:
    """Wait for :func:`import_processor_modules`' thread, if one runs (at most ``timeout_s``)."""
    while _importing:
        _importing.pop().join(timeout=timeout_s)


def import_processor_modules(modules: Sequence[str] = PROCESSOR_MODULES) -> threading.Thread:
    """Import ``modules`` in a thread of their own while the notebook waits on Ray (its start, the
    read's id check), so that the processor cell finds them imported: on a 2-core CPU the cells
    before the pipeline took 17.6 s instead of 21.1 s (the processor cell 1.1 s instead of 5.6 s).
    Python's import locks make the processor cell wait for an import still under way; an import
    that fails here fails again there, with its error."""

    for name in SHARED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # another stack: then not shared
            pass

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - raised again, where it is used
                return

    thread = threading.Thread(target=run, daemon=True, name="import-processor-modules")
    thread.start()
    _importing.append(thread)
    return thread


def overview(task: str) -> pd.DataFrame:
    """The presets for ``task``, one row each (:func:`helpers.presets.overview`)."""
    from helpers.presets import overview as rows

    return pd.DataFrame(rows(task)).set_index("preset")


def check_named(name: str, **overrides: Any) -> list[str]:
    """The configuration checks' findings for the preset ``name`` (with ``overrides``), a line each,
    after a line that says which preset and hardware they are about: in a run on other hardware,
    the preset's findings are not the run's."""
    preset = PRESETS[name].override(**overrides) if overrides else PRESETS[name]
    on = f"{preset.gpus} x {preset.accelerator_type}" if preset.accelerator_type else "a CPU"
    findings = [f"  {f.level}: {f.message}" for f in checks.check_preset(preset)]
    changed = f", with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}" if overrides else ""
    return [f"The preset {name!r} on {on}{changed} (not this run): "
            f"{'the checks find:' if findings else 'the checks find nothing'}", *findings]
