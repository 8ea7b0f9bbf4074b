"""flared's per-job metrics, healthy history and webhook, on 4 sim ranks streaming through
`flare run`: the five-metric gauges against independently aggregated figures; `flare baseline
add` on two healthy runs, then a run with a synchronize in every layer raises
issue_latency_regression with the learned threshold while a third healthy run raises nothing;
each new diagnosis is posted to a webhook (retried, failures counted)."""

import collections
import http.server
import json
import os
import re
import statistics
import subprocess
import threading
import time

import pytest

from flared_process import Flared
from pipeline_health import assert_nothing_refused
# The alerts beyond what this machine's load explains, of jobs run_job ran (tmp_path/sim-JOB.json).
from test_flared_diagnosis import alerts, beyond_load

RANKS = 4
BASELINES = ["healthy-0", "healthy-1", "healthy-2"]  # the runs marked healthy, sorted
LAYERS = "8"  # a synchronize per layer: more layers, a clearer collapse of the issue queue


class Daemon(Flared):
    def __init__(self, build_dir, workdir, *extra):
        super().__init__(build_dir, workdir, "--diagnose-interval-s", "1", *extra)

    def get(self, path):
        return self.text(path)


def start(build_dir, tmp_path, *extra):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    return Daemon(build_dir, tmp_path, *extra)


def flare(build_dir, *args, env=None):
    return subprocess.run([os.path.join(build_dir, "bin", "flare"), *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **(env or {})))


def run_job(build_dir, daemon, tmp_path, job, fault_env=None, tp=2):
    """The job through flared, the workload's own account (--json) in tmp_path/sim-JOB.json."""
    env = dict(fault_env or {}, FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)),
               TRACED_PYTHON_API="sim_train@_LoaderIter.__next__,sim_train@injected_sync")
    res = flare(build_dir, "run", "--daemon", "127.0.0.1:%d" % daemon.grpc, "--job-id", job,
                "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"), "--python",
                "--ranks", str(RANKS), "--steps", "6", "--layers", LAYERS, "--tp", str(tp),
                "--data-ms", "2", "--quiet", "--json", str(tmp_path / ("sim-%s.json" % job)),
                env=env)
    assert res.returncode == 0, res.stderr


