"""Culprit versus victims (issue 21, item 2), end to end on the simulated stack with its noise
on: 8 ranks, tensor parallel 2 x data parallel 4 or data parallel 8. The sim knows the truth (the
rank it injected the fault into); every other rank the fault slows must be listed as a victim,
never as a culprit.

- A slow link on one rank slows its TP pair and its DP group of four: flare-diagnose names that
  rank alone (`ranks`) and its partners as `victims`, also when the fault is mild enough that one
  of its two communicators stays under link_min_effect.
- A compute hang on one rank: flared's hang analysis names that rank alone; with TP 2 its
  partner, whose GPU waits in their all-reduce, is a victim (the watchdogs' stuck ops)."""

import os
import signal
import subprocess
import time

import pytest

from flared_process import Flared
from offline_diagnose import diagnose

RANKS = 8


def run_job(build_dir, out, env, tp=2, steps=12):
    full = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
                FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="job")
    full.update(env)
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS),
                          "--steps", str(steps), "--layers", "4", "--hidden", "4096", "--tp",
                          str(tp), "--quiet"], env=full, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("factor,seed", [("0.8", "1"), ("0.82", "1"), ("0.82", "2")])
def test_slow_link_on_one_rank_names_that_rank_and_lists_its_partners_as_victims(
        build_dir, tmp_path, factor, seed):
    # Rank 5: TP pair {4,5}, DP group {1,3,5,7}. At 0.82 the 192 MiB DP all-reduce is about 17.5%
    # slower (past link_min_effect, 15%, by a margin the run-to-run spread of ~1 point does not
    # cross; at 0.84 it measured 15.6% here and under 15% in a CI run) while the 16 MiB TP
    # all-reduce, diluted by the fixed latency, lands on either side of it (seed 2 under, seed 1
    # over): the whole DP group used to be named. The unit tests (link_slow) pin the exact case.
    run_job(build_dir, tmp_path, {"FLARE_SIM_LINK_FACTOR": "5:" + factor, "FLARE_SIM_SEED": seed})
    found = [d for d in diagnose(build_dir, tmp_path) if d["kind"] == "link_slow"]
    assert len(found) == 1, found
    d = found[0]
    assert d["ranks"] == [5], d
    # The DP group's other members are victims; the TP partner too when their pair's
    # communicator is slower than its peers (always, at this size: past the threshold or not).
    assert {1, 3, 7} <= set(d["victims"]) <= {1, 3, 4, 7}, d
    assert 5 not in d["victims"]
    assert "victims" in d["summary"]


@pytest.mark.parametrize("seed", ["1", "3"])
def test_healthy_tp_dp_job_names_no_slow_link(build_dir, tmp_path, seed):
    run_job(build_dir, tmp_path, {"FLARE_SIM_SEED": seed})
    assert diagnose(build_dir, tmp_path) == []


# ---- hangs through flared -----------------------------------------------------------------------

HANG_TIMEOUT_S = 2


@pytest.fixture
def daemon(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Flared(build_dir, tmp_path, "--diagnose-interval-s", "0", "--hang-timeout-s",
               HANG_TIMEOUT_S, "--hang-answer-timeout-s", "2")
    yield d
    d.stop(timeout=20, kill=True)


@pytest.mark.parametrize("tp,watchdog,victims,sampled", [
    (2, "0", [4], False), (2, "1", [4], False), (1, "0", [], False), (2, "1", [4], True)])
def test_compute_hang_names_only_the_stuck_rank(build_dir, daemon, tmp_path, tp, watchdog,
                                                victims, sampled):
    # Rank 5's GEMM never finishes from step 3 on. With TP 2 its partner rank 4 waits for it in
    # their all-reduce; both hosts wait outside communication and every connection of both
    # stays at step 0, so both were named. Rank 5's GPU runs no collective kernel (its
    # inspection finds none), rank 4's waits in one; with the rank watchdog on (1 s, it reports
    # before the daemon's 2 s silence), rank 5's stuck op is its GEMM, rank 4's the all-reduce.
    # Sampled: the hang comes in a step that step sampling left untimed (FLARE_SAMPLE_STEPS=1024:
    # after the 3 measured first steps, nearly none), so the GEMM heads no stream; rank 5's
    # watchdog names the untimed compute ahead of its all-reduce, which has not started (the
    # default timing budget's trial, 2026-11-28: reported as the all-reduce, a victim's kind).
    job = "compute-tp%d-wd%s%s" % (tp, watchdog, "-sampled" if sampled else "")
    env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / "spool"),
               FLARE_SIM_HANG="5:compute:%d" % (8 if sampled else 3), FLARE_SIM_SEED="2",
               FLARE_HANG_TIMEOUT=watchdog)
    if sampled:
        env.update(FLARE_SAMPLE_STEPS="1024", FLARE_MODE="summary")
    proc = subprocess.Popen(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:%d" % daemon.grpc,
         "--job-id", job, "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
         "--ranks", str(RANKS), "--steps", "40", "--layers", "4", "--tp", str(tp), "--quiet",
         "--timeout", "15"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline, incidents = time.time() + 25, []
        while time.time() < deadline and not incidents:
            incidents = daemon.json("/api/v1/jobs/%s/hangs" % job)["incidents"]
            time.sleep(0.1)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        if watchdog != "0":
            assert inc["triggeredBy"] == "watchdog", inc["trigger"]
            # The op each watchdog found stuck longest: rank 5's kernel, rank 4's all-reduce.
            first = {w["rank"]: max(w["stuck"], key=lambda o: o["ageS"])
                     for w in inc["watchdog"]}
            if sampled:
                assert 5 in first, inc["watchdog"]
                assert first[5]["kind"] == "kernel", first[5]
                assert first[5]["op"].startswith("compute not timed"), first[5]
            if 4 in first and 5 in first:
                assert first[5]["kind"] in ("kernel", "gemm"), first
                assert first[4]["kind"] == "collective", first
        assert inc["kind"] == "non-communication hang", inc["text"]
        assert [s["rank"] for s in inc["suspects"]] == [5], inc["text"]
        assert inc["victims"] == victims, inc["text"]
        alerts = [a for a in daemon.json("/api/v1/alerts?job=" + job)["alerts"]
                  if a["kind"] == "hang"]
        assert len(alerts) == 1 and alerts[0]["rank"] == 5, alerts
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_report_text_lists_the_victims_apart_from_the_culprit():
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    try:
        from flare import report
    finally:
        sys.path.pop(0)
    data = {"jobId": "j", "ranks": [], "series": None, "hangs": [], "alerts": [],
            "diagnoses": [{"kind": "link_slow", "team": "operations", "ranks": [5],
                           "victims": [1, 3, 4, 7], "summary": "rank 5: slow network link",
                           "evidence": []}]}
    text = report.format_text(data)
    assert "[operations] rank 5: slow network link" in text
    assert "victims (slowed by the culprit, not at fault): ranks 1,3,4,7" in text
