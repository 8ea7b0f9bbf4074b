"""flare-replay: a recorded trace (tests/fixtures/sim/*.tar.gz, one rank's raw spool from the
simulated stack; tests/fixtures/sim/record.sh) streamed into the real flared as 8 ranks.

A healthy replay raises nothing, every figure the daemon reports equals the same figure computed
here from the fixture's raw records (flare-export's JSON lines), and flared rejects nothing; each
perturbation (slow GPU, slow link, host stall, hang) is named with the right rank and team."""

import gzip
import json
import os
import re
import statistics
import subprocess
import tarfile
import time
import urllib.request

import pytest
import test_flared_diagnosis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "sim")
FIXTURE = os.path.join(FIXTURES, "healthy.tar.gz")
# healthy: flare-sim-train --python, TP 2 x DP 2 (two communicators, explicit step markers);
# pytorch-like: its PyTorch-like workload (DataLoader-only steps, an autograd thread, set-up,
# evaluation and checkpoint pauses, cold first launches; one data-parallel communicator).
NAMES = ["healthy", "pytorch-like"]
RANKS = 8


class Daemon(test_flared_diagnosis.Daemon):
    def rejected(self):
        """What flared refused, from /metrics: every flare_ingest_rejected_total (whole messages)
        and flare_ingest_items_dropped_total (items of a kept batch) series, by name and reason."""
        return {m.group(1) + ":" + m.group(2): float(m.group(3)) for m in re.finditer(
            r'^(flare_ingest_rejected_total|flare_ingest_items_dropped_total)'
            r'\{reason="([^"]+)"\} (\S+)$', self.get("/metrics"), re.M)}


def start_daemon(build_dir, tmp_path, *extra):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    if not os.path.exists(os.path.join(build_dir, "bin", "flare-replay")):
        pytest.skip("build/bin/flare-replay not built")
    return Daemon(build_dir, tmp_path, *extra)


@pytest.fixture
def daemon(build_dir, tmp_path):
    d = start_daemon(build_dir, tmp_path)
    yield d
    if d.proc.poll() is None:
        d.proc.kill()


def replay_cmd(build_dir, daemon, job, *extra, fixture=FIXTURE):
    return [os.path.join(build_dir, "bin", "flare-replay"), "--fixture", fixture, "--target",
            "127.0.0.1:%d" % daemon.grpc, "--ranks", str(RANKS), "--job", job, "--speed", "0",
            "--hold-s", "0.5", *map(str, extra)]


