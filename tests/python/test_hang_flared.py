"""Hang diagnosis end to end: 8 sim ranks stream to the real flared through `flare run`; a hang
makes every rank silent, or a rank's watchdog (FLARE_HANG_TIMEOUT) reports its stuck op first,
flared opens one incident, asks every rank for its stacks and collective progress (DumpStacks,
answered by libflare_hook.so on its stream thread), runs the analysis and raises one "hang"
alert (operations) naming the culprit rank, served at /api/v1/jobs/{job}/hangs. The truth is
the injected fault (FLARE_SIM_HANG, FLARE_SIM_CRASH, SIGSTOP)."""

import os
import re
import signal
import subprocess
import time
import urllib.request

import pytest
from flared_process import Flared
from pipeline_health import assert_nothing_refused

HANG_TIMEOUT_S = 2


class Daemon(Flared):
    def __init__(self, build_dir, workdir, hang_timeout_s=HANG_TIMEOUT_S):
        super().__init__(build_dir, workdir, "--diagnose-interval-s", "0", "--hang-timeout-s",
                         hang_timeout_s, "--hang-answer-timeout-s", "2")

    def get(self, path):
        return self.json(path)


@pytest.fixture
def daemon(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path)
    yield d
    if d.proc.poll() is None:
        assert_nothing_refused(d.http)
    d.stop(timeout=20, kill=True)


def start_job(build_dir, daemon, tmp_path, job, fault_env=None, steps=40, timeout_s=25,
              extra=(), stdout=subprocess.DEVNULL):
    env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)), **(fault_env or {}))
    return subprocess.Popen(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:%d" % daemon.grpc,
         "--job-id", job, "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
         "--ranks", "8", "--steps", str(steps), "--layers", "4", "--tp", "2", "--quiet",
         "--timeout", str(timeout_s)] + list(extra),
        env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout != subprocess.DEVNULL
        else subprocess.DEVNULL, start_new_session=True)


