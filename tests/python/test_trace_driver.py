"""Issue 19 part 2, the second replay mode: `flare-sim-train --trace FIXTURE` re-issues a recorded
trace against the simulated CUDA/cuBLAS/NCCL stack with libflare_hook.so preloaded
(src/sim/workload/trace_driver.py), so that the hook's own pipeline meets the recorded launch
pattern. flare-replay (test_replay.py) is the first mode: records streamed into flared, no hook.

What is asserted, on the simulator's fixtures (tests/fixtures/sim/, one recorded rank each):
raw mode into a spool reproduces the fixture's op counts per kind and name, its steps (the
DataLoader calls and step markers), its spans and their nesting, its threads and streams (which
thread launches what on which stream), and each signature's GPU duration within a tolerance;
with several ranks the collectives are NCCL calls on rebuilt communicators; through flared in
summary mode nothing is refused, every step is present and a healthy fixture raises nothing."""

import collections
import gzip
import json
import statistics
import os
import subprocess
import tarfile
import time

import pytest

import pipeline_health
from conftest import python_interpreters
from test_flared_diagnosis import Daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "sim")
# healthy.tar.gz was recorded with these traced (tests/fixtures/sim/healthy.json): the replay
# needs them traced too, as any replay of a fixture recorded with TRACED_PYTHON_API does.
TRACED = {"healthy": "sim_train@_LoaderIter.__next__,sim_train@injected_sync",
          "pytorch-like": ""}
STEP_SPANS = ("torch.utils.data.dataloader._BaseDataLoaderIter@__next__",
              "sim_train@_LoaderIter.__next__")
GPU_KINDS = ("kernel", "attention", "gemm", "collective", "p2p", "memcpy", "memset", "graph")


def clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLARE_") and k not in ("LD_PRELOAD", "TRACED_PYTHON_API")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def fixture(build_dir, tmp_path_factory):
    """name -> (the fixture's records as flare-export prints them, the same lines written as
    the GPU captures' layout: <dir>/rank0.jsonl.gz)."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp("fixture-" + name)
            with tarfile.open(os.path.join(FIXTURES, name + ".tar.gz")) as t:
                t.extractall(str(folder / "spool"))
            res = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                                  str(folder / "spool")], capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, res.stderr
            (folder / "jsonl").mkdir()
            with gzip.open(str(folder / "jsonl" / "rank0.jsonl.gz"), "wt") as f:
                f.write(res.stdout)
            cache[name] = ([json.loads(line) for line in res.stdout.splitlines()],
                           str(folder / "jsonl"))
        return cache[name]
    return get


def replay_args(build_dir, trace, ranks, *extra):
    return [os.path.join(build_dir, "bin", "flare-sim-train"), "--trace", trace, "--ranks",
            str(ranks), "--timeout", "100", *extra]


def replay_to_spool(build_dir, workdir, name, trace, ranks, *extra):
    """Replays `trace` with the hook preloaded, raw mode, into a spool; returns (records per
    replayed rank, the ranks' FLARE_TRACE_REPLAY summaries)."""
    spool = os.path.join(str(workdir), "spool")
    env = clean_env({"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
                     "FLARE_OUTPUT_DIR": spool, "FLARE_JOB_ID": "trace", "FLARE_MODE": "raw",
                     "TRACED_PYTHON_API": TRACED[name]})
    started = time.monotonic()
    res = subprocess.run(replay_args(build_dir, trace, ranks, *extra), env=env,
                         capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summaries = [json.loads(line.split("FLARE_TRACE_REPLAY ", 1)[1])
                 for line in res.stdout.splitlines() if "FLARE_TRACE_REPLAY " in line]
    assert len(summaries) == ranks, res.stdout
    out = {}
    for r in range(ranks):
        exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                              os.path.join(spool, "trace", str(r))], capture_output=True,
                             text=True, timeout=60)
        assert exp.returncode == 0, exp.stderr
        out[r] = [json.loads(line) for line in exp.stdout.splitlines()]
    return out, sorted(summaries, key=lambda s: s["rank"]), wall


# ---- what the comparisons look at ------------------------------------------------------------

def as_kernels(records):
    """The fixture as a one-rank replay issues it: collectives as kernels of the same name."""
    out = []
    for r in records:
        if r["kind"] == "collective":
            r = dict(r, kind="kernel")
        out.append(r)
    return out


def counts(records):
    return collections.Counter((r["kind"], r["name"]) for r in records)


