"""The detectors inside flared: 8 sim ranks stream to the real daemon through `flare run`; the
daemon raises routed, deduplicated alerts (stored, in /metrics, through `flare alerts`)."""

import json
import os
import re
import subprocess
import time

import pytest

import contention
from flared_process import Flared
from pipeline_health import assert_nothing_refused


class Daemon(Flared):
    """A real flared on free loopback ports (detectors every second); `extra`: more flags."""

    def __init__(self, build_dir, workdir, *extra):
        super().__init__(build_dir, workdir, "--diagnose-interval-s", "1", *extra)

    def get(self, path):
        return self.text(path)

    def alerts(self, job):
        return self.json("/api/v1/alerts?job=" + job).get("alerts", [])


@pytest.fixture
def daemon(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path)
    yield d
    if d.proc.poll() is None:
        assert_nothing_refused(d.http)
        d.proc.kill()


def flare(build_dir, *args, env=None):
    return subprocess.run([os.path.join(build_dir, "bin", "flare"), *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **(env or {})))


def run_job(build_dir, daemon, tmp_path, job, fault_env=None):
    """The job through flared, the workload's own account (--json) in tmp_path/sim-JOB.json."""
    env = dict(fault_env or {}, FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)))
    res = flare(build_dir, "run", "--daemon", "127.0.0.1:%d" % daemon.grpc, "--job-id", job,
                "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks",
                "8", "--steps", "6", "--layers", "4", "--tp", "2", "--quiet", "--json",
                str(tmp_path / ("sim-%s.json" % job)), env=env)
    assert res.returncode == 0, res.stderr


def beyond_load(tmp_path, job, found):
    """`found` (alerts or diagnoses) on `job`, less the host findings the job's own
    CPU-contention readings explain (contention.py: on a loaded machine a rank can really be
    starved of CPU, and the stall detector is right to say so)."""
    return contention.beyond_load(found, tmp_path / ("sim-%s.json" % job))


def alerts(daemon, tmp_path, job):
    """flared's alerts on `job` beyond what this machine's load explains (beyond_load)."""
    return beyond_load(tmp_path, job, daemon.json("/api/v1/alerts?job=" + job)["alerts"])


