"""`flare report`: a job's kernel report, diagnoses and metrics, gathered from flared's HTTP JSON
API and put in the shapes the text, JSON and HTML outputs print.

    collect(get, job, baseline=None, progress=None) -> data   (the daemon's answers)
    derive(data) -> data with "kernels" and "metrics"         (pure: no I/O)
    format_text(data) -> str

`get(path, optional=False)` returns the decoded JSON of one GET, or None for an optional route
the daemon answers 404 (an older daemon, a job without a detector window). Everything here is
stdlib only and tolerant of fields a newer daemon adds: report fields this module does not know
(e.g. the five metrics and changes against history) are carried through and printed as they are.
"""
import math
import urllib.parse

# Report fields rendered by name; anything else in the report is shown under "other fields".
KNOWN_REPORT_KEYS = {"jobId", "signatures"}
KNOWN_SIGNATURE_KEYS = {"signature", "count", "totalNs", "timeShare", "tflops", "busbwGbps",
                        "p50Ns", "p99Ns", "jobBusbwGbps", "jobBusbwInstances", "estimated"}
# A count (and its GPU time) estimated from 1-in-N timed launches (SignatureReport.estimated).
SAMPLED = ("~: estimated from 1-in-N samples of plain kernel launches (FLARE_SAMPLE_KERNELS on "
           "the ranks; docs/metrics.md \"Sampled kernel launches\")")

# The two bus bandwidths of a collective, named apart wherever they are shown (docs/metrics.md
# "Bus bandwidth: job and per rank"). Both use nccl-tests' busbw factor (records::
# busBandwidthFactor); they differ in the time they divide by.
JOB_BUSBW = ("job busbw: nccl-tests busbw with t from the start of the last-issued instance "
             "across ranks to the end of the last one, median over the complete instances in "
             "the detectors' window; the bus bandwidth metric and /metrics' "
             "flare_job_busbw_bytes_per_second give it per collective kind")
RANK_BUSBW = ("rank busbw: bytes over each rank's own kernel time, every call of every rank of "
              "the whole job; a rank's kernel time includes waiting for late peers, so it is "
              "below the job busbw when ranks arrive apart")


def _num(value, default=0.0):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def signature_key(sig):
    """What makes two signatures equal across the report and the series (ids differ)."""
    shape = []
    for d in sig.get("shape") or []:
        try:
            shape.append(int(d))
        except (TypeError, ValueError):
            shape.append(d)
    return (sig.get("name", ""), sig.get("kind", ""), sig.get("dtype", ""), tuple(shape),
            sig.get("layout", ""))


def label(value, prefix):
    """'OP_KIND_GEMM' -> 'gemm'; '' and *_UNSPECIFIED -> ''."""
    value = str(value or "")
    if value.endswith("UNSPECIFIED"):
        return ""
    return value[len(prefix):].lower() if value.startswith(prefix) else value.lower()


def shape_text(sig):
    shape = sig.get("shape") or []
    return "[%s]" % ",".join(str(d) for d in shape) if shape else ""


