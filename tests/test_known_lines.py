"""Ray's one known red line is left out of a run's standard error; every other line comes through."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import known_lines

RAY_LINE = (b"[2026-11-27 07:58:51,620 E 11778 11778] core_worker.cc:2465: Actor with class name: "
            b"'MapWorker(MapBatches(ChatTemplateUDF))' and ID: '32ee5d3da290313aaf49838901000000' has constructor "
            b"arguments in the object store and max_restarts > 0. If the arguments in the object store go out of "
            b"scope or are lost, the actor restart will fail. See https://github.com/ray-project/ray/issues/53727 "
            b"for more details.\n")


def test_only_rays_known_line_is_left_out_and_every_other_line_written_from_c_comes_in_order(capfd):
    with known_lines.without_known_lines() as dropped:
        os.write(2, b"a real error from C\n")
        os.write(2, RAY_LINE)
        os.write(2, b"[2026-11-27 07:58:52,000 E 1 1] core_worker.cc:99: another of Ray's errors\n")
        os.write(2, b"a partial line ")  # goes out as it comes, not when its end does
        os.write(2, b"ended later\n")
        os.write(2, b"[a line that starts like Ray's, in two writes")
        os.write(2, b"]\n")
        os.write(2, b"no newline at the end")
    os.write(2, b"\nafter\n")
    err = capfd.readouterr().err
    assert err == ("a real error from C\n[2026-11-27 07:58:52,000 E 1 1] core_worker.cc:99: another of Ray's errors\n"
                   "a partial line ended later\n[a line that starts like Ray's, in two writes]\nno newline at the end"
                   "\nafter\n")
    assert dropped == [RAY_LINE.rstrip(b"\n")]


@pytest.mark.slow
def test_rays_own_line_for_an_actor_with_arguments_in_the_object_store_is_left_out():
    """Ray 2.60 itself, in a process of its own (it logs the line once per process): an actor with
    restarts on and an argument in the object store, as Ray Data starts its stages. The line Ray logs
    is the one left out, and a C-level error written meanwhile still arrives."""
    script = textwrap.dedent("""
        import os, ray
        from helpers import known_lines

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, address="local")
        with known_lines.without_known_lines() as dropped:
            @ray.remote(num_cpus=0, max_restarts=-1)
            class Stage:
                def __init__(self, code):
                    self.code = code

                def ping(self):
                    return len(self.code)

            stage = Stage.remote(ray.put(b"x" * 10))  # an argument by reference, as Ray Data passes its stages'
            assert ray.get(stage.ping.remote()) == 10
            os.write(2, b"an unrelated error from C\\n")
        ray.shutdown()
        print(f"left out: {[line.decode() for line in dropped]}")
    """)
    root = Path(known_lines.__file__).resolve().parents[1]  # where `helpers` is imported from
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "has constructor arguments in the object store and max_restarts > 0" in done.stdout  # Ray logged it
    assert "has constructor arguments" not in done.stderr, done.stderr  # and it was left out
    assert "an unrelated error from C\n" in done.stderr
