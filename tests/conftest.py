"""Shared fixtures: repository paths and loading the repo's scripts as modules."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import io
import os
import tarfile
import threading
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]

# A notebook cell that runs longer than this fails its test (scripts/run_notebooks.py): a stalled run
# fails in minutes instead of holding CI. The longest cell here, a pipeline on 309 rows, takes ~2 min.
os.environ.setdefault("LLM_KIT_CELL_TIMEOUT", "900")


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """Import ``<folder>/<name>.py`` as a module (scripts and benchmarks are not packages; as when run,
    one imports another beside it)."""
    if str(REPO / folder) not in sys.path:
        sys.path.insert(0, str(REPO / folder))
    spec = importlib.util.spec_from_file_location(f"kit_{folder}_{name}", REPO / folder / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


#: The test that runs each generated project's own suite (tests/test_templates.py).
PROJECT_SUITES = "tests/test_templates.py::test_a_project_passes_its_whole_suite_exactly_as_generated"
RUN_IN_PROJECTS = pytest.StashKey[tuple]()  # (how many items, which use cases)


def project_suites_in(items) -> set[str]:
    """The use cases whose generated project's suite runs among ``items`` (a session's chosen tests)."""
    return {item.callspec.params["use_case"] for item in items
            if item.nodeid.startswith(PROJECT_SUITES) and hasattr(item, "callspec")}


@pytest.hookimpl(trylast=True)  # after -m and -k chose what runs
def pytest_collection_modifyitems(config, items):
    """Run each test once: where this session runs a generated project's suite, the kit's files that
    the project runs as they are (its notebook under nbval, the kit's unit tests it carries, each
    byte for byte against the same helpers) run there, not here as well."""
    use_cases = project_suites_in(items)
    if not use_cases:
        return
    new_project = load_script("new_project")
    inside = {path.resolve() for use_case in use_cases for path in new_project.carried(use_case)}
    there = [item for item in items if item.path.resolve() in inside]
    if there:
        items[:] = [item for item in items if item not in there]
        config.hook.pytest_deselected(items=there)
        config.stash[RUN_IN_PROJECTS] = (len(there), sorted(use_cases))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if RUN_IN_PROJECTS in config.stash:
        count, use_cases = config.stash[RUN_IN_PROJECTS]
        terminalreporter.write_line(f"{count} of the kit's tests and notebook cells run inside the generated "
                                    f"{' and '.join(use_cases)} projects' suites (the same files), not a second time here")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The offline SmolLM2 folder (converted once, then cached)."""
    from helpers.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for a module's Ray Data runs: a start per test costs seconds on 2 cores.
    Each run builds its own dataset and stages; Ray Data ends a run's actors with the run."""
    import ray

    # Ray's workers import the functions a test hands them from the test's own module.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, address="local")
    ray.data.DataContext.get_current().use_datasource_v2 = False  # as cluster.start sets it
    yield ray
    ray.shutdown()


def notebook_cells(name: str) -> list:
    """The code cells of ``notebooks/NAME.ipynb``."""
    import nbformat

    return [c for c in nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4).cells if c.cell_type == "code"]


def run_cells(name: str, upto: str, **parameters) -> dict:
    """Run ``name``'s code cells in this process, its parameters cell followed by ``parameters`` (as
    papermill injects them), up to and including the first cell whose source holds ``upto``; return
    the namespace."""
    namespace: dict = {}
    for cell in notebook_cells(name):
        exec(compile(cell.source, f"<{name}>", "exec"), namespace)
        if "parameters" in cell.metadata.get("tags", []):
            namespace.update(parameters)
        if upto in cell.source:
            return namespace
    raise AssertionError(f"no cell of {name} holds {upto!r}")


def parameterised_notebook(path: Path, parameters: str, *code: str) -> Path:
    """Write a small notebook to ``path``: a cell tagged ``parameters`` with ``parameters``, then
    one code cell per ``code``; for tests of the runner."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, *(nbformat.v4.new_code_cell(source) for source in code)]
    nbformat.write(nb, path)
    return path


def tar_bytes(members: dict[str, bytes]) -> bytes:
    """A tar archive (a webdataset shard) of ``members`` (name -> bytes), in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def sample_files() -> dict[str, bytes]:
    """The bundled sample images, ``{key: bytes}``, as ``scripts/make_sample_images.py`` wrote them."""
    from helpers import images

    with tarfile.open(images.sample_path()) as tar:
        return {m.name.removesuffix(".jpg"): tar.extractfile(m).read() for m in tar}


#: The sample's real photos (the rest are awkward variants and broken files).
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field")


BUCKET = "kit-test"