def collect(get, job, baseline=None, progress=None, limits=None):
    """Every answer the report needs. Raises whatever `get` raises for the report itself (an
    unknown job: the caller's 404 handling); the other routes are optional. `limits`: series
    bounds passed to the daemon ({"max_steps": N, "max_ranks": N}; None: its defaults)."""
    q = urllib.parse.quote(job, safe="")
    say = progress or (lambda _msg: None)
    data = {"jobId": job}
    say("report")
    data["report"] = get("/api/v1/jobs/%s/report" % q)
    say("ranks")
    ranks = get("/api/v1/jobs/%s/ranks" % q, optional=True) or {}
    data["ranks"] = ranks.get("ranks", []) if isinstance(ranks, dict) else []
    say("diagnoses")
    diag = get("/api/v1/jobs/%s/diagnoses" % q, optional=True) or {}
    data["diagnoses"] = diag.get("diagnoses", []) if isinstance(diag, dict) else []
    flagged = sorted({int(r) for d in data["diagnoses"] for r in d.get("ranks", [])
                      if isinstance(r, int) or str(r).isdigit()})
    query = {}
    if flagged:
        query["ranks"] = ",".join(str(r) for r in flagged)
    if baseline:
        query["baseline"] = baseline
    for key, value in sorted((limits or {}).items()):
        if value:
            query[key] = str(int(value))
    say("series")
    series = get("/api/v1/jobs/%s/series%s" % (q, "?" + urllib.parse.urlencode(query)
                                               if query else ""), optional=True)
    data["series"] = series if isinstance(series, dict) else None
    say("hangs")
    hangs = get("/api/v1/jobs/%s/hangs" % q, optional=True) or {}
    data["hangs"] = hangs.get("incidents", []) if isinstance(hangs, dict) else []
    say("alerts")
    alerts = get("/api/v1/alerts?" + urllib.parse.urlencode({"job": job}), optional=True) or {}
    data["alerts"] = alerts.get("alerts", []) if isinstance(alerts, dict) else []
    data["baselineJob"] = baseline or ""
    return data


def _median(values):
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def steady_columns(series):
    """Indices (into the series rows) of the steps after the warm-up: the window's first step is
    the warm-up the detectors skip, when the series starts at it."""
    steps = series.get("steps") or {}
    count = int(_num(steps.get("count")))
    skip = int(_num(steps.get("warmup"), 1)) if int(_num(steps.get("first"))) == 0 else 0
    return list(range(min(skip, count), count))


def flagged_ranks(data):
    return sorted({r for d in data.get("diagnoses", []) for r in d.get("ranks", [])
                   if isinstance(r, int)})


def _rows(series, key):
    """{rank: [values]} of a rank x step matrix, None for JSON null."""
    out = {}
    for rank, row in zip(series.get("ranks", []), series.get(key, []) or []):
        out[rank] = [v if isinstance(v, (int, float)) and math.isfinite(v) else None for v in row]
    return out


def quantile_at(probs, qs, p):
    """The series' quantile `qs` at the probability of `probs` nearest to p (None: no
    quantiles). The text report, the Metrics panel and the algorithm view all read it here."""
    if not probs or len(qs) != len(probs):
        return None
    best = min(range(len(probs)), key=lambda i: abs(probs[i] - p))
    return _num(qs[best], None)


