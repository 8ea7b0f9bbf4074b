"""Nothing found always says what was looked at: flare-diagnose on a healthy job names the ranks,
the steps analysed, the window, the detectors that ran and those skipped with their reasons
(text), and lists every registered detector once under "lookedAt" (--json); flared's
/api/v1/jobs/{job}/diagnoses carries the same "lookedAt" object."""

import json
import os
import re
import subprocess
import time

import pytest
from flared_process import Flared

RANKS = 4
STEPS = 10
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def registered_detectors():
    """The detector names of registry.cc's FLARE_DETECTORS (X(GpuSlow) runs as "gpu_slow")."""
    text = open(os.path.join(ROOT, "src", "engine", "diagnosis", "registry.cc")).read()
    block = text[text.index("#define FLARE_DETECTORS(X)"):text.index("namespace flare::engine")]
    names = re.findall(r"X\((\w+)\)", block)
    return [re.sub(r"(?<!^)([A-Z])", r"_\1", n).lower() for n in names]


def sim_cmd(build_dir):
    return [os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS), "--steps",
            str(STEPS), "--quiet"]


def run_job(build_dir, out):
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="job")
    res = subprocess.run(sim_cmd(build_dir), env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def flare_diagnose(build_dir, out, *extra):
    return subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input", str(out),
                           *extra], capture_output=True, text=True, timeout=120)


def check_looked_at(seen, ranks, sampled=False):
    """sampled: the job ran in summary mode under the default timing budget, which may sample
    steps out (FLARE_TIMING_BUDGET_PCT); else every step was timed (raw mode)."""
    names = [d["name"] for d in seen["detectors"]]
    assert sorted(names) == sorted(registered_detectors()), names  # each exactly once
    assert seen["ranks"] == ranks
    assert len(seen["steps"]) == 2 and 1 <= seen["steps"][0] <= seen["steps"][1], seen
    span = seen["steps"][1] - seen["steps"][0] + 1
    if sampled:
        # Every rank-step is looked at, measured or sampled out, and the text says how many.
        looked = seen["stepsMeasured"] + seen["stepsSampledOut"]
        assert 0 < seen["stepsMeasured"] and looked <= ranks * span, seen
        assert (seen["stepsSampledOut"] > 0) == ("sampled out by step sampling" in seen["text"]), \
            seen
    else:
        # Every step timed: rank-steps measured, none sampled out.
        assert seen["stepsSampledOut"] == 0 and 0 < seen["stepsMeasured"] <= ranks * span, seen
    for d in seen["detectors"]:
        assert d["ran"] == (d["skipped"] == ""), d
        assert d["ran"] == (d["window"] != ""), d
        assert d["diagnoses"] >= 0
    return {d["name"]: d for d in seen["detectors"]}


def test_a_healthy_job_says_what_flare_diagnose_looked_at(build_dir, tmp_path):
    run_job(build_dir, tmp_path)
    res = flare_diagnose(build_dir, tmp_path)
    assert res.returncode == 0, (res.stdout, res.stderr)
    line = res.stdout.strip()
    m = re.fullmatch(r"no anomaly found in 4 ranks, steps 1-(\d+); window: all steps; "
                     r"(\d+) detectors ran \(([a-z_, ]+)\); skipped: (.+)", line)
    assert m, line
    assert 1 < int(m.group(1)) < STEPS
    ran = m.group(3).split(", ")
    assert int(m.group(2)) == len(ran) and "gpu_slow" in ran and "link_slow" in ran, line
    skipped = m.group(4)
    assert "issue_latency_regression (needs a baseline or healthy history)" in skipped, line
    assert "gpu_slow_from_summaries (no kernel summaries)" in skipped, line

    res = flare_diagnose(build_dir, tmp_path, "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["diagnoses"] == []
    by_name = check_looked_at(got["lookedAt"], RANKS)
    assert got["lookedAt"]["steps"] == [1, int(m.group(1))]
    assert [n for n, d in by_name.items() if d["ran"]] == ran
    assert by_name["issue_latency_regression"]["skipped"] == "needs a baseline or healthy history"
    assert all(d["window"] == "all steps" for d in by_name.values() if d["ran"])


def test_flared_diagnoses_carry_what_was_looked_at(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    daemon = Flared(build_dir, tmp_path, "--diagnose-interval-s", "1")
    try:
        env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / "spool"))
        res = subprocess.run(
            [os.path.join(build_dir, "bin", "flare"), "run", "--daemon",
             "127.0.0.1:%d" % daemon.grpc, "--job-id", "healthy", "--quiet", "--",
             *sim_cmd(build_dir)], capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
        deadline = time.monotonic() + 15
        while True:
            got = daemon.json("/api/v1/jobs/healthy/diagnoses")
            if got["lookedAt"]["ranks"] == RANKS or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "diagnoses" in got
        by_name = check_looked_at(got["lookedAt"], RANKS, sampled=True)
        assert by_name["gpu_slow"]["ran"], by_name
        # A job flared does not know: nothing was looked at.
        unknown = daemon.json("/api/v1/jobs/nosuchjob/diagnoses")
        assert unknown == {"diagnoses": [], "lookedAt": {
            "ranks": 0, "steps": [], "stepsMeasured": 0, "stepsSampledOut": 0, "detectors": [],
            "text": "0 ranks, no complete step after the warm-up; 0 detectors ran"}}
    finally:
        daemon.stop(kill=True)
