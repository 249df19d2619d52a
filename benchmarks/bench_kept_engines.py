"""The kit's engines, kept between runs, against Ray Data LLM's engines started per run, on the text
notebook's plan and requests, in one process and one Ray session:

- ``per-run``: Ray Data LLM's ``vLLMEngineProcessorConfig`` with the plan's settings (the notebook's
  processor cell until the kit kept its engines): each run starts its engines.
- ``kept-batch``: the notebook's own path: the same config through the kit's ``build_processor`` (vLLM's
  ``AsyncLLMEngine`` in a Serve deployment, a replica per engine, kept; a batch of requests per call); then
  short re-runs with the prompt changed, each timed to its last result.
- ``kept``: the same engine arguments in a Ray Serve LLM deployment (``LLMConfig``, no HTTP proxy),
  started once, driven by Ray Data LLM's ``ServeDeploymentProcessorConfig`` (a request per row).
- ``echo``: the kept side's path to a deployment with no model (empty answers): Serve's cost a row alone.

A side named with ``+confidence`` (``kept-batch+confidence``; or every per-run and kept-batch side, with
``--params '{"CONFIDENCE": true}'``) asks what the notebook asks for each
answer's confidence (20 candidates a token, flat lists, no candidate decoding) and compute it as the
notebook's ``postprocess`` does (``labels.confidence``), in Ray Data's postprocess tasks.

``--profile SIDE,...`` records each side's run with py-spy, ``--profile-after`` seconds in (once its engines
answer), for 15 s, 50 a second, where a thread holds the GIL (Python's own work: on_gpu.sh's ``top`` file has
each process's whole CPU): this process and every process Ray and vLLM start (the replicas, the engine
cores, the stage actors, the postprocess tasks), into ``--out``, a collapsed stack a line
(``pyspy_summary.py`` sums it up per process).

Each side prints its whole time, its first result, its steady rate (rows between 20% and 90% of the
run, over their span) and each GPU's busy share over that span; the last line the ratios. The kept side's
requests go as plain dicts (``--requests dict``, the default: the deployment's ``chat`` builds vLLM's
``ChatCompletionRequest`` itself, and answers with dicts) or as that class (``--requests class``): Ray
Data's stage actor then imports vLLM's OpenAI layer in every run, 15 s of a 2-core CPU's re-run. The
kept side gets the per-run side's rows in flight per engine (``in_flight``); with Ray Data's one batch
at a time per Serve stage actor it had a sixth of them on an H200 (256 against 1,536; in the engine at
most 256 against the per-run side's 563: benchmarks/RESULTS.md).

    python benchmarks/bench_kept_engines.py --rows 100000 --sides per-run,kept   # on a GPU, 8B shape:
        # MODEL_SOURCE from random_weights (bench_pipeline.run_settings loads it with dummy weights)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pipeline as b  # noqa: E402

NAME = "kit-text"  # the deployment's and the application's name


def openai_request(request: dict[str, Any]) -> dict[str, Any]:
    """The kit's request (``messages`` and vLLM's ``sampling_params``) as an OpenAI chat request."""
    sampling = request["sampling_params"]
    out = {"model": NAME, "messages": request["messages"], "temperature": sampling["temperature"],
           "max_tokens": sampling["max_tokens"], "structured_outputs": sampling["structured_outputs"]}
    if sampling.get("logprobs"):
        out.update(logprobs=True, top_logprobs=sampling["logprobs"])
    return out


def rate(marks: list[tuple[float, int]]) -> tuple[float, float, float]:
    """Rows per second from the batch that reaches 20% of the rows to the one that reaches 90%, and
    those two batches' times (wall clock); not claimed (NaN) from fewer than 5 batches."""
    total = marks[-1][1]
    lo = next(m for m in marks if m[1] >= 0.2 * total)
    hi = next(m for m in marks if m[1] >= 0.9 * total)
    steady = (hi[1] - lo[1]) / (hi[0] - lo[0]) if len(marks) >= 5 and hi[0] > lo[0] else float("nan")
    return steady, lo[0], hi[0]