def good_parquet_images(folder: Path, layout: str) -> int:
    """Good images only, as parquet without an id column, in one of the layouts users bring: Hugging
    Face ``{bytes, path}`` rows with the bytes in them, the same with the bytes left out and each
    image's path (``datasets`` writing a local dataset of image files kept elsewhere), or a plain folder
    of image bytes in several files."""
    import pandas as pd

    files = {k: v for k, v in sample_files().items() if k in SAMPLE_PHOTOS}
    folder.mkdir(parents=True)
    if layout == "hf-bytes":
        pd.DataFrame({"image": [{"bytes": b, "path": f"{k}.jpg"} for k, b in files.items()]}).to_parquet(
            folder / "train-00000-of-00001.parquet")
    elif layout == "hf-paths":
        images = folder.parent / "image-files"
        images.mkdir()
        for key, raw in files.items():
            (images / f"{key}.jpg").write_bytes(raw)
        pd.DataFrame({"image": [{"bytes": None, "path": str(images / f"{k}.jpg")} for k in files]}).to_parquet(
            folder / "train.parquet")
    else:  # plain: a bytes column, rows spread over three files
        items = list(files.items())
        for n in range(3):
            pd.DataFrame({"jpg": [b for _, b in items[n::3]], "name": [k for k, _ in items[n::3]]}).to_parquet(
                folder / f"part-{n}.parquet")
    return len(files)


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 and a bucket; the S3 variables set for the module's tests."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "kit-test",
           "AWS_SECRET_ACCESS_KEY": "kit-test-secret", "AWS_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    client.create_bucket(Bucket=BUCKET)
    yield client
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def http_folder(tmp_path):
    """A plain HTTP server on 127.0.0.1 serving ``tmp_path / "www"``; yields the folder and its URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


#: The private repository's token (``hub``): no file a run writes may hold it.
HUB_TOKEN = "hf_kit_private_token_0123"


def blip_shards() -> dict[str, dict[str, str]]:
    """The stand-in Hub's BLIP3o-style shards (``hub``): shard -> {key: the sample file it holds}. Each
    shard holds the kit's whole corpus of awkward and broken images under keys from 000000, as each
    shard of BLIP3o numbers its own samples; the second also a sample whose image is missing."""
    names = sorted(sample_files())
    shards = {f"shard-{n:03d}.tar": {f"{i:06d}": name for i, name in enumerate(names)} for n in range(2)}
    shards["shard-001.tar"][f"{len(names):06d}"] = "no image field"
    return shards


def blip_samples() -> dict[str, str]:
    """:func:`blip_shards` by the id the kit gives each sample read from the repository's root
    (``data/<shard>/<key>``: the shard's path within ``INPUT_PATH`` plus the key) -> the file it holds."""
    return {f"data/{shard}/{key}": name for shard, samples in blip_shards().items() for key, name in samples.items()}


def blip_shard_bytes() -> dict[str, bytes]:
    """:func:`blip_shards` as tar files (name -> bytes): ``<key>.jpg`` and a ``<key>.txt`` caption each."""
    files = sample_files()
    shards = {}
    for shard, samples in blip_shards().items():
        members = {}
        for key, name in samples.items():
            members.update({f"{key}.jpg": files[name]} if name in files else {})
            members[f"{key}.txt"] = b"a caption" if name in files else b"a caption whose image is missing"
        shards[shard] = tar_bytes(members)
    return shards


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in Hub with a BLIP3o-style repository (:func:`blip_shards` in ``data/``) and a
    private one with a CSV."""
    import pandas as pd
    from hub_server import HubServer, Repo

    root = tmp_path_factory.mktemp("hub")
    (root / "blip" / "data").mkdir(parents=True)
    for shard, data in blip_shard_bytes().items():
        (root / "blip" / "data" / shard).write_bytes(data)
    (root / "csv").mkdir()
    # The sample with two columns named as fields Ray Data LLM's stages write into each row: yours are kept.
    sample = pd.read_csv(REPO / "helpers" / "sample_data" / "customers.csv", dtype=str, keep_default_na=False)
    sample.assign(prompt="note " + sample["Customer Id"], messages=sample["City"]).to_csv(root / "csv" / "customers.csv", index=False)
    server = HubServer({"kit/blip3o-style": Repo({"main": root / "blip"}),
                        "kit/customers": Repo({"main": root / "csv"}, private_token=HUB_TOKEN)})
    url = server.start()
    yield server, url, root
    server.stop()


def hub_env(url: str, token: str | None = None) -> dict[str, str]:
    """This process's environment for a process that reads from the stand-in Hub at ``url``."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN", "RAY_ADDRESS")}
    env["HF_ENDPOINT"] = url
    if token:
        env["HF_TOKEN"] = token
    return env