def derive(data):
    """Adds data["kernels"] (the report's rows joined with the per-rank series: spread across
    ranks and the slowest rank) and data["metrics"] (step time, void %, issue latency, and the
    report's own extra fields)."""
    report = data.get("report") or {}
    series = data.get("series") or {}
    per_sig = {}
    for s in series.get("signatures", []) or []:
        per_sig[signature_key(s)] = s
    kernels = []
    for row in report.get("signatures", []) or []:
        sig = row.get("signature") or {}
        k = {
            "name": sig.get("name", ""),
            "kind": label(sig.get("kind"), "OP_KIND_"),
            "dtype": label(sig.get("dtype"), "DTYPE_"),
            "shape": shape_text(sig),
            "layout": sig.get("layout", ""),
            "collective": label(sig.get("collective"), "COLLECTIVE_KIND_"),
            "count": int(_num(row.get("count"))),
            "estimated": int(_num(row.get("estimated"))),
            "totalNs": _num(row.get("totalNs")),
            "timeShare": _num(row.get("timeShare")),
            "tflops": _num(row.get("tflops")),
            "busbwGbps": _num(row.get("busbwGbps")),
            "jobBusbwGbps": _num(row.get("jobBusbwGbps")),
            "jobBusbwInstances": int(_num(row.get("jobBusbwInstances"))),
            "p50Ns": _num(row.get("p50Ns")),
            "p99Ns": _num(row.get("p99Ns")),
            "spread": None,
            "slowestRank": None,
            "extra": {key: v for key, v in row.items() if key not in KNOWN_SIGNATURE_KEYS},
        }
        ranks = per_sig.get(signature_key(sig), {}).get("perRank", [])
        p50 = [(r.get("rank"), _num(r.get("p50Ns"))) for r in ranks if _num(r.get("p50Ns")) > 0]
        if len(p50) >= 2:
            mid = _median([v for _r, v in p50])
            lo, hi = min(v for _r, v in p50), max(v for _r, v in p50)
            k["spread"] = (hi - lo) / mid if mid else None
            k["slowestRank"] = max(p50, key=lambda rv: rv[1])[0]
        kernels.append(k)
    data["kernels"] = kernels

    metrics = {}
    if series:
        cols = steady_columns(series)
        steps = _rows(series, "stepTimeNs")
        flat = [row[i] for row in steps.values() for i in cols if i < len(row)]
        per_rank = {r: _median([row[i] for i in cols if i < len(row)]) for r, row in steps.items()}
        per_rank = {r: v for r, v in per_rank.items() if v is not None}
        med = _median(flat)
        if med:
            metrics["stepTimeMedianNs"] = med
            metrics["stepsPerSecond"] = 1e9 / med
            metrics["steps"] = len(cols)
            slowest = max(per_rank.items(), key=lambda rv: (rv[1], -rv[0]))
            metrics["slowestRank"] = {"rank": slowest[0], "medianNs": slowest[1]}
        for key, name in (("vInter", "vInterMedian"), ("vMinority", "vMinorityMedian")):
            rows = _rows(series, key)
            values = [row[i] for row in rows.values() for i in cols if i < len(row)]
            m = _median(values)
            if m is not None:
                metrics[name] = m
                worst = {r: _median([row[i] for i in cols if i < len(row)]) for r, row in
                         rows.items()}
                worst = {r: v for r, v in worst.items() if v is not None}
                if worst:
                    r, v = max(worst.items(), key=lambda rv: (rv[1], -rv[0]))
                    metrics[name.replace("Median", "Worst")] = {"rank": r, "median": v}
        lat = series.get("issueLatency") or {}
        probs = lat.get("probabilities") or []
        job_q = (lat.get("job") or {}).get("ns") or []

        def at(qs, p):
            return quantile_at(probs, qs, p)
        if job_q:
            metrics["issueLatencyP50Ns"] = at(job_q, 0.5)
            metrics["issueLatencyP99Ns"] = at(job_q, 0.99)
        base = lat.get("baseline")
        if isinstance(base, dict):
            metrics["baseline"] = {"jobId": base.get("jobId", ""),
                                   "issueLatencyP50Ns": at(base.get("ns") or [], 0.5),
                                   "w1Ns": _num(base.get("w1Ns"), None)}
    extra = {k: v for k, v in report.items() if k not in KNOWN_REPORT_KEYS}
    if extra:
        metrics["reported"] = extra  # what the daemon adds (five metrics, history, ...)
    data["metrics"] = metrics
    return data


def fmt_ns(ns):
    if ns is None:
        return "-"
    ns = float(ns)
    if abs(ns) >= 1e9:
        return "%.2f s" % (ns / 1e9)
    if abs(ns) >= 1e6:
        return "%.2f ms" % (ns / 1e6)
    if abs(ns) >= 1e3:
        return "%.1f us" % (ns / 1e3)
    return "%.0f ns" % ns


def fmt_latency(ns):
    """Issue latencies and their W1 distances, in one unit everywhere: milliseconds with three
    decimals, as flared's diagnoses print them (src/engine/diagnosis/signals.cc fmtMs)."""
    return "-" if ns is None else "%.3f ms" % (float(ns) / 1e6)


def fmt_pct(ratio):
    return "-" if ratio is None else "%.1f%%" % (100 * ratio)


def rate_text(k):
    """TFLOPS of a GEMM/attention signature; the job busbw of a collective (JOB_BUSBW: the
    bus bandwidth metric's computation, per signature)."""
    if k["tflops"] > 0:
        return "%.1f TFLOPS" % k["tflops"]
    if k["kind"] == "collective":
        if k.get("jobBusbwInstances") and k.get("jobBusbwGbps", 0) > 0:
            return "%.1f GB/s" % k["jobBusbwGbps"]
        return NOT_MEASURED
    return "-"


