"""Data on the Hugging Face Hub, read as Ray's tutorials read it: ``INPUT_PATH="hf://datasets/..."``.

Nothing here can reach the Hub, so a stand-in answers on 127.0.0.1 (``tests/hub_server.py``, through
``HF_ENDPOINT``) the calls ``huggingface_hub.HfFileSystem`` makes to list and read a repository; any
other call fails the tests. The notebooks run through the kit's runner in processes of their own,
so that ``HF_ENDPOINT`` and ``HF_TOKEN`` reach the kernel and Ray's workers as they would a user's.
The text notebook on a private repository is stepped through in a live kernel
(tests/test_live_kernel.py); the stand-in is the ``hub`` fixture of tests/conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import HUB_TOKEN, REPO, hub_env

LIST = """
import json, sys, time
from helpers import image_data, sample_images, storage
found = {}
for path in sys.argv[1:]:
    started = time.monotonic()
    try:
        files = storage.list_files(path)
        found[path] = {"files": files, "format": image_data.detect_format(path, storage.filesystem(path))}
    except Exception as exc:
        found[path] = {"error": f"{type(exc).__name__}: {exc}"}
    found[path]["seconds"] = time.monotonic() - started
print(json.dumps(found))
"""


def listed(url: str, *paths: str, token: str | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", LIST, *paths], env=hub_env(url, token), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hub_paths_are_listed_and_bad_ones_get_one_clear_message_each_within_seconds(hub):
    server, url, _ = hub
    repo = "hf://datasets/kit/blip3o-style"
    found = listed(url, repo, f"{repo}@main/data", "hf://datasets/kit/customers", "hf://datasets/kit/no-such-repo",
                   f"{repo}@no-such-revision", f"{repo}/no-such-folder")
    assert found[repo]["files"] == [f"{repo}/data/shard-000.tar", f"{repo}/data/shard-001.tar"]
    assert found[repo]["format"] == "webdataset" and len(found[f"{repo}@main/data"]["files"]) == 2
    assert "a private or gated one: set HF_TOKEN" in found["hf://datasets/kit/customers"]["error"]
    assert "no such dataset repository" in found["hf://datasets/kit/no-such-repo"]["error"]
    assert "no such revision" in found[f"{repo}@no-such-revision"]["error"]
    assert "nothing there" in found[f"{repo}/no-such-folder"]["error"]
    assert all(entry["seconds"] < 10 for entry in found.values())
    private = listed(url, "hf://datasets/kit/customers", token=HUB_TOKEN)["hf://datasets/kit/customers"]
    assert private["files"] == ["hf://datasets/kit/customers/customers.csv"]
    assert not server.unexpected and {"repo_info", "list_repo_tree"} <= server.calls


def run(notebook: str, out: Path, params: dict, env: dict) -> dict:
    cmd = [sys.executable, str(REPO / "scripts" / "run_notebooks.py"), "--only", notebook, "--out", str(out)]
    for name, value in params.items():
        cmd += ["-p", name, repr(value)]
    done = subprocess.run(cmd, env={**env, "LLM_KIT_CELL_TIMEOUT": "900"}, capture_output=True, text=True,
                          timeout=1500, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / notebook / "summary.json").read_text())


@pytest.mark.slow
def test_captioning_reads_webdataset_shards_from_the_hub_as_from_a_folder(hub, tmp_path):
    """The notebook on hf:// shards gives each image the id, verdict and reason the kit's own reader and
    preparation give the same shards in a folder (read here, without a model: the notebook's defaults)."""
    import ray

    from helpers import image_data

    server, url, root = hub
    from_hub = run("vlm_captioning", tmp_path / "hub", {"INPUT_PATH": "hf://datasets/kit/blip3o-style"}, hub_env(url))
    assert from_hub["images read"] == 24 and from_hub["all images accounted for"] and from_hub["engine errors"] == 0

    ray.init(address="local", num_cpus=2, log_to_driver=False)
    try:
        ds = image_data.read_images(str(root / "blip"), "webdataset", num_blocks=4)
        ds = ds.map_batches(image_data.prepare_batch, batch_format="pandas",
                            fn_kwargs={"max_tokens": 64, "keep_aspect": True, "max_pixels": 50_000_000})
        local = ds.select_columns([image_data.SOURCE, image_data.REJECT_REASON]).take_all()
    finally:
        ray.shutdown()
    assert len(local) == 24

    def table(name, columns):
        frame = pd.read_parquet(tmp_path / "hub" / "vlm_captioning" / name)
        return sorted(map(tuple, frame[columns].astype(str).values.tolist()))

    # Ids are the shard's path within INPUT_PATH plus the key: the same wherever the shards live,
    # and distinct although each shard numbers its samples from 000000.
    assert table("captions.parquet", ["source"]) == sorted((r["source"],) for r in local if not r["reject_reason"])
    assert table("errors.parquet", ["source", "reason"]) == \
           sorted((r["source"], r["reject_reason"]) for r in local if r["reject_reason"])
    assert not server.unexpected and "resolve" in server.calls
