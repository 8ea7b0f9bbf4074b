"""Evidence that passed its test (issue 21, item 4): a step-time change point
(step_time_change) or a jitter window (step_time_jitter) opens a diagnosis, and narrows the
window its detector reads, only when it passes its significance test (docs/metrics.md). Host
noise does not: the sim's own noise (FLARE_SIM_SEED) and a CPU hog, a busy loop pinned beside
the job on one of the machine's CPUs. An injected fail-slow still gives its change point at its
onset.

A healthy run raises no diagnosis at all, so its evidence cannot be read: the runs here carry a
fault that holds from the first step (rank 3's GPU at 80% clock), whose diagnosis must cite no
change point and no jitter, since the step time neither moved nor spiked."""

import multiprocessing
import os
import subprocess

import pytest

from offline_diagnose import diagnose

RANKS = 8


def busy_loop(cpu):
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        pass
    while True:
        pass


@pytest.fixture
def cpu_hog():
    """A stress-like busy loop pinned to the last CPU, for the length of the test."""
    cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    proc = multiprocessing.Process(target=busy_loop, args=(cpu,), daemon=True)
    proc.start()
    yield proc
    proc.terminate()
    proc.join(timeout=10)


def run_job(build_dir, out, env, steps=20):
    full = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
                FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="job")
    full.update(env)
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS),
                          "--steps", str(steps), "--layers", "3", "--hidden", "4096", "--tp", "2",
                          "--quiet"], env=full, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


WINDOW_METRICS = {"step_time_change", "step_time_jitter"}
# The hog is real host contention: the rank whose process shares its CPU may be named for it
# (its GPU runs dry while its host waits for the CPU). No other diagnosis is right here.
HOST_KINDS = {"issue_stall", "slow_steps", "cpu_contention"}


def the_gpu_slow(found):
    """The one gpu_slow diagnosis, on rank 3; anything else found names the host's contention."""
    gpu = [d for d in found if d["kind"] == "gpu_slow"]
    assert len(gpu) == 1 and gpu[0]["ranks"] == [3], found
    assert all(d["kind"] in HOST_KINDS for d in found if d["kind"] != "gpu_slow"), found
    return gpu[0]


@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_steady_fault_under_a_cpu_hog_cites_no_change_point_or_jitter(build_dir, tmp_path,
                                                                     cpu_hog, seed):
    run_job(build_dir, tmp_path, {"FLARE_SIM_CLOCK_FACTOR": "3:0.8", "FLARE_SIM_SEED": seed},
            steps=30)
    found = diagnose(build_dir, tmp_path)
    the_gpu_slow(found)
    cited = [e for d in found for e in d["evidence"] if e["metric"] in WINDOW_METRICS]
    assert cited == [], cited


@pytest.mark.parametrize("seed", ["1", "2"])
def test_fail_slow_under_a_cpu_hog_is_cited_at_its_onset(build_dir, tmp_path, cpu_hog, seed):
    # 30 steps: 16 since the onset (with 6, two host hiccups can hide the shift from the
    # change-point segmentation itself under the hog, before any test of ours). A 70% clock: the
    # job's step rises about 15%, above 3 robust SDs of the hog's step noise (about 4.5% of the
    # step); an 80% clock (+8..11%) is at that floor, and 12 of 50 runs cited no change point.
    run_job(build_dir, tmp_path, {"FLARE_SIM_CLOCK_FACTOR": "3:0.7:14", "FLARE_SIM_SEED": seed},
            steps=30)
    found = diagnose(build_dir, tmp_path)
    d = the_gpu_slow(found)
    change = d["evidence"][0]
    assert change["metric"] == "step_time_change", d["evidence"]
    step = int(change["text"].split("at step ")[1].split()[0].rstrip(":,"))
    assert abs(step - 14) <= 2, change["text"]
