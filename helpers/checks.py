"""The throughput guide's rules as checks with numbers in their messages.

Each check returns findings (``error`` or ``warning``); :func:`enforce` raises on errors and
prints warnings. Memory is estimated from the model's shape (layers, KV heads, head size, weight
count and dtype): weights + the KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens
must fit ``gpu_memory_utilization`` of each GPU of a replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from helpers.engine import blocks_for_every_replica, max_replicas
from helpers.gpus import ACTIVATIONS, GPUS, memory_budget
from helpers.presets import Preset
from helpers.shapes import GIB, KNOWN_MODELS, ModelShape

@dataclass(frozen=True)
class Finding:
    level: str  # "error" or "warning"
    message: str


def batching(batch_size: int, max_concurrent_batches: int, max_num_seqs: int) -> list[Finding]:
    """Each replica holds ``batch_size x max_concurrent_batches`` rows; fewer than ``max_num_seqs``
    and the engine can never fill its running batch."""
    queued = batch_size * max_concurrent_batches
    if queued < max_num_seqs:
        # A warning, not an error: the run is correct, only slower (small batches help when testing).
        return [Finding("warning", f"batch_size x max_concurrent_batches = {batch_size} x {max_concurrent_batches} = "
                                   f"{queued} < max_num_seqs = {max_num_seqs}: the engine can never fill its batch; "
                                   f"raise batch_size or max_concurrent_batches, or lower max_num_seqs")]
    return []


def memory(preset: Preset, shape: ModelShape) -> list[Finding]:
    """Weights and KV cache per GPU against the engine's budget (:func:`helpers.gpus.memory_budget`)
    on the preset's GPU: its memory as measured where it was, else the kit's table."""
    if not preset.accelerator_type:
        return []
    memory_gib = preset.gpu_memory
    if memory_gib is None:
        return [Finding("warning", f"no memory data for GPU type {preset.accelerator_type!r}; "
                                   f"known: {sorted(GPUS)}")]
    where = f"{preset.accelerator_type} ({memory_gib:.0f} GiB{', measured' if preset.gpu_memory_gib else ''})"
    shards = preset.tensor_parallel_size * preset.pipeline_parallel_size
    budget = memory_budget(memory_gib, preset.memory_share)  # this replica's
    weights = shape.weight_bytes(preset.quantization) / shards
    kv = shape.kv_bytes_per_token * preset.max_num_seqs * preset.max_model_len / shards
    if weights > budget:
        return [Finding("error", f"weights need {weights / GIB:.1f} GiB per GPU but {where} offers "
                                 f"{budget / GIB:.1f} GiB (at gpu_memory_utilization={preset.memory_share}, "
                                 f"{ACTIVATIONS:.0%} kept for activations): use more GPUs per replica "
                                 f"(tensor_parallel_size) or quantization")]
    if weights + kv > budget:
        fits = int((budget - weights) / (shape.kv_bytes_per_token * preset.max_model_len / shards))
        return [Finding("warning", f"weights {weights / GIB:.1f} GiB + KV cache for {preset.max_num_seqs} sequences x "
                                   f"{preset.max_model_len} tokens {kv / GIB:.1f} GiB = {(weights + kv) / GIB:.1f} GiB "
                                   f"> {budget / GIB:.1f} GiB per {where}: only ~{fits} full-length sequences fit at "
                                   f"once (vLLM queues the rest); lower max_model_len or max_num_seqs to match")]
    return []


def interconnect(preset: Preset) -> list[Finding]:
    """Tensor parallelism exchanges activations every layer: over PCIe (no NVLink) it is slow."""
    gpu = GPUS.get(preset.accelerator_type or "")
    if preset.tensor_parallel_size > 1 and gpu is not None and not gpu.nvlink:
        return [Finding("warning", f"tensor_parallel_size={preset.tensor_parallel_size} on {gpu.name}, whose GPUs talk "
                                   f"over PCIe: prefer more replicas of a model that fits one GPU (or quantization)")]
    return []


def blocks(num_blocks: int, replicas: int, batch_size: int, rows: int | None = None,
           max_concurrent_batches: int | None = None) -> list[Finding]:
    """Work for every replica. The read's ``num_blocks`` sets how many read tasks work in parallel
    and, since a read block's batches reach the engine as one task, how many tasks the replicas share
    (:func:`helpers.engine.blocks_for_every_replica`, given ``max_concurrent_batches``); ``rows``
    (the run's: ``LIMIT``, else the whole input) set how many batches there are."""
    findings = []
    if num_blocks < 2 * replicas:
        findings.append(Finding("warning", f"num_blocks={num_blocks} < 2 x {replicas} replicas: the input is read in "
                                           f"only {num_blocks} tasks, so the first batches come slowly; use "
                                           f"{2 * replicas}-{4 * replicas} or more"))
    elif replicas > 1 and max_concurrent_batches:
        wanted = blocks_for_every_replica(replicas, max_concurrent_batches)
        if num_blocks < wanted:
            findings.append(Finding("warning", f"num_blocks={num_blocks} < {wanted}: the replica ready first may take "
                                               f"every block and Ray stops the others as idle; use {wanted} or more"))
    if rows is not None and replicas > 1 and math.ceil(rows / batch_size) < replicas:
        batches = math.ceil(rows / batch_size)
        findings.append(Finding("warning", f"{rows:,} rows make {batches} batch{'es' if batches > 1 else ''} of "
                                           f"{batch_size}: {replicas - batches} of the {replicas} replicas get none; "
                                           f"lower BATCH_SIZE to about {max(1, rows // replicas)}"))
    return findings


def check_preset(preset: Preset, shape: ModelShape | None = None, rows: int | None = None) -> list[Finding]:
    """All checks for one preset (memory only when the model's shape is known); ``rows``: the run's
    rows (``LIMIT``, else the whole input's, counted or estimated), None when not known."""
    shape = shape or KNOWN_MODELS.get(preset.model_source)
    findings = batching(preset.batch_size, preset.max_concurrent_batches, preset.max_num_seqs)
    findings += memory(preset, shape) if shape else []
    findings += interconnect(preset)
    findings += blocks(preset.num_blocks, max_replicas(preset.concurrency), preset.batch_size, rows,
                       preset.max_concurrent_batches)
    return findings


class ConfigurationError(ValueError):
    """A run configuration breaks a rule that would make it fail or waste its resources."""


def enforce(findings: Iterable[Finding]) -> list[str]:
    """Raise on errors (all of them in one message); return the warnings' messages."""
    findings = list(findings)
    errors = [f.message for f in findings if f.level == "error"]
    if errors:
        raise ConfigurationError("Configuration errors:\n  - " + "\n  - ".join(errors))
    return [f.message for f in findings if f.level == "warning"]


def _prompt_tokens(tokenizer: Any, conversation: list[dict[str, Any]]) -> int:
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def suggest_max_model_len(tokenizer: Any, conversations: Sequence[list[dict[str, Any]]], max_tokens: int,
                          quantile: float = 0.99, multiple: int = 64) -> dict[str, int]:
    """Token lengths of a sample of prompts (with the model's chat template), and a ``max_model_len``
    that holds the ``quantile`` prompt plus the answer, rounded up to ``multiple``.

    The guide's advice: size the context from the real P95/P99, not the model's 128K maximum.
    """
    if not conversations:
        raise ValueError("need at least one conversation to measure")
    lengths = sorted(_prompt_tokens(tokenizer, c) for c in conversations)

    def at(q: float) -> int:
        return lengths[min(len(lengths) - 1, math.ceil(q * len(lengths)) - 1)]

    needed = at(quantile) + max_tokens
    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "max": lengths[-1],
            "max_model_len": -(-needed // multiple) * multiple}
