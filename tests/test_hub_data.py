"""Data on the Hugging Face Hub, read as Ray's tutorials read it: ``INPUT_PATH="hf://datasets/..."``.

Nothing here can reach the Hub, so a stand-in answers on 127.0.0.1 (``tests/hub_server.py``, through
``HF_ENDPOINT``) the calls ``huggingface_hub.HfFileSystem`` makes to list and read a repository; any
other call fails the tests. The notebooks run through the kit's runner in processes of their own,
so that ``HF_ENDPOINT`` and ``HF_TOKEN`` reach the kernel and Ray's workers as they would a user's.
The notebooks on the Hub are stepped through in a live kernel (tests/test_live_kernel.py): the text
notebook on a private repository's CSV, the captioning notebook on BLIP3o-style shards, interrupted
and resumed. The stand-in is the ``hub`` fixture of tests/conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import HUB_TOKEN, REPO, hub_env

LIST = """
import json, sys, time
from helpers import images, storage
found = {}
for path in sys.argv[1:]:
    started = time.monotonic()
    try:
        files = storage.list_files(path)
        found[path] = {"files": files, "format": images.detect_format(files)}
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