def wait_for(fn, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    return fn()


def gauges(daemon, job):
    """{(name, frozenset(labels other than job)): value} of the job's flare_job_* series."""
    out = {}
    for line in daemon.get("/metrics").splitlines():
        m = re.match(r'(flare_job_\w+)\{([^}]*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.pop("job", None) == job:
            out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def metrics_of(daemon, job):
    report = daemon.json("/api/v1/jobs/%s/report" % job)
    return report if report.get("metrics", {}).get("steps") else None


def test_history_learns_the_threshold_and_flags_only_the_synchronize_run(build_dir, tmp_path):
    daemon = start(build_dir, tmp_path)
    http = "127.0.0.1:%d" % daemon.http
    try:
        run_job(build_dir, daemon, tmp_path, "healthy-1")
        # Three healthy runs: the threshold is 1.5x the largest W1 between two of them, and two
        # runs on this loaded 2-core VM once learned 265 us against a third healthy run's 273 us
        # (the synchronize reads ~3 ms); three sample the healthy spread better, as history does.
        for job in ("healthy-2", "healthy-0"):
            run_job(build_dir, daemon, tmp_path, job)
        time.sleep(2.5)  # two detector runs after the last batches
        for job in BASELINES:
            assert wait_for(lambda: metrics_of(daemon, job)), job
            res = flare(build_dir, "baseline", "add", "--job", job, "--daemon-http", http)
            assert res.returncode == 0, res.stderr
            assert "healthy history" in res.stdout
        listed = json.loads(flare(build_dir, "baseline", "list", "--json", "--daemon-http",
                                  http).stdout)["baselines"]
        assert sorted(b["jobId"] for b in listed) == BASELINES
        assert {b["scale"] for b in listed} == {RANKS}
        assert 'flare_baseline_runs %d' % len(BASELINES) in daemon.get("/metrics")

        # Item 1: the gauges of a healthy job against independently aggregated figures.
        g = gauges(daemon, "healthy-1")
        report = daemon.json("/api/v1/jobs/healthy-1/report")
        m = report["metrics"]
        # Throughput: the sim's own per-rank step times (host clock), after the warm-up step.
        sim = json.load(open(tmp_path / "sim-healthy-1.json"))["ranks"]
        truth = statistics.median(1000.0 / statistics.mean(r["step_ms"][1:]) for r in sim)
        assert g[("flare_job_steps_per_second", frozenset())] == pytest.approx(truth, rel=0.1)
        assert g[("flare_job_steps_per_second", frozenset())] == pytest.approx(
            m["stepsPerSecond"], rel=1e-9)
        # TFLOPS: the Ingest's per-signature aggregates (FLOPs and time of every call) give the
        # job-wide rate of the GEMM/attention kernels whose FLOPs are known; the sim runs
        # identical kernels every step (the gauge leaves the warm-up step out, the report not:
        # a few percent apart on the loaded 2-core VM).
        compute = [s for s in report["signatures"] if s["tflops"] > 0 and
                   s["signature"]["kind"] in ("OP_KIND_GEMM", "OP_KIND_ATTENTION")]
        flops = sum(s["tflops"] * int(s["totalNs"]) for s in compute)
        ns = sum(int(s["totalNs"]) for s in compute)
        assert g[("flare_job_flops_per_second", frozenset())] / 1e12 == pytest.approx(
            flops / ns, rel=0.08)
        ranks = {int(dict(k[1])["rank"]): v for k, v in g.items()
                 if k[0] == "flare_job_rank_flops_per_second"}
        assert sorted(ranks) == list(range(RANKS))
        for v in ranks.values():  # identical GEMMs on every rank
            assert v == pytest.approx(g[("flare_job_flops_per_second", frozenset())], rel=0.1)
        # Bus bandwidth of the all-reduces: the sim's model is 8 µs + S·f / busbw; the gauge
        # (median, from the last arrival) stays below the ceiling and within 20% of it.
        bw = g[("flare_job_busbw_bytes_per_second", frozenset({("kind", "all_reduce")}))]
        assert bw == pytest.approx(m["busbw"][0]["busbwGbps"] * 1e9, rel=1e-9)
        assert 0 < g[("flare_job_void_inter_ratio", frozenset())] < 0.5
        assert g[("flare_job_void_minority_ratio", frozenset())] == pytest.approx(
            m["vMinority"], rel=1e-9)
        # Baseline jobs are not compared with history (their own run is in it).
        assert ("flare_job_issue_latency_w1_seconds", frozenset()) not in g

        # Item 2: the regression, through flared, with the learned threshold.
        run_job(build_dir, daemon, tmp_path, "sync", {"FLARE_SIM_INJECT_SYNC": "1"})
        run_job(build_dir, daemon, tmp_path, "healthy-3")
        found = wait_for(lambda: alerts(daemon, tmp_path, "sync"))
        assert [(a["kind"], a["team"]) for a in found] == [("issue_latency_regression",
                                                            "algorithm")], found
        assert "sim_train@injected_sync" in found[0]["message"]
        assert "learned threshold" in found[0]["message"]
        sync = wait_for(lambda: gauges(daemon, "sync").get(
            ("flare_job_issue_latency_w1_seconds", frozenset())))
        threshold = gauges(daemon, "sync")[("flare_job_issue_latency_w1_threshold_seconds",
                                            frozenset())]
        assert sync > threshold >= 20e-6  # the documented floor
        healthy = wait_for(lambda: gauges(daemon, "healthy-3").get(
            ("flare_job_issue_latency_w1_seconds", frozenset())))
        assert healthy < threshold
        with open(os.path.join(os.environ.get("FLARE_TEST_FIGURES", str(tmp_path)),
                               "history_w1.txt"), "a") as f:  # figures for docs/benchmarks.md
            f.write("threshold %.1f us sync %.1f us healthy %.1f us | %s\n" % (
                threshold * 1e6, sync * 1e6, healthy * 1e6, " ".join(
                    l.split("] ", 1)[1] for l in open(daemon.log_path) if "history of" in l)))
        time.sleep(2.5)  # more detector runs
        assert alerts(daemon, tmp_path, "healthy-3") == []

        # Item 5: the report's change against history and the metrics.
        rep = daemon.json("/api/v1/jobs/healthy-3/report")
        assert rep["baselineRuns"] == len(BASELINES) and rep["scale"] == RANKS
        assert rep["metrics"]["hasBaseline"] and rep["metrics"]["baselineRuns"] == len(BASELINES)
        compared = [s for s in rep["signatures"] if "history" in s]
        gemms = [s for s in compared if s["signature"]["kind"] == "OP_KIND_GEMM"]
        assert gemms, rep["signatures"]
        for s in gemms:  # the same GEMMs on the same simulated GPU as the baseline runs
            h = s["history"]
            assert h["baselineRuns"] == len(BASELINES)
            assert h["durationRatio"] == pytest.approx(int(s["p50Ns"]) / int(h["baselineP50Ns"]),
                                                       rel=1e-4)
            assert h["durationRatio"] == pytest.approx(1.0, abs=0.1)
            assert h["tflopsRatio"] == pytest.approx(1 / h["durationRatio"])
        # The all-reduces' job busbw against history's: the same simulated fabric.
        collectives = [s for s in compared if s["signature"]["kind"] == "OP_KIND_COLLECTIVE"
                       and s["history"]["baselineBusbwGbps"] > 0]
        assert collectives, rep["signatures"]
        for s in collectives:
            h = s["history"]
            assert h["busbwRatio"] == pytest.approx(s["jobBusbwGbps"] / h["baselineBusbwGbps"])
            assert h["busbwRatio"] == pytest.approx(1.0, abs=0.1)

        # History survives a restart; remove forgets it.
        daemon.stop()
        daemon = start(build_dir, tmp_path)
        http = "127.0.0.1:%d" % daemon.http
        assert len(daemon.json("/api/v1/baselines")["baselines"]) == len(BASELINES)
        res = flare(build_dir, "baseline", "remove", "--job", "healthy-2", "--daemon-http", http)
        assert res.returncode == 0, res.stderr
        assert sorted(b["jobId"] for b in daemon.json("/api/v1/baselines")["baselines"]) == \
            ["healthy-0", "healthy-1"]
        res = flare(build_dir, "baseline", "add", "--job", "nope", "--daemon-http", http)
        assert res.returncode == 3 and "nope" in res.stderr
        assert_nothing_refused(daemon.http)
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()


def test_history_names_a_slow_link_that_pure_data_parallelism_cannot_localise(build_dir,
                                                                             tmp_path):
    """Pure data parallelism (TP 1): every all-reduce runs on one communicator of all ranks, so
    no peer communicator shows a slow link. Against two healthy runs marked as history, a link at
    50% is named on all the communicator's ranks, routed to operations; a healthy run is not."""
    daemon = start(build_dir, tmp_path)
    http = "127.0.0.1:%d" % daemon.http
    try:
        # A job with no history says what it could not compare, and how to get a reference.
        run_job(build_dir, daemon, tmp_path, "dp-first", {"FLARE_SIM_LINK_FACTOR": "2:0.5"}, tp=1)
        first = wait_for(lambda: [d["note"] for d in daemon.json(
            "/api/v1/jobs/dp-first/diagnoses")["lookedAt"]["detectors"]
            if d["name"] == "link_slow" and d["note"]])
        assert first and "with no peer" in first[0] and "flare baseline add" in first[0], first
        for job in ("dp-healthy-0", "dp-healthy-1"):
            run_job(build_dir, daemon, tmp_path, job, tp=1)
        time.sleep(2.5)  # two detector runs after the last batches
        for job in ("dp-healthy-0", "dp-healthy-1"):
            assert wait_for(lambda: metrics_of(daemon, job)), job
            res = flare(build_dir, "baseline", "add", "--job", job, "--daemon-http", http)
            assert res.returncode == 0, res.stderr
        run_job(build_dir, daemon, tmp_path, "dp-slow", {"FLARE_SIM_LINK_FACTOR": "2:0.5"}, tp=1)
        run_job(build_dir, daemon, tmp_path, "dp-healthy-2", tp=1)
        found = wait_for(lambda: alerts(daemon, tmp_path, "dp-slow"))
        assert [(a["kind"], a["team"]) for a in found] == [("link_slow", "operations")], found
        assert "healthy history (the slowest of 2 runs)" in found[0]["message"], found[0]
        diag = [d for d in daemon.json("/api/v1/jobs/dp-slow/diagnoses")["diagnoses"]
                if d["kind"] == "link_slow"]
        assert diag and diag[0]["ranks"] == list(range(RANKS)), diag
        # The sim's ring runs at the slowest member's link: half the healthy runs' busbw, as
        # the kernel report's comparison with history says too.
        assert diag[0]["severity"] == pytest.approx(0.5, abs=0.1), diag[0]
        ratios = [s["history"]["busbwRatio"] for s in
                  daemon.json("/api/v1/jobs/dp-slow/report")["signatures"]
                  if s.get("history", {}).get("busbwRatio", 0) > 0]
        assert ratios and all(r == pytest.approx(0.5, abs=0.1) for r in ratios), ratios
        time.sleep(2.5)  # more detector runs
        assert [a for a in alerts(daemon, tmp_path, "dp-healthy-2")
                if a["kind"] == "link_slow"] == []
        assert_nothing_refused(daemon.http)
    finally:
        daemon.stop()


class Hook(http.server.BaseHTTPRequestHandler):
    fail_first = 0
    posts = []
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with Hook.lock:
            Hook.posts.append(body)
            fail = len(Hook.posts) <= Hook.fail_first
        self.send_response(500 if fail else 204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_posts_each_new_diagnosis_with_retries(build_dir, tmp_path):
    Hook.fail_first, Hook.posts = 2, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon = start(build_dir, tmp_path, "--webhook-url",
                   "http://127.0.0.1:%d/flare" % server.server_address[1])
    try:
        run_job(build_dir, daemon, tmp_path, "slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "1:0.8"})

        def posted(kind):  # the documents answered 204 (the first two were answered 500)
            return [d for d in map(json.loads, Hook.posts[Hook.fail_first:])
                    if d["alert"]["kind"] == kind]

        assert wait_for(lambda: posted("gpu_slow")), daemon.get("/metrics")
        time.sleep(2.5)  # the same diagnoses again: deduplicated, not posted again
        metrics = daemon.get("/metrics")
        delivered = Hook.posts[Hook.fail_first:]
        # Each new diagnosis posted once; the first one twice more before (two 500s, then 204).
        assert len(set(delivered)) == len(delivered) and len(set(Hook.posts[:3])) == 1
        assert "flare_webhook_delivered_total %d\n" % len(delivered) in metrics
        assert "flare_webhook_retries_total 2\n" in metrics
        assert "flare_webhook_failures_total 0\n" in metrics
        docs = [json.loads(b) for b in delivered]
        assert [a["kind"] for a in beyond_load(tmp_path, "slowgpu", [d["alert"] for d in docs])] \
            == ["gpu_slow"], docs
        doc = posted("gpu_slow")[0]
        assert doc["alert"]["jobId"] == "slowgpu"
        assert doc["diagnosis"]["ranks"] == [1] and doc["diagnosis"]["team"] == "operations"
        assert doc["diagnosis"]["evidence"]
        assert_nothing_refused(daemon.http)
    finally:
        daemon.stop()
        server.shutdown()


def test_unreachable_webhook_is_counted_and_blocks_nothing(build_dir, tmp_path):
    daemon = start(build_dir, tmp_path, "--webhook-url", "http://127.0.0.1:1/x",
                   "--webhook-attempts", "2", "--webhook-timeout-ms", "500")
    try:
        run_job(build_dir, daemon, tmp_path, "slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "1:0.8"})
        assert wait_for(lambda: alerts(daemon, tmp_path, "slowgpu"))  # alerts still stored
        time.sleep(2.5)  # every alert raised
        raised = len(daemon.json("/api/v1/alerts?job=slowgpu")["alerts"])
        # Each alert's delivery failed (two attempts each): counted each, said once in the log.
        assert wait_for(lambda: re.search(r"flare_webhook_failures_total %d\b" % raised,
                                          daemon.get("/metrics")))
        assert open(daemon.log_path).read().count("could not be delivered") == 1
        assert_nothing_refused(daemon.http)
    finally:
        daemon.stop()


def test_bad_webhook_url_is_a_clear_error(build_dir, tmp_path):
    res = subprocess.run([os.path.join(build_dir, "bin", "flared"), "--webhook-url",
                          "https://example.com/x", "--db", str(tmp_path / "f.db")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "http://" in res.stderr


def test_a_job_flared_no_longer_holds_is_rebuilt_from_the_store(build_dir, tmp_path):
    """After a restart flared has no window of the job; `flare baseline add` and `flare timeline`
    then use its stored raw records, signatures and rank rows."""
    d = start(build_dir, tmp_path)
    try:
        # Raw mode: the store keeps raw records, not summaries or step statistics (a summary-mode
        # job rebuilt from it has its collectives and syncs only; docs/architecture.md).
        run_job(build_dir, d, tmp_path, "done", {"FLARE_MODE": "raw"})
        wait_for(lambda: d.json("/api/v1/jobs/done/ranks")["ranks"])
        live_stats = {s["signature"]["name"] + repr(s["signature"].get("shape")): int(s["count"])
                      for s in d.json("/api/v1/jobs/done/report")["signatures"]}
        assert_nothing_refused(d.http)
    finally:
        d.stop()
    d = start(build_dir, tmp_path)  # same database
    try:
        http = "127.0.0.1:%d" % d.http
        res = flare(build_dir, "baseline", "add", "--daemon-http", http, "--job", "done", "--json")
        assert res.returncode == 0, res.stderr
        added = json.loads(res.stdout)
        assert added["jobId"] == "done" and added["scale"] == RANKS
        assert added["backend"] == "Flare Simulated GPU"
        listed = json.loads(flare(build_dir, "baseline", "list", "--daemon-http", http,
                                  "--json").stdout)
        assert [b["jobId"] for b in listed["baselines"]] == ["done"]
        # The timeline of the stored records: every GPU op the daemon counted, on its rank's
        # GPU tracks (no Python spans: the store does not keep them).
        out = tmp_path / "trace.json"
        res = flare(build_dir, "timeline", "--daemon-http", http, "--job", "done", "-o", str(out))
        assert res.returncode == 0, res.stderr
        events = json.loads(out.read_text())["traceEvents"]
        gpu = collections.Counter(e["name"] for e in events
                                  if e["ph"] == "X" and e["cat"] == "kernel")
        report = d.json("/api/v1/jobs/done/report")
        kernels = collections.Counter()
        for s in report["signatures"]:
            if s["signature"].get("kind") in ("OP_KIND_KERNEL", "OP_KIND_GEMM",
                                              "OP_KIND_ATTENTION"):
                kernels[s["signature"]["name"]] += int(s["count"])
        assert kernels and all(gpu[name] == n for name, n in kernels.items()), (gpu, kernels)
        assert sum(live_stats.values()) > 0
        assert_nothing_refused(d.http)
    finally:
        d.stop()
