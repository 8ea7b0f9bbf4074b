"""Deep trace on demand (src/hook/deep_trace.h) on the simulated stack, through the real code path:
libflare_hook.so dlopens the simulated libcupti.so.13 (build/lib/sim), which reports every kernel
(GEMM kernels launched inside cuBLAS, NCCL kernels, the --extra-kernels minority kernels),
memcpy and memset the simulated GPU runs while a kind is enabled.

The truth is the simulator's own count of the ops issued in each step (FLARE_SIM_OP_COUNTS:
every op, traced by Flare's wrappers or not), written by each rank at exit.

  - through flared: `flare deep-trace --job J --steps 3 --ranks 2,5` captures exactly 3 steps'
    ops on ranks 2 and 5 (and nothing on the others), stops by itself, and flared stores the
    records (/api/v1/jobs/J/deep-trace);
  - CUPTI taken by another tool (the sim's FLARE_SIM_CUPTI_BUSY) is reported and skipped;
  - without a deep trace no process loads libcupti (FLARE_SIM_CUPTI_LOADED);
  - offline (FLARE_DEEP_TRACE=FROM:N, spool): the records are exactly steps FROM..FROM+N-1 and
    flare-timeline shows them on the GPU stream tracks (category deep_trace), linked to the
    traced launches they belong to.
"""

import collections
import glob
import json
import os
import re
import signal
import subprocess
import time

import pytest

import trace_rules
from flared_process import Flared
from pipeline_health import assert_nothing_refused

RANKS = 8
ARGS = ["--layers", "2", "--hidden", "1024", "--seq", "512", "--tp", "2", "--extra-kernels", "2",
        "--copies", "2"]
LONG_JOB = ["--data-ms", "20"]  # the flared tests' jobs run while the command travels


def sim_counts(counts_dir, rank):
    """{step: (kernels, memcpys, memsets)} issued by `rank`, from the simulator itself."""
    files = glob.glob(os.path.join(str(counts_dir), "ops-%d-*.json" % rank))
    assert len(files) == 1, files
    raw = json.load(open(files[0]))
    return {int(step): tuple(v[1:4]) for step, v in raw.items()}


def kind_counts(records):
    c = collections.Counter(r.get("kind", "KIND_KERNEL") for r in records)
    return (c["KIND_KERNEL"], c["KIND_MEMCPY"], c["KIND_MEMSET"])


class Daemon(Flared):
    def __init__(self, build_dir, workdir, *flags):
        super().__init__(build_dir, workdir, "--hang-timeout-s", "0",
                         *(flags or ("--diagnose-interval-s", "0", "--deep-trace-steps", "0")))

    def get(self, path):
        return self.json(path)

    def stop(self):
        super().stop(timeout=20, kill=True)


@pytest.fixture
def daemon(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path)
    yield d
    if d.proc.poll() is None:
        assert_nothing_refused(d.http)
    d.stop()