JOB_BUSBW_UNMEASURED = ("no complete instance of it in the detectors' window (summary mode, a "
                        "rank's records missing, or the daemon has no window for the job)")


def rank_busbw_text(k):
    """The per-rank busbw of a collective (RANK_BUSBW)."""
    return "%.1f GB/s" % k["busbwGbps"] if k["busbwGbps"] > 0 else "-"


def spread_text(k):
    if k["spread"] is None:
        return "-"
    return "%s (slowest r%s)" % (fmt_pct(k["spread"]), k["slowestRank"])


def flatten(value, prefix=""):
    """Nested JSON as ("a.b.c", scalar) pairs, for printing fields this module does not know."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, "%s.%s" % (prefix, k) if prefix else str(k))
    elif isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            yield prefix, ", ".join(str(v) for v in value)
        else:
            for i, v in enumerate(value):
                yield from flatten(v, "%s[%d]" % (prefix, i))
    else:
        yield prefix, value


def _fmt_bytes(n):
    n = float(n)
    return "%.0f B" % n if n < 1024 else ("%.2f KiB" % (n / 1024) if n < 1 << 20
                                         else "%.2f MiB" % (n / (1 << 20)))


NOT_MEASURED = "not measured"


def daemon_measured(m):
    """Which job-wide figures the daemon measured ({"rate": bool, "void": bool}) for derived
    metrics m: where it did, its figure is the one shown (it is the one /metrics exports), and
    the same figure is not computed a second way from the series."""
    jm = ((m or {}).get("reported") or {}).get("metrics") or {}
    steps = _num(jm.get("steps", 0)) > 0
    return {"rate": steps and _num(jm.get("stepsPerSecond", 0)) > 0,
            "void": steps and (jm.get("vInter") is not None or jm.get("vMinority") is not None)}


def _worst_text(m):
    """The highest per-rank void shares of the series, for the void row's detail."""
    parts = []
    for key, name in (("vInter", "V_inter"), ("vMinority", "V_minority")):
        worst = (m or {}).get(key + "Worst")
        if worst and _num(worst.get("median")) > 0:  # every rank at 0: no rank is highest
            parts.append("%s highest on rank %s (%s)" % (name, worst.get("rank"),
                                                        fmt_pct(worst.get("median"))))
    return "; ".join(parts)


