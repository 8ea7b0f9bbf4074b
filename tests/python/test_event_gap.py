"""FLARE_EVENT_GAP_CORRECTION (src/timing/timing.h, TracerOptions::correct_event_gap): a CUDA
event pair reads an op longer than it ran by two gaps between commands queued back to back (the
start event runs one gap before the op's first GPU work, the end event one after its last; ~1.3 us
each on an H200, docs/benchmarks.md). On the simulated stack with that gap set
(FLARE_SIM_COMMAND_GAP_US), against the durations the simulated GPU ran (FLARE_SIM_KERNEL_LOG):

- the hook measures the gap from the ops themselves and says so once;
- corrected, each kernel's median duration is the truth's; uncorrected, two gaps longer;
- with 1-in-N sampling the untimed launches between timed ops do not enter the estimate, nor do
  the application's own event records between two ops (two gaps, not one)."""
import collections
import json
import os
import re
import statistics
import subprocess

import pytest

from test_sample_kernels import kernel_key

GAP_US = 10
# Two gaps of 10 us are resolved against the elapsed-time resolution (cudaEventElapsedTime's
# float milliseconds from a reference up to 10 s old: about 1 us) and the simulated kernels.
TOL_NS = 3_000


def run(sim_train, build_dir, tmp_path, tag, env_extra):
    spool, log = tmp_path / tag, tmp_path / (tag + "-log")
    log.mkdir()
    env = {"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
           "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": tag, "FLARE_MODE": "raw",
           "FLARE_SIM_KERNEL_LOG": str(log), "FLARE_SIM_NOISE": "0",
           "FLARE_SIM_COMMAND_GAP_US": str(GAP_US)}
    env.update(env_extra)
    res = sim_train("--ranks", 1, "--steps", 40, "--layers", 2, "--hidden", 2048, "--seq", 1024,
                    env=env)
    assert res.returncode == 0, res.stderr
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    flare = collections.defaultdict(list)
    records = [json.loads(line) for line in exp.stdout.splitlines()]
    # No correction until the first window of readings is full (the first step or so): from the
    # third step on.
    steps = sorted(r["issue_ns"] for r in records if r["name"] == "flare_step")
    assert len(steps) >= 30, len(steps)
    for r in records:
        if r["kind"] in ("kernel", "attention") and r["issue_ns"] > steps[2]:
            flare[kernel_key(r["name"])].append(r["duration_ns"])
    truth = collections.defaultdict(list)
    for path in log.iterdir():
        with open(path) as f:
            for line in f:
                _, name, _, dur = line.rstrip("\n").split("\t")
                truth[kernel_key(name)].append(int(dur))
    both = sorted(k for k in flare if k in truth)
    assert len(both) >= 3, (sorted(flare), sorted(truth))
    return {k: (statistics.median(flare[k]), statistics.median(truth[k])) for k in both}, res


def test_the_gap_is_measured_and_taken_off_each_side(sim_train, build_dir, tmp_path):
    medians, res = run(sim_train, build_dir, tmp_path, "corrected", {})
    m = re.search(r"two CUDA events queued back to back run (\d+) ns apart", res.stderr)
    assert m, res.stderr[-2000:]
    assert abs(int(m.group(1)) - GAP_US * 1000) <= 1_000, m.group(0)
    for key, (flare, truth) in medians.items():
        assert abs(flare - truth) <= 0.01 * truth + TOL_NS, (key, flare, truth)


def test_uncorrected_pairs_read_two_gaps_long(sim_train, build_dir, tmp_path):
    medians, res = run(sim_train, build_dir, tmp_path, "raw-pairs",
                       {"FLARE_EVENT_GAP_CORRECTION": "0"})
    assert "queued back to back" not in res.stderr
    for key, (flare, truth) in medians.items():
        assert abs(flare - truth - 2 * GAP_US * 1000) <= 0.01 * truth + TOL_NS, (key, flare, truth)


def test_untimed_launches_stay_out_of_the_estimate(sim_train, build_dir, tmp_path):
    # One launch in 8 timed: most timed ops follow untimed ones, whose GPU time would read as a
    # gap of tens of microseconds if they were taken as back-to-back pairs.
    medians, res = run(sim_train, build_dir, tmp_path, "sampled",
                       {"FLARE_SAMPLE_KERNELS": "8", "FLARE_SAMPLE_CALLS": "8"})
    m = re.search(r"run (\d+) ns apart", res.stderr)
    assert m and abs(int(m.group(1)) - GAP_US * 1000) <= 1_000, res.stderr[-2000:]
    for key, (flare, truth) in medians.items():
        assert abs(flare - truth) <= 0.01 * truth + TOL_NS, (key, flare, truth)


def test_the_applications_own_events_stay_out_of_the_estimate(build_dir, tmp_path):
    # hook_probe events: kernels of 50 us, an event of the application's own recorded after
    # three in four of them. Taken as readings those pairs (end event, its event, start event)
    # would read two gaps and set the estimate to 20 us; the event records are intercepted and
    # the ops after them give no reading.
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update({"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
                "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": "events", "FLARE_MODE": "raw",
                "FLARE_SIM_COMMAND_GAP_US": str(GAP_US)})
    proc = subprocess.run([os.path.join(build_dir, "bin", "hook_probe"), "events", "1024"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"run (\d+) ns apart", proc.stderr)
    assert m and abs(int(m.group(1)) - GAP_US * 1000) <= 1_000, proc.stderr[-2000:]
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    durations = [r["duration_ns"] for r in map(json.loads, exp.stdout.splitlines())
                 if r["kind"] == "kernel"]
    assert len(durations) == 1024
    # The last half: after the first window of readings.
    assert abs(statistics.median(durations[512:]) - 50_000) <= TOL_NS


def test_a_gap_never_measured_is_said_once(probe):
    # 20 launches: fewer readings than a window takes; the rank says its durations went
    # uncorrected, once, when timing ends.
    proc, _ = probe("launches", 20, env={"FLARE_MODE": "raw",
                                         "FLARE_SIM_COMMAND_GAP_US": str(GAP_US)})
    assert proc.returncode == 0, proc.stderr
    said = re.findall(r"device 0: the event-pair gap was never measured \((\d+) of the 64",
                      proc.stderr)
    assert len(said) == 1 and int(said[0]) < 64, proc.stderr[-2000:]