def job_env(build_dir, tmp_path, extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLARE_") and k != "LD_PRELOAD"}
    env.update(FLARE_OUTPUT_DIR=str(tmp_path / "spool"),
               FLARE_CUPTI_LIB=os.path.join(build_dir, "lib", "sim", "libcupti.so.13"),
               FLARE_SIM_OP_COUNTS=str(tmp_path / "counts"),
               FLARE_SIM_CUPTI_LOADED=str(tmp_path / "cupti-loaded"))
    os.makedirs(str(tmp_path / "counts"), exist_ok=True)
    env.update(extra or {})
    return env


def start_job(build_dir, daemon, tmp_path, job, steps, extra_env=None):
    return subprocess.Popen(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:%d" % daemon.grpc,
         "--job-id", job, "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
         "--ranks", str(RANKS), "--steps", str(steps), *ARGS, *LONG_JOB, "--quiet",
         "--timeout", "240"],
        env=job_env(build_dir, tmp_path, extra_env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_connected(daemon, job, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            ranks = daemon.get("/api/v1/jobs/%s/ranks" % job).get("ranks", [])
        except Exception:  # the job is not known yet
            ranks = []
        if sum(1 for r in ranks if r.get("connected")) == RANKS:
            return
        time.sleep(0.1)
    raise AssertionError("the job's ranks did not connect")


def deep_trace_cli(build_dir, daemon, job, *args):
    return subprocess.run(
        [os.path.join(build_dir, "bin", "flare"), "deep-trace", "--daemon-http",
         "127.0.0.1:%d" % daemon.http, "--job", job, "--json", "--wait", "60", *args],
        capture_output=True, text=True, timeout=120)


def test_deep_trace_through_flared_captures_exactly_n_steps(build_dir, daemon, tmp_path):
    job = "deep"
    steps = 100
    proc = start_job(build_dir, daemon, tmp_path, job, steps=steps)
    try:
        wait_connected(daemon, job)
        res = deep_trace_cli(build_dir, daemon, job, "--steps", "3", "--ranks", "2,5")
        assert res.returncode == 0, res.stdout + res.stderr
        answer = json.loads(res.stdout)
        assert answer["complete"] and answer["ranksAsked"] == 2
        by_rank = {r["rank"]: r for r in answer["ranks"]}
        assert sorted(by_rank) == [2, 5]
        for r in by_rank.values():
            assert r["state"] == "done" and r["stepsCaptured"] == 3, r
            assert r["dropped"] == 0, r
            assert r["library"].endswith("libcupti.so.13")
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The job ran 100 steps; the capture stopped by itself after 3 of them.
    expected = sum(r["kernels"] + r["memcpys"] + r["memsets"] for r in by_rank.values())
    deadline = time.time() + 15
    while True:  # the store's writer commits asynchronously
        stored = daemon.get("/api/v1/jobs/%s/deep-trace" % job)["records"]
        if len(stored) >= expected or time.time() > deadline:
            break
        time.sleep(0.1)
    assert len(stored) == expected
    assert {r["rank"] for r in stored} == {2, 5}
    for rank in (2, 5):
        records = [r for r in stored if r["rank"] == rank]
        truth = sim_counts(tmp_path / "counts", rank)
        assert len(truth) == steps
        per_step = collections.defaultdict(list)
        for r in records:
            per_step[r.get("stepIndex", 0)].append(r)
        assert sorted(per_step) == [0, 1, 2]
        # Every step of the job issues the same ops; each captured step holds all of them.
        step_truth = truth[10]
        assert step_truth[0] > 0 and step_truth[1] == 2 and step_truth[2] == 2
        for i in range(3):
            assert kind_counts(per_step[i]) == step_truth, (rank, i)
        # The rank's answer counted what flared stored.
        answered = by_rank[rank]
        assert (answered["kernels"], answered["memcpys"], answered["memsets"]) == kind_counts(records)
        # Kernels no Flare wrapper names: the GEMM kernels inside cuBLAS and NCCL's kernels.
        names = {r["name"] for r in records}
        assert any("residual_add" in n for n in names)  # the --extra-kernels minority kernels
        assert any("Memcpy HtoD" == n for n in names) and "Memset" in names
    # Only the two asked ranks loaded libcupti.
    loaded = open(str(tmp_path / "cupti-loaded")).read().split()
    assert len(loaded) == 2


def test_cupti_in_use_is_reported_and_skipped(build_dir, daemon, tmp_path):
    job = "busy"
    proc = start_job(build_dir, daemon, tmp_path, job, steps=100,
                     extra_env={"FLARE_SIM_CUPTI_BUSY": "subscribe"})
    try:
        wait_connected(daemon, job)
        res = deep_trace_cli(build_dir, daemon, job, "--steps", "2", "--ranks", "1")
        assert res.returncode == 1, res.stdout + res.stderr
        answer = json.loads(res.stdout)
        (r,) = answer["ranks"]
        assert r["state"] == "skipped" and "in use by another tool" in r["reason"], r
        assert "MULTIPLE_SUBSCRIBERS" in r["reason"]
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert daemon.get("/api/v1/jobs/%s/deep-trace" % job)["records"] == []


def test_cli_rejects_bad_arguments(build_dir):
    flare = os.path.join(build_dir, "bin", "flare")
    res = subprocess.run([flare, "deep-trace", "--job", "j", "--steps", "0"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--steps" in res.stderr
    res = subprocess.run([flare, "deep-trace", "--job", "j", "--steps", "3", "--ranks", "2-x"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--ranks" in res.stderr
    res = subprocess.run([flare, "deep-trace", "--job", "j", "--steps", "3", "--daemon-http",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 3 and "cannot reach" in res.stderr


def run_spool_job(build_dir, tmp_path, steps, extra_env):
    env = job_env(build_dir, tmp_path, extra_env)
    env.update(LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"), FLARE_JOB_ID="dt")
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "2",
                          "--steps", str(steps), *ARGS, "--data-ms", "2", "--quiet"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    return res


def test_no_deep_trace_loads_no_cupti(build_dir, tmp_path):
    run_spool_job(build_dir, tmp_path, 3, {})
    assert not os.path.exists(str(tmp_path / "cupti-loaded"))
    # The simulator did count the ops: the truth exists, nothing captured them.
    assert sim_counts(tmp_path / "counts", 0)


def test_offline_deep_trace_joins_the_timeline(build_dir, tmp_path):
    run_spool_job(build_dir, tmp_path, 8, {"FLARE_DEEP_TRACE": "3:2"})
    spool = str(tmp_path / "spool")
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", spool],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    path = tmp_path / "trace.json"
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-timeline"), "--input", spool,
                          "-o", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    trace = json.loads(path.read_text())
    assert trace_rules.check(trace) == []
    events = trace["traceEvents"]
    deep = [e for e in events if e.get("cat") == "deep_trace"]
    for rank in (0, 1):
        pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
                and e["args"]["name"] == "rank %d GPU %d" % (rank, rank)}
        mine = [e for e in deep if e["pid"] in pids]
        truth = sim_counts(tmp_path / "counts", rank)
        # Steps 3 and 4 exactly (FLARE_DEEP_TRACE=3:2), by kind, per step.
        for i, step in enumerate((3, 4)):
            in_step = [e for e in mine if e["args"]["step index"] == i]
            got = collections.Counter(e["args"]["kind"] for e in in_step)
            assert (got["kernel"], got["memcpy"], got["memset"]) == truth[step], (rank, step)
        assert {e["args"]["step index"] for e in mine} == {0, 1}
        # On the traced streams' tracks, most linked to the traced launch they ran inside.
        traced_tracks = {(e["pid"], e["tid"]) for e in events
                         if e["ph"] == "X" and e.get("cat") == "kernel" and e["pid"] in pids}
        assert {(e["pid"], e["tid"]) for e in mine} <= traced_tracks
        # Linking is by time (CUPTI's clock against the mapped CUDA events, ~1 µs apart, as
        # long as the smallest sim kernels): nearly all, not necessarily every one, under load.
        linked = [e for e in mine if "flare correlation" in e["args"]]
        assert len(linked) >= 0.95 * len(mine), (len(linked), len(mine))


def test_activity_api_taken_is_said_once_and_skipped(build_dir, tmp_path):
    # Subscribing works but enabling activity records is refused (another tool records them).
    res = run_spool_job(build_dir, tmp_path, 6,
                        {"FLARE_DEEP_TRACE": "1:2", "FLARE_SIM_CUPTI_BUSY": "enable"})
    lines = [l for l in res.stderr.splitlines() if "in use by another tool" in l]
    assert len(lines) == 2, res.stderr  # once per rank
    assert all("CUPTI_ERROR_NOT_COMPATIBLE" in l for l in lines)
    path = tmp_path / "trace.json"
    out = subprocess.run([os.path.join(build_dir, "bin", "flare-timeline"), "--input",
                          str(tmp_path / "spool"), "-o", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    events = json.loads(path.read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == "deep_trace"]
    assert [e for e in events if e.get("cat") == "kernel"]  # tracing itself went on


def test_an_alert_naming_a_rank_deep_traces_it_and_a_healthy_peer(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path, "--diagnose-interval-s", "1", "--deep-trace-steps", "2")
    job = "auto"
    proc = start_job(build_dir, d, tmp_path, job, steps=300,
                     extra_env={"FLARE_SIM_CLOCK_FACTOR": "3:0.8"})
    try:
        # The first alert naming one rank picks the traced ranks: that rank and the next
        # connected one. Here that is rank 3's gpu_slow, except when a false issue_stall on
        # another rank comes in the same pass (seen in 2 of ~45 runs on the loaded 2-core CI
        # machine, from a short fail-slow view; its rate is the scenario matrix's concern,
        # docs/benchmarks.md): the trigger is what this test checks.
        deadline = time.time() + 90
        stored, traced = [], None
        while time.time() < deadline:
            m = re.search(r"deep trace of 2 steps on job auto ranks (\d+) and peer (\d+)",
                          open(d.log_path).read())
            if m:
                traced = (int(m.group(1)), int(m.group(2)))
            stored = d.get("/api/v1/jobs/%s/deep-trace" % job)["records"]
            if traced and {r["rank"] for r in stored} == set(traced) and proc.poll() is not None:
                break
            time.sleep(0.5)
        alerts = d.get("/api/v1/alerts?job=" + job)["alerts"]
        assert ("gpu_slow", 3) in [(a["kind"], a["rank"]) for a in alerts]
        assert traced is not None, "no deep trace was triggered"
        first, peer = traced
        assert first in [a["rank"] for a in alerts], (traced, alerts)
        assert peer == (first + 1) % RANKS  # the next connected rank (all are)
        assert {r["rank"] for r in stored} == {first, peer}
        assert {r.get("stepIndex", 0) for r in stored} == {0, 1}  # 2 steps
        for rank in (first, peer):
            truth = sim_counts(tmp_path / "counts", rank)[50]  # every step issues the same ops
            for i in (0, 1):
                got = [r for r in stored if r["rank"] == rank and r.get("stepIndex", 0) == i]
                assert kind_counts(got) == truth, (rank, i)
        assert 'flare_deep_traces_triggered_total{result="sent"} 1' in d.text("/metrics")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        d.stop()