def reported_rows(reported, derived=None):
    """The daemon's own figures (GetReportResponse beyond the kernel table: the detectors' five
    metrics, the history key) as rows (name, value, detail) for people, shared by the text report
    and the HTML page so that both show the same figure in the same unit. A figure the daemon
    could not measure reads "not measured" with the reason, never 0. Returns (rows, unknown):
    unknown is the ("a.b", value) pairs of fields this version does not know. `derived` (the
    metrics derive() computed) adds the per-rank detail the daemon's figures lack."""
    rows, unknown = [], []
    rep = dict(reported or {})
    jm = dict(rep.pop("metrics", None) or {})
    backend, scale = rep.pop("backend", None), rep.pop("scale", None)
    runs = rep.pop("baselineRuns", None)
    if backend or scale:
        rows.append(("device", "%s, %s ranks" % (backend or "(unknown)",
                                                 scale if scale is not None else "?"),
                     "%s healthy baseline run%s of this backend and scale" % (
                         runs or 0, "" if runs == 1 else "s")))
    if jm:
        jm.pop("computedUnixNs", None)
        jm.pop("baselineRuns", None)
        steps, sps = _num(jm.pop("steps", 0)), _num(jm.pop("stepsPerSecond", 0))
        samples = _num(jm.pop("samplesPerSecond", 0))
        if steps > 0 and sps > 0:
            rows.append(("throughput", "%.2f steps/s over %d steps" % (sps, steps),
                         "%.0f samples/s" % samples if samples else "(batch size unknown)"))
        else:
            rows.append(("throughput", NOT_MEASURED,
                         "the detectors' window holds no complete step (steps are found from "
                         "the DataLoader or flare.step())"))
        tflops = _num(jm.pop("tflops", 0))
        per_rank = [r for r in (jm.pop("rankTflops", []) or []) if isinstance(r, dict)]
        measured = [(_num(r.get("tflops")), r.get("rank", 0)) for r in per_rank
                    if _num(r.get("tflops")) > 0]
        if tflops > 0 or measured:
            detail = ""
            if measured:
                vals = sorted(measured)
                detail = "per rank %.1f (r%s) .. %.1f (r%s), median %.1f" % (
                    vals[0][0], vals[0][1], vals[-1][0], vals[-1][1],
                    _median([v for v, _ in vals]))
            rows.append(("FLOPS", "%.1f TFLOPS job-wide (GEMM/attention)" % tflops
                         if tflops > 0 else NOT_MEASURED + " job-wide", detail or
                         "no rank's GEMM/attention FLOPs were measured"))
            if measured and len(per_rank) <= 16:
                rows.append(("", "  ".join("r%s %.1f" % (r, v) for v, r in
                                           sorted(measured, key=lambda x: x[1])), ""))
        else:
            rows.append(("FLOPS", NOT_MEASURED, "no GEMM or attention kernel with known FLOPs "
                         "in the window (flare.register_kernel declares custom ones)"))
        for bw in jm.pop("busbw", []) or []:
            rows.append(("bus bandwidth", "%s: %.1f GB/s over %s instances" % (
                bw.get("kind", "?"), _num(bw.get("busbwGbps")), bw.get("instances", 0)),
                "job busbw: median over every %s instance, each timed from the last rank's "
                "start to the last end; per signature in the kernel table" % bw.get("kind", "?")))
        has_base = jm.pop("hasBaseline", False)
        w1, thr = jm.pop("issueLatencyW1Ns", None), jm.pop("issueLatencyW1ThresholdNs", None)
        if has_base:
            over = _num(w1) > _num(thr) > 0
            rows.append(("issue latency", "W1 %s from healthy history (threshold %s)%s" % (
                fmt_latency(_num(w1)), fmt_latency(_num(thr)), " — ABOVE" if over else ""), ""))
        else:
            rows.append(("vs history", NOT_MEASURED, "no healthy baseline of this backend and "
                         "scale yet (flare baseline add --job HEALTHY_JOB)"))
        vi, vm = jm.pop("vInter", None), jm.pop("vMinority", None)
        if (vi is not None or vm is not None) and steps <= 0:
            rows.append(("void", NOT_MEASURED, "void percentages are per step, and the "
                         "detectors' window holds no complete step"))
        elif vi is not None or vm is not None:
            worst = _worst_text(derived)
            rows.append(("void", "V_inter %s, V_minority %s" % (fmt_pct(_num(vi)),
                                                               fmt_pct(_num(vm))),
                         "median over ranks" + ("; " + worst if worst else "")))
        # CPU wait: the figure cpu_contention compares, per rank (its own unit: fmt_latency).
        waits = sorted((_num(r.get("waitNs")), r.get("rank", 0))
                       for r in (jm.pop("rankRunQueueWait", []) or []) if isinstance(r, dict))
        if waits:
            rows.append(("CPU wait", "%s per step, median over %d rank%s" % (
                fmt_latency(_median([v for v, _ in waits])), len(waits),
                "" if len(waits) == 1 else "s"),
                "the issuing threads runnable without a CPU (run queue); most r%s %s" % (
                    waits[-1][1], fmt_latency(waits[-1][0]))))
            if len(waits) <= 16:
                rows.append(("", "  ".join("r%s %s" % (r, fmt_latency(v)) for v, r in
                                           sorted(waits, key=lambda x: x[1])), ""))
        else:
            rows.append(("CPU wait", NOT_MEASURED, "no rank has 3 steps with run-queue readings "
                         "(Linux schedstat; `flare status` counts a rank's steps sent without "
                         "them as runQueueUnmeasured)"))
        volume = jm.pop("bytesPerRankStep", None)
        if volume:
            rows.append(("volume", "%s per rank per step" % _fmt_bytes(volume), "as received"))
        unknown.extend(flatten(jm, "metrics"))
    unknown.extend(flatten(rep))
    return rows, unknown


