"""The real GPU fixtures (tests/fixtures/gpu/: PyTorch loops recorded on an H200) re-issued
through the preload library in its default mode: `flare run --daemon` (summary mode, the 0.5%
timing budget's step sampling) around `flare-sim-train --trace FIXTURE --repeat N`, which plays
the recorded API sequence against the simulated stack (src/sim/workload/trace_driver.py): the
hook's own pipeline — launch wrappers, step rule, step sampling, summaries, encoder — meets
the launch patterns of real PyTorch, and flared judges what it sent. test_gpu_fixtures.py
streams the recorded records themselves (no hook).

A fixture holds 8 steps after 3 warm-up ones; --repeat plays the 8 (less the last, which ends
the loop) REPEAT times, so that step sampling has a job long enough to sample.

Asserted for each fixture: nothing refused or lost; every step of the replay held by flared;
the kernel report's launch counts per kind against what the driver issued (the workload's own
truth; step sampling's weights stand for the steps it left untimed); the default budget left
steps untimed where there was something to leave; and the diagnoses: none on the healthy loops,
the scenario's own fault where one rank shows it; a GPU at 80% clock under one of four copies of
a healthy loop named on that rank; the stray synchronize named against healthy history of the
same loop, recorded in the default mode too. The host-stall fixture's recorded GC pause
(rank 1, ~10 ms per step) replayed as rank 3 beside three copies of rank 0 is named on rank 3
with every op timed (raw mode, and summary mode with FLARE_TIMING_BUDGET_PCT=0); the default
budget's sampling names it only now and then, and never another rank (see the test)."""

import gzip
import json
import os
import subprocess
import sys
import time

import pytest

import pipeline_health
from test_flared_diagnosis import Daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "gpu")
REPEAT = 6
STEP_SPAN = "torch.utils.data.dataloader._BaseDataLoaderIter@__next__"
# What each fixture must raise through the hook: (kind, team, ranks).
EXPECT = {
    "healthy-small": [],
    "healthy-medium": [],
    "cuda-graph": [],
    "compile": [],
    "slow-dataloader": [("void_inter", "algorithm", (0,))],
    "unaligned-gemm": [("unoptimized_gemm", "infrastructure", ())],
}
REPORT_KINDS = {"gemm": "OP_KIND_GEMM", "memcpy": "OP_KIND_MEMCPY", "memset": "OP_KIND_MEMSET"}


@pytest.fixture(scope="module")
def daemon(build_dir, tmp_path_factory):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path_factory.mktemp("flared"))
    yield d
    if d.proc.poll() is None:
        pipeline_health.assert_nothing_refused(d.http)
        d.proc.kill()


def clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLARE_") and k not in ("LD_PRELOAD", "TRACED_PYTHON_API")}
    env.update(extra)
    return env


def boundaries(name, rank):
    """The recorded rank's step boundaries (its DataLoader calls) and warm-up steps."""
    with gzip.open(os.path.join(FIXTURES, name, "rank%d.jsonl.gz" % rank), "rt") as f:
        n = sum(1 for line in f if '"span"' in line and STEP_SPAN in line)
    with open(os.path.join(FIXTURES, name, "loop.json")) as f:
        warmup = json.load(f)["ranks"][str(rank)]["warmup"]
    return n, warmup


