"""`flare report` against the real flared: an 8-rank sim job with rank 3 underclocked to 80%
(FLARE_SIM_CLOCK_FACTOR=3:0.8) and a healthy job as the issue-latency baseline, both streamed
through `flare run`. Checks the text and JSON report, the daemon's /series against the sim's own
step times, the HTML page in headless Chromium (DOM after its script ran, and a screenshot), and
the failure paths (daemon down, unknown job, bad input)."""
import html
import html.parser
import json
import re
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

import pytest

import contention
from flared_process import Flared
from pipeline_health import assert_nothing_refused

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS, STEPS, SLOW = 8, 12, 3
FLAG_RGB = (0xE0, 0x31, 0x31)  # html_report.FLAG: the diagnosed rank's bar


class Daemon(Flared):
    def __init__(self, build_dir, workdir):
        super().__init__(build_dir, workdir, "--diagnose-interval-s", "1")
        self.log = self.log_path

    def get(self, path):
        return self.json(path, timeout=20)

    def status_of(self, path):
        try:
            self.text(path, timeout=20)
            return 200
        except urllib.error.HTTPError as e:
            return e.code


def flare(build_dir, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    return subprocess.run([os.path.join(build_dir, "bin", "flare"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def run_job(build_dir, daemon, workdir, job, fault_env=None):
    out = os.path.join(workdir, job + ".json")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLARE_") and k != "LD_PRELOAD"}
    env.update(fault_env or {}, FLARE_OUTPUT_DIR=os.path.join(workdir, "spool-" + job))
    res = subprocess.run(
        [os.path.join(build_dir, "bin", "flare"), "run", "--daemon",
         "127.0.0.1:%d" % daemon.grpc, "--job-id", job, "--quiet", "--",
         os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS), "--steps",
         str(STEPS), "--layers", "4", "--tp", "2", "--quiet", "--json", out],
        env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.load(open(out))


@pytest.fixture(scope="module")
def job(build_dir, tmp_path_factory):
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    workdir = str(tmp_path_factory.mktemp("report"))
    daemon = Daemon(build_dir, workdir)
    try:
        run_job(build_dir, daemon, workdir, "healthy")
        sim = run_job(build_dir, daemon, workdir, "slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "%d:0.8"
                                                                                      % SLOW})
        deadline = time.time() + 30  # the last batches reach the detector window
        while time.time() < deadline:
            series = daemon.get("/api/v1/jobs/slowgpu/series")
            if series["steps"]["total"] >= STEPS - 1 and daemon.get(
                    "/api/v1/jobs/slowgpu/diagnoses")["diagnoses"]:
                break
            time.sleep(0.3)
        yield {"daemon": daemon, "sim": sim, "workdir": workdir,
               "http": "127.0.0.1:%d" % daemon.http}
        if daemon.proc.poll() is None:  # the restart test stops it
            assert_nothing_refused(daemon.http)
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()


def beyond_load(job, found):
    """Diagnoses `found` on slowgpu beyond what this machine's load explains (contention.py: on a
    loaded machine a rank can really be starved of CPU, and the stall detector says so)."""
    return contention.beyond_load(found, os.path.join(job["workdir"], "slowgpu.json"))


def report_json(build_dir, job, *extra):
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu", "--json",
                *extra)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ---- the daemon's series ----------------------------------------------------------------------

def test_series_step_times_match_the_sims_own_clock(job):
    series = job["daemon"].get("/api/v1/jobs/slowgpu/series")
    assert series["rankCount"] == RANKS and sorted(series["ranks"]) == list(range(RANKS))
    # Steps are the intervals between DataLoader calls: STEPS calls give STEPS-1 intervals, and
    # interval i is the sim's step i. The first (warm-up) includes start-up costs the sim counts
    # differently, so it is not compared.
    assert series["steps"] == {"total": STEPS - 1, "first": 0, "count": STEPS - 1, "warmup": 1}
    # Flare's marker is read inside the sim's bracket around flare_step (boundary_ms), so a
    # preemption there moves Flare's boundary by up to the bracket: step i may differ from the
    # sim's by the bracket of its start (shorter) or of the next step's (longer), plus 3%.
    for row, rank in zip(series["stepTimeNs"], series["ranks"]):
        ours = [v / 1e6 for v in row]
        sims = job["sim"]["ranks"][rank]["step_ms"]
        bracket = job["sim"]["ranks"][rank]["boundary_ms"]
        for i in range(1, STEPS - 1):
            assert -bracket[i] - 0.03 * sims[i] <= ours[i] - sims[i] <= \
                bracket[i + 1] + 0.03 * sims[i], (rank, i, ours[i], sims[i], bracket[i:i + 2])
    # V_* are shares of the step; the sim's DataLoader does not wait, so V_inter stays small.
    for key in ("vInter", "vMinority"):
        assert all(v is None or 0 <= v <= 1 for row in series[key] for v in row)
    # (None: a step the default timing budget sampled out, its GPU figures not measured.)
    steady = sorted(v for row in series["vInter"] for v in row[1:] if v is not None)
    assert len(steady) >= RANKS and steady[len(steady) // 2] < 0.05


def test_series_per_rank_gemm_durations_show_the_underclocked_rank(job):
    series = job["daemon"].get("/api/v1/jobs/slowgpu/series")
    gemms = [s for s in series["signatures"] if s["kind"] == "OP_KIND_GEMM"]
    assert gemms
    for s in gemms:
        p50 = {r["rank"]: r["p50Ns"] for r in s["perRank"]}
        others = sorted(v for r, v in p50.items() if r != SLOW)
        # 80% clock: 1/0.8 = 1.25x the duration, 0.8x the TFLOPS of the other ranks.
        assert p50[SLOW] / others[len(others) // 2] == pytest.approx(1.25, rel=0.03)
        # TFLOPS per rank: 2·m·n·k·b FLOPs per call (from the shape, not the daemon's count)
        # over the rank's summed GEMM time.
        m, n, k, b = s["shape"]
        for r in s["perRank"]:
            assert r["tflops"] == pytest.approx(r["count"] * 2 * m * n * k * b / r["totalNs"] /
                                                1e3, rel=1e-4)
    # Summed time is a mean, which a loaded test machine's stragglers move more than the
    # median: over all GEMM signatures, the underclocked rank is the slowest, near 0.8.
    flops, time_ns = {}, {}
    for s in gemms:
        for r in s["perRank"]:
            flops[r["rank"]] = flops.get(r["rank"], 0) + r["tflops"] * r["totalNs"]
            time_ns[r["rank"]] = time_ns.get(r["rank"], 0) + r["totalNs"]
    tf = {r: flops[r] / time_ns[r] for r in flops}
    healthy = sorted(v for r, v in tf.items() if r != SLOW)
    assert tf[SLOW] < healthy[0]
    assert 0.65 < tf[SLOW] / healthy[len(healthy) // 2] < 0.9


def test_series_bounds_and_bad_input(job):
    d = job["daemon"]
    cut = d.get("/api/v1/jobs/slowgpu/series?max_steps=4&max_ranks=2&ranks=5&points=11")
    assert cut["ranks"] == [5, 0] and cut["truncated"]["ranks"] and cut["truncated"]["steps"]
    assert cut["steps"]["first"] == STEPS - 1 - 4 and len(cut["stepTimeNs"][0]) == 4
    assert len(cut["issueLatency"]["probabilities"]) == 11
    assert d.status_of("/api/v1/jobs/slowgpu/series?max_steps=-1") == 400
    assert d.status_of("/api/v1/jobs/slowgpu/series?ranks=a,b") == 400
    assert d.status_of("/api/v1/jobs/nosuchjob/series") == 404
    base = d.get("/api/v1/jobs/slowgpu/series?baseline=healthy")["issueLatency"]["baseline"]
    assert base["jobId"] == "healthy" and base["samples"] > 0 and base["w1Ns"] > 0
    assert d.get("/api/v1/jobs/slowgpu/series?baseline=nosuchjob")["issueLatency"][
        "baseline"] is None


# ---- flare report: text and JSON --------------------------------------------------------------

def test_report_text_names_the_rank_the_kernels_and_the_metrics(build_dir, job):
    # The five metrics come from the detectors' runs (every second here): wait for the first.
    deadline = time.time() + 20
    while "metrics" not in job["daemon"].get("/api/v1/jobs/slowgpu/report") and \
            time.time() < deadline:
        time.sleep(0.2)
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu", "--top",
                "0")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "Flare report: job slowgpu (8 ranks" in out
    assert "[operations] rank 3: GPU slow" in out
    assert "step time        median" in out and "issue latency    p50" in out
    # The daemon's five metrics as readable lines, not raw JSON paths.
    assert "metrics.rankTflops" not in out and "rankTflops[" not in out
    assert re.search(r"throughput +\d+\.\d+ steps/s over \d+ steps", out), out
    assert re.search(r"FLOPS +\d+\.\d TFLOPS job-wide .*per rank [\d.]+ \(r3\)", out), out
    assert "device           Flare Simulated GPU, 8 ranks" in out
    report = job["daemon"].get("/api/v1/jobs/slowgpu/report")
    rows = [line for line in out.splitlines() if line.startswith("  cublas")]
    gemms = [s for s in report["signatures"] if s["signature"]["name"].startswith("cublas")]
    assert len(rows) == len(gemms) > 0
    assert all("TFLOPS" in r and "(slowest r3)" in r for r in rows)


def test_report_json_kernels_spread_and_metrics(build_dir, job):
    data = report_json(build_dir, job, "--baseline", "healthy")
    report = job["daemon"].get("/api/v1/jobs/slowgpu/report")
    assert len(data["kernels"]) == len(report["signatures"])
    assert [d["kind"] for d in beyond_load(job, data["diagnoses"])] == ["gpu_slow"]
    gemm = [k for k in data["kernels"] if k["kind"] == "gemm"]
    for k in gemm:
        # (slowest - fastest) / median of the ranks' medians: rank 3 at 1.25x the others.
        assert k["slowestRank"] == SLOW and k["spread"] == pytest.approx(0.25, abs=0.03)
        assert k["tflops"] > 0 and k["shape"].startswith("[") and k["dtype"] == "bf16"
    # The median step time is the median of the series' steps after the warm-up.
    steps = sorted(v for row in data["series"]["stepTimeNs"] for v in row[1:])
    n = len(steps)
    assert data["metrics"]["stepTimeMedianNs"] == pytest.approx(
        steps[n // 2] if n % 2 else (steps[n // 2 - 1] + steps[n // 2]) / 2)
    assert data["metrics"]["baseline"]["jobId"] == "healthy"
    assert data["metrics"]["baseline"]["w1Ns"] > 0


def test_figures_agree_across_text_json_html_and_metrics(build_dir, job):
    """One computation per figure: the job-wide TFLOPS, bus bandwidth, step rate and void shares
    read the same in `flare report` text, its --json, its --html Metrics panel and flared's
    /metrics (to the printed precision)."""
    deadline = time.time() + 20
    while "metrics" not in job["daemon"].get("/api/v1/jobs/slowgpu/report") and \
            time.time() < deadline:
        time.sleep(0.2)
    text = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu").stdout
    data = report_json(build_dir, job)
    page = os.path.join(job["workdir"], "agree.html")
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu", "--html",
                page, "--quiet")
    assert res.returncode == 0, res.stderr
    panel = re.search(r'<div class="metrics" id="metrics">.*?</section>',
                      open(page, encoding="utf-8").read(), re.S).group(0)
    with urllib.request.urlopen("http://%s/metrics" % job["http"], timeout=20) as r:
        prom = r.read().decode()

    def gauge(name, **labels):
        want = ",".join('%s="%s"' % kv for kv in sorted(dict(labels, job="slowgpu").items()))
        for line in prom.splitlines():
            m = re.match(r"%s\{(.*)\} (\S+)$" % name, line)
            if m and ",".join(sorted(m.group(1).split(","))) == want:
                return float(m.group(2))
        raise AssertionError("%s{%s} not in /metrics" % (name, want))
    jm = data["report"]["metrics"]
    tflops = "%.1f TFLOPS job-wide" % (gauge("flare_job_flops_per_second") / 1e12)
    assert tflops == "%.1f TFLOPS job-wide" % jm["tflops"]
    assert tflops in text and tflops in panel, (tflops, text)
    bw = jm["busbw"][0]
    busbw = "%s: %.1f GB/s" % (bw["kind"], gauge("flare_job_busbw_bytes_per_second",
                                                 kind=bw["kind"]) / 1e9)
    assert busbw == "%s: %.1f GB/s" % (bw["kind"], bw["busbwGbps"])
    assert busbw in text and busbw in panel
    # Bus bandwidth per collective signature: the kernel table's job busbw is the metric's own
    # computation per signature (so the kind's figure lies between its signatures'), and reads
    # the same in the text table, the JSON and the HTML table; the per-rank busbw (own kernel
    # time, waits included) is a second figure under its own name, never in the job's column.
    report = job["daemon"].get("/api/v1/jobs/slowgpu/report")
    colls = [r for r in report["signatures"] if r["signature"]["kind"] == "OP_KIND_COLLECTIVE"]
    assert colls
    html_rows = re.findall(r'<tr data-kind="collective">(.*?)</tr>',
                           open(page, encoding="utf-8").read(), re.S)
    assert len(html_rows) == len(colls)
    table = text[text.index("Kernels ("):]
    for kind in {b["kind"] for b in jm["busbw"]}:
        mine = [r for r in colls if r["signature"]["collective"] == "COLLECTIVE_KIND_"
                + kind.upper()]
        assert mine and all(int(r["jobBusbwInstances"]) > 0 for r in mine), mine
        per_sig = [r["jobBusbwGbps"] for r in mine]
        got = [b for b in jm["busbw"] if b["kind"] == kind][0]
        assert min(per_sig) - 1e-9 <= got["busbwGbps"] <= max(per_sig) + 1e-9, (got, per_sig)
        assert int(got["instances"]) == sum(int(r["jobBusbwInstances"]) for r in mine)
    kernels = {(k["name"], k["shape"]): k for k in data["kernels"]}
    for r in colls:
        k = kernels[(r["signature"]["name"], "[%s]" % ",".join(r["signature"]["shape"]))]
        assert k["jobBusbwGbps"] == r["jobBusbwGbps"] and k["busbwGbps"] == r["busbwGbps"]
        job_bw, rank_bw = "%.1f GB/s" % r["jobBusbwGbps"], "%.1f GB/s" % r["busbwGbps"]
        line = [ln for ln in table.splitlines() if ln.startswith("  " + k["name"][:34])
                and k["shape"][:22] in ln][0]
        assert re.search(r"\s%s\s+%s\s" % (re.escape(job_bw), re.escape(rank_bw)), line), line
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td.*?</td>", "".join(
            row for row in html_rows if ">%s<" % html.escape(k["name"]) in row
            and html.escape(k["shape"]) in row))]
        assert cells[10:12] == [job_bw, rank_bw], cells
    assert "TFLOPS/job busbw" in table and "rank busbw" in table
    rate = "%.2f steps/s" % gauge("flare_job_steps_per_second")
    assert rate == "%.2f steps/s" % jm["stepsPerSecond"] and rate in text and rate in panel
    void = "V_inter %.1f%%, V_minority %.1f%%" % (100 * gauge("flare_job_void_inter_ratio"),
                                                 100 * gauge("flare_job_void_minority_ratio"))
    assert void in text and void in panel
    # CPU wait per step (run queue): the per-rank gauges are the figures the text and the panel
    # print, and their median the row's headline.
    waits = {int(r["rank"]): r["waitNs"] for r in jm.get("rankRunQueueWait", [])}
    assert len(waits) == 8, jm  # summary mode: every rank's steps carry it
    for rank, ns in waits.items():
        shown = "r%d %.3f ms" % (rank, gauge("flare_job_rank_run_queue_wait_seconds",
                                            rank=str(rank)) * 1e3)
        assert shown == "r%d %.3f ms" % (rank, ns / 1e6) and shown in text and shown in panel
    ordered = sorted(waits.values())
    median = (ordered[3] + ordered[4]) / 2
    assert "%.3f ms per step, median over 8 ranks" % (median / 1e6) in text
    # Each figure once: not a second time computed another way from the series.
    for shown in (text, panel):
        assert shown.count("steps/s") == 1, shown
        assert len(re.findall(r"V_minority \d", shown)) == 1, shown


def test_report_series_limits_reach_the_daemon(build_dir, job):
    data = report_json(build_dir, job, "--max-steps", "4", "--max-ranks", "2")
    series = data["series"]
    # The diagnosed rank is asked for first, so it is kept when the ranks are cut.
    assert series["ranks"] == [SLOW, 0] and series["truncated"]["ranks"]
    assert series["steps"]["count"] == 4 and series["steps"]["first"] == STEPS - 1 - 4
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu",
                "--max-steps", "0")
    assert res.returncode == 2 and "--max-steps" in res.stderr


def test_report_fails_clearly(build_dir, job):
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "nosuchjob")
    assert res.returncode == 4 and "nosuchjob" in res.stderr and "not known" in res.stderr
    res = flare(build_dir, "report", "--daemon-http", "127.0.0.1:1", "--job", "slowgpu")
    assert res.returncode == 3 and "cannot reach the daemon" in res.stderr
    res = flare(build_dir, "report", "--daemon-http", "127.0.0.1:%d" % job["daemon"].grpc,
                "--job", "slowgpu", "--timeout", "5")  # the gRPC port: not HTTP
    assert res.returncode == 3 and "does not answer HTTP" in res.stderr, res.stderr
    res = flare(build_dir, "report", "--daemon-http", "nonsense", "--job", "slowgpu")
    assert res.returncode == 2 and "HOST:PORT" in res.stderr
    res = flare(build_dir, "report", "--daemon-http", job["http"])
    assert res.returncode == 2 and "--job" in res.stderr
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu", "--html",
                os.path.join(job["workdir"], "no", "such", "dir", "r.html"))
    assert res.returncode == 2 and "cannot write" in res.stderr
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu",
                "--baseline", "nosuchjob", "--json")
    assert res.returncode == 0 and "baseline job 'nosuchjob'" in res.stderr