def format_reported(reported, derived=None):
    """The daemon's own figures as text lines (reported_rows); fields this version does not know
    are printed as key/value pairs rather than dropped."""
    rows, unknown = reported_rows(reported, derived)
    out = []
    for name, value, detail in rows:
        if not detail:
            tail = ""
        elif name == "throughput" and value != NOT_MEASURED:
            tail = (" " if detail.startswith("(") else ", ") + detail
        elif name in ("void", "volume"):
            tail = " (%s)" % detail
        else:
            tail = "; " + detail
        out.append("  %-16s %s%s" % (name, value, tail))
    for key, value in unknown:
        out.append("  %-16s %s" % (key, value))
    return out


def shares_collectives(data):
    """Whether the job's kernel report holds a collective or point-to-point signature."""
    for k in data.get("kernels", []) or []:
        kind = str(k.get("kind") or (k.get("signature") or {}).get("kind") or "").lower()
        if "collective" in kind or "p2p" in kind:
            return True
    return False


def slowest_rank_text(data):
    """What "slowest rank" means here: the rank with the slowest median step. Where the ranks
    meet at collectives they wait for each other, so it is not the culprit; the diagnoses name
    that. Where they share none, each runs at its own pace."""
    m = data.get("metrics", {})
    if not m.get("slowestRank"):
        return None
    blamed = sorted({r for d in data.get("diagnoses", []) for r in d.get("ranks", [])})
    verdict = ("the diagnoses blame rank%s %s" % ("" if len(blamed) == 1 else "s",
                                                 ",".join(str(r) for r in blamed))
               if blamed else "no rank is diagnosed")
    how = ("ranks wait for each other at collectives" if shares_collectives(data)
           else "the ranks share no collective, each runs at its own pace")
    return "slowest median step: rank %s at %s (%s: %s)" % (
        m["slowestRank"]["rank"], fmt_ns(m["slowestRank"]["medianNs"]), how, verdict)


def split_alerts(data):
    """The stored alerts that are not about a diagnosis in the current window (listed on their
    own), and {id(diagnosis): alert} for those that are (shown on the diagnosis, not twice)."""
    raised = {}
    for a in data.get("alerts", []):
        raised.setdefault((a.get("kind"), a.get("rank")), a)
    on_diagnosis, used = {}, set()
    for d in data.get("diagnoses", []):
        for r in d.get("ranks", []) or [None]:
            if (d.get("kind"), r) in raised:
                on_diagnosis.setdefault(id(d), raised[(d.get("kind"), r)])
                used.add((d.get("kind"), r))
    # A hang incident is shown with its own evidence (data["hangs"]); its alert is not repeated.
    hung = bool(data.get("hangs"))
    rest = [a for a in data.get("alerts", []) if (a.get("kind"), a.get("rank")) not in used
            and not (hung and a.get("kind") == "hang")]
    return rest, on_diagnosis


