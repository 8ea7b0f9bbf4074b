"""flare-timeline on a traced 8-rank sim job: a well-formed Perfetto/Kineto trace."""

import collections
import json
import os
import subprocess

import pytest

import trace_rules
from pipeline_health import assert_nothing_refused

RANKS, STEPS, LAYERS = 8, 3, 2


@pytest.fixture(scope="module")
def spool(build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("spool")
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="timeline")
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS),
                          "--steps", str(STEPS), "--layers", str(LAYERS), "--hidden", "1024",
                          "--seq", "512", "--tp", "2", "--quiet"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    return out, [json.loads(line) for line in exp.stdout.splitlines()]


def timeline(build_dir, *args):
    return subprocess.run([os.path.join(build_dir, "bin", "flare-timeline"), *args],
                          capture_output=True, text=True, timeout=120)


def test_combined_trace_is_well_formed_and_complete(build_dir, spool, tmp_path):
    out, records = spool
    path = tmp_path / "trace.json"
    res = timeline(build_dir, "--input", str(out), "-o", str(path))
    assert res.returncode == 0, res.stderr
    trace = json.loads(path.read_text())
    assert trace_rules.check(trace) == []
    events = trace["traceEvents"]
    gpu = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu_records = [r for r in records if r["kind"] != "sync"]
    assert len(gpu) == len(gpu_records)
    # Every GPU op has its launch slice and an ac2g arrow.
    assert sum(1 for e in events if e["ph"] == "s" and e["cat"] == "ac2g") == len(gpu_records)
    # One process per rank for the CPU and one per GPU, named.
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank {r} GPU {r}" for r in range(RANKS)} <= names
    # Collective links: every instance of a collective joined across its ranks in rank order.
    coll = collections.Counter((r["comm_hash"], r["seq"]) for r in records if r["kind"] == "collective")
    links = sum(n - 1 for n in coll.values())
    assert sum(1 for e in events if e["ph"] == "s" and e["cat"] == "collective") == links
    # GEMM args carry shape, dtype and TFLOPS.
    gemm = next(e for e in gpu if e["args"].get("kind") == "gemm")
    assert len(gemm["args"]["shape"]) == 4 and gemm["args"]["dtype"] == "bf16"
    assert gemm["args"]["TFLOPS"] > 0
    # busbw = algbw x 2(n-1)/n: 1 for the tensor-parallel pairs, 1.5 for the 4-rank data-parallel
    # groups (which of them comes first depends on the ranks' timing).
    for allreduce in (e for e in gpu if e["name"] == "ncclAllReduce"):
        n = allreduce["args"]["nranks"]
        assert allreduce["args"]["busbw GB/s"] == pytest.approx(
            allreduce["args"]["algbw GB/s"] * 2 * (n - 1) / n, rel=2e-3, abs=2e-3)
    # All ranks share one host clock here: the estimated offsets are tiny.
    offsets = trace["flare"]["clockOffsetsNs"]
    assert len(offsets) == RANKS and all(abs(v) < 2_000_000 for v in offsets.values())