def consume(ds) -> dict[str, Any]:
    """Every row of ``ds`` pulled to this process: (time, rows so far) per batch, answers, token counts,
    errors, confidences (where asked)."""
    start, marks, answers, errors, tokens, confidences = time.time(), [], {}, [], [], {}
    for batch in ds.iter_batches(batch_size=None, batch_format="pandas"):
        for row in batch.to_dict("records"):
            if row.get("__inference_error__"):
                errors.append(str(row["__inference_error__"])[:200])
            else:
                answers[row["key"]] = row["answer"]
                tokens.append((row["prompt_tokens"], row["generated_tokens"]))
                if row.get("confidence") is not None:
                    confidences[row["key"]] = row["confidence"]
        marks.append((time.time(), len(answers) + len(errors)))
    return {"start": start, "marks": marks, "answers": answers, "errors": errors, "tokens": tokens, "confidences": confidences}


def processor_config(plan: Any, env: dict[str, str], confidence=None):
    """Ray Data LLM's config on the plan, as the notebooks' config cell builds it (a tokenize stage of its own on a GPU)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    return vLLMEngineProcessorConfig(
        model_source=plan.model_path, engine_kwargs=plan.engine_args, batch_size=plan.batch_size,
        max_concurrent_batches=plan.max_concurrent_batches, concurrency=plan.actor_pool,
        tokenize_stage={"enabled": bool(plan.accelerator_type), "num_cpus": plan.stage_cpus},
        detokenize_stage={"enabled": confidence is not None, "num_cpus": plan.stage_cpus}, chat_template_stage={"num_cpus": plan.stage_cpus},
        log_engine_metrics=False, should_continue_on_error=True, runtime_env={"env_vars": env}, **placement(plan))


def per_run_processor(plan: Any, env: dict[str, str], request_of, confidence=None, build=None):
    """Ray Data LLM's processor on the plan (``build``: Ray's ``build_processor``, or the kit's on its kept engines);
    ``confidence`` (``labels.choices(...).confidence``): each answer's, computed in the postprocess."""
    from ray.data.llm import build_processor

    return (build or build_processor)(processor_config(plan, env, confidence), preprocess=lambda row: {**request_of(row), "key": row["key"]},
                                      postprocess=answered(confidence), preprocess_map_kwargs={"num_cpus": plan.stage_cpus},
                                      postprocess_map_kwargs={"num_cpus": plan.stage_cpus})


def answered(confidence=None):
    """The benchmark's postprocess, on both sides: the answer, its tokens, its confidence where asked."""
    return lambda row: {"key": row["key"], "answer": row.get("generated_text"), "prompt_tokens": row.get("num_input_tokens"),
                        "generated_tokens": row.get("num_generated_tokens"), "__inference_error__": row.get("__inference_error__") or "",
                        "confidence": confidence(row)["confidence"] if confidence and not row.get("__inference_error__") else None}


def placement(plan: Any) -> dict[str, Any]:
    """Ray Data LLM's and Serve LLM's config fields that place each engine: whole GPUs, a share of one, or one CPU."""
    return {"accelerator_type": plan.ray_type, "placement_group_config": plan.placement_group_config}