def format_text(data, top=25):
    out = []
    ranks = data.get("ranks", [])
    connected = sum(1 for r in ranks if r.get("connected"))
    out.append("Flare report: job %s (%d ranks, %d connected)" % (data["jobId"], len(ranks),
                                                                 connected))
    out.append("")
    diags = data.get("diagnoses", [])
    out.append("Diagnoses (%d)" % len(diags) if diags else "Diagnoses: none (no anomaly found)")
    alerts, shown = split_alerts(data)
    for d in diags:
        alert = shown.get(id(d))
        out.append("  [%s] %s%s" % (d.get("team", "?"), d.get("summary", ""),
                                    "  (alert raised: %s)" % alert.get("severity", "")
                                    if alert else ""))
        if d.get("victims"):
            out.append("      victims (slowed by the culprit, not at fault): ranks %s" %
                       ",".join(str(r) for r in d["victims"]))
        for e in d.get("evidence", []):
            out.append("      - %s" % e.get("text", ""))
    for h in data.get("hangs", []):
        out.append("  [hang] %s" % (h.get("text") or h.get("kind") or "incident").splitlines()[0])
    if alerts:
        out.append("")
        out.append("Alerts raised (%d, stored by the daemon)" % len(alerts))
        for a in alerts:
            out.append("  [%s] %s %s: %s" % (a.get("team", "?"), a.get("severity", ""),
                                             a.get("kind", ""),
                                             a.get("message", "").split(" | ")[0]))
    out.append("")
    m = data.get("metrics", {})
    out.append("Metrics")
    measured = daemon_measured(m)
    if "stepTimeMedianNs" in m:
        out.append("  step time        median %s over %d steps x %d ranks%s" % (
                       fmt_ns(m["stepTimeMedianNs"]), m["steps"],
                       len((data.get("series") or {}).get("ranks", [])),
                       "" if measured["rate"] else " (%.2f steps/s)" % m["stepsPerSecond"]))
        out.append("  %-16s %s" % ("", slowest_rank_text(data)))
    for key, name in (("vInter", "V_inter"), ("vMinority", "V_minority")):
        if key + "Median" in m and not measured["void"]:
            worst = m.get(key + "Worst") or {}
            out.append("  %-16s median %s (highest: rank %s at %s)" % (
                name, fmt_pct(m[key + "Median"]), worst.get("rank", "-"),
                fmt_pct(worst.get("median"))))
    if m.get("issueLatencyP50Ns") is not None:
        line = "  issue latency    p50 %s, p99 %s" % (fmt_latency(m["issueLatencyP50Ns"]),
                                                     fmt_latency(m.get("issueLatencyP99Ns")))
        if m.get("baseline"):
            w1 = m["baseline"]["w1Ns"]
            line += "; baseline %s p50 %s, W1 of this job's to it (ranks pooled) %s" % (
                m["baseline"]["jobId"], fmt_latency(m["baseline"]["issueLatencyP50Ns"]),
                fmt_latency(w1) if w1 else NOT_MEASURED)
        out.append(line)
    if data.get("series") is None:
        out.append("  (no per-step series: the daemon has no detector window for this job)")
    out.extend(format_reported(m.get("reported", {}), m))
    out.append("")
    kernels = data.get("kernels", [])
    shown = kernels[:top] if top else kernels
    out.append("Kernels (%s by GPU time)" % ("all %d" % len(kernels) if len(shown) == len(kernels)
                                             else "top %d of %d" % (len(shown), len(kernels))))
    if shown:
        out.append("  %-34s %-10s %-22s %-6s %8s %7s %10s %18s %11s  %s" % (
            "signature", "kind", "shape", "dtype", "count", "share", "p50", "TFLOPS/job busbw",
            "rank busbw", "spread across ranks"))
    for k in shown:
        count = ("~%d" if k.get("estimated") else "%d") % k["count"]
        line = "  %-34s %-10s %-22s %-6s %8s %7s %10s %18s %11s  %s" % (
            k["name"][:34], k["kind"][:10], k["shape"][:22], k["dtype"][:6], count,
            fmt_pct(k["timeShare"]), fmt_ns(k["p50Ns"]), rate_text(k), rank_busbw_text(k),
            spread_text(k))
        extra = ", ".join("%s=%s" % kv for kv in flatten(k["extra"]))
        out.append(line + ("  " + extra if extra else ""))
    if any(k.get("estimated") for k in shown):
        out.append("  (%s)" % SAMPLED)
    if any(k["kind"] == "collective" for k in shown):
        out.append("  (%s;" % JOB_BUSBW)
        out.append("   %s%s)" % (RANK_BUSBW, "; job busbw not measured: " + JOB_BUSBW_UNMEASURED
                                 if any(rate_text(k) == NOT_MEASURED for k in shown) else ""))
    return "\n".join(out) + "\n"
