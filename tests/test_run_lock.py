"""One run per OUTPUT_DIR at a time (helpers.run_lock), with the lock held by real processes."""

import json
import os
import socket
import subprocess
import sys
import time

from helpers import output_dir, outputs, run_lock
from helpers.location import Location

#: A second process that prepares OUTPUT_DIR, as a second run would, and says what happened.
SECOND_RUN = """
import json, sys
from helpers import output_dir, run_lock
try:
    out = output_dir.prepare_output_dir(sys.argv[1])
    print(json.dumps({"ran": out.message}))
except run_lock.RunningElsewhereError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


def second_run(folder) -> dict:
    """What a second process preparing ``folder`` (a path or a bucket URI) ran into."""
    done = subprocess.run([sys.executable, "-c", SECOND_RUN, str(folder)], capture_output=True, text=True, timeout=120,
                          cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def an_earlier_run(folder) -> None:
    output_dir.claim_output_dir(folder)
    (folder / outputs.PARTS / "results").mkdir(parents=True)
    (folder / outputs.PARTS / "results" / "live.parquet").write_text("rows being written")


def test_a_second_run_stops_naming_the_live_one_and_moves_nothing(tmp_path):
    folder = tmp_path / "out"
    an_earlier_run(folder)
    live = output_dir.prepare_output_dir(str(folder))  # this process: the live run (its parts moved aside first)
    (folder / outputs.PARTS / "results").mkdir(parents=True)
    (folder / outputs.PARTS / "results" / "now.parquet").write_text("the live run's rows")
    found = second_run(folder)
    assert "refused" in found, found
    assert f"is in use by another run (run {live.lock.record['run'][:8]}" in found["refused"]
    assert f"on {socket.gethostname()} (process {os.getpid()})" in found["refused"]
    assert (folder / outputs.PARTS / "results" / "now.parquet").read_text() == "the live run's rows"
    live.lock.release()
    assert not (folder / run_lock.LOCK).exists()
    assert "ran" in second_run(folder)  # once the live run ended, the next one goes ahead


def test_a_lock_left_by_a_dead_process_or_not_refreshed_is_taken_over(tmp_path):
    folder = tmp_path / "out"
    an_earlier_run(folder)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = {"run": "dead", "host": socket.gethostname(), "pid": gone.pid, "started": time.time(),
              "heartbeat": time.time()}
    (folder / run_lock.LOCK).write_text(json.dumps(record))
    assert run_lock.holder(Location.of(folder)) == ""  # its process is gone from this machine: at once
    elsewhere = {**record, "host": "another-machine", "pid": 1234}
    (folder / run_lock.LOCK).write_text(json.dumps(elsewhere))
    assert run_lock.holder(Location.of(folder)).startswith("run dead, started ")  # another machine's: live ...
    stale = {**elsewhere, "heartbeat": time.time() - run_lock.STALE_S - 1}
    (folder / run_lock.LOCK).write_text(json.dumps(stale))
    assert run_lock.holder(Location.of(folder)) == ""  # ... until it was not refreshed for STALE_S
    assert "ran" in second_run(folder)


def test_the_live_run_keeps_its_lock_fresh_and_a_rerun_in_the_same_process_takes_it_over(tmp_path):
    folder = tmp_path / "out"
    first = output_dir.prepare_output_dir(str(folder))
    seen = first.lock.record["heartbeat"]
    with first.lock.keep_fresh(every_s=0.2):
        time.sleep(1)
    assert json.loads((folder / run_lock.LOCK).read_text())["heartbeat"] > seen
    again = output_dir.prepare_output_dir(str(folder))  # the same kernel runs the cell again
    assert again.lock.record["run"] != first.lock.record["run"]
    first.lock.release()  # no longer the first run's: left to the second
    assert json.loads((folder / run_lock.LOCK).read_text())["run"] == again.lock.record["run"]