def wait_incidents(daemon, job, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        inc = daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"]
        if inc:
            return inc
        time.sleep(0.1)
    return []


def hang_alerts(daemon, job, wait_s=0):
    """The job's hang alerts; with `wait_s`, waiting up to that long for the first: the
    incident is visible a moment before its alert is recorded (CI, 2026-11-28: an empty list
    right after the incident)."""
    deadline = time.time() + wait_s
    while True:
        alerts = [a for a in daemon.get("/api/v1/alerts?job=" + job).get("alerts", [])
                  if a["kind"] == "hang"]
        if alerts or time.time() >= deadline:
            return alerts
        time.sleep(0.1)


def finish(job_proc):
    """Ends the (hung) job: its whole process group (flare run, the launcher, the ranks)."""
    try:
        os.killpg(job_proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job_proc.wait(timeout=30)
    # No rank survives its job (zombies wait for init to reap them).
    for _ in range(50):
        out = [line for line in subprocess.run(
            ["ps", "-o", "stat=,pid=", "-g", str(job_proc.pid)], capture_output=True,
            text=True).stdout.splitlines() if line.strip() and not line.strip().startswith("Z")]
        if not out:
            break
        time.sleep(0.1)
    assert out == [], out


@pytest.mark.parametrize("rank,step", [(3, 3), (6, 5)])
def test_rank_that_never_issues_its_collectives_is_named(build_dir, daemon, tmp_path, rank, step):
    job = "skip%d" % rank
    proc = start_job(build_dir, daemon, tmp_path, job,
                     {"FLARE_SIM_HANG": "%d:skip:%d" % (rank, step)}, timeout_s=12)
    try:
        incidents = wait_incidents(daemon, job)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["kind"] == "non-communication hang"
        assert [s["rank"] for s in inc["suspects"]] == [rank]
        assert "never issued" in inc["suspects"][0]["reason"]
        assert inc["answered"] == list(range(8)) and inc["noAnswer"] == [] and inc["crashed"] == []
        # The stacks came from the hung processes: the culprit sleeps in the workload's loop.
        assert "nanosleep" in inc["text"]
        # Hang onset to diagnosis: the timeout plus polling and one command round.
        took = (inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9
        assert HANG_TIMEOUT_S <= took < HANG_TIMEOUT_S + 5, took
        print("onset-to-diagnosis %.2f s (skip);" % took,
              re.search(r"diagnosed in [0-9.]+ s", hang_alerts(daemon, job, wait_s=10)[0]["message"]).group(0))
        # One incident per episode: still one while the job stays hung.
        time.sleep(HANG_TIMEOUT_S + 1.5)
        assert len(daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"]) == 1
        alerts = hang_alerts(daemon, job)
        assert [(a["rank"], a["team"], a["severity"]) for a in alerts] == \
            [(rank, "operations", "critical")]
        assert "rank %d on " % rank in alerts[0]["message"]
        assert "diagnosed in" in alerts[0]["message"]
    finally:
        finish(proc)


def test_stopped_rank_is_unresponsive_and_named_and_the_episode_ends(build_dir, daemon, tmp_path):
    job = "stopped"
    proc = start_job(build_dir, daemon, tmp_path, job, steps=400, timeout_s=40)
    victim = 5
    pid = None
    try:
        # Wait until every rank streams records, then stop one with SIGSTOP.
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                ranks = daemon.get("/api/v1/jobs/%s/ranks" % job).get("ranks", [])
            except Exception:
                ranks = []
            if len(ranks) == 8 and all(int(r.get("records", "0")) > 0 for r in ranks):
                pid = [r["pid"] for r in ranks if r.get("rank", 0) == victim][0]
                break
            time.sleep(0.1)
        assert pid, "ranks did not stream"
        os.kill(pid, signal.SIGSTOP)
        incidents = wait_incidents(daemon, job)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["kind"] == "unresponsive rank"
        assert [s["rank"] for s in inc["suspects"]] == [victim]
        assert inc["noAnswer"] == [victim]
        assert inc["answered"] == [r for r in range(8) if r != victim]
        alerts = hang_alerts(daemon, job)
        print("onset-to-diagnosis %.2f s (stopped);" %
              ((inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9),
              re.search(r"diagnosed in [0-9.]+ s", alerts[0]["message"]).group(0))
        assert [a["rank"] for a in alerts] == [victim]
        assert "no answer" in alerts[0]["message"]
        # The rank resumes: the job progresses, the episode ends, no new incident.
        os.kill(pid, signal.SIGCONT)
        pid = None
        time.sleep(HANG_TIMEOUT_S * 0.5 + 1)
        assert len(daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"]) == 1
        assert "hang episode of job stopped ended" in open(daemon.log_path).read()
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        finish(proc)


@pytest.mark.parametrize("kind,rank,expect_kind,expect_suspects", [
    ("compute", 5, "non-communication hang", [5]),
    ("collective", 2, "communication hang", [2, 3]),
])
def test_gpu_side_hangs_are_located_with_the_connection_steps(build_dir, daemon, tmp_path, kind,
                                                              rank, expect_kind, expect_suspects):
    # --tp 1: the data-parallel communicator spans the job, so the sim's connection peers are
    # global ranks. Every rank's host waits at the step's end and every rank issued the
    # collective: only the GPU-side state (Inspect -> simulated connection steps) locates it.
    job = "%s%d" % (kind, rank)
    env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)),
               FLARE_SIM_HANG="%d:%s:3" % (rank, kind))
    proc = subprocess.Popen(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:%d" % daemon.grpc,
         "--job-id", job, "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
         "--ranks", "8", "--steps", "40", "--layers", "4", "--tp", "1", "--quiet", "--timeout",
         "12"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        incidents = wait_incidents(daemon, job)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["inspected"] is True
        assert inc["kind"] == expect_kind, inc["text"]
        assert [s["rank"] for s in inc["suspects"]] == expect_suspects, inc["text"]
        if kind == "collective":
            assert (inc["link"]["sender"], inc["link"]["receiver"]) == (rank, rank + 1)
            assert inc["link"]["channelsAgreeing"] == 2
        took = (inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9
        assert HANG_TIMEOUT_S <= took < HANG_TIMEOUT_S + 5, took
        print("onset-to-diagnosis %.2f s (%s);" % (took, kind),
              re.search(r"diagnosed in [0-9.]+ s", hang_alerts(daemon, job, wait_s=10)[0]["message"]).group(0))
        alerts = hang_alerts(daemon, job)
        assert len(alerts) == 1 and alerts[0]["team"] == "operations"
        assert "connection steps inspected" in alerts[0]["message"]
    finally:
        finish(proc)


# ---- the rank watchdog (FLARE_HANG_TIMEOUT) and crashed ranks ---------------------------------

SILENCE_S = 60  # the daemon's silence timeout in these tests: far beyond the watchdog's
WATCHDOG_S = 2


@pytest.fixture
def slow_silence_daemon(build_dir, tmp_path):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path, hang_timeout_s=SILENCE_S)
    yield d
    if d.proc.poll() is None:
        assert_nothing_refused(d.http)
    d.stop(timeout=20, kill=True)


def metric(daemon, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % daemon.http, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_watchdog_opens_the_incident_before_the_silence_timeout(build_dir, slow_silence_daemon,
                                                                tmp_path):
    daemon = slow_silence_daemon
    rank = 5
    job = "watchdog-skip"
    proc = start_job(build_dir, daemon, tmp_path, job,
                     {"FLARE_SIM_HANG": "%d:skip:3" % rank,
                      "FLARE_HANG_TIMEOUT": str(WATCHDOG_S)}, timeout_s=14)
    try:
        incidents = wait_incidents(daemon, job, timeout=15)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["triggeredBy"] == "watchdog", inc["trigger"]
        assert "watchdog of ranks" in inc["trigger"]
        assert inc["kind"] == "non-communication hang", inc["text"]
        assert [s["rank"] for s in inc["suspects"]] == [rank]
        # Onset (the stuck op became its stream's head) to diagnosis: the watchdog's timeout
        # plus one report and one command round, far below the silence timeout.
        took = (inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9
        assert WATCHDOG_S <= took < WATCHDOG_S + 4, took
        print("onset-to-diagnosis %.2f s (watchdog, skip), diagnosis %.2f s" %
              (took, inc["diagnosisSeconds"]))
        # The stuck op each rank reported is the collective it waits in, by the independent
        # count of issued/completed collectives that DumpStacks returned.
        assert inc["watchdog"], inc
        lagging = {(l["communicator"], l["seq"]) for l in inc["lagging"]}
        for w in inc["watchdog"]:
            assert w["rank"] != rank  # the culprit is on the host, its streams are idle
            op = w["first"]
            assert op["op"] == "ncclAllReduce" and op["kind"] == "collective", w
            assert (op["communicator"], op["seq"]) in lagging, (w, inc["lagging"])
            assert op["ageS"] >= WATCHDOG_S and op["thresholdS"] >= WATCHDOG_S
        assert metric(daemon, "flare_hang_reports_total") >= len(inc["watchdog"])
        alerts = hang_alerts(daemon, job)
        assert [(a["rank"], a["team"]) for a in alerts] == [(rank, "operations")]
        assert "watchdog:" in alerts[0]["message"]
        # One incident per episode while more ranks' reports and the silence keep coming.
        time.sleep(2)
        assert len(daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"]) == 1
        # `flare hang` shows it: the suspect, the groups, the progress, the watchdog.
        cli = subprocess.run(
            [os.path.join(build_dir, "bin", "flare"), "hang", "--job", job, "--daemon-http",
             "127.0.0.1:%d" % daemon.http], capture_output=True, text=True, timeout=30)
        assert cli.returncode == 3, cli.stderr
        assert "(triggered by watchdog)" in cli.stdout
        assert "suspect: rank %d on " % rank in cli.stdout
        assert "never issued" in cli.stdout
        assert "stack groups:" in cli.stdout and "last collective issued / completed:" in cli.stdout
        assert ": ncclAllReduce on " in cli.stdout and "stuck up to" in cli.stdout
    finally:
        finish(proc)


@pytest.mark.parametrize("override", [True, False])
def test_long_collective_below_its_override_is_not_a_hang(build_dir, slow_silence_daemon,
                                                          tmp_path, override):
    # Rank 2's host stalls 3 s at steps 0 and 4 (a checkpoint-like pause): every other rank
    # waits 3 s in its all-reduce, twice the watchdog's 1.5 s. With ncclAllReduce=20 s the
    # job runs to its end without a report; without it, the same job raises one (the test
    # can fail). The optimizer kernel that waits (cudaStreamWaitEvent) for the all-reduce is
    # excused while the all-reduce runs on the GPU (its start event completed), also when the
    # kernel became the head of its stream first (a loaded machine; docs/hang-analysis.md,
    # cross-stream waits).
    daemon = slow_silence_daemon
    job = "longar-%s" % ("override" if override else "none")
    env = {"FLARE_SIM_HOST_STALL": "2:3000:4", "FLARE_HANG_TIMEOUT": "1.5"}
    if override:
        env["FLARE_HANG_TIMEOUT_OPS"] = "ncclAllReduce=20"
    proc = start_job(build_dir, daemon, tmp_path, job, env, steps=6, timeout_s=40)
    try:
        if override:
            assert proc.wait(timeout=60) == 0
            time.sleep(1.5)  # a report would have been sent before the job ended
            assert daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"] == []
            assert metric(daemon, "flare_hang_reports_total") == 0
            assert hang_alerts(daemon, job) == []
        else:
            incidents = wait_incidents(daemon, job, timeout=30)
            assert len(incidents) >= 1
            assert incidents[0]["triggeredBy"] == "watchdog"
            assert incidents[0]["watchdog"][0]["first"]["op"] == "ncclAllReduce"
            assert metric(daemon, "flare_hang_reports_total") >= 1
    finally:
        finish(proc)


def test_bad_op_override_is_reported_and_ignored(build_dir, slow_silence_daemon, tmp_path):
    # A malformed FLARE_HANG_TIMEOUT_OPS entry gives one clear warning naming it; the valid
    # entry still applies and the job is not harmed.
    daemon = slow_silence_daemon
    job = "badops"
    log = tmp_path / "badops.log"
    proc = start_job(build_dir, daemon, tmp_path, job,
                     {"FLARE_HANG_TIMEOUT_OPS": "ncclAllReduce,collective=600",
                      "FLARE_HANG_TIMEOUT": "30"}, steps=3, timeout_s=30,
                     stdout=open(log, "w"))
    try:
        assert proc.wait(timeout=60) == 0
        text = open(log).read()
        assert "FLARE_HANG_TIMEOUT_OPS entry 'ncclAllReduce': expected NAME=DURATION" in text, text
        assert "collective=600'" not in text
    finally:
        finish(proc)


@pytest.mark.parametrize("trigger", ["watchdog", "silence"])
def test_crashed_rank_is_named_while_the_survivors_wait(build_dir, daemon, slow_silence_daemon,
                                                        tmp_path, trigger):
    # --keep-going: the launcher leaves the survivors running, waiting in the collective the
    # crashed rank never joins (like a real NCCL job). Its stream closed without an answer:
    # the silence is the evidence.
    d = slow_silence_daemon if trigger == "watchdog" else daemon
    rank = 4
    job = "crash-%s" % trigger
    env = {"FLARE_SIM_CRASH": "%d:3" % rank}
    env["FLARE_HANG_TIMEOUT"] = str(WATCHDOG_S) if trigger == "watchdog" else "0"
    proc = start_job(build_dir, d, tmp_path, job, env, timeout_s=14, extra=["--keep-going"])
    try:
        incidents = wait_incidents(d, job, timeout=15)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["triggeredBy"] == trigger
        assert inc["kind"] == "unresponsive rank", inc["text"]
        assert [s["rank"] for s in inc["suspects"]] == [rank]
        assert "crashed" in inc["suspects"][0]["reason"]
        assert inc["crashed"] == [rank]
        assert inc["answered"] == [r for r in range(8) if r != rank]
        # The survivors were alive and waiting when the stacks were taken.
        assert proc.poll() is None
        took = (inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9
        limit = WATCHDOG_S if trigger == "watchdog" else HANG_TIMEOUT_S
        assert limit <= took < limit + 5, took
        print("onset-to-diagnosis %.2f s (crash, %s)" % (took, trigger))
        alerts = hang_alerts(d, job)
        assert [(a["rank"], a["severity"]) for a in alerts] == [(rank, "critical")]
        assert "1 crashed" in alerts[0]["message"]
    finally:
        finish(proc)


def test_communication_hang_on_one_link_of_a_data_parallel_sub_communicator(build_dir, daemon,
                                                                           tmp_path):
    # --tp 2: data-parallel groups {0,2,4,6} and {1,3,5,7}. Rank 2's all-reduce on its 4-rank
    # communicator hangs on its ring link (comm rank 1 -> 2, i.e. global 2 -> 4). The ranks of
    # the other group then wait in the next tensor-parallel all-reduce their partners never
    # issue (blocked, not culprits); Inspect reports communicator-local peers, flared translates
    # them and joins channels per communicator.
    job = "dp-link"
    proc = start_job(build_dir, daemon, tmp_path, job,
                     {"FLARE_SIM_HANG": "2:collective:3:4"}, timeout_s=14)
    try:
        incidents = wait_incidents(daemon, job)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["inspected"] is True, inc["text"]
        assert inc["kind"] == "communication hang", inc["text"]
        assert (inc["link"]["sender"], inc["link"]["receiver"]) == (2, 4), inc["link"]
        assert inc["link"]["channelsAgreeing"] == 2
        assert inc["link"]["communicator"] != ""
        assert [s["rank"] for s in inc["suspects"]] == [2, 4], inc["text"]
        # The hung communicator is the one the link names: its 4 ranks wait in it.
        hung = [l for l in inc["lagging"] if l["communicator"] == inc["link"]["communicator"]]
        assert hung and hung[0]["waiting"] == [0, 2, 4, 6], inc["lagging"]
        took = (inc["diagnosedUnixNs"] - inc["onsetUnixNs"]) / 1e9
        assert HANG_TIMEOUT_S <= took < HANG_TIMEOUT_S + 5, took
        print("onset-to-diagnosis %.2f s (dp sub-communicator link)" % took)
    finally:
        finish(proc)


# ---- FLARE_HANG_KILL: the ranks that opted in exit after the diagnosis -------------------------

def live_processes(pgid):
    """Processes of the job's process group that still run (zombies excluded)."""
    out = subprocess.run(["ps", "-o", "stat=,pid=,args=", "-g", str(pgid)], capture_output=True,
                         text=True).stdout.splitlines()
    return [line for line in out if line.strip() and not line.strip().startswith("Z")]


@pytest.mark.parametrize("opt_in", [True, False])
def test_hang_kill_ends_every_opted_in_rank_after_the_diagnosis(build_dir, daemon, tmp_path,
                                                                opt_in):
    # Rank 5's kernel never finishes (the others wait in the next all-reduce). With
    # FLARE_HANG_KILL=1 every rank process ends itself (exit code 75) once the diagnosis is
    # stored; --keep-going: the launcher stops nobody, so each exit is the rank's own. Without
    # the opt-in flared sends nothing and every rank stays (hung) until the test ends the job.
    job = "kill-%s" % ("on" if opt_in else "off")
    env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)),
               FLARE_SIM_HANG="5:compute:3")
    env.pop("FLARE_HANG_KILL", None)
    if opt_in:
        env["FLARE_HANG_KILL"] = "1"
    log_path = tmp_path / (job + ".log")
    proc = subprocess.Popen(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:%d" % daemon.grpc,
         "--job-id", job, "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
         "--ranks", "8", "--steps", "40", "--layers", "4", "--tp", "1", "--quiet", "--timeout",
         "60", "--keep-going"], env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        incidents = wait_incidents(daemon, job)
        assert len(incidents) == 1, incidents
        inc = incidents[0]
        assert inc["kind"] == "non-communication hang", inc["text"]
        assert [s["rank"] for s in inc["suspects"]] == [5], inc["text"]
        # The incident is listed as soon as it is stored; the alert (the store's writer) and the
        # Exit commands (sent right after) follow within moments.
        deadline = time.time() + 10
        while time.time() < deadline and (not hang_alerts(daemon, job) or (
                opt_in and daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"][0][
                    "exitSent"] != 8)):
            time.sleep(0.05)
        assert len(hang_alerts(daemon, job)) == 1
        inc = daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"][0]
        if opt_in:
            assert inc["exitSent"] == 8, inc
            # Every rank ends by itself: the launcher, then `flare run`, end when the last did.
            assert proc.wait(timeout=20) != 0
            ended_ns = time.time_ns()
            assert inc["diagnosedUnixNs"] < ended_ns
            assert live_processes(proc.pid) == []
            log = open(log_path).read()
            assert log.count("FLARE_HANG_KILL: ending this process") == 8, log
            assert "rank " in log and "(exit code 75)" in log, log
            assert metric(daemon, "flare_hang_exits_sent_total") == 8
            # The ranks' exits are not a new hang (the episode is over, the job finished).
            time.sleep(HANG_TIMEOUT_S + 1)
            assert len(daemon.get("/api/v1/jobs/%s/hangs" % job)["incidents"]) == 1
            assert len(hang_alerts(daemon, job)) == 1
        else:
            assert inc["exitSent"] == 0, inc
            time.sleep(3)
            assert proc.poll() is None
            ranks = [p for p in live_processes(proc.pid) if "flare-sim-rank" in p]
            assert len(ranks) == 8, live_processes(proc.pid)
            assert "FLARE_HANG_KILL" not in open(log_path).read()
            assert metric(daemon, "flare_hang_exits_sent_total") == 0
    finally:
        finish(proc)