def test_rank_selection_and_per_rank_files(build_dir, spool, tmp_path):
    out, records = spool
    res = timeline(build_dir, "--input", str(out), "--ranks", "0-1,5", "--per-rank", str(tmp_path))
    assert res.returncode == 0, res.stderr
    files = sorted(os.listdir(tmp_path))
    assert files == ["rank0.trace.json", "rank1.trace.json", "rank5.trace.json"]
    for name in files:
        trace = json.loads((tmp_path / name).read_text())
        assert trace_rules.check(trace) == []
        rank = int(name[4:-len(".trace.json")])
        assert trace["distributedInfo"]["rank"] == rank
        # Kineto's ids: the GPU process is the device, the CPU process the OS pid.
        gpu_pids = {e["pid"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
        assert gpu_pids == {rank}
        n = sum(1 for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        assert n == sum(1 for r in records if r["rank"] == rank and r["kind"] != "sync")


def test_errors_are_clear(build_dir, spool, tmp_path):
    out, _ = spool
    res = timeline(build_dir, "--input", str(tmp_path / "missing"), "-o", str(tmp_path / "t.json"))
    assert res.returncode == 1 and "is not a directory" in res.stderr
    res = timeline(build_dir, "--input", str(out), "--ranks", "x", "-o", str(tmp_path / "t.json"))
    assert res.returncode == 2 and "bad --ranks" in res.stderr
    res = timeline(build_dir, "--input", str(out), "--steps", "1-2", "-o", str(tmp_path / "t.json"))
    assert res.returncode == 1 and "__next__" in res.stderr  # the C++ sim job has no DataLoader spans
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "t.json.partial").exists()
    res = timeline(build_dir, "--input", str(out))
    assert res.returncode == 2


def test_checker_catches_violations():
    bad = {"traceEvents": [
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "name": "a"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": 10, "name": "b"},
        {"ph": "s", "pid": 1, "tid": 1, "ts": 50, "id": 1, "cat": "c", "name": "c"},
    ]}
    errors = trace_rules.check(bad)
    assert any("partially overlaps" in e for e in errors)
    assert any("no process_name" in e for e in errors)
    assert any("no thread_name" in e for e in errors)
    assert any("1 starts and 0 ends" in e for e in errors)


def test_holistic_trace_analysis_loads_the_rank_files(build_dir, spool, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    out, records = spool
    res = timeline(build_dir, "--input", str(out), "--ranks", "2-3", "--per-rank", str(tmp_path))
    assert res.returncode == 0, res.stderr
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    assert sorted(analysis.t.traces) == [2, 3]
    for rank in (2, 3):
        df = analysis.t.get_trace(rank)
        names = analysis.t.symbol_table.get_sym_table()
        kernels = df[df["stream"] > 0]
        expected = collections.Counter(r["name"] for r in records
                                       if r["rank"] == rank and r["kind"] != "sync")
        got = collections.Counter(names[i] for i in kernels["name"])
        assert got == expected
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert sorted(breakdown["rank"]) == [2, 3]
    assert (breakdown["compute_time_pctg"] > 0).all()


# ---- from flared: `flare timeline --job` / `flare export --job` ------------------------------

@pytest.fixture(scope="module")
def flared_job(build_dir, tmp_path_factory):
    """The same sim job streamed to a real flared (no spool): what the daemon holds."""
    import re
    import signal
    import time
    work = tmp_path_factory.mktemp("flared")
    log = work / "flared.log"
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "flared"), "--listen", "127.0.0.1:0",
                             "--http", "127.0.0.1:0", "--db", str(work / "f.db")],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            m = re.search(r"gRPC on port (\d+), HTTP on port (\d+)", log.read_text())
            if m:
                break
            time.sleep(0.05)
        assert m, log.read_text()
        grpc, http = m.group(1), "127.0.0.1:" + m.group(2)
        res = subprocess.run(
            [os.path.join(build_dir, "bin", "flare"), "run", "--daemon", "127.0.0.1:" + grpc,
             "--job-id", "tl", "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
             "--ranks", str(RANKS), "--steps", str(STEPS), "--layers", str(LAYERS), "--hidden",
             "1024", "--seq", "512", "--tp", "2", "--quiet"],
            # A timeline needs every op: raw mode (summary mode, the default when streaming,
            # sends kernel summaries in place of compute ops).
            env=dict(os.environ, FLARE_MODE="raw"), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert_nothing_refused(http)
        yield http
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def flare_cli(build_dir, *args, **kw):
    return subprocess.run([os.path.join(build_dir, "bin", "flare"), *args], capture_output=True,
                          text=True, timeout=120, **kw)


def test_timeline_of_a_job_flared_holds(build_dir, flared_job, tmp_path):
    exp = flare_cli(build_dir, "export", "--daemon-http", flared_job, "--job", "tl")
    assert exp.returncode == 0, exp.stderr
    records = [json.loads(line) for line in exp.stdout.splitlines()]
    # Every record each rank sent (the daemon's own per-rank count) is in the export; the sim's
    # per-step marker records come back as the batch's step markers (the model keeps them as
    # step boundaries), one per step.
    import urllib.request
    with urllib.request.urlopen("http://%s/api/v1/jobs/tl/ranks" % flared_job) as r:
        ranks = json.loads(r.read())["ranks"]
    per_rank = collections.Counter(r["rank"] for r in records)
    assert {int(r.get("rank", 0)): int(r["records"]) for r in ranks} == \
        {rank: n + STEPS for rank, n in per_rank.items()}
    path = tmp_path / "trace.json"
    res = flare_cli(build_dir, "timeline", "--daemon-http", flared_job, "--job", "tl", "-o",
                    str(path))
    assert res.returncode == 0, res.stderr
    trace = json.loads(path.read_text())
    assert trace_rules.check(trace) == []
    events = trace["traceEvents"]
    gpu = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(gpu) == sum(1 for r in records if r["kind"] != "sync") > 0
    coll = collections.Counter((r["comm_hash"], r["seq"]) for r in records if r["kind"] == "collective")
    assert sum(1 for e in events if e["ph"] == "s" and e["cat"] == "collective") == \
        sum(n - 1 for n in coll.values())
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank {r} GPU {r}" for r in range(RANKS)} <= names
    # Rank selection reaches both the daemon (only those ranks are fetched) and flare-timeline.
    sel = tmp_path / "sel.json"
    res = flare_cli(build_dir, "timeline", "--daemon-http", flared_job, "--job", "tl", "--ranks",
                    "2-3", "-o", str(sel))
    assert res.returncode == 0, res.stderr
    pids = {e["args"]["name"] for e in json.loads(sel.read_text())["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}
    assert pids and all(n.startswith(("rank 2", "rank 3")) for n in pids)


def test_holistic_trace_analysis_loads_a_rank_file_from_flared(build_dir, flared_job, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    res = flare_cli(build_dir, "timeline", "--daemon-http", flared_job, "--job", "tl", "--ranks",
                    "4", "--per-rank", str(tmp_path))
    assert res.returncode == 0, res.stderr
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    assert sorted(analysis.t.traces) == [4]
    assert len(analysis.t.get_trace(4)) > 0


def test_timeline_from_flared_fails_clearly_and_shows_progress_only_on_a_terminal(
        build_dir, flared_job, tmp_path):
    res = flare_cli(build_dir, "timeline", "--daemon-http", flared_job, "--job", "nope", "-o",
                    str(tmp_path / "x.json"))
    assert res.returncode == 3 and "404" in res.stderr and "nope" in res.stderr
    res = flare_cli(build_dir, "timeline", "--daemon-http", "127.0.0.1:1", "--job", "tl", "-o",
                    str(tmp_path / "x.json"))
    assert res.returncode == 3 and "cannot reach" in res.stderr
    # Not a terminal: no progress line. A terminal (pty): "fetching tl [####] 8/8 ranks".
    res = flare_cli(build_dir, "timeline", "--daemon-http", flared_job, "--job", "tl", "-o",
                    str(tmp_path / "a.json"))
    assert res.returncode == 0 and "fetching" not in res.stderr
    rc, seen = stderr_on_a_terminal(build_dir, "timeline", "--daemon-http", flared_job, "--job",
                                    "tl", "-o", str(tmp_path / "b.json"))
    assert rc == 0 and b"fetching tl [" in seen and b"8/8 ranks" in seen
    # --quiet: none even on a terminal.
    rc, seen = stderr_on_a_terminal(build_dir, "timeline", "--daemon-http", flared_job, "--job",
                                    "tl", "--quiet", "-o", str(tmp_path / "c.json"))
    assert rc == 0 and b"fetching" not in seen


def stderr_on_a_terminal(build_dir, *args):
    """Runs `flare ARGS` with stderr on a pseudo-terminal; (exit code, what it wrote there)."""
    import pty
    main, sub = pty.openpty()
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "flare"), *args],
                            stdout=subprocess.DEVNULL, stderr=sub, stdin=subprocess.DEVNULL)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    return proc.wait(timeout=120), seen