def drive(build_dir, daemon, tmp_path, name, job, ranks=1, extra_env=None, extra_args=()):
    """The fixture through the hook and flared as job `job`; returns (the driver's per-rank
    FLARE_TRACE_REPLAY summaries, the ranks' rows, the kernel report, flared's diagnoses) once
    flared settled."""
    env = clean_env(dict(extra_env or {}, FLARE_OUTPUT_DIR=str(tmp_path / "spool")))
    cmd = [os.path.join(build_dir, "bin", "flare"), "run", "--daemon",
           "127.0.0.1:%d" % daemon.grpc, "--job-id", job, "--quiet", "--",
           os.path.join(build_dir, "bin", "flare-sim-train"), "--trace",
           os.path.join(FIXTURES, name), "--ranks", str(ranks), "--repeat", str(REPEAT),
           "--timeout", "200", *extra_args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summaries = sorted((json.loads(line.split("FLARE_TRACE_REPLAY ", 1)[1])
                        for line in res.stdout.splitlines() if "FLARE_TRACE_REPLAY " in line),
                       key=lambda s: s["rank"])
    assert len(summaries) == ranks, res.stdout[-3000:]
    want = {s["rank"]: s["step_boundaries"] - 1 for s in summaries}
    info = pipeline_health.wait_for_job(daemon, job, ranks, lambda held: held == want, 40)
    assert pipeline_health.steps_held(daemon, job) == want, info
    for r in info:
        assert not int(r.get("lostBatches", 0)) and not r.get("refusals"), r
    # The detectors' pass over everything the ranks sent: flared analyses a job when new
    # records arrived, every second; the pass that stays the last one for 2.5 s saw it all.
    last, deadline = -1, time.time() + 45
    while True:
        report = json.loads(daemon.get("/api/v1/jobs/%s/report" % job))
        now = int(report.get("metrics", {}).get("computedUnixNs", 0) or 0)
        if now == last and now > 0:
            break
        assert time.time() < deadline, "flared never settled on job " + job
        last = now
        time.sleep(2.5)
    pipeline_health.assert_nothing_refused(daemon.http)
    found = json.loads(daemon.get("/api/v1/jobs/%s/diagnoses" % job))["diagnoses"]
    return summaries, info, report, found


def shown(found):
    return [(d["kind"], d.get("ranks"), d.get("summary", "")[:300]) for d in found]


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_each_real_fixture_through_the_hook_in_its_default_mode(build_dir, daemon, tmp_path,
                                                                name):
    summaries, info, report, found = drive(build_dir, daemon, tmp_path, name, "hook-" + name)
    s = summaries[0]
    n, warmup = boundaries(name, 0)
    assert s["repeat"] == REPEAT, s
    # The graph capture's stream and event waits and empty_cache are traced spans the driver
    # has no stand-in function for (their ops are replayed; the spans are counted as skipped).
    skipped = {"torch.cuda.Event@wait", "torch.cuda.Stream@wait_event",
               "torch.cuda.Stream@wait_stream", "torch.cuda@empty_cache"}
    assert set(s["spans_not_reproduced"]) <= (skipped if name == "cuda-graph" else set()), s
    # The replay's steps: the warm-up once, the steps after it REPEAT times, the loop's end.
    assert s["step_boundaries"] == warmup + (n - 1 - warmup) * REPEAT + 1, (s, n, warmup)
    # The kernel report counts every launch the driver issued, the untimed steps' included
    # (each measured step stands for those it represents; the steps are alike, so the weighted
    # counts come out within 0.5% of the truth).
    counts = {}
    for sig in report.get("signatures", []):
        kind = sig["signature"].get("kind")
        counts[kind] = counts.get(kind, 0) + int(sig.get("count", 0))
    for kind, report_kind in REPORT_KINDS.items():
        issued = s["issued"].get(kind, 0)
        assert abs(counts.get(report_kind, 0) - issued) <= 0.005 * issued, (kind, counts, s)
    plain = s["issued"].get("kernel", 0)
    assert abs(counts.get("OP_KIND_KERNEL", 0) - plain) <= 0.005 * plain, (counts, s)
    if name == "cuda-graph":
        # Each step is one graph launch (the loop captured it before its first step; timed in
        # every step, as collectives are): the hook's step rule takes a launch as training work,
        # so each DataLoader call starts a step.
        assert s["issued"].get("graph") == s["step_boundaries"], s
    else:
        # The default budget (0.5% of the step) left steps untimed: timing every op of these
        # loops costs more than that on any machine (hundreds of launches a step).
        assert int(info[0].get("stepsSampledOut", 0)) > 0, info
    got = sorted((d["kind"], d["team"], tuple(d.get("ranks", []))) for d in found)
    assert got == EXPECT[name], shown(found)
    if name == "unaligned-gemm":
        # The MLP's 3080 named, against an aligned GEMM of its own transposes.
        e = found[0]["evidence"]
        assert e and all("3080" in x["text"] for x in e), e


def test_an_underclocked_gpu_beside_three_real_loops_is_named_in_the_default_mode(
        build_dir, daemon, tmp_path):
    """healthy-small as 4 ranks, rank 2's simulated GPU at 80% clock (FLARE_SIM_CLOCK_FACTOR):
    gpu_slow on rank 2 alone, routed to operations, from the kernel summaries of the few steps
    the default budget measured (before summary mode also judged a rank by its typical call,
    the W1 fence missed it in 2 runs of 6)."""
    _, _, _, found = drive(build_dir, daemon, tmp_path, "healthy-small", "hook-gpu-slow", ranks=4,
                           extra_env={"FLARE_SIM_CLOCK_FACTOR": "2:0.8"})
    slow = [d for d in found if d["kind"] == "gpu_slow"]
    assert [(d["team"], d.get("ranks")) for d in slow] == [("operations", [2])], shown(found)
    assert 0.1 <= slow[0]["severity"] <= 0.4, slow[0]
    # The 4 replayed ranks share this machine's 2 CPUs: cpu_contention is the machine's.
    assert [d for d in found if d["kind"] not in ("gpu_slow", "cpu_contention")] == [], \
        shown(found)


def test_a_stray_synchronize_is_named_against_healthy_history_of_the_default_mode(
        build_dir, tmp_path):
    """Three runs of the H200 healthy-small loop through the hook in the default mode, stored
    as healthy history (`flare baseline add`); then the stray-sync loop (a torch.cuda.synchronize()
    mid-forward every step, on every rank: nothing a rank-vs-peers detector can see) is named by
    issue_latency_regression with the synchronize as its cause, and a fourth healthy run is not,
    its lookedAt saying what was compared. Before a measured step's issue latencies stood for the
    steps sampled out before it, the history read as low as the stray synchronize (W1 57 us
    against a learned 125 us) and nothing was named."""
    (tmp_path / "flared").mkdir()
    d = Daemon(build_dir, tmp_path / "flared")
    try:
        http = "127.0.0.1:%d" % d.http
        for job in ("history-1", "history-2", "history-3"):
            drive(build_dir, d, tmp_path / job, "healthy-small", job)
            res = subprocess.run([os.path.join(build_dir, "bin", "flare"), "baseline", "add",
                                  "--job", job, "--daemon-http", http], capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0 and "healthy history" in res.stdout, res.stderr
        _, _, _, found = drive(build_dir, d, tmp_path / "sync", "stray-sync", "stray-sync")
        got = [(x["kind"], x["team"]) for x in found]
        assert got == [("issue_latency_regression", "algorithm")], shown(found)
        assert "likely cause: torch.cuda@synchronize" in found[0]["summary"], found[0]
        _, _, _, found = drive(build_dir, d, tmp_path / "again", "healthy-small", "healthy-4")
        assert found == [], shown(found)
        looked = json.loads(d.get("/api/v1/jobs/healthy-4/diagnoses"))["lookedAt"]["detectors"]
        note = [x["note"] for x in looked if x["name"] == "issue_latency_regression"]
        assert note and note[0].startswith("issue latencies compared with 3 healthy history "
                                           "runs': W1 below them"), looked
    finally:
        if d.proc.poll() is None:
            pipeline_health.assert_nothing_refused(d.http)
            d.proc.kill()


HOST_STALL_MODES = [
    ("raw", {"FLARE_MODE": "raw"}),
    ("summary-exact", {"FLARE_TIMING_BUDGET_PCT": "0"}),
    ("default", {}),
]


@pytest.mark.parametrize("mode,env", HOST_STALL_MODES, ids=[m for m, _ in HOST_STALL_MODES])
def test_the_recorded_gc_pause_through_the_hook_is_named_on_its_rank(build_dir, daemon, tmp_path,
                                                                    mode, env):
    """host-stall's recorded rank 1 (a ~10 ms gc.collect() every step) as rank 3 beside three
    copies of its rank 0: issue_stall on rank 3 alone, routed to the algorithm team, with every
    op timed (raw mode, and summary mode with FLARE_TIMING_BUDGET_PCT=0).

    In the default mode it is named only now and then (2026-11-29: in 2 runs of 9 at 45 steps
    on this machine, not in the one at 143 steps): the four processes share no collective, so
    a step the budget sampled out has no host figure (a rank's issue offset there comes from
    its collectives) and the paired test keeps only the steps every rank measured
    (docs/metrics.md, "Step sampling"). What the default must not do is name another rank or
    another cause."""
    _, _, _, found = drive(build_dir, daemon, tmp_path, "host-stall", "hook-stall-" + mode,
                           ranks=4, extra_env=env, extra_args=("--rank-map", "0,0,0,1"))
    stalls = [(d["team"], d.get("ranks")) for d in found if d["kind"] == "issue_stall"]
    if mode == "default":
        assert stalls in ([], [("algorithm", [3])]), shown(found)
    else:
        assert stalls == [("algorithm", [3])], shown(found)
    # The 4 replayed ranks share this machine's CPUs: a host finding on another rank is the
    # machine's (cpu_contention), never issue_stall on a healthy copy.
    assert [d for d in found if d["kind"] not in ("issue_stall", "cpu_contention")] == [], \
        shown(found)


def test_repeat_plays_the_steady_steps_again_with_spans_of_their_own(build_dir):
    """repeat_steps on a real fixture: the warm-up once, the steps after it N times back to
    back, the loop's end after the last copy; every copied span has an id of its own and its
    ops follow it."""
    sys.path.insert(0, os.path.join(ROOT, "src", "sim", "workload"))
    import trace_driver as td
    records = td.read_fixture(os.path.join(FIXTURES, "healthy-small"),
                              os.path.join(build_dir, "bin", "flare-export"))[0]
    bounds = td.step_boundaries(records)
    warmup = td.fixture_warmup(os.path.join(FIXTURES, "healthy-small"), 0)
    assert warmup == 3 and len(bounds) == 11
    lo, hi = bounds[warmup], bounds[-1]
    inside = [r for r in records if lo <= td._t(r) < hi]
    out = td.repeat_steps(records, warmup, 4)
    assert len(out) == len(records) + 3 * len(inside)
    got = td.step_boundaries(out)
    assert len(got) == warmup + 4 * (len(bounds) - 1 - warmup) + 1
    assert got[:warmup + 1] == bounds[:warmup + 1]
    width = hi - lo
    assert got[-1] == hi + 3 * width and got[warmup + 7] == lo + width
    spans = [r for r in out if r["kind"] == "span"]
    ids = [r["id"] for r in spans]
    assert len(ids) == len(set(ids))
    by_id = {r["id"]: r for r in spans}
    for r in out:
        parent = r.get("parent_span") if r["kind"] != "span" else r.get("parent")
        if parent:
            owner = by_id[parent]
            assert owner["start_ns"] <= td._t(r) <= owner["end_ns"], (r, owner)
    assert td.repeat_steps(records, warmup, 1) is records
    with pytest.raises(td.TraceError, match="warm-up"):
        td.repeat_steps(records, 10, 2)


def test_the_driver_checks_repeat_and_rank_map(build_dir, tmp_path):
    base = [os.path.join(build_dir, "bin", "flare-sim-train"), "--trace",
            os.path.join(FIXTURES, "host-stall"), "--timeout", "60"]
    env = clean_env({})
    for args, said in ((["--ranks", "2", "--rank-map", "0,5"], "no rank 5"),
                       (["--ranks", "2", "--rank-map", "0"], "names 1 ranks for a replay of 2"),
                       (["--ranks", "1", "--rank-map", "x"], "--rank-map takes recorded ranks"),
                       (["--ranks", "1", "--repeat", "0"], "--repeat must be at least 1")):
        res = subprocess.run(base + args, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode != 0 and said in res.stdout + res.stderr, \
            (args, res.stdout[-2000:], res.stderr[-2000:])
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--repeat", "2"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--repeat needs --trace" in res.stderr, res.stderr
