"""The job definitions are valid and run the notebook, not a copy of it."""

import shlex

import pytest
import yaml

from conftest import REPO, load_script


@pytest.fixture(scope="module")
def job():
    return yaml.safe_load((REPO / "job.yaml").read_text())


def test_job_yaml_is_a_valid_anyscale_job_config():
    from anyscale.job.models import JobConfig

    config = JobConfig.from_yaml(str(REPO / "job.yaml"))
    assert config.name == "llm-batch-text-classification" and config.max_retries == 2
    assert config.image_uri.startswith("anyscale/ray-llm:2.60.0")


def test_anyscale_rejects_what_a_typo_would_produce(job):
    from anyscale.job.models import JobConfig

    with pytest.raises(TypeError, match="max_retires"):
        JobConfig.from_dict({**job, "max_retires": 2})
    with pytest.raises(ValueError, match="'entrypoint' cannot be empty"):
        JobConfig.from_dict({**job, "entrypoint": ""})


def test_job_runs_the_notebook_with_parameters_the_notebook_accepts(job):
    from helpers import labels, plans
    from helpers.presets import PRESETS, names

    command = job["entrypoint"].split("&&")[-1]
    args = shlex.split(command)
    assert args[:2] == ["python", "scripts/run_notebooks.py"] and "text_classification" in args
    runner = load_script("run_notebooks")
    overrides = {args[i + 1]: runner.parse_value(args[i + 2]) for i, a in enumerate(args) if a == "-p"}
    assert overrides["PRESET"] == "text-llama8b-l4" and overrides["LIMIT"] == 10_000
    preset = PRESETS[overrides["PRESET"]]
    assert (preset.model_source, preset.accelerator_type, preset.concurrency) == ("unsloth/Llama-3.1-8B-Instruct", "L4", 4)
    defaults = runner.defaults("text_classification")
    assert set(overrides) <= set(defaults), "job.yaml sets a parameter the notebook lacks"
    p = {**defaults, **overrides}
    assert plans.check_engine(p["ENGINE"]) == [] and p["PRESET"] in names("text") and p["LIMIT"] > 0
    labels.check_prompt(p["LABELS"], p["TASK"], p["USER_TEMPLATE"], p["TEMPERATURE"], p["CONFIDENCE"], p["REVIEW_BELOW"])
    # A retry resumes (tests/test_resume.py: with LIMIT too): same command, results on storage every node
    # shares and that outlives an attempt, resuming left on.
    assert job["max_retries"] >= 1 and overrides.get("RESUME", defaults["RESUME"]) is True
    assert args[args.index("--out") + 1].startswith("/mnt/cluster_storage/")


def test_a_mistyped_parameter_in_the_jobs_command_stops_it_before_the_kernel(job, monkeypatch, capsys):
    """job.yaml's command with ``-p LIMT 10000``: the runner stops at once, naming LIMIT, where
    papermill would warn and run the whole input on the cluster's GPUs."""
    import papermill

    args = shlex.split(job["entrypoint"].split("&&")[-1])
    runner = load_script("run_notebooks")
    runner.check_names(["text_classification"], {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "-p"})
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: pytest.fail("the notebook started"))
    typo = [("LIMT" if a == "LIMIT" and args[i - 1] == "-p" else a) for i, a in enumerate(args)]
    assert "LIMT" in typo and runner.main(typo[2:]) == 2
    assert "LIMT is not a parameter of text_classification" in capsys.readouterr().err


def test_job_yaml_is_rendered_from_the_project_template():
    new_project = load_script("new_project")
    assert (REPO / "job.yaml").read_text() == new_project.render_job(*new_project.KIT_JOB), \
        "job.yaml drifted from templates/project/job.yaml.jinja: run python scripts/new_project.py kit-job"


def test_kuberay_rayjob_runs_the_notebook_on_l4_workers():
    """deploy/rayjob.yaml: a KubeRay RayJob whose entrypoint runs the notebook with a valid preset."""
    from helpers.presets import PRESETS

    job = yaml.safe_load((REPO / "deploy" / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["rayClusterSpec"]["rayVersion"] == "2.60.0"
    args = shlex.split(spec["entrypoint"].split("&&")[-1])
    assert args[:2] == ["python", "scripts/run_notebooks.py"] and "text_classification" in args
    overrides = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "-p"}
    preset = PRESETS[overrides["PRESET"]]
    workers = spec["rayClusterSpec"]["workerGroupSpecs"]
    [gpus] = [w for w in workers if "nvidia.com/gpu" in w["template"]["spec"]["containers"][0]["resources"]["limits"]]
    assert gpus["maxReplicas"] >= preset.concurrency and gpus["replicas"] == preset.concurrency
    assert "l4" in str(gpus["template"]["spec"].get("nodeSelector", {})).lower() and preset.accelerator_type == "L4"
    # Results on a volume every pod mounts: the output folder of the command, shared by head and workers.
    out = args[args.index("--out") + 1]
    for group in [spec["rayClusterSpec"]["headGroupSpec"], *workers]:
        pod = group["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        mounts = {m["mountPath"]: claims[m["name"]] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert mounts.get(out) == "llm-batch-results", group
    images = {c["image"] for g in [spec["rayClusterSpec"]["headGroupSpec"], *workers]
              for c in g["template"]["spec"]["containers"]}
    assert images == {"rayproject/ray-llm:2.60.0-py311-cu128"}
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"].endswith(".zip")
    assert "pip install -r requirements-common.txt" in spec["entrypoint"]