# ---- the HTML page in headless Chromium -------------------------------------------------------

def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_chromium(args, profile):
    cmd = [chromium(), "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--user-data-dir=" + profile, *args]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


class Dom(html.parser.HTMLParser):
    """Elements of the dumped DOM with their attributes and the id of the svg around them."""

    def __init__(self):
        super().__init__()
        self.elements, self.svg = [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svg = a.get("id")
        self.elements.append((tag, a, self.svg))

    def handle_endtag(self, tag):
        if tag == "svg":
            self.svg = None

    def find(self, tag, svg=None, cls=None, **attrs):
        out = []
        for t, a, s in self.elements:
            if t != tag or (svg and s != svg):
                continue
            if cls and cls not in (a.get("class") or "").split():
                continue
            if all(a.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                out.append(a)
        return out


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit non-interlaced RGB/RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, colour, _c, _f, interlace = head
    assert depth == 8 and colour in (2, 6) and interlace == 0, head
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def test_html_report_renders_in_headless_chromium(build_dir, job):
    page = os.path.join(job["workdir"], "report.html")
    # The diagnosis's alert is raised by a detector run after the diagnosis: wait for it, so
    # that the page shows it on the diagnosis.
    deadline = time.time() + 20
    while not job["daemon"].get("/api/v1/alerts?job=slowgpu")["alerts"] and \
            time.time() < deadline:
        time.sleep(0.2)
    res = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu", "--html",
                page, "--baseline", "healthy")
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""  # --html alone prints no text report
    text = open(page, encoding="utf-8").read()
    # Self-contained: nothing fetched from anywhere.
    for needle in ("http://", "https://", "<link", "src=", "@import", "url(http"):
        assert needle not in text, needle
    if chromium() is None:
        pytest.skip("chromium not installed (deploy/install-deps.sh installs Debian's chromium)")
    data = report_json(build_dir, job, "--baseline", "healthy")
    series = data["series"]
    steady = series["steps"]["count"] - 1  # the warm-up step is not drawn
    # ... and the caption says which steps are: the axis starts where the caption says.
    first = series["steps"]["first"]
    assert "steps %d-%d drawn" % (first + 1, first + steady) in text
    if first == 0:
        assert "step 0, the warm-up, is left out" in text

    with tempfile.TemporaryDirectory() as profile:
        dump = run_chromium(["--dump-dom", "file://" + page], profile)
    assert dump.returncode == 0, dump.stderr[-2000:]
    dom = Dom()
    dom.feed(dump.stdout)
    body = dom.find("body")
    assert body and body[0].get("data-interactive") == "1", "the page's script did not run"
    for sid in ("step-time", "heatmap", "latency-cdf", "flops-sig", "flops-rank", "void",
                "void-inter-map", "void-minority-map"):
        assert dom.find("svg", id=sid), sid
    # Diagnoses: the underclocked rank, once: its alert is a badge on it, not a second list.
    diags = dom.find("div", cls="diagnosis")
    shown = [{"kind": d["data-kind"], "ranks": [int(r) for r in d["data-ranks"].split(",") if r],
              "team": d["data-team"]} for d in diags]
    assert [(d["kind"], d["ranks"], d["team"]) for d in beyond_load(job, shown)] == [
        ("gpu_slow", [SLOW], "operations")]
    # (A host finding this machine's load explains may have its alert a detector run later.)
    assert 1 <= len(dom.find("span", cls="alert-badge")) <= len(diags) and \
        not dom.find("ul", id="alerts")
    # The Metrics panel: people's names and units, no raw JSON key, and the same figures as the
    # text report (one computation: flare.report.reported_rows).
    panel = re.search(r'<div class="metrics" id="metrics">.*?</section>', dump.stdout,
                      re.S).group(0)
    for raw in ("metrics.", "rankTflops", "hasBaseline", "computedUnixNs", "True", "False"):
        assert raw not in panel, raw
    text = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu").stdout
    flops = re.search(r"FLOPS +([\d.]+ TFLOPS job-wide)", text).group(1)
    assert flops in panel, (flops, panel)
    busbw = re.search(r"bus bandwidth +(\w+: [\d.]+ GB/s)", text).group(1)
    assert busbw in panel
    slowest = re.search(r"slowest median step: rank (\d+)", text).group(1)
    assert "slowest median step: rank %s" % slowest in panel
    assert "the diagnoses blame rank %d" % SLOW in text
    # Step time: a line per rank, the diagnosed one flagged; the heat map: rank x step cells.
    lines = dom.find("path", svg="step-time", cls="rank-line")
    assert sorted(int(a["data-rank"]) for a in lines) == list(range(RANKS))
    assert [a["data-rank"] for a in lines if "flagged" in a["class"]] == [str(SLOW)]
    cells = dom.find("rect", svg="heatmap", cls="cell")
    assert len(cells) == RANKS * steady
    assert {a["data-rank"] for a in cells} == {str(r) for r in range(RANKS)}
    # Issue-latency CDFs: the job, each rank, and the healthy baseline.
    assert len(dom.find("path", svg="latency-cdf", cls="rank-line")) == RANKS
    assert len(dom.find("path", svg="latency-cdf", cls="baseline-line")) == 1
    assert len(dom.find("path", svg="latency-cdf", cls="median-line")) == 1
    # FLOPS: a bar per compute signature, a bar per rank with the slow rank red and lowest.
    compute = [s for s in series["signatures"] if s["tflops"] > 0]
    assert len(dom.find("rect", svg="flops-sig", cls="bar")) == min(16, len(compute))
    bars = dom.find("rect", svg="flops-rank", cls="bar")
    assert len(bars) == RANKS
    assert [b["data-rank"] for b in bars if b["fill"] == "#e03131"] == [str(SLOW)]
    tallest = min(bars, key=lambda b: float(b["y"]))  # SVG y grows downwards
    assert tallest["data-rank"] != str(SLOW)
    assert max(float(b["y"]) for b in bars) == float(
        [b for b in bars if b["data-rank"] == str(SLOW)][0]["y"])
    # Void percentages: two bars per rank.
    assert len(dom.find("rect", svg="void", cls="bar")) == 2 * RANKS
    # The algorithm team's view. Issue latency: the job, the baseline job and each rank at
    # p10-p99 in the diagnoses' unit (ms, 3 decimals), the job's p50 the text report's; every
    # W1 with what it compares, the baseline one the text report's.
    algo = re.search(r'<div id="algorithm">.*?</section>', dump.stdout, re.S).group(0)
    assert len(dom.find("tr", data_row="rank")) == RANKS
    assert len(dom.find("tr", data_row="job")) == len(dom.find("tr", data_row="baseline")) == 1

    def cells(row):
        return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td.*?</td>", row, re.S)]
    job_row = cells(re.search(r'<tr data-row="job">(.*?)</tr>', algo, re.S).group(1))
    p50, p99 = re.search(r"issue latency +p50 (\d+\.\d{3} ms), p99 (\d+\.\d{3} ms)",
                         text).groups()
    assert job_row[3] == p50 and job_row[5] == p99, (job_row, p50, p99)
    assert all(re.fullmatch(r"\d+\.\d{3} ms", c) for c in job_row[2:]), job_row
    base_row = cells(re.search(r'<tr data-row="baseline">(.*?)</tr>', algo, re.S).group(1))
    assert base_row[0] == "baseline job healthy" and base_row[3] == "%.3f ms" % (
        data["metrics"]["baseline"]["issueLatencyP50Ns"] / 1e6)
    slow_row = cells(re.search(r'<tr data-row="rank" data-rank="%d" class="flagged">(.*?)</tr>'
                               % SLOW, algo, re.S).group(1))
    mine = [r for r in series["issueLatency"]["perRank"] if r["rank"] == SLOW][0]
    assert slow_row[1] == str(mine["samples"])
    text_b = flare(build_dir, "report", "--daemon-http", job["http"], "--job", "slowgpu",
                   "--baseline", "healthy").stdout
    w1 = re.search(r"W1 of this job's to it \(ranks pooled\) (\d+\.\d{3} ms)",
                   text_b).group(1)
    items = {a["data-w1"] for a in dom.find("li") if a.get("data-w1")}
    assert {"baseline", "history", "ranks"} <= items, items
    assert re.search(r'<li data-w1="baseline"><b>W1 %s</b> this job \(ranks pooled\) to '
                     r'baseline job healthy' % re.escape(w1), algo), algo[:3000]
    assert re.search(r'<li data-w1="history"><b class="unmeasured">not measured</b> this job to '
                     r'healthy history: no healthy baseline', algo)
    assert " us<" not in algo and " us " not in algo  # one unit: no microseconds beside ms
    # Void per rank and step: a cell per rank and drawn step in each map, with the series'
    # value (a ratio) and its percentage; the diagnosed rank's row outlined.
    for sid, key in (("void-inter-map", "vInter"), ("void-minority-map", "vMinority")):
        got = dom.find("rect", svg=sid, cls="vcell")
        assert len(got) == RANKS * steady, sid
        for a in got:
            row = series[key][series["ranks"].index(int(a["data-rank"]))]
            v = row[int(a["data-step"]) - series["steps"]["first"]]
            if v is None:
                assert "data-v" not in a
            else:
                assert float(a["data-v"]) == pytest.approx(v, rel=1e-5, abs=1e-9), (sid, a)
    # The kernel table: one row per signature of the report; the ranks table: one per rank; the
    # issue-latency table: the job, the baseline and one per rank.
    rows = [e for e in dom.elements if e[0] == "tr"]
    assert len(rows) == len(data["kernels"]) + 1 + RANKS + 1 + RANKS + 2 + 1  # + header rows
    # The diagnosed rank is marked in the ranks table and the issue-latency table.
    assert len(dom.find("tr", data_rank=str(SLOW), cls="flagged")) == 2

    # The kernel table fits a 1,300 px window without horizontal scrolling: measured by a
    # wrapper page that loads the report in a frame of that width (--dump-dom prints what its
    # script wrote; file:// frames need --allow-file-access-from-files to be read).
    wrapper = os.path.join(job["workdir"], "measure.html")
    with open(wrapper, "w") as f:
        f.write('<!DOCTYPE html><html><body style="margin:0"><iframe id="f" src="report.html" '
                'style="width:1300px;height:1200px;border:0"></iframe><script>'
                'window.addEventListener("load",function(){var d=document.getElementById("f")'
                '.contentDocument,t=d.getElementById("kernels");document.body.dataset.table='
                't.scrollWidth;document.body.dataset.box=t.parentElement.clientWidth;'
                'document.body.dataset.page=d.documentElement.scrollWidth;});</script>'
                '</body></html>')
    with tempfile.TemporaryDirectory() as profile:
        measured = run_chromium(["--allow-file-access-from-files", "--window-size=1300,1300",
                                 "--dump-dom", "file://" + wrapper], profile)
    widths = Dom()
    widths.feed(measured.stdout)
    got = widths.find("body")[0]
    assert "data-table" in got, measured.stdout[-2000:] + measured.stderr[-2000:]
    assert int(got["data-table"]) <= int(got["data-box"]), got
    assert int(got["data-page"]) <= 1300, got
    # The operator's summary: verdict, culprit, team, evidence.
    summary = dom.find("div", id="summary")
    assert summary and summary[0]["data-ranks"] == str(SLOW)
    assert summary[0]["data-teams"] == "operations"

    shot = os.path.join(job["workdir"], "report.png")
    with tempfile.TemporaryDirectory() as profile:
        res = run_chromium(["--screenshot=" + shot, "--window-size=1280,2600",
                            "file://" + page], profile)
    assert res.returncode == 0 and os.path.exists(shot), res.stderr[-2000:]
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (1280, 2600)
    counts = {}
    for row in pixels[::2]:
        for px in row[::2]:
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    assert len(counts) > 200, "too few colours: a blank or unstyled page"
    assert max(counts.values()) < 0.9 * total, "one colour covers 90% of the page"
    # The diagnosed rank's red bar is on screen (solid fill: exact colour).
    assert counts.get(FLAG_RGB, 0) > 100


# ---- rendering without a daemon: fields a newer daemon adds are shown ------------------------

def test_the_slowest_rank_line_says_whether_the_ranks_wait_for_each_other():
    """Ranks that meet at collectives wait for each other, so the slowest is not the culprit;
    ranks that share none (independent processes on one GPU, a fixture's ranks replayed side by
    side) each run at their own pace, and the line must not claim otherwise."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import report
    finally:
        sys.path.pop(0)
    data = {"metrics": {"slowestRank": {"rank": 3, "medianNs": 184_000_000}}, "diagnoses": [],
            "kernels": [{"name": "cublasGemmEx", "kind": "gemm"}]}
    alone = report.slowest_rank_text(data)
    assert "rank 3 at 184" in alone and "share no collective" in alone, alone
    assert "wait for each other" not in alone
    data["kernels"].append({"name": "ncclAllReduce", "kind": "collective"})
    data["diagnoses"] = [{"kind": "issue_stall", "ranks": [3]}]
    together = report.slowest_rank_text(data)
    assert "ranks wait for each other at collectives: the diagnoses blame rank 3" in together


def test_unknown_report_fields_are_rendered_not_dropped():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import html_report, report
    finally:
        sys.path.pop(0)
    sig = {"name": "cublasGemmEx", "kind": "OP_KIND_GEMM", "dtype": "DTYPE_BF16",
           "shape": ["8", "16", "32"], "layout": "tn"}
    data = {"jobId": "j<1>", "ranks": [], "diagnoses": [], "series": None, "hangs": [],
            "alerts": [], "report": {
                "jobId": "j<1>", "fiveMetrics": {"throughputStepsPerS": 2.5, "voidInter": 0.1},
                "signatures": [{"signature": sig, "count": "3", "totalNs": "300",
                                "timeShare": 1.0, "tflops": 1.5, "p50Ns": "100", "p99Ns": "100",
                                "changeVsHistory": -0.2}]}}
    report.derive(data)
    text = report.format_text(data)
    assert "fiveMetrics.throughputStepsPerS 2.5" in text
    assert "changeVsHistory=-0.2" in text and "1.5 TFLOPS" in text
    page = html_report.render(data)
    assert "fiveMetrics.voidInter" in page and "changeVsHistory" in page
    # ... folded away below the panels, never as a card of the Metrics panel.
    metrics = re.search(r'<div class="metrics" id="metrics">.*?</section>', page, re.S)
    assert metrics is None or "fiveMetrics" not in metrics.group(0)
    assert '<details id="unknown-fields">' in page
    assert "j&lt;1&gt;" in page and "j<1>" not in page  # escaped
    assert 'id="no-series"' in page


def test_daemon_metrics_are_formatted_for_people():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import report
    finally:
        sys.path.pop(0)
    lines = report.format_reported({
        "backend": "NVIDIA H100 80GB HBM3", "scale": 8, "baselineRuns": 2,
        "metrics": {"steps": 40, "stepsPerSecond": 2.5, "samplesPerSecond": 80, "tflops": 312.4,
                    "rankTflops": [{"rank": 0, "tflops": 330.0}, {"rank": 1, "tflops": 250.5},
                                   {"rank": 2, "tflops": 331.0}],
                    "busbw": [{"kind": "all_reduce", "busbwGbps": 180.25, "instances": "64"}],
                    "hasBaseline": True, "issueLatencyW1Ns": 3000000,
                    "issueLatencyW1ThresholdNs": 1000000, "vInter": 0.125, "vMinority": 0.05,
                    "bytesPerRankStep": 2300, "computedUnixNs": "1", "newField": 7,
                    "rankRunQueueWait": [{"rank": 0, "waitNs": 150000},
                                         {"rank": 1, "waitNs": 2250000}, {"rank": 2}]},
        "somethingNew": {"a": 1}})
    text = "\n".join(lines)
    assert "NVIDIA H100 80GB HBM3, 8 ranks; 2 healthy baseline runs" in text
    assert "2.50 steps/s over 40 steps, 80 samples/s" in text
    assert "312.4 TFLOPS job-wide" in text and "250.5 (r1) .. 331.0 (r2), median 330.0" in text
    assert "r0 330.0  r1 250.5  r2 331.0" in text
    assert "all_reduce: 180.2 GB/s over 64 instances" in text
    assert "W1 3.000 ms from healthy history (threshold 1.000 ms) — ABOVE" in text
    assert "V_inter 12.5%, V_minority 5.0%" in text
    assert "2.25 KiB per rank per step" in text
    assert "0.150 ms per step, median over 3 ranks; the issuing threads runnable without a CPU " \
        "(run queue); most r1 2.250 ms" in text, text
    assert "r0 0.150 ms  r1 2.250 ms  r2 0.000 ms" in text
    # Unknown fields stay visible; known ones are not repeated raw.
    assert "metrics.newField" in text and "somethingNew.a" in text
    assert "rankTflops" not in text and "computedUnixNs" not in text


def test_unmeasured_figures_read_not_measured_with_the_reason_never_zero():
    """The first H100 report showed 0 ns and 0 for what was never measured (no healthy history,
    no complete step in the window, no baseline W1): each reads "not measured" and says why, in
    the text report and in the HTML Metrics panel alike, whose cards carry no raw JSON key."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import html_report, report
    finally:
        sys.path.pop(0)
    data = {"jobId": "j", "ranks": [], "diagnoses": [], "hangs": [], "alerts": [], "series": None,
            "report": {"jobId": "j", "signatures": [], "backend": "NVIDIA H100 80GB HBM3",
                       "scale": 4, "baselineRuns": 0, "metrics": {
                           "steps": 0, "stepsPerSecond": 0, "samplesPerSecond": 0, "tflops": 0,
                           "rankTflops": [{"rank": 0, "tflops": 9.364}, {"rank": 1}],
                           "busbw": [], "hasBaseline": False, "issueLatencyW1Ns": 0,
                           "issueLatencyW1ThresholdNs": 0, "vInter": 0, "vMinority": 0,
                           "computedUnixNs": "1795719291085083351",
                           "bytesPerRankStep": 11814}}}
    report.derive(data)
    text = report.format_text(data)
    assert re.search(r"throughput +not measured; the detectors' window holds no complete step",
                     text), text
    assert re.search(r"FLOPS +not measured job-wide; per rank 9.4 \(r0\) .. 9.4 \(r0\)", text), text
    assert re.search(r"vs history +not measured; no healthy baseline", text), text
    assert re.search(r"CPU wait +not measured; no rank has 3 steps with run-queue readings", text)
    assert "0.00 steps/s" not in text and "0 ns" not in text and "0.0 TFLOPS" not in text
    page = html_report.render(data)
    panel = re.search(r'<div class="metrics" id="metrics">.*?</section>', page, re.S).group(0)
    assert panel.count('class="unmeasured"') == 5, panel
    assert "not measured" in panel and ">0 ns<" not in panel and ">0<" not in panel
    for raw in ("metrics.", "rankTflops", "hasBaseline", "computedUnixNs", "1795719291085083351"):
        assert raw not in panel, raw
    assert "unknown-fields" not in page  # every field the daemon sent is known


def test_algorithm_view_reads_the_diagnosis_w1_and_says_what_was_not_measured():
    """The algorithm team's view of an issue-stalled rank: the diagnosis's W1 in the diagnosis's
    own unit (the first report showed one W1 as "430.1 us" in a card and "0.198 ms" in the
    diagnosis); no baseline job and no history read "not measured" with the reason; a step
    without statistics is a grey "not measured" cell that says why, never 0%."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import html_report, report
    finally:
        sys.path.pop(0)
    probs = [i / 100 for i in range(101)]
    series = {"ranks": [0, 1], "rankCount": 2,
              "steps": {"total": 4, "first": 0, "count": 4, "warmup": 1}, "truncated": {},
              "stepTimeNs": [[9e7, 5e7, 5e7, 5e7], [9e7, 5e7, 5e7, 5e7]],
              "vInter": [[0.5, 0.02, None, 0.03], [0.5, 0.25, 0.3, 0.2]],
              "vMinority": [[0.1, 0.04, None, 0.05], [0.1, 0.06, 0.07, 0.08]],
              "signatures": [],
              "issueLatency": {"probabilities": probs,
                               "job": {"samples": 200, "ns": [1e4 * i for i in range(101)]},
                               "perRank": [{"rank": 0, "samples": 100,
                                            "ns": [2e4 * i for i in range(101)]},
                                           {"rank": 1, "samples": 100,
                                            "ns": [1e2 * i for i in range(101)]}],
                               "baseline": None}}
    stall = {"kind": "issue_stall", "team": "algorithm", "cause": "host stall", "ranks": [1],
             "summary": "rank 1: kernel issue stalled",
             "evidence": [{"metric": "issue_latency_w1", "value": 198123.0,
                           "reference": 100000.0,
                           "text": "issue-latency distribution W1 0.198 ms from the other ranks "
                                   "(fence 0.100 ms); median 0.005 ms vs 1.000 ms"}]}
    data = {"jobId": "j", "ranks": [], "diagnoses": [stall], "hangs": [], "alerts": [],
            "series": series, "report": {"jobId": "j", "signatures": [], "metrics": {
                "steps": 3, "stepsPerSecond": 20, "hasBaseline": False}}}
    page = html_report.render(report.derive(data))
    algo = re.search(r'<div id="algorithm">.*?</section>', page, re.S).group(0)
    assert '<li data-w1="diagnosis"><b>W1 0.198 ms</b> rank 1, from the issue_stall diagnosis: ' \
        'issue-latency distribution W1 0.198 ms from the other ranks' in algo, algo
    assert '<li data-w1="baseline"><b class="unmeasured">not measured</b> this job to a ' \
        'baseline job: no baseline job given (flare report --baseline HEALTHY_JOB)' in algo
    assert '<li data-w1="history"><b class="unmeasured">not measured</b> this job to healthy ' \
        'history: no healthy baseline of this backend and scale yet' in algo
    assert 'data-w1="ranks"' not in algo  # a rank's W1 is given: not "no rank crossed"
    # Quantiles: rank 1's p50 (100 x 50 ns) in ms with three decimals, as the diagnoses write.
    row = re.search(r'<tr data-row="rank" data-rank="1" class="flagged">(.*?)</tr>', algo).group(1)
    assert ">0.005 ms<" in row and "us<" not in algo
    assert re.search(r'<tr data-row="baseline"><td>baseline job</td><td class="n unmeasured" '
                     r'colspan="5">not measured: no baseline job given', algo)
    # Rank 0's step 2: no statistics: grey, "not measured" and why, in both void maps.
    for sid, what, other in (("void-inter-map", "V_inter", "0.3"),
                             ("void-minority-map", "V_minority", "0.07")):
        svg = re.search(r'<svg id="%s".*?</svg>' % sid, algo, re.S).group(0)
        assert svg.count('class="vcell"') == 2 * 3  # the warm-up step is not drawn
        cell = re.search(r'<rect class="vcell" data-rank="0" data-step="2" [^>]*>(.*?)</rect>',
                         svg).group(0)
        assert "data-v" not in cell and 'fill="#e9ecef"' in cell
        assert "rank 0, step 2: %s not measured: no step statistics for this step" % what in cell
        assert 'data-rank="1" data-step="2" data-v="%s"' % other in svg  # the other rank's
    # No step at all: both views say so instead of drawing zeros.
    for key in ("vInter", "vMinority"):
        series[key] = [[None] * 4, [None] * 4]
    page = html_report.render(report.derive(data))
    assert "V_inter not measured: no step boundaries in the window" in page
    assert "V_minority not measured: no step boundaries in the window" in page


def test_each_finding_is_shown_once_with_its_alert():
    """An alert raised for a diagnosis (or a hang) still in the window is shown on it, not a
    second time; an alert whose diagnosis left the window is listed on its own."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import html_report, report
    finally:
        sys.path.pop(0)
    diag = {"kind": "gpu_slow", "team": "operations", "ranks": [3], "cause": "GPU",
            "summary": "rank 3: GPU slow", "evidence": [{"text": "kernels 25% slower"}]}
    data = {"jobId": "j", "ranks": [{"rank": 3, "host": "node7"}], "diagnoses": [diag],
            "hangs": [{"text": "non-communication hang: suspects rank 5", "suspects": [
                {"rank": 5}]}], "series": None,
            "alerts": [{"kind": "gpu_slow", "rank": 3, "team": "operations",
                        "severity": "critical", "message": "rank 3: GPU slow | kernels"},
                       {"kind": "hang", "rank": 5, "team": "operations", "severity": "critical",
                        "message": "non-communication hang"},
                       {"kind": "issue_stall", "rank": 1, "team": "algorithm",
                        "severity": "warning", "message": "rank 1: stall earlier | w1"}],
            "report": {"jobId": "j", "signatures": []}}
    report.derive(data)
    text = report.format_text(data)
    assert text.count("rank 3: GPU slow") == 1 and "(alert raised: critical)" in text
    assert "Alerts raised (1, stored by the daemon)" in text and "stall earlier" in text
    assert text.count("non-communication hang") == 1
    page = html_report.render(data)
    assert page.count("rank 3: GPU slow") == 2  # the summary's line and the diagnosis
    assert page.count('class="badge alert-badge"') == 1
    alerts = re.search(r'<ul id="alerts">.*?</ul>', page, re.S).group(0)
    assert "stall earlier" in alerts and "GPU slow" not in alerts and "hang" not in alerts
    # The operator's summary: verdict, culprits with hosts, team.
    summary = re.search(r'<div id="summary".*?</div>', page, re.S).group(0)
    assert "2 findings: hang, gpu slow" in summary and "rank 3 (node7)" in summary
    assert "rank 5" in summary and "operations" in summary


def test_report_after_a_daemon_restart_keeps_the_kernels_and_alerts(build_dir, job):
    # Runs last: it replaces the module's daemon. The kernel report and the alerts are stored;
    # the detector window (diagnoses, series) is not, and the report says so.
    job["daemon"].stop()
    again = Daemon(build_dir, job["workdir"])
    try:
        res = flare(build_dir, "report", "--daemon-http", "127.0.0.1:%d" % again.http, "--job",
                    "slowgpu", "--html", os.path.join(job["workdir"], "after.html"), "--text")
        assert res.returncode == 0, res.stderr
        assert "Diagnoses: none" in res.stdout
        assert "Alerts raised (1, stored by the daemon)" in res.stdout
        assert "[operations] critical gpu_slow: rank 3" in res.stdout
        assert "no per-step series" in res.stdout
        assert "cublasGemmEx" in res.stdout
        page = open(os.path.join(job["workdir"], "after.html"), encoding="utf-8").read()
        assert 'id="no-series"' in page and 'id="alerts"' in page
    finally:
        again.stop()


def test_html_bounds_long_series_and_says_what_it_cut():
    """400 steps on 4 ranks: the heat map averages steps in bins (at most MAX_COLUMNS columns);
    a start-up spike is cut from the step-time axis and the page says so."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from flare import html_report, report
    finally:
        sys.path.pop(0)
    ranks, steps = 4, 400
    rows = [[(500e6 if i in (1, 2) else 60e6 + (r * 7 + i) % 5 * 1e5) for i in range(steps)]
            for r in range(ranks)]
    series = {"ranks": list(range(ranks)), "rankCount": ranks,
              "steps": {"total": steps, "first": 0, "count": steps, "warmup": 1},
              "truncated": {}, "stepTimeNs": rows, "vInter": [[0.0] * steps] * ranks,
              "vMinority": [[0.1] * steps] * ranks, "signatures": [],
              "issueLatency": {"probabilities": [0, 1], "job": {"samples": 2, "ns": [1, 2]},
                               "perRank": [], "baseline": None}}
    data = {"jobId": "long", "ranks": [], "diagnoses": [], "hangs": [], "alerts": [],
            "series": series, "report": {"jobId": "long", "signatures": []}}
    page = html_report.render(report.derive(data))
    per_bin = -(-(steps - 1) // html_report.MAX_COLUMNS)  # ceil: steady steps per column
    columns = -(-(steps - 1) // per_bin)
    assert columns <= html_report.MAX_COLUMNS
    assert page.count('class="cell"') == ranks * columns
    assert "8 rank-steps above" in page and "the heat map shows them" in page
    assert "≥ " in page  # the heat map's top colour is a clipped bound
