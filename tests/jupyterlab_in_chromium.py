"""The text notebook stepped through in JupyterLab in a real browser (headless Chromium), once, by
hand: not part of `make test` (it needs Debian's `chromium`; the live-kernel tests in
tests/test_live_kernel.py cover the same steps in CI). Run it as

    .venv/bin/python tests/jupyterlab_in_chromium.py /tmp/lab-pass

It copies notebooks/ to that folder (JupyterLab saves outputs into the notebook it shows), sets
LIMIT and OUTPUT_DIR there, starts JupyterLab with its app exposed to the page, and drives it over
Chrome's DevTools protocol: run all; re-run the run cell after the summary. It saves screenshots of
the run cell while it runs and when it is done, prints what the run cell shows, and checks it (no
stderr, which JupyterLab shows on a red background, in the clean run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websocket

REPO = Path(__file__).resolve().parents[1]
LAB_PORT, DEBUG_PORT, TOKEN = 8899, 9333, "kit-pass"


class Page:
    """One browser tab over the DevTools protocol."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=120, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


def wait(condition, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what} did not happen within {timeout} s")


# The notebook's panel in JupyterLab's main area (a headless page has no focus to make it "current").
NOTEBOOK = ("Array.from(jupyterapp.shell.widgets('main')).find(w => w.context && "
            "w.context.path.endsWith('text_classification.ipynb'))")
RUN_CELL = f"{NOTEBOOK}.content.widgets.findIndex(c => c.model.sharedModel.getSource().includes('pipeline.run('))"


def cell_text(page: Page, index_js: str) -> str:
    """What cell ``index_js`` shows: its outputs' text (streams, plain-text displays, errors), read from
    the notebook's model, since JupyterLab renders only the cells in view."""
    return page.js(f"(() => {{ const c = {NOTEBOOK}.content.widgets[{index_js}]; if (!c.model.outputs) return ''; "
                   "return c.model.outputs.toJSON().map(o => o.text ? [].concat(o.text).join('') : "
                   "(o.data && o.data['text/plain']) ? [].concat(o.data['text/plain']).join('') : "
                   "o.ename ? o.ename + ': ' + o.evalue + '\\n' + [].concat(o.traceback || []).join('\\n') : '')"
                   ".join('\\n'); })()")


def stderr_text(page: Page, index_js: str) -> str:
    """The stderr streams of cell ``index_js``: what JupyterLab shows on a red background."""
    return page.js(f"(() => {{ const c = {NOTEBOOK}.content.widgets[{index_js}]; if (!c.model.outputs) return ''; "
                   "return c.model.outputs.toJSON().filter(o => o.output_type === 'stream' && o.name === 'stderr')"
                   ".map(o => [].concat(o.text).join('')).join(''); })()")


def show(page: Page, index_js: str) -> None:
    """Scroll cell ``index_js`` to the top of the view, as a person would, before a screenshot."""
    page.js(f"{NOTEBOOK}.content.scrollToItem({index_js}, 'start')")
    time.sleep(1.5)


def main(folder: str) -> int:
    work = Path(folder)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for notebook in (REPO / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, work)
    nb_path = work / "text_classification.ipynb"
    nb = json.loads(nb_path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = "".join(cell["source"]).replace("LIMIT = None", "LIMIT = 40")
    nb_path.write_text(json.dumps(nb, indent=1))
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={LAB_PORT}",
                            f"--IdentityProvider.token={TOKEN}", "--LabApp.expose_app_in_browser=True", "--allow-root",
                            "--ServerApp.root_dir=" + str(work)], cwd=work,
                           stdout=open(work / "lab.log", "w"), stderr=subprocess.STDOUT)
    browser = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                                f"--remote-debugging-port={DEBUG_PORT}", "--window-size=1500,1800",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait(lambda: _get(f"http://127.0.0.1:{LAB_PORT}/api/status?token={TOKEN}"), 120, "JupyterLab's start")
        tabs = wait(lambda: _get(f"http://127.0.0.1:{DEBUG_PORT}/json/list"), 60, "Chromium's start")
        page = Page(next(t for t in json.loads(tabs) if t["type"] == "page")["webSocketDebuggerUrl"])
        page.call("Page.enable")
        page.call("Emulation.setFocusEmulationEnabled", enabled=True)  # a headless tab has no focus otherwise
        page.call("Page.navigate", url=f"http://127.0.0.1:{LAB_PORT}/lab/tree/text_classification.ipynb?token={TOKEN}")
        wait(lambda: page.js(f"!!(window.jupyterapp && {NOTEBOOK} && {NOTEBOOK}.sessionContext && "
                             f"{NOTEBOOK}.sessionContext.session && {NOTEBOOK}.sessionContext.session.kernel)"),
             180, "the notebook and its kernel")
        wait(lambda: page.js(f"{NOTEBOOK}.sessionContext.session.kernel.status === 'idle'"), 120, "an idle kernel")
        page.js(f"jupyterapp.shell.activateById({NOTEBOOK}.id); {NOTEBOOK}.content.node.focus()")
        wait(lambda: page.js(f"jupyterapp.shell.currentWidget === {NOTEBOOK}"), 30, "the notebook as the current tab")
        run_cell = page.js(RUN_CELL)
        page.js("jupyterapp.commands.execute('notebook:run-all-cells')")

        def run_cell_busy_with_results():
            text = cell_text(page, run_cell)
            return "rows written" in text or "pipeline finished" in text

        wait(run_cell_busy_with_results, 900, "the run cell's first results", every=0.5)
        show(page, run_cell)
        page.screenshot(work / "run_cell_running.png")
        wait(lambda: page.js(f"{NOTEBOOK}.content.widgets.every(c => c.model.type !== 'code' || "
                             f"c.model.executionCount) && {NOTEBOOK}.sessionContext.session.kernel.status === 'idle'"),
             900, "run all")
        show(page, run_cell)
        page.screenshot(work / "run_cell_done.png")
        shown, red = cell_text(page, run_cell), stderr_text(page, run_cell)
        print("---- the run cell shows ----\n" + shown)
        print(f"---- on a red background (stderr) ----\n{red}")
        checked = cell_text(page, f"{NOTEBOOK}.content.widgets.length - 1")
        print("---- the checked cell shows ----\n" + checked)
        # Re-run the run cell after the summary cell: one sentence, nothing touched.
        before = sorted(str(p) for p in (work / "results").rglob("*"))
        page.js(f"{NOTEBOOK}.content.activeCellIndex = {run_cell}")
        page.js("jupyterapp.commands.execute('notebook:run-cell')")
        wait(lambda: "NotReadyError" in cell_text(page, run_cell), 120, "the re-run's message")
        show(page, run_cell)
        page.screenshot(work / "run_cell_rerun.png")
        rerun = cell_text(page, run_cell)
        print("---- the re-run run cell shows ----\n" + rerun)
        assert "logging_progress" not in shown and "Total Progress" not in shown, shown
        assert "rows written" in shown and "pipeline finished" in shown and len(shown) < 4000
        assert red == "", red  # a clean run shows no red (Ray's known core_worker.cc line left out)
        assert "all rows accounted for:      True" in checked
        assert "'Start Ray and the engines' cell" in rerun and len(rerun.splitlines()) <= 3, rerun
        assert sorted(str(p) for p in (work / "results").rglob("*")) == before
        print(f"screenshots: {sorted(str(p) for p in work.glob('*.png'))}")
        return 0
    finally:
        browser.terminate()
        lab.terminate()
        subprocess.run(["pkill", "-f", f"ray.*{work}"], check=False)


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.read().decode()
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/lab-pass"))