def replay(build_dir, daemon, job, *extra, fixture=FIXTURE):
    """Runs flare-replay to the end; returns when it started (ns), for settled()."""
    started = time.time_ns()
    res = subprocess.run(replay_cmd(build_dir, daemon, job, *extra, fixture=fixture),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr + res.stdout
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["accepted"] == RANKS and out["rejected"] == {} and out["stream_errors"] == 0, out
    return started


def settled(daemon, job, since, timeout=20):
    """The job's report once the detectors have run over everything the replay sent (metrics
    computed after the replay ended), after one more detector pass."""
    deadline = time.time() + timeout
    sent = since
    while time.time() < deadline:
        report = daemon.json("/api/v1/jobs/%s/report" % job)
        computed = int(report.get("metrics", {}).get("computedUnixNs", 0) or 0)
        if computed > sent:
            time.sleep(1.2)  # one more pass: alerts of the same window are out
            return daemon.json("/api/v1/jobs/%s/report" % job)
        time.sleep(0.2)
    raise AssertionError("no detector pass over job %s: %s" % (job, report))


def wait_alerts(daemon, job, kind, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        alerts = [a for a in daemon.alerts(job) if a["kind"] == kind]
        if alerts:
            return alerts
        time.sleep(0.2)
    return []


# ---- the fixture's figures, computed here from its raw records ----------------------------

@pytest.fixture(scope="module")
def export(build_dir, tmp_path_factory):
    """name -> (the fixture's records as flare-export prints them, where they were written in
    the layout of tests/fixtures/gpu/: <fixture>/rank0.jsonl.gz)."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            with tarfile.open(os.path.join(FIXTURES, name + ".tar.gz")) as t:
                t.extractall(folder / "spool")
            res = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                                  str(folder / "spool")], capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, res.stderr
            (folder / name).mkdir()
            with gzip.open(folder / name / "rank0.jsonl.gz", "wt") as f:
                f.write(res.stdout)
            cache[name] = ([json.loads(line) for line in res.stdout.splitlines()],
                           str(folder / name))
        return cache[name]
    return get


@pytest.fixture(scope="module")
def records(export):
    return export("healthy")[0]


def step_starts(records):
    """Step boundaries as flared takes them: explicit step markers, else DataLoader __next__."""
    markers = sorted(r["start_ns"] for r in records
                     if r["kind"] == "sync" and r["name"] == "flare_step")
    if markers:
        return markers
    return sorted(r["start_ns"] for r in records
                  if r["kind"] == "span" and r["name"].endswith("__next__"))


def gpu_ops(records):
    return [r for r in records if r["kind"] not in ("span", "sync", "summary")]


def quantile(sorted_values, p):
    """Linear interpolation between order statistics (numpy's default)."""
    pos = p * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def v_inter_per_step(records):
    """T_inter / T_step per step (docs/metrics.md): the GPU gap around the step's first
    DataLoader call, from the latest end of the ops started before the call (not before the
    step's start) to the first op starting at or after its end (not after the step's end)."""
    starts = step_starts(records)
    ops = sorted(gpu_ops(records), key=lambda r: (r["start_ns"], r["end_ns"]))
    loads = sorted((r["start_ns"], r["end_ns"]) for r in records
                   if r["kind"] == "span" and r["name"].endswith("__next__"))
    out = []
    for s0, s1 in zip(starts, starts[1:]):
        load = next((l for l in loads if l[0] >= s0), None)
        inter = 0
        if load is not None and load[0] < s1:
            before = [o["end_ns"] for o in ops if o["start_ns"] < load[0]]
            opens = max(s0, max(before)) if before else s0
            after = [o["start_ns"] for o in ops if o["start_ns"] >= load[1]]
            closes = min(s1, after[0]) if after else s1
            inter = max(0, closes - min(opens, s1))
        out.append(inter / (s1 - s0))
    return out


def expected(records):
    starts = step_starts(records)
    warm = starts[1]
    compute = [r for r in records if r["kind"] in ("gemm", "attention") and
               r["issue_ns"] >= warm and r["flops"] > 0]
    latencies = sorted(r["issue_latency_ns"] for r in gpu_ops(records) if r["issue_ns"] >= warm)
    return {
        "steps": len(starts) - 2,  # intervals after the warm-up step
        "step_ns": [b - a for a, b in zip(starts, starts[1:])],
        "tflops": sum(r["flops"] for r in compute) /
                  sum(r["duration_ns"] for r in compute) / 1e3,
        "v_inter_steps": v_inter_per_step(records),
        "v_inter": statistics.median(v_inter_per_step(records)[1:]),
        "latencies": latencies,
    }


# ---- tests -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_the_fixtures_are_small_and_have_steps_collectives_and_loader_spans(export, name):
    records = export(name)[0]
    assert os.path.getsize(os.path.join(FIXTURES, name + ".tar.gz")) < 400 * 1024
    assert len(step_starts(records)) >= 16
    kinds = {r["kind"] for r in records}
    assert {"gemm", "collective", "span"} <= kinds
    assert any(r["kind"] == "span" and r["name"].endswith("__next__") for r in records)
    comms = {r["comm_hash"] for r in records if r["kind"] == "collective"}
    assert len(comms) == (2 if name == "healthy" else 1)


@pytest.mark.parametrize("name,form,mode", [
    ("healthy", "spool", "raw"), ("healthy", "jsonl", "raw"), ("healthy", "spool", "summary"),
    ("pytorch-like", "spool", "raw"), ("pytorch-like", "spool", "summary")])
def test_healthy_replay_raises_nothing_and_every_figure_matches_the_fixture(
        build_dir, daemon, export, name, form, mode):
    # The same trace as a spool archive (tests/fixtures/sim/) and as flare-export's JSON lines
    # in the layout of the GPU captures (tests/fixtures/gpu/README.md); and in summary mode, as
    # the ranks' own encoder (BatchBuilder) turns it into kernel summaries and step statistics.
    # Summary mode's figures are the raw records' except where it keeps less: TFLOPS from 1 s
    # kernel-summary windows (the one holding the warm-up step counts whole).
    records, jsonl = export(name)
    summary = mode == "summary"
    spool = os.path.join(FIXTURES, name + ".tar.gz")
    started = replay(build_dir, daemon, "healthy", "--mode", mode,
                     fixture=spool if form == "spool" else jsonl)
    report = settled(daemon, "healthy", started)
    assert daemon.alerts("healthy") == []
    want = expected(records)
    m = report["metrics"]
    # Every rank replays the fixture's rank: the job's figures are the fixture's.
    assert m["steps"] == want["steps"]
    tflops_rel = 1e-3 if summary else 1e-6
    assert m["tflops"] == pytest.approx(want["tflops"], rel=tflops_rel)
    assert len(m["rankTflops"]) == RANKS
    for r in m["rankTflops"]:
        assert r["tflops"] == pytest.approx(want["tflops"], rel=tflops_rel)
    assert m.get("vInter", 0) == pytest.approx(want["v_inter"], rel=1e-6, abs=1e-9)
    # The series print 6 significant digits: equal to that precision.
    series = daemon.json("/api/v1/jobs/healthy/series")
    assert series["ranks"] == list(range(RANKS))
    first = series["steps"]["first"]
    for row in series["stepTimeNs"]:
        assert row == pytest.approx(want["step_ns"][first:first + len(row)], rel=1e-5)
    for row in series["vInter"]:
        assert row == pytest.approx(want["v_inter_steps"][first:first + len(row)], rel=1e-5)
    # The series' issue-latency distribution is built from the ops flared holds one by one: in
    # summary mode only the collectives (the rest reaches the detectors as step sketches), so it
    # is compared in raw mode only.
    lat = series["issueLatency"]
    for per_rank in lat["perRank"] if not summary else []:
        assert per_rank["samples"] == len(want["latencies"])
        assert per_rank["ns"] == pytest.approx(
            [quantile(want["latencies"], p) for p in lat["probabilities"]], rel=1e-5)
    assert all(v == 0 for v in daemon.rejected().values()), daemon.rejected()


@pytest.mark.parametrize("name,flag,kind,rank,team", [
    ("healthy", ("--slow-gpu", "3:1.25"), "gpu_slow", 3, "operations"),  # a GPU at 80% clock
    ("healthy", ("--slow-link", "5:2"), "link_slow", 5, "operations"),  # half the bandwidth
    ("healthy", ("--stall", "6:5"), "issue_stall", 6, "algorithm"),  # 5 ms host pause per step
    # One job-wide communicator: no peer communicator to compare a slow link with (named
    # against history: test_a_slow_link_on_the_one_job_wide_communicator_is_named_against_history).
    ("pytorch-like", ("--slow-gpu", "3:1.25"), "gpu_slow", 3, "operations"),
    ("pytorch-like", ("--stall", "6:5"), "issue_stall", 6, "algorithm"),
])
@pytest.mark.parametrize("mode", ["raw", "summary"])
def test_each_perturbation_is_named_with_its_rank_and_team(build_dir, daemon, name, flag, kind,
                                                             rank, team, mode):
    job = name + "-" + kind
    started = replay(build_dir, daemon, job, "--mode", mode, *flag,
                     fixture=os.path.join(FIXTURES, name + ".tar.gz"))
    wait_alerts(daemon, job, kind)
    settled(daemon, job, started)
    alerts = daemon.alerts(job)
    assert [(a["kind"], a["rank"], a["team"]) for a in alerts] == [(kind, rank, team)], alerts
    assert "rank %d" % rank in alerts[0]["message"]
    assert all(v == 0 for v in daemon.rejected().values()), daemon.rejected()


@pytest.mark.parametrize("mode", ["raw", "summary"])
def test_a_slow_link_on_the_one_job_wide_communicator_is_named_against_history(build_dir, daemon,
                                                                              mode):
    """pytorch-like runs every collective on one communicator of all ranks: a slow link has no
    peer communicator to show against, and is named only against healthy history (the
    fixture's own healthy replay): on every rank of the communicator, routed to operations."""
    fixture = os.path.join(FIXTURES, "pytorch-like.tar.gz")
    started = replay(build_dir, daemon, "dp-base", "--mode", mode, fixture=fixture)
    settled(daemon, "dp-base", started)
    req = urllib.request.Request("http://127.0.0.1:%d/api/v1/jobs/dp-base/baseline" % daemon.http,
                                 method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    started = replay(build_dir, daemon, "dp-slow", "--mode", mode, "--slow-link", "5:2",
                     fixture=fixture)
    wait_alerts(daemon, "dp-slow", "link_slow")
    settled(daemon, "dp-slow", started)
    alerts = daemon.alerts("dp-slow")
    assert [(a["kind"], a["rank"], a["team"]) for a in alerts] == [
        ("link_slow", -1, "operations")], alerts
    assert "below healthy history (1 run)" in alerts[0]["message"], alerts[0]
    found = [d for d in daemon.json("/api/v1/jobs/dp-slow/diagnoses")["diagnoses"]
             if d["kind"] == "link_slow"]
    assert found and found[0]["ranks"] == list(range(RANKS)), found
    # And a healthy replay against the same history raises nothing.
    started = replay(build_dir, daemon, "dp-again", "--mode", mode, fixture=fixture)
    settled(daemon, "dp-again", started)
    assert daemon.alerts("dp-again") == []
    assert all(v == 0 for v in daemon.rejected().values()), daemon.rejected()


def test_dump_is_what_was_sent_and_diagnoses_offline_as_in_flared(build_dir, daemon, tmp_path):
    # --dump writes each rank's stream as a spool: flare-diagnose finds there what flared found.
    started = replay(build_dir, daemon, "dumped", "--slow-gpu", "3:1.25", "--dump",
                     str(tmp_path / "dump"))
    wait_alerts(daemon, "dumped", "gpu_slow")
    settled(daemon, "dumped", started)
    online = [(a["kind"], a["rank"], a["team"]) for a in daemon.alerts("dumped")]
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input",
                          str(tmp_path / "dump"), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 3, res.stderr
    offline = [(d["kind"], d["ranks"][0] if len(d["ranks"]) == 1 else -1, d["team"])
               for d in json.loads(res.stdout)["diagnoses"]]
    assert offline == online == [("gpu_slow", 3, "operations")]
    ranks = daemon.json("/api/v1/jobs/dumped/ranks")["ranks"]
    assert len(ranks) == RANKS and all(int(r.get("lostBatches", 0)) == 0 for r in ranks)


def issue_latencies(records):
    """Per rank, the issue latencies of the GPU ops it issued after its warm-up step, pooled."""
    out = []
    for rank in sorted({r["rank"] for r in records}):
        mine = [r for r in records if r["rank"] == rank]
        warm = step_starts(mine)[1]
        out += [r["issue_latency_ns"] for r in gpu_ops(mine) if r["issue_ns"] >= warm]
    return sorted(out)


def clipped_w1(a, b, cap, points=1000):
    """1-Wasserstein distance of two samples, each clipped at `cap` (docs/metrics.md: the
    regression detector's distance), over `points` evenly spaced quantiles."""
    def q(s, u):
        return s[min(len(s) - 1, int(u * len(s)))]
    return sum(abs(min(q(a, (i + 0.5) / points), cap) - min(q(b, (i + 0.5) / points), cap))
               for i in range(points)) / points


def test_issue_latency_against_a_healthy_baseline_matches_the_records(build_dir, daemon, records,
                                                                      tmp_path):
    # The healthy replay becomes the history of its backend and scale; a replay with a stalled
    # rank is then compared with it. The W1 flared reports equals the one computed here from
    # what the two replays sent (the stall's --dump and the fixture itself) within the 2%
    # accuracy of flared's sketches.
    started = replay(build_dir, daemon, "base")
    settled(daemon, "base", started)
    req = urllib.request.Request("http://127.0.0.1:%d/api/v1/jobs/base/baseline" % daemon.http,
                                 method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    # A second healthy replay: the same distribution, W1 0.
    started = replay(build_dir, daemon, "again")
    m = settled(daemon, "again", started)["metrics"]
    assert m["hasBaseline"] and m["baselineRuns"] == 1
    assert m["issueLatencyW1Ns"] == pytest.approx(0, abs=1.0)
    assert daemon.alerts("again") == []
    # The stalled rank's queue runs dry: its issue latencies collapse.
    dump = tmp_path / "dump"
    started = replay(build_dir, daemon, "stalled", "--stall", "6:5", "--dump", str(dump))
    m = settled(daemon, "stalled", started)["metrics"]
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(dump)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    sent = [json.loads(line) for line in res.stdout.splitlines()]
    healthy = issue_latencies(records)
    cap = quantile(healthy, 0.5)
    want = clipped_w1(issue_latencies(sent), healthy, cap)
    assert want > m["issueLatencyW1ThresholdNs"]
    assert m["issueLatencyW1Ns"] == pytest.approx(want, rel=0.05, abs=0.005 * cap)
    found = {(a["kind"], a["rank"], a["team"]) for a in daemon.alerts("stalled")}
    assert found == {("issue_stall", 6, "algorithm"),
                     ("issue_latency_regression", -1, "algorithm")}, found
    assert all(v == 0 for v in daemon.rejected().values()), daemon.rejected()


@pytest.mark.parametrize("name,mode", [("healthy", "raw"), ("healthy", "summary"),
                                       ("pytorch-like", "raw")])
def test_hang_mid_step_is_diagnosed_as_that_rank(build_dir, tmp_path, name, mode):
    # Rank 2 stops issuing in the middle of step 3; every other rank ends up waiting in a
    # collective rank 2 never issued. flared sees the silence, asks every rank for its stacks
    # (answered by the replayer from its model: progress per communicator, where each waits)
    # and names rank 2.
    daemon = start_daemon(build_dir, tmp_path, "--hang-timeout-s", "2")
    proc = subprocess.Popen(replay_cmd(build_dir, daemon, "hang", "--mode", mode, "--hang", "2:3",
                                       "--hold-s", "40",
                                       fixture=os.path.join(FIXTURES, name + ".tar.gz")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        alerts = wait_alerts(daemon, "hang", "hang", timeout=40)
        assert [(a["kind"], a["rank"], a["team"]) for a in alerts] == [("hang", 2, "operations")], \
            alerts
        assert alerts[0]["message"].startswith("non-communication hang: suspects rank 2 ")
        assert "never issued by ranks 2" in alerts[0]["message"]
        assert all(v == 0 for v in daemon.rejected().values()), daemon.rejected()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        daemon.proc.kill()


def test_paced_replay_stamps_records_with_the_time_they_are_sent(build_dir, daemon, records,
                                                                   tmp_path):
    # At --speed 2 the 0.37 s trace takes about half that; the records are moved so that the
    # last one is stamped when it is sent: none is from the future, none from long ago.
    recorded = max(r["end_ns"] for r in records) - min(r.get("issue_ns", r["start_ns"])
                                                       for r in records)
    before = time.time_ns()
    replay(build_dir, daemon, "paced", "--speed", "2", "--hold-s", "0", "--dump",
           str(tmp_path / "dump"))
    after = time.time_ns()
    assert after - before >= recorded / 2 * 0.9
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                          str(tmp_path / "dump")], capture_output=True, text=True, timeout=60)
    sent = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(sent) == RANKS * len(records)
    assert before - recorded <= min(r["start_ns"] for r in sent)
    assert max(r["end_ns"] for r in sent) <= after
    assert int(daemon.json("/api/v1/jobs/paced/ranks")["ranks"][0]["records"]) > 0


def test_bad_arguments_are_clear_errors(build_dir, tmp_path):
    tool = os.path.join(build_dir, "bin", "flare-replay")
    if not os.path.exists(tool):
        pytest.skip("build/bin/flare-replay not built")
    res = subprocess.run([tool], capture_output=True, text=True)
    assert res.returncode == 2 and "--fixture" in res.stderr
    res = subprocess.run([tool, "--fixture", str(tmp_path / "nope")], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "neither a fixture folder nor a fixture file" in res.stderr
    res = subprocess.run([tool, "--fixture", FIXTURE, "--ranks", "4", "--slow-gpu", "4:2"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "not below --ranks" in res.stderr