def structure(records):
    """Which thread launches what kind on which stream, threads and streams named by role: the
    main thread (the one with the DataLoader calls, else the first), the others by their
    first record; streams by their first op (0: the legacy default stream)."""
    ordered = sorted(records, key=lambda r: r.get("issue_ns", r["start_ns"]))
    loader = [r["thread"] for r in ordered if r["kind"] == "span" and r["name"] in STEP_SPANS]
    threads = loader[:1]
    streams = [0]
    for r in ordered:
        if r["thread"] not in threads:
            threads.append(r["thread"])
        if r["kind"] != "span" and r.get("stream") not in streams:
            streams.append(r["stream"])
    return collections.Counter(
        (threads.index(r["thread"]), -1 if r["kind"] == "span" else streams.index(r["stream"]),
         r["kind"], r["name"]) for r in records)


def nesting(records):
    """(parent span's name, launched from the span's own thread?) per op kind."""
    spans = {r["id"]: r for r in records if r["kind"] == "span"}
    out = collections.Counter()
    for r in records:
        if r["kind"] != "span":
            p = spans.get(r["parent_span"])
            out[(p["name"] if p else None, p is not None and p["thread"] == r["thread"],
                 r["kind"])] += 1
    return out


def durations(records):
    d = collections.defaultdict(list)
    for r in records:
        if r["kind"] in GPU_KINDS:
            d[(r["kind"], r["name"], tuple(r.get("shape") or []), r.get("layout", ""))].append(
                r["duration_ns"])
    return d