def wait_alerts(daemon, tmp_path, job, n, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = alerts(daemon, tmp_path, job)
        if len(found) >= n:
            return found
        time.sleep(0.2)
    return alerts(daemon, tmp_path, job)


def test_flared_alerts_on_the_underclocked_rank_once_and_not_on_the_healthy_job(
        build_dir, daemon, tmp_path):
    run_job(build_dir, daemon, tmp_path, "healthy")
    run_job(build_dir, daemon, tmp_path, "slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "3:0.8"})
    found = wait_alerts(daemon, tmp_path, "slowgpu", 1)
    assert [(a["kind"], a["rank"], a["team"]) for a in found] == [("gpu_slow", 3, "operations")]
    assert "rank 3" in found[0]["message"]
    time.sleep(2.5)  # more detector runs over the same window: the alert is not repeated
    assert len(alerts(daemon, tmp_path, "slowgpu")) == 1
    assert alerts(daemon, tmp_path, "healthy") == []
    metrics = daemon.get("/metrics")
    assert 'flare_alerts_total{job="slowgpu",kind="gpu_slow",team="operations"} 1' in metrics
    assert "ALERT [operations] job slowgpu: rank 3" in open(daemon.log_path).read()
    # The CLI: alerts, and the detectors on demand.
    http = "127.0.0.1:%d" % daemon.http
    res = flare(build_dir, "alerts", "--daemon-http", http, "--job", "slowgpu")
    assert res.returncode == 0 and "[operations]" in res.stdout and "rank 3" in res.stdout
    res = flare(build_dir, "diagnose", "--daemon-http", http, "--job", "slowgpu", "--json")
    assert res.returncode == 3
    assert [d["kind"] for d in beyond_load(tmp_path, "slowgpu",
                                           json.loads(res.stdout)["diagnoses"])] == ["gpu_slow"]
    res = flare(build_dir, "diagnose", "--daemon-http", http, "--job", "slowgpu")
    assert res.returncode == 3 and "\nlooked at 8 ranks, steps " in res.stdout, res.stdout
    res = flare(build_dir, "diagnose", "--daemon-http", http, "--job", "healthy")
    assert res.returncode == 0 and "no anomaly" in res.stdout
    # An empty answer says what was looked at, detectors included (those skipped with their
    # reason: no baseline here); an unknown job is not a healthy one.
    assert "looked at 8 rank(s)" in res.stdout and " records " in res.stdout, res.stdout
    assert "detectors ran (shared_gpu, gpu_slow, " in res.stdout, res.stdout
    assert "skipped: " in res.stdout and "(needs a baseline or healthy history)" in res.stdout
    res = flare(build_dir, "diagnose", "--daemon-http", http, "--job", "healthy", "--json")
    seen = json.loads(res.stdout)["lookedAt"]
    assert seen["ranks"] == 8 and seen["records"] > 0 and seen["ranksWithRefusedData"] == []
    detectors = json.loads(res.stdout)["lookedAt"]["detectors"]
    assert [d["name"] for d in detectors if not d["ran"]] and all(
        d["skipped"] for d in detectors if not d["ran"]), detectors
    res = flare(build_dir, "diagnose", "--daemon-http", http, "--job", "nosuchjob")
    assert res.returncode == 4 and "not known to the daemon" in res.stderr, res.stderr
    assert res.stdout == ""
    # Alerts are stored: a restarted daemon still lists it.
    daemon.stop()
    again = Daemon(build_dir, tmp_path)
    try:
        assert [a["kind"] for a in alerts(again, tmp_path, "slowgpu")] == ["gpu_slow"]
    finally:
        again.stop()


def test_flare_alerts_fails_clearly_without_a_daemon(build_dir):
    res = flare(build_dir, "alerts", "--daemon-http", "127.0.0.1:1")
    assert res.returncode != 0 and "flare:" in res.stderr


def test_flared_learns_each_ranks_gpu_from_the_stream_and_compares_gemms_with_its_peak(
        build_dir, daemon, tmp_path):
    # The hello leaves before CUDA is up; the timing thread names the GPU (driver API) with its
    # first op, in the next batch. flared keys history by it and looks it up in its peak table.
    run_job(build_dir, daemon, tmp_path, "gpu-named")
    ranks = json.loads(daemon.get("/api/v1/jobs/gpu-named/ranks"))["ranks"]
    assert len(ranks) == 8
    assert {r.get("deviceName") for r in ranks} == {"Flare Simulated GPU"}
    assert all(r.get("deviceUuid", "").startswith("GPU-") for r in ranks)
    wait_alerts(daemon, tmp_path, "gpu-named", 1, timeout=3)
    report = json.loads(daemon.get("/api/v1/jobs/gpu-named/report"))
    assert report.get("backend") == "Flare Simulated GPU"
    # At its defaults the simulated GPU reaches what its peak-table entry expects: no alert.
    assert alerts(daemon, tmp_path, "gpu-named") == []
    # The volume a rank sends per step, as the daemon measures it (raw mode, 4 layers: every
    # kernel a record, tens of bytes each, ~150 per step; tables amortized over 6 steps).
    volume = report["metrics"]["bytesPerRankStep"]
    assert 2000 < volume < 60000, volume
    m = re.search(r'flare_job_bytes_per_rank_step\{job="gpu-named"\} ([0-9.e+]+)',
                  daemon.get("/metrics"))
    assert m and float(m.group(1)) == pytest.approx(volume, rel=0.05)
    # The same GPU name with a quarter of the tensor throughput (every GEMM, aligned or not, is
    # slow, so the job's own best GEMM is no reference): only the device's expected TFLOPS for
    # each shape shows it.
    run_job(build_dir, daemon, tmp_path, "gpu-quarter", {"FLARE_SIM_PEAK_TFLOPS": "100"})
    found = wait_alerts(daemon, tmp_path, "gpu-quarter", 1)
    assert [(a["kind"], a["team"]) for a in found] == [("unoptimized_gemm", "infrastructure")]
    assert "expected for the shape on Flare Simulated GPU" in found[0]["message"]


def test_kernels_no_lookup_could_name_are_counted_in_flare_status(build_dir, daemon, tmp_path):
    """A driver that names no kernel (FLARE_SIM_NAMELESS_KERNELS=1): every plain kernel is
    recorded as kernel@unknown, kept, and `flare status` says how many launches that was, against
    the kernel report's own count; a job whose kernels have names says nothing of it."""
    run_job(build_dir, daemon, tmp_path, "named")
    run_job(build_dir, daemon, tmp_path, "nameless", {"FLARE_SIM_NAMELESS_KERNELS": "1"})
    http = "127.0.0.1:%d" % daemon.http
    res = flare(build_dir, "status", "--all", "--daemon-http", http, "--json")
    assert res.returncode == 0, res.stderr
    jobs = {j["jobId"]: j for j in json.loads(res.stdout)["jobs"]}
    report = daemon.json("/api/v1/jobs/nameless/report")["signatures"]
    unknown = sum(int(s["count"]) for s in report if s["signature"]["name"] == "kernel@unknown")
    assert unknown > 0
    assert jobs["nameless"]["unnamedKernels"]["launches"] == unknown
    assert jobs["named"]["unnamedKernels"] == {"launches": 0, "timeShare": 0.0}
    text = flare(build_dir, "status", "--all", "--daemon-http", http).stdout
    assert text.count("unnamed kernels: %d launch(es)" % unknown) == 1, text