def engine_env(placement: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """The engines' environment: where the plan gives each engine a share of a GPU, that share as
    ``VLLM_RAY_PER_WORKER_GPUS`` (Serve LLM runs a GPU engine on vLLM's ``ray`` executor, whose worker asks
    a whole GPU unless told; Ray 2.60 computes the share for its callback only, and the replica failed)."""
    shares = [b["GPU"] for b in placement.get("placement_group_config", {}).get("bundles", []) if "GPU" in b]
    return {**env, "VLLM_RAY_PER_WORKER_GPUS": str(shares[0])} if shares and shares[0] < 1 else env


def in_flight(plan: Any, actors_per_engine: int, batch: int | None = None) -> tuple[int, int]:
    """Rows per batch and stage actors for the kept side. Ray Data runs one batch at a time in each Serve
    stage actor (the vLLM stage actor runs max_concurrent_batches), so the per-run side's rows in flight per
    engine, batch_size x max_concurrent_batches, are split over ``actors_per_engine`` actors per engine."""
    return (batch or max(1, plan.batch_size * plan.max_concurrent_batches // actors_per_engine),
            actors_per_engine * plan.replicas)


def serve_app(app: Any, name: str) -> float:
    """``app`` running as the application ``name`` (no HTTP proxy, no route); seconds until it is ready."""
    from ray import serve

    started = time.perf_counter()
    serve.start(proxy_location="Disabled")
    serve.run(app, name=name, route_prefix=None)
    return time.perf_counter() - started


def deploy(plan: Any, env: dict[str, str]) -> float:
    """The plan's engines as one Ray Serve LLM application (a replica per engine, placed as the processor
    places them), no HTTP proxy; seconds until it is ready."""
    from ray.serve.llm import LLMConfig, LLMServer, build_llm_deployment

    class DictServer(LLMServer):
        """Takes chat requests and gives answers as plain dicts: vLLM's request and response classes stay in
        the replica (unpickling one imports vLLM's OpenAI layer: 9-15 s in each new caller on a 2-core CPU)."""

        async def chat(self, request, raw_request_info=None):
            if isinstance(request, dict):
                from ray.serve.llm.openai_api_models import ChatCompletionRequest

                request = ChatCompletionRequest(**{k: v for k, v in request.items() if k != "idx_in_batch"})
            async for answer in await super().chat(request, raw_request_info):
                yield answer.model_dump() if hasattr(answer, "model_dump") else answer

    where = placement(plan)  # bundles where the kit sets them (a share of a GPU, a CPU), else Serve's own per GPU
    env = engine_env(where, env)
    llm_config = LLMConfig(model_loading_config={"model_id": NAME, "model_source": plan.model_path},
                           engine_kwargs=plan.engine_args, accelerator_type=where["accelerator_type"],
                           **({"placement_group_config": where["placement_group_config"]}
                              if "placement_group_config" in where else {}),
                           runtime_env={"env_vars": env}, log_engine_metrics=False,
                           deployment_config={"num_replicas": plan.replicas, "max_ongoing_requests": 100_000})
    return serve_app(build_llm_deployment(llm_config, override_serve_options={"name": NAME}, deployment_cls=DictServer), NAME)


ECHO = "kit-text-echo"  # the echo side's deployment and application


def deploy_echo(plan: Any) -> float:
    """A deployment with no model, a replica per engine, that answers each chat request with an empty
    answer: what Serve's path through ``ServeDeploymentProcessorConfig`` costs a row by itself."""
    from ray import serve

    @serve.deployment(name=ECHO, num_replicas=plan.replicas, max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0})
    class Echo:
        async def chat(self, request, raw_request_info=None):
            yield {"choices": [{"message": {"content": ""}}], "usage": {"prompt_tokens": 0, "completion_tokens": 0}}

    return serve_app(Echo.bind(), ECHO)


def kept_processor(plan: Any, request_of, requests: str, batch_size: int, actors: int, name: str = NAME):
    from ray.data.llm import ServeDeploymentProcessorConfig, build_processor

    mapping = None
    if requests == "class":
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        mapping = {"ChatCompletionRequest": ChatCompletionRequest}

    def pre(row):
        return {"method": "chat", "request_kwargs": openai_request(request_of(row)), "key": row["key"],
                **({"dtype": "ChatCompletionRequest"} if mapping else {})}

    config = ServeDeploymentProcessorConfig(deployment_name=name, app_name=name, **({"dtype_mapping": mapping} if mapping else {}),
                                            batch_size=batch_size, concurrency=actors,
                                            should_continue_on_error=True)
    # No num_cpus for preprocess: fused into Serve's stage actor. Given its own, it stalled on 3 CPUs
    # (the replica holds 2, the stage actor 1: benchmarks/RESULTS.md).
    return build_processor(config, preprocess=pre, postprocess=lambda row: {
        "key": row["key"], "answer": (row.get("choices") or [{}])[0].get("message", {}).get("content"),
        "prompt_tokens": (row.get("usage") or {}).get("prompt_tokens"),
        "generated_tokens": (row.get("usage") or {}).get("completion_tokens"),
        "__inference_error__": row.get("__inference_error__") or (json.dumps(row["error"], default=str) if row.get("error") else "")})


def profile(path: Path, after: float, seconds: int = 15) -> None:
    """py-spy records this process and its children (Ray's and vLLM's) from ``after`` seconds on, in the background."""
    import os
    import shutil
    import subprocess
    import threading

    path.parent.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [py_spy, "record", "--pid", str(os.getpid()), "--subprocesses", "--gil", "--nonblocking", "-d", str(seconds),
               "-r", "50", "-f", "raw", "-o", str(path)]
    threading.Timer(after, subprocess.Popen, (command,), {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}).start()
    print(f"py-spy records {seconds} s from {after:.0f} s on into {path}", flush=True)


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def report(side: str, seen: dict[str, Any], gpus: Any) -> dict[str, Any]:
    marks, start = seen["marks"] or [(seen["start"], 0)], seen["start"]  # no batch: nothing came back
    steady, lo, hi = rate(marks)
    line = (f"{side}: {marks[-1][1]} rows ({len(seen['errors'])} errors) in {marks[-1][0] - start:.1f} s, "
            f"first result at {marks[0][0] - start:.1f} s, steady {steady:.1f} rows/s, tokens per answered row "
            f"{_mean(t[0] for t in seen['tokens']):.1f} in, {_mean(t[1] for t in seen['tokens']):.2f} out")
    print("RESULT " + line + (f"; errors e.g. {seen['errors'][:2]}" if seen["errors"] else ""), flush=True)
    for gpu in b.gpu_lines(gpus.busy(lo, hi)):
        print(f"  {side}, steady span, {gpu}")
    if seen["confidences"]:
        print(f"  {side}, confidence: {len(seen['confidences'])} rows, mean {_mean(seen['confidences'].values()):.4f}")
    return {"whole": marks[-1][0] - start, "steady": steady, "answers": seen["answers"], "confidences": seen["confidences"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--sides", default="per-run,kept", help="in order, comma-separated: per-run, kept, kept-batch, echo; "
                        "per-run+confidence and kept-batch+confidence: with each answer's confidence")
    parser.add_argument("--reruns", type=int, default=3, help="short runs on the kept engines after its long one")
    parser.add_argument("--rerun-rows", type=int, default=30)
    parser.add_argument("--requests", choices=("dict", "class"), default="dict")
    parser.add_argument("--kept-batch", type=int, help="rows per batch on the kept side (default: the per-run side's rows "
                        "in flight per engine, batch_size x max_concurrent_batches, split over --kept-actors per engine)")
    parser.add_argument("--kept-actors", type=int, default=2, help="Serve stage actors per engine on the kept side")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_kept_engines"))
    parser.add_argument("--params", default="{}", help="notebook parameters (JSON), e.g. MODEL_SOURCE")
    parser.add_argument("--profile", default="", help="sides to record with py-spy, comma-separated")
    parser.add_argument("--profile-after", type=float, default=20.0, help="seconds into that side's run (the kept engines' run: once ready)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_kept_engines"), help="where the profile goes")
    args = parser.parse_args(argv)
    sides, profiled = args.sides.split(","), args.profile.split(",")
    if unknown := sorted(set(sides) - {"per-run", "kept", "kept-batch", "echo", "per-run+confidence", "kept-batch+confidence"}):
        parser.error(f"--sides: unknown {unknown}; the sides are per-run, kept, kept-batch and echo, "
                     "and per-run+confidence, kept-batch+confidence")
    if args.kept_actors < 1 or (args.kept_batch is not None and args.kept_batch < 1):
        parser.error("--kept-actors and --kept-batch: at least 1")

    import pandas as pd
    import ray
    from ray import serve

    from helpers import cluster, engines, labels

    csv = args.workdir / f"input-{args.rows}" / "companies.csv"
    if not csv.exists():
        b.text_input(args.rows, csv.parent)
    setup = b.text_setup(csv, b.run_settings("text", json.loads(args.params)))
    plan, params = setup.plan, setup.params
    max_tokens = labels.max_tokens(plan, params["LABELS"])
    confident = labels.choices(plan, params["LABELS"], confidence=True).confidence
    print(f"{setup.name}; {args.rows:,} prompts; plan: {plan.replicas} engine(s), {plan.engine_args}", flush=True)
    env = cluster.start(plan, False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    frame = pd.read_csv(csv)
    rows = [{"key": str(k), "text": str(t)} for k, t in zip(frame[params["ID_COLUMN"]], frame[params["TEXT_COLUMN"]])]

    def request_of(task: str, asks: bool):
        return lambda row: b.text_request(row["text"], {**params, "TASK": task, "CONFIDENCE": asks}, max_tokens)

    def dataset(n: int):
        return ray.data.from_items(rows[:n], override_num_blocks=max(1, min(plan.num_blocks, n)))

    batch, actors = in_flight(plan, args.kept_actors, args.kept_batch)
    print(f"rows in flight per engine: per-run {plan.batch_size} x {plan.max_concurrent_batches} batches; "
          f"kept {batch} x {args.kept_actors} stage actors", flush=True)
    got: dict[str, dict[str, Any]] = {}

    def reruns(side: str, run) -> None:
        """``args.reruns`` short runs on ``side``'s kept engines, the prompt changed each time (``run(task)``: its
        dataset)."""
        for i in range(args.reruns):
            report(f"{side} re-run {i + 1}", consume(run(f"{params['TASK']} (take {i + 2}: the prompt changed)")), gpus)

    with b.GpuSampler() as gpus:
        for named in sides:
            side, asks = named.removesuffix("+confidence"), named.endswith("+confidence") or params["CONFIDENCE"]
            if named in profiled and side != "kept-batch":  # that side's engines start in its run
                profile(args.out / f"pyspy-{named}.txt", args.profile_after)
            confidence = confident if asks else None
            task = params["TASK"]
            if side == "per-run":
                got[named] = report(named, consume(per_run_processor(plan, env, request_of(task, asks), confidence)(
                    dataset(len(rows)))), gpus)
            elif side == "echo":
                print(f"echo: the deployment is ready in {deploy_echo(plan):.1f} s", flush=True)
                got[named] = report(named, consume(kept_processor(plan, request_of(task, False), args.requests, batch, actors,
                                                                  ECHO)(dataset(len(rows)))), gpus)
            elif side == "kept-batch":
                def kit(task: str):  # the notebook's path: the kit's build_processor on Ray's config, its engines kept
                    return per_run_processor(plan, env, request_of(task, asks), confidence, build=engines.build_processor)

                started, kept = time.perf_counter(), kit(task).engines
                kept.ready()  # the first engine; the steady rate is measured with all of them
                while engines._state(kept.name)[1] < plan.replicas:
                    time.sleep(0.5)
                print(f"{named}: the engines are ready in {time.perf_counter() - started:.1f} s", flush=True)
                if named in profiled:
                    profile(args.out / f"pyspy-{named}.txt", args.profile_after)
                got[named] = report(named, consume(kit(task)(dataset(len(rows)))), gpus)
                reruns(named, lambda task: kit(task)(dataset(args.rerun_rows)))
                engines.free(kept, quiet=True)  # the GPU to the next side
            elif side == "kept":
                print(f"kept: the deployment is ready in {deploy(plan, env):.1f} s", flush=True)
                got[named] = report(named, consume(kept_processor(plan, request_of(task, False), args.requests, batch, actors)(
                    dataset(len(rows)))), gpus)
                small = in_flight(plan, 1, -(-args.rerun_rows // plan.replicas))  # a batch per engine
                reruns(named, lambda task: kept_processor(plan, request_of(task, False), args.requests, *small)(dataset(args.rerun_rows)))
                serve.delete(NAME)
    pairs = [(k, a) for k, a in [("kept", "per-run"), ("kept-batch", "per-run"), ("kept-batch+confidence", "per-run+confidence"),
                                 ("kept-batch+confidence", "kept-batch"), ("per-run+confidence", "per-run")] if k in got and a in got]
    for side, base in pairs:
        a, k = got[base], got[side]
        same = sum(a["answers"].get(key) == answer for key, answer in k["answers"].items())
        near = sum(abs(a["confidences"].get(key, -9) - c) < 1e-3 for key, c in k["confidences"].items())
        print(f"RATIO {side} / {base}: steady {k['steady'] / a['steady']:.2f}x, whole {a['whole'] / k['whole']:.2f}x faster "
              f"(the deployment's start not counted); answers equal {same} of {len(k['answers'])}"
              + (f"; confidences within 0.001: {near} of {len(k['confidences'])}" if k["confidences"] and a["confidences"] else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