def low_quartile(values):
    v = sorted(values)
    return v[(len(v) - 1) // 4]


def step_count(records):
    markers = [r for r in records if r["kind"] == "sync" and r["name"] == "flare_step"]
    loader = [r for r in records if r["kind"] == "span" and r["name"] in STEP_SPANS]
    return len(markers), len(loader)


def assert_reproduces(want, got, name, speed=1.0, cold_first_calls=True):
    failures = []
    if counts(got) != counts(want):
        diff = {k: (counts(want)[k], counts(got)[k]) for k in set(counts(want)) | set(counts(got))
                if counts(want)[k] != counts(got)[k]}
        failures.append("%s: op counts differ (fixture, replay): %s" % (name, diff))
    if step_count(got) != step_count(want):
        failures.append("%s: steps (markers, DataLoader calls) %s, fixture %s" % (
            name, step_count(got), step_count(want)))
    if structure(got) != structure(want):
        failures.append("%s: threads/streams differ: fixture-only %s, replay-only %s" % (
            name, structure(want) - structure(got), structure(got) - structure(want)))
    if nesting(got) != nesting(want):
        failures.append("%s: nesting differs: fixture %s, replay %s" % (
            name, nesting(want), nesting(got)))
    dw, dg = durations(want), durations(got)
    for key, wd in dw.items():
        gd = dg.get(key)
        if gd is None:
            continue  # counted above
        # The kernels' durations are the recorded ones (FLARE_SIM_COST_NANOS), the GEMMs' and
        # collectives' the simulator's model (fitted), the copies' its bandwidth model: a
        # signature's lower quartile within 10% or 30 us, at --speed X of 1/X of the recorded.
        # (The lower quartile: a launching thread descheduled between the hook's start event and
        # the launch, while its stream idles, lengthens that op as timed; on a loaded machine
        # that happens to many ops of a replay, only ever lengthening them.)
        # A collective's time holds its wait for the last peer: the replayed ranks' arrival
        # skew is their own (at set-up the recorded ranks joined far apart, in the loop copies
        # of one rank keep closer step than the recorded ranks did), so only the loop's
        # collectives (10 calls or more of a signature) are compared: the shortest (every rank
        # there at once: the modelled transfer) within a factor of 2.
        if key[0] == "collective":
            mw, mg = min(wd) / speed, min(gd)
            if len(wd) >= 10 and not 0.5 * mw <= mg <= 2 * mw:
                failures.append("%s: %s shortest %.0f ns, fixture %.0f ns" % (
                    name, key[:3], mg, mw))
            continue
        mw, mg = low_quartile(wd) / speed, low_quartile(gd)
        if abs(mg - mw) > max(0.1 * mw, 30e3):
            failures.append("%s: %s lower quartile %.0f ns, fixture %.0f ns" % (
                name, key[:3], mg, mw))
        # A cold first call (a kernel's lazy loading, a GEMM shape's heuristics: milliseconds
        # on the launching thread, timed with the call while the stream idles) stays cold. Work
        # still queued on the stream when it is issued hides part of the wait (a late, loaded
        # replay queues more than the recording did): at least 1 ms above the lower quartile.
        if (cold_first_calls and key[0] != "collective" and wd[0] / speed > mw + 2e6 / speed
                and gd[0] < mg + 1e6 / speed):
            failures.append("%s: %s first call %.0f ns (lower quartile %.0f), fixture %.0f ns"
                            % (name, key[:3], gd[0], mg, wd[0] / speed))
    assert not failures, "\n".join(failures)


# ---- raw mode into a spool --------------------------------------------------------------------

@pytest.mark.parametrize("name,form", [("pytorch-like", "spool"), ("healthy", "jsonl")])
def test_one_rank_replay_reproduces_the_fixture(build_dir, fixture, tmp_path, name, form):
    """One replayed rank: collectives become kernels of the same name (no peer to meet);
    everything else as recorded. From the spool archive, and from flare-export's JSON lines in
    the GPU captures' layout (tests/fixtures/gpu/README.md)."""
    records, jsonl = fixture(name)
    trace = os.path.join(FIXTURES, name + ".tar.gz") if form == "spool" else jsonl
    got, summaries, _ = replay_to_spool(build_dir, tmp_path, name, trace, 1)
    assert summaries[0]["spans_not_reproduced"] == {}
    assert_reproduces(as_kernels(records), got[0], name)


@pytest.mark.parametrize("name", ["pytorch-like", "healthy"])
def test_four_ranks_meet_in_nccl_on_the_recorded_communicators(build_dir, fixture, tmp_path,
                                                               name):
    """Four replayed ranks (the recorded job's size): every collective is an NCCL call again, on
    communicators laid out as recorded (pytorch-like: one data-parallel communicator of 4;
    healthy: tensor-parallel pairs {0,1},{2,3} and data-parallel pairs {0,2},{1,3})."""
    records, _ = fixture(name)
    got, summaries, _ = replay_to_spool(build_dir, tmp_path, name,
                                        os.path.join(FIXTURES, name + ".tar.gz"), 4)
    recorded_comms = {(r["comm_hash"], r["nranks"]) for r in records
                      if r["kind"] == "collective"}
    members = collections.defaultdict(set)
    for rank, recs in got.items():
        assert_reproduces(records, recs, "%s rank %d" % (name, rank))
        coll = [r for r in recs if r["kind"] == "collective"]
        assert sorted(r["nranks"] for r in coll) == sorted(r["nranks"] for r in records
                                                          if r["kind"] == "collective")
        for r in coll:
            members[r["comm_hash"]].add(rank)
        assert summaries[rank]["communicators"] == len(recorded_comms)
    groups = sorted(sorted(m) for m in members.values())
    if name == "pytorch-like":
        assert groups == [[0, 1, 2, 3]]
    else:
        assert groups == [[0, 1], [0, 2], [1, 3], [2, 3]]


def test_a_fixture_of_every_rank_is_replayed_rank_by_rank(build_dir, fixture, tmp_path):
    """A capture of every rank (tests/fixtures/gpu/'s layout, rank<R>.jsonl.gz per rank),
    replayed with as many ranks: rank r replays recorded rank r. Here two ranks made from the
    pytorch-like fixture, rank 1's kernels twice as long (an underclocked GPU); their shared
    communicator becomes one of the two replayed ranks."""
    records, _ = fixture("pytorch-like")
    slow = []
    for r in records:
        r = dict(r, rank=1)
        if r["kind"] in ("kernel", "attention"):
            r["end_ns"] = r["start_ns"] + 2 * r["duration_ns"]
            r["duration_ns"] *= 2
        slow.append(r)
    folder = tmp_path / "capture"
    folder.mkdir()
    for rank, recs in ((0, records), (1, slow)):
        with gzip.open(str(folder / ("rank%d.jsonl.gz" % rank)), "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))
    got, summaries, _ = replay_to_spool(build_dir, tmp_path, "pytorch-like", str(folder), 2)
    assert [s["source_rank"] for s in summaries] == [0, 1]
    assert_reproduces(records, got[0], "rank 0")
    # Rank 1's doubled kernels keep its stream busier, and work still queued when a cold first
    # GEMM is issued hides its host-side wait (assert_reproduces): on the 2-core machine that
    # failed the check in 4 runs of 5 (2026-11-27), so rank 0 alone carries it here.
    assert_reproduces(slow, got[1], "rank 1", cold_first_calls=False)
    for rank in (0, 1):
        coll = [r for r in got[rank] if r["kind"] == "collective"]
        assert coll and {r["nranks"] for r in coll} == {2}
    assert {r["comm_hash"] for r in got[0] if r["kind"] == "collective"} == \
        {r["comm_hash"] for r in got[1] if r["kind"] == "collective"}


def test_the_capture_scripts_fixtures_replay(build_dir, tmp_path):
    """tests/gpu/capture.sh's fixtures, from its simulated mode until a GPU run commits real ones
    (tests/fixtures/gpu/README.md): a host stall on rank 1 of 2 (each rank replays its own),
    a stray synchronize inside a traced function (sim_train@injected_sync), unaligned GEMMs."""
    out = tmp_path / "fixtures"
    env = clean_env({"OUT": str(out), "FLARE_BUILD_DIR": build_dir, "FLARE_CAPTURE_SIM": "1"})
    proc = subprocess.run(["bash", os.path.join(ROOT, "tests", "gpu", "capture.sh"), "--steps",
                           "8", "--only", "host-stall,stray-sync,unaligned-gemm"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    meta = {f["name"]: f for f in json.loads((out / "metadata.json").read_text())["fixtures"]}
    TRACED.update({"host-stall": "", "unaligned-gemm": "",
                   "stray-sync": "sim_train@injected_sync"})
    for name in ("host-stall", "stray-sync", "unaligned-gemm"):
        ranks = meta[name]["ranks"]
        want = {}
        for r in range(ranks):
            with gzip.open(str(out / name / ("rank%d.jsonl.gz" % r)), "rt") as f:
                want[r] = [json.loads(line) for line in f]
        got, summaries, _ = replay_to_spool(build_dir, tmp_path / ("replay-" + name), name,
                                            str(out / name), ranks)
        for r in range(ranks):
            assert summaries[r]["source_rank"] == r
            assert summaries[r]["spans_not_reproduced"] == {}
            recorded = want[r] if ranks > 1 else as_kernels(want[r])
            assert_reproduces(recorded, got[r], "%s rank %d" % (name, r))
        if name == "stray-sync":
            assert any(r["name"] == "sim_train@injected_sync" for r in got[0])


@pytest.mark.parametrize("version", sorted(python_interpreters()))
def test_every_python_replays_the_spans_and_their_nesting(build_dir, fixture, tmp_path, version):
    """Python tracing differs by version (the profile hook up to 3.11, sys.monitoring from
    3.12): on each interpreter the replay's spans, the backward thread's ops nested under the
    main thread's backward span, and everything else, as recorded."""
    records, _ = fixture("pytorch-like")
    got, _, _ = replay_to_spool(build_dir, tmp_path, "pytorch-like",
                                os.path.join(FIXTURES, "pytorch-like.tar.gz"), 1,
                                "--python-exe", python_interpreters()[version])
    assert_reproduces(as_kernels(records), got[0], "python " + version)


def test_speed_scales_host_times_and_durations(build_dir, fixture, tmp_path):
    """--speed 4: issue times and GPU durations a quarter of the recorded ones."""
    records, _ = fixture("pytorch-like")
    got, _, _ = replay_to_spool(build_dir, tmp_path, "pytorch-like",
                                os.path.join(FIXTURES, "pytorch-like.tar.gz"), 1, "--speed", "4")
    recs = got[0]

    def span(rs):
        return (max(r["end_ns"] for r in rs) -
                min(r.get("issue_ns", r["start_ns"]) for r in rs))
    assert span(recs) < 0.5 * span(records)  # 0.25 when nothing is late
    assert_reproduces(as_kernels(records), recs, "pytorch-like at 4x", speed=4.0)


# ---- through flared, summary mode ---------------------------------------------------------------

@pytest.fixture(scope="module")
def flared(build_dir, tmp_path_factory):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path_factory.mktemp("flared"))
    yield d
    if d.proc.poll() is None:
        d.proc.kill()


@pytest.mark.parametrize("name", ["pytorch-like", "healthy"])
def test_summary_mode_through_flared_keeps_every_step_and_raises_nothing(
        build_dir, flared, fixture, tmp_path, name):
    records, _ = fixture(name)
    ranks = 4
    job = "trace-" + name
    env = clean_env({"FLARE_MODE": "summary", "TRACED_PYTHON_API": TRACED[name],
                     "FLARE_OUTPUT_DIR": str(tmp_path / "spool")})
    res = subprocess.run([os.path.join(build_dir, "bin", "flare"), "run", "--daemon",
                          "127.0.0.1:%d" % flared.grpc, "--job-id", job, "--quiet", "--",
                          *replay_args(build_dir, os.path.join(FIXTURES, name + ".tar.gz"),
                                       ranks)],
                         env=env, capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # Steps as flared takes them: the intervals between step markers, else between DataLoader
    # calls (a loop of S steps makes S + 1 calls, the last one raising StopIteration).
    markers, loader = step_count(records)
    want = (markers or loader) - 1
    deadline = time.time() + 30
    info = pipeline_health.wait_for_job(
        flared, job, ranks, lambda held: held == {r: want for r in range(ranks)}, 30)
    # The detectors' pass over the job's last batches: flared analyses a job when new records
    # arrived, every second (--diagnose-interval-s 1); once the ranks are gone, the pass that
    # stays the last one for 2.5 s saw everything.
    def computed():
        report = json.loads(flared.get("/api/v1/jobs/%s/report" % job))
        return int(report.get("metrics", {}).get("computedUnixNs", 0) or 0)
    last = computed()
    while True:
        time.sleep(2.5)
        now = computed()
        if now == last and now > 0:
            break
        assert time.time() < deadline + 45, "flared never settled on job " + job
        last = now
    pipeline_health.assert_nothing_refused(flared.http)
    for r in info:
        assert not int(r.get("lostBatches", 0)) and not r.get("refusals"), r
    assert pipeline_health.steps_held(flared, job) == {r: want for r in range(ranks)}
    # Each step's statistics arrived (summary mode: the ranks' own StepStats): its GPU figures
    # where the step was measured, its times only where the default timing budget sampled it out
    # (counted per rank). Ranks may choose different K (each from its own measured cost); at any
    # step the powers of 2 nest, so most of the sparsest rank's measured steps are common.
    series = json.loads(flared.get("/api/v1/jobs/%s/series?max_signatures=1&max_steps=2048"
                                   % job))
    sampled_out = {r["rank"]: int(r.get("stepsSampledOut", 0)) for r in info}
    for r, row in zip(series["ranks"], series["vInter"]):
        assert sum(1 for v in row if v is not None) + sampled_out[r] == want, (r, row, info)
    measured = [{i for i, v in enumerate(row) if v is not None} for row in series["vInter"]]
    assert len(set.intersection(*measured)) >= 0.5 * min(len(m) for m in measured), \
        str([sorted(m) for m in measured])
    # ... and its run-queue wait: summary mode reads the issuing thread's schedstat every step.
    waits = [v for row in series["runQueueWaitNs"] for v in row[1:] if v is not None]
    assert len(waits) >= ranks * (want - 2), series["runQueueWaitNs"]
    found = json.loads(flared.get("/api/v1/jobs/%s/diagnoses" % job))["diagnoses"]
    # The replay's ranks and their simulated GPUs' threads share this machine's CPUs: on a
    # 2-core machine each rank's issuing thread waits for a CPU for a third or more of every
    # step. The recorded job is healthy, so nothing on its GPU or links may be named; a host
    # finding (issue_stall, cpu_contention) is the machine's, accepted only where the ranks
    # were measured waiting for a CPU at least 10% of the step (median, series runQueueWaitNs).
    steps = [v for row in series["stepTimeNs"] for v in row[1:] if v is not None]
    oversubscribed = statistics.median(waits) >= 0.1 * statistics.median(steps)
    host = [d for d in found if d["kind"] in ("issue_stall", "cpu_contention")]
    shown = [(d["kind"], d.get("ranks"), d.get("summary", "")[:200]) for d in found]
    assert [d for d in found if d not in host] == [], shown
    assert not host or oversubscribed, (shown, statistics.median(waits), statistics.median(steps))
    alerts = json.loads(flared.get("/api/v1/alerts?job=" + job)).get("alerts", [])
    assert [a for a in alerts if a.get("kind") not in ("issue_stall", "cpu_contention")] == [], alerts
    assert not alerts or oversubscribed, alerts


def test_the_launcher_checks_trace_options(build_dir, tmp_path):
    exe = os.path.join(build_dir, "bin", "flare-sim-train")
    res = subprocess.run([exe, "--ranks", "1", "--speed", "2"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "--speed needs --trace" in res.stderr
    res = subprocess.run([exe, "--trace", "x", "--tp", "2"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "--tp is not an option of --trace" in res.stderr
    res = subprocess.run([exe, "--trace", str(tmp_path / "missing"), "--ranks", "1"],
                         capture_output=True, text=True, timeout=60, env=clean_env({}))
    assert res.returncode == 1 and "not a fixture" in res.stderr
