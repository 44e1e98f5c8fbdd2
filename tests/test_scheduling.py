"""The scheduler wakes when a job finishes (not on a poll) and runs ready nodes depth-first."""

from __future__ import annotations

import logging
import time

from example_workflows.incrementation import build_workflow, make_chunks


def sea_events(caplog) -> list[dict]:
    """Placements and completions, in order, from Sea's log lines."""
    events = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith("[Sea] placed "):
            events.append({"event": "started", "key": message.split()[2]})
        elif message.startswith("[Sea] ") and "nodes done (" in message:
            events.append({"event": "done", "key": message.split("(")[1].split(")")[0]})
    return events


def test_loop_wakes_on_job_completion_not_on_poll(disk_dir, shm_dir):
    make_chunks(disk_dir / "data", 1, 0.1)
    wf = build_workflow(disk_dir / "data", 1, 6, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 600  # MultiProc would wait 10 min per round
    start = time.monotonic()
    wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}]}})
    assert time.monotonic() - start < 120, "the loop slept on the poll instead of waking on completion"
    assert (disk_dir / "out" / "incremented" / "chunk000.nii").is_file()


def test_depth_first_one_chain_finishes_before_the_last_starts(disk_dir, shm_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="sea")
    n_chunks, iterations = 6, 4
    make_chunks(disk_dir / "data", n_chunks, 0.5)
    wf = build_workflow(disk_dir / "data", n_chunks, iterations, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}]}})
    events = sea_events(caplog)
    assert len(events) == 2 * (n_chunks * (iterations + 2))
    first_sink_done = next(i for i, e in enumerate(events) if e["event"] == "done" and e["key"].endswith("/sink"))
    last_first_step = max(i for i, e in enumerate(events) if e["event"] == "started" and e["key"].endswith("/increment_1"))
    assert first_sink_done < last_first_step, "breadth-first: every chunk's first step ran before any chain finished"
    # depth-first keeps few chains alive at once: at most n_procs + 1 chunks have data on the tier
    alive, peak = set(), 0
    for e in events:
        chunk = e["key"].split("/")[1]
        if e["event"] == "started":
            alive.add(chunk)
        if e["event"] == "done" and e["key"].endswith("/sink"):
            alive.discard(chunk)
        peak = max(peak, len(alive))
    assert peak <= 3
