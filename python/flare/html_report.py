"""A self-contained HTML page of one job's report (`flare report --html FILE`).

render(data) takes what flare.report.collect() + derive() produce and returns one HTML document:
inline CSS, charts drawn here as inline SVG, and a few lines of inline JavaScript (sortable
tables, a rank hovered in one chart highlighted in all). Nothing is loaded from the network, and
the page reads fine with JavaScript off. Stdlib only.

Sections and their ids (tests/python/test_report.py checks them in headless Chromium):
  #diagnoses        one div.diagnosis per diagnosis (data-kind, data-team, data-ranks)
  #alerts           the alerts the daemon raised and stored for the job (when any)
  #step-time        svg: step time per rank and step (path.rank-line per rank, .flagged ones red)
  #heatmap          svg: rank x step heat map of step time (rect.cell per rank and step)
  #flops-sig        svg: TFLOPS per GEMM/attention signature (rect.bar)
  #flops-rank       svg: GEMM/attention TFLOPS per rank (rect.bar per rank)
  #algorithm        the algorithm team's view:
    #latency-w1       ul: every issue-latency W1 (li[data-w1]: baseline, history, diagnosis)
    #latency-table    table: p10/p50/p90/p99 of the job, the baseline job and each rank
                      (tr[data-row=job|baseline|rank], data-rank)
    #latency-cdf      svg: issue-latency CDF of the job, each rank, and the baseline job
    #void-inter-map, #void-minority-map
                      svg: V_inter / V_minority per rank and step (rect.vcell, data-rank,
                      data-step, data-v; grey and "not measured: why" where undefined)
    #void             svg: median V_inter and V_minority per rank
  Issue latencies and W1 read in one unit, the diagnoses' (fmt_latency: ms, 3 decimals).
  #kernels          table: the kernel report (one tbody row per signature)
  #ranks            table: the ranks
The warm-up step (the window's first, which the detectors skip) is left out of the step charts.
Sizes are bounded: at most MAX_LINES rank lines, MAX_COLUMNS heat-map columns (steps averaged in
bins beyond that), MAX_TABLE_ROWS kernel rows.
"""
import html
import math

from .report import JOB_BUSBW, JOB_BUSBW_UNMEASURED, NOT_MEASURED, RANK_BUSBW, SAMPLED, \
    daemon_measured, flagged_ranks, flatten, fmt_latency, fmt_ns, fmt_pct, rank_busbw_text, \
    quantile_at, rate_text, reported_rows, slowest_rank_text, split_alerts, spread_text, \
    steady_columns, _num

MAX_LINES = 64
MAX_COLUMNS = 160
MAX_TABLE_ROWS = 500
FLAG = "#e03131"
TEAM_COLOURS = {"operations": "#d9480f", "algorithm": "#1971c2", "infrastructure": "#7048e8"}
# Viridis, sampled: low = dark purple, high = yellow.
VIRIDIS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#212529;
  background:#f8f9fa}
header{background:#212529;color:#f8f9fa;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;color:#ced4da}
main{padding:8px 24px 40px;max-width:1280px}
section{background:#fff;border:1px solid #dee2e6;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:0 0 8px} .note{color:#6c757d;font-size:12px;margin:4px 0}
.diagnosis{border-left:5px solid #868e96;padding:6px 10px;margin:8px 0;background:#f1f3f5}
.diagnosis .team{font-weight:600;text-transform:uppercase;font-size:11px;letter-spacing:.05em}
.diagnosis ul{margin:4px 0 0 18px;padding:0} .ok{color:#2b8a3e;font-weight:600}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{border-bottom:1px solid #e9ecef;padding:3px 5px;text-align:left;white-space:nowrap}
td.wrap{white-space:normal;overflow-wrap:anywhere;min-width:9em} th,td.soft{white-space:normal}
th{background:#f1f3f5;cursor:pointer;position:sticky;top:0} td.n{text-align:right}
tr.flagged td{background:#fff5f5} .scroll{max-height:520px;overflow:auto}
.metrics{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:8px}
.metric{background:#f1f3f5;border-radius:4px;padding:6px 10px}
.metric b{display:block;font-size:18px;overflow-wrap:anywhere}
.metric span{color:#495057;font-size:12px} .metric b.unmeasured{color:#868e96;font-size:15px}
#summary{border-left:6px solid #2b8a3e} #summary.anomalous{border-left-color:#e03131}
#summary .verdict{font-size:17px;font-weight:600;margin:0 0 4px}
#summary dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0 0}
#summary dt{color:#6c757d} #summary dd{margin:0}
.badge{display:inline-block;margin-left:6px;padding:0 6px;border-radius:3px;font-size:11px;
background:#e9ecef;color:#495057}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:16px}
svg{display:block;max-width:100%;height:auto} svg text{font-size:11px;fill:#495057}
svg .axis{stroke:#adb5bd;stroke-width:1} svg .grid{stroke:#f1f3f5;stroke-width:1}
svg .rank-line{fill:none;stroke:#adb5bd;stroke-width:1.2;opacity:.8}
svg .rank-line.flagged{stroke:#e03131;stroke-width:2.4;opacity:1}
svg .median-line{fill:none;stroke:#212529;stroke-width:2}
svg .baseline-line{fill:none;stroke:#2b8a3e;stroke-width:2.4;stroke-dasharray:6 4}
svg .hl{stroke:#f08c00!important;stroke-width:3!important;opacity:1!important}
svg rect.hl{stroke:#f08c00;stroke-width:2}
h3{font-size:14px;margin:12px 0 4px} #latency-w1{margin:4px 0 8px 18px;padding:0}
#latency-w1 b.unmeasured,td.unmeasured{color:#868e96}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:4px}
"""

JS = """
(function(){
  function num(t){var v=parseFloat(t.replace(/[^0-9.eE+-]/g,''));return isNaN(v)?null:v;}
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th,i){
      th.addEventListener('click',function(){
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        var asc=th.dataset.dir!=='asc';th.dataset.dir=asc?'asc':'desc';
        rows.sort(function(a,b){
          var x=a.cells[i].dataset.v||a.cells[i].textContent,
              y=b.cells[i].dataset.v||b.cells[i].textContent,nx=num(x),ny=num(y);
          var c=(nx!==null&&ny!==null)?nx-ny:x.localeCompare(y);return asc?c:-c;});
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
  var marked=[];
  document.querySelectorAll('[data-rank]').forEach(function(el){
    el.addEventListener('mouseenter',function(){
      marked=document.querySelectorAll('svg [data-rank="'+el.dataset.rank+'"]');
      marked.forEach(function(m){m.classList.add('hl');});
    });
    el.addEventListener('mouseleave',function(){
      marked.forEach(function(m){m.classList.remove('hl');});marked=[];
    });
  });
  document.body.dataset.interactive='1';
})();
"""


def esc(value):
    return html.escape(str(value), quote=True)


def _finite(v):
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def nice_max(v):
    """A round axis maximum at or above v."""
    if not _finite(v) or v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def viridis(t):
    t = min(1.0, max(0.0, t))
    pos = t * (len(VIRIDIS) - 1)
    i = min(int(pos), len(VIRIDIS) - 2)
    f = pos - i
    c = [round(a + (b - a) * f) for a, b in zip(VIRIDIS[i], VIRIDIS[i + 1])]
    return "#%02x%02x%02x" % tuple(c)


class Plot:
    """An SVG chart area with linear axes; x/y map data to pixels."""

    def __init__(self, svg_id, title, width=600, height=280, left=58, right=16, top=12,
                 bottom=40):
        self.id, self.title = svg_id, title
        self.w, self.h = width, height
        self.l, self.r, self.t, self.b = left, right, top, bottom
        self.parts = []
        self.x0 = self.x1 = self.y0 = self.y1 = 0.0

    def scale(self, x0, x1, y0, y1):
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)

    def x(self, v):
        return self.l + (v - self.x0) / (self.x1 - self.x0) * (self.w - self.l - self.r)

    def y(self, v):
        return self.h - self.b - (v - self.y0) / (self.y1 - self.y0) * (self.h - self.t - self.b)

    def axes(self, xlabel, ylabel, xticks, yticks, xfmt=str, yfmt=str):
        p = self.parts
        for v in yticks:
            y = self.y(v)
            p.append('<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/>' % (
                self.l, self.w - self.r, y, y))
            p.append('<text x="%.1f" y="%.1f" text-anchor="end">%s</text>' % (
                self.l - 4, y + 4, esc(yfmt(v))))
        for v in xticks:
            p.append('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>' % (
                self.x(v), self.h - self.b + 14, esc(xfmt(v))))
        p.append('<line class="axis" x1="%d" x2="%d" y1="%d" y2="%d"/>' % (
            self.l, self.w - self.r, self.h - self.b, self.h - self.b))
        p.append('<line class="axis" x1="%d" x2="%d" y1="%d" y2="%d"/>' % (
            self.l, self.l, self.t, self.h - self.b))
        p.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (
            (self.l + self.w - self.r) / 2, self.h - 6, esc(xlabel)))
        p.append('<text transform="translate(12,%.1f) rotate(-90)" text-anchor="middle">%s</text>'
                 % ((self.t + self.h - self.b) / 2, esc(ylabel)))

    def clip(self):
        return ('<clipPath id="%s-clip"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>'
                % (self.id, self.l, self.t, self.w - self.l - self.r, self.h - self.t - self.b))

    def path(self, points, cls, rank=None, title=None):
        pts = [(x, y) for x, y in points if _finite(x) and _finite(y)]
        if not pts:
            return
        d = "M" + " L".join("%.1f,%.1f" % (self.x(x), self.y(y)) for x, y in pts)
        attrs = ' data-rank="%s"' % rank if rank is not None else ""
        self.parts.append('<path class="%s"%s clip-path="url(#%s-clip)" d="%s">%s</path>' % (
            cls, attrs, self.id, d, "<title>%s</title>" % esc(title) if title else ""))

    def svg(self):
        return ('<svg id="%s" viewBox="0 0 %d %d" width="%d" height="%d" role="img" '
                'aria-label="%s">%s%s</svg>' % (self.id, self.w, self.h, self.w, self.h,
                                                 esc(self.title), self.clip(),
                                                 "".join(self.parts)))


def ticks(lo, hi, n=5):
    if not (_finite(lo) and _finite(hi)) or hi <= lo:
        return [lo] if _finite(lo) else []
    step = nice_max((hi - lo) / n)
    first = math.ceil(lo / step) * step
    out, v = [], first
    while v <= hi + 1e-9 * step and len(out) < 12:
        out.append(round(v, 10))
        v += step
    return out


def robust_range(values):
    """(low, high) of sorted `values` inside Tukey's far fences (Q1 − 3·IQR, Q3 + 3·IQR), so a few
    start-up spikes do not flatten every other step; the caller says what was clipped."""
    n = len(values)
    q1, q2, q3 = (values[int(round(f * (n - 1)))] for f in (0.25, 0.5, 0.75))
    iqr = max(q3 - q1, 0.01 * abs(q2))
    return max(values[0], q1 - 3 * iqr), min(values[-1], q3 + 3 * iqr)


def ms(v):
    return "%g" % round(v / 1e6, 3)


def section(sid, title, body, note=""):
    return '<section id="%s-section"><h2>%s</h2>%s%s</section>' % (
        sid, esc(title), '<p class="note">%s</p>' % esc(note) if note else "", body)


def empty(sid, text):
    return '<p class="note" id="%s">%s</p>' % (sid, esc(text))


# ---- sections -------------------------------------------------------------------------------

def diagnoses_html(data):
    diags = data.get("diagnoses", [])
    parts = ['<div id="diagnoses">']
    if not diags:
        parts.append('<p class="ok">No anomaly found in this job\'s window.</p>')
    others, on_diagnosis = split_alerts(data)
    for d in diags:
        team = d.get("team", "")
        alert = on_diagnosis.get(id(d))
        ranks = ",".join(str(r) for r in d.get("ranks", []))
        badge = ('<span class="badge alert-badge">alert raised: %s</span>'
                 % esc(alert.get("severity", "")) if alert else "")
        parts.append('<div class="diagnosis" data-kind="%s" data-team="%s" data-ranks="%s" '
                     'style="border-left-color:%s"><span class="team">%s · %s · %s</span>%s'
                     '<div>%s</div><ul>%s</ul></div>' % (
                         esc(d.get("kind", "")), esc(team), esc(ranks),
                         TEAM_COLOURS.get(team, "#868e96"), esc(team), esc(d.get("kind", "")),
                         esc(d.get("cause", "")), badge, esc(d.get("summary", "")),
                         "".join("<li>%s</li>" % esc(e.get("text", ""))
                                 for e in d.get("evidence", []))))
    for h in data.get("hangs", []):
        parts.append('<div class="diagnosis" data-kind="hang" data-team="operations" '
                     'data-ranks="%s" style="border-left-color:%s"><span class="team">hang'
                     '</span><pre>%s</pre></div>' % (
                         esc(",".join(str(s.get("rank")) for s in h.get("suspects", []))),
                         TEAM_COLOURS["operations"], esc(h.get("text", ""))))
    parts.append("</div>")
    if others:
        parts.append('<h2>Other alerts raised (stored by the daemon; their diagnosis is not in '
                     'the current window)</h2><ul id="alerts">%s</ul>' % "".join(
                         "<li><b>[%s]</b> %s %s: %s</li>" % (
                             esc(a.get("team", "")), esc(a.get("severity", "")),
                             esc(a.get("kind", "")),
                             esc(a.get("message", "").replace(" | ", " — "))) for a in others))
    return "".join(parts)


def summary_html(data):
    """The operator's summary: the verdict, the culprit (ranks, hosts), the team it goes to and
    the first line of evidence of each finding; the sections below have the rest."""
    diags = data.get("diagnoses", [])
    hangs = data.get("hangs", [])
    hosts = {r.get("rank"): r.get("host", "") for r in data.get("ranks", [])}
    findings = []
    for h in hangs:
        suspects = h.get("suspects", [])
        findings.append(("operations", "hang", [s.get("rank") for s in suspects],
                         (h.get("text") or "").splitlines()[0] if h.get("text") else
                         h.get("kind", "hang")))
    for d in diags:
        ev = d.get("evidence", [])
        findings.append((d.get("team", ""), d.get("kind", ""), d.get("ranks", []),
                         d.get("summary", "") + (" — " + ev[0].get("text", "") if ev else "")))
    if not findings:
        verdict = "Healthy: no anomaly found in this job's window."
        if data.get("series") is None:
            verdict = ("No verdict: the daemon has no detector window for this job (its "
                       "alerts, if any, are below).")
        return ('<section id="summary-section"><div id="summary"><p class="verdict">%s</p>'
                '</div></section>' % esc(verdict))
    culprits = sorted({r for _t, _k, ranks, _e in findings for r in ranks if r is not None})
    teams = sorted({t for t, _k, _r, _e in findings if t})
    verdict = "%d finding%s: %s" % (len(findings), "" if len(findings) == 1 else "s",
                                    ", ".join(k.replace("_", " ") for _t, k, _r, _e in findings))
    where = ", ".join("rank %s%s" % (r, " (%s)" % hosts[r] if hosts.get(r) else "")
                      for r in culprits) or "the whole job (no single rank)"
    rows = "".join("<dt>%s</dt><dd>%s</dd>" % (esc(t or "?"), esc(e))
                   for t, _k, _r, e in findings)
    return ('<section id="summary-section"><div id="summary" class="anomalous" data-ranks="%s" '
            'data-teams="%s"><p class="verdict">%s</p><dl><dt>culprit</dt><dd>%s</dd>'
            '<dt>routed to</dt><dd>%s</dd>%s</dl></div></section>' % (
                esc(",".join(str(r) for r in culprits)), esc(",".join(teams)), esc(verdict),
                esc(where), esc(", ".join(teams) or "-"), rows))


def metrics_html(data):
    m = data.get("metrics", {})
    cards = []

    def card(value, what, name=""):
        cards.append('<div class="metric" data-name="%s"><b%s>%s</b><span>%s</span></div>' % (
            esc(name), ' class="unmeasured"' if str(value).startswith(NOT_MEASURED) else "", esc(value),
            esc(what)))
    measured = daemon_measured(m)
    if "stepTimeMedianNs" in m:
        card(fmt_ns(m["stepTimeMedianNs"]), "median step time over %d steps%s" % (
            m["steps"], "" if measured["rate"] else " (%.2f steps/s)" % m["stepsPerSecond"]),
            "step time")
        card("rank %s" % m["slowestRank"]["rank"], slowest_rank_text(data), "slowest step")
    for key, name in (("vInter", "V_inter"), ("vMinority", "V_minority")):
        if key + "Median" in m and not measured["void"]:
            worst = m.get(key + "Worst") or {}
            card(fmt_pct(m[key + "Median"]), "median %s (highest: rank %s, %s)" % (
                name, worst.get("rank", "-"), fmt_pct(worst.get("median"))))
    if m.get("issueLatencyP50Ns") is not None:
        card(fmt_latency(m["issueLatencyP50Ns"]), "median issue latency (p99 %s)"
             % fmt_latency(m.get("issueLatencyP99Ns")), "issue latency")
    if m.get("baseline"):
        w1 = m["baseline"].get("w1Ns")
        card(fmt_latency(w1) if w1 else NOT_MEASURED, "issue-latency W1 of this job's (ranks "
             "pooled) to baseline %s; a diagnosis's W1 compares one rank with the others%s" % (
            m["baseline"]["jobId"], "" if w1 else ": the daemon computed no W1 for this pair "
            "(the baseline's distribution is drawn below)"), "baseline W1")
    rows, _unknown = reported_rows(m.get("reported", {}), m)
    for name, value, detail in rows:
        if name:
            card(value, "%s%s" % (name, ": " + detail if detail else ""), name)
        elif cards:  # a continuation row (per-rank TFLOPS) belongs to the card before
            cards[-1] = cards[-1].replace("</span></div>", " · %s</span></div>" % esc(value))
    if not cards:
        return '<p class="note">No metrics: the daemon has no series for this job.</p>'
    return '<div class="metrics" id="metrics">%s</div>' % "".join(cards)


def step_time_svg(series, flagged):
    cols = steady_columns(series)
    ranks = series.get("ranks", [])
    rows = series.get("stepTimeNs", [])
    first = int(series.get("steps", {}).get("first", 0))
    values = [row[i] for row in rows for i in cols if i < len(row) and _finite(row[i])]
    if not values:
        return empty("step-time", "No step boundaries in this job's window (no DataLoader "
                     "spans or step markers).")
    p = Plot("step-time", "step time per rank and step")
    values.sort()
    lo, hi = robust_range(values)
    pad = (hi - lo) * 0.1 or hi * 0.05
    y0, y1 = max(0.0, lo - pad), hi + pad
    above = sum(1 for v in values if v > y1)
    p.scale(first + cols[0], first + cols[-1], y0, y1)
    every = max(1, math.ceil(len(cols) / 10))
    p.axes("step (index in the daemon's window)", "step time (ms)",
           [first + i for i in cols[::every]], ticks(y0, y1), xfmt=lambda v: "%d" % v, yfmt=ms)
    drawn = 0
    for rank, row in zip(ranks, rows):
        is_flagged = rank in flagged
        if not is_flagged and drawn >= MAX_LINES:
            continue
        drawn += 0 if is_flagged else 1
        pts = [(first + i, row[i]) for i in cols if i < len(row)]
        p.path(pts, "rank-line flagged" if is_flagged else "rank-line", rank=rank,
               title="rank %s" % rank)
    # Flagged ranks on top, and the median over ranks per step.
    p.parts.sort(key=lambda s: "flagged" in s)
    med = []
    for i in cols:
        col = sorted(row[i] for row in rows if i < len(row) and _finite(row[i]))
        if col:
            n = len(col)
            med.append((first + i, col[n // 2] if n % 2 else (col[n // 2 - 1] + col[n // 2]) / 2))
    p.path(med, "median-line", title="median over ranks")
    legend = ('<div class="legend"><span><i style="background:#212529"></i>median over ranks'
              '</span><span><i style="background:%s"></i>diagnosed rank(s) %s</span><span><i '
              'style="background:#adb5bd"></i>other ranks</span></div>'
              % (FLAG, esc(", ".join(str(r) for r in sorted(flagged))) or "none"))
    if above:
        legend += ('<p class="note">%d rank-steps above %s ms are cut off (up to %s ms); the heat '
                   'map shows them.</p>' % (above, ms(y1), ms(values[-1])))
    return p.svg() + legend


def heatmap_svg(series, flagged):
    return matrix_svg("heatmap", "step time heat map", series, "stepTimeNs", flagged, fmt_ns,
                      "cell", "step time")


def matrix_svg(svg_id, title, series, key, flagged, fmt, cell_cls, what, fixed=None,
               unmeasured=None):
    """A rank x step heat map of the series matrix `key` (rect.`cell_cls` per rank and column,
    data-rank, data-step: the first step of the column, data-v: the value). Colour range: the
    values inside Tukey's far fences, or `fixed` (lo, hi). A missing value is grey, its title
    "not measured" and the reason `unmeasured(rank, column index)` gives."""
    cols = steady_columns(series)
    ranks = series.get("ranks", [])
    rows = series.get(key, []) or []
    first = int(series.get("steps", {}).get("first", 0))
    if not cols or not ranks:
        return empty(svg_id, "No %s to draw." % what)
    # Columns: steps, averaged in bins when there are more than MAX_COLUMNS.
    per = max(1, math.ceil(len(cols) / MAX_COLUMNS))
    bins = [cols[i:i + per] for i in range(0, len(cols), per)]
    grid = []
    for row in rows:
        line = []
        for b in bins:
            vals = [row[i] for i in b if i < len(row) and _finite(row[i])]
            line.append(sum(vals) / len(vals) if vals else None)
        grid.append(line)
    values = sorted(v for line in grid for v in line if v is not None)
    if not values:
        return empty(svg_id, "No %s to draw." % what)
    lo, hi = fixed if fixed else robust_range(values)
    clipped = values[-1] > hi or values[0] < lo
    left, top = 64, 22
    cw = max(3.0, min(28.0, 760.0 / len(bins)))
    ch = max(2.0, min(20.0, 520.0 / len(ranks)))
    width = int(left + cw * len(bins) + 110)
    height = int(top + ch * len(ranks) + 34)
    parts = []
    label_every = max(1, int(math.ceil(12 / ch)))
    for ri, (rank, line) in enumerate(zip(ranks, grid)):
        y = top + ri * ch
        if ri % label_every == 0 or rank in flagged:
            parts.append('<text x="%d" y="%.1f" text-anchor="end"%s>rank %s</text>' % (
                left - 6, y + ch / 2 + 4, ' fill="%s" font-weight="bold"' % FLAG
                if rank in flagged else "", esc(rank)))
        for ci, v in enumerate(line):
            b = bins[ci]
            step_text = ("step %d" % (first + b[0]) if len(b) == 1 else
                         "steps %d-%d" % (first + b[0], first + b[-1]))
            colour = "#e9ecef" if v is None else viridis((v - lo) / (hi - lo) if hi > lo else .5)
            shown = fmt(v) if v is not None else NOT_MEASURED + (
                ": " + unmeasured(ri, b[0]) if unmeasured else "")
            parts.append('<rect class="%s" data-rank="%s" data-step="%d"%s x="%.1f" y="%.1f" '
                         'width="%.1f" height="%.1f" fill="%s"><title>rank %s, %s: %s%s</title>'
                         '</rect>' % (cell_cls, rank, first + b[0], ' data-v="%.6g"' % v
                                      if v is not None else "", left + ci * cw, y, cw, ch,
                                      colour, rank, step_text, what + " " if cell_cls != "cell"
                                      else "", esc(shown)))
        if rank in flagged:
            parts.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" '
                         'stroke="%s" stroke-width="2"/>' % (left, y, cw * len(bins), ch, FLAG))
    for ci in range(0, len(bins), max(1, len(bins) // 10)):
        parts.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (
            left + (ci + .5) * cw, top - 6, first + bins[ci][0]))
    # Colour legend.
    lx = left + cw * len(bins) + 16
    lh = ch * len(ranks)
    for i in range(20):
        parts.append('<rect x="%.1f" y="%.1f" width="14" height="%.2f" fill="%s"/>' % (
            lx, top + lh * (1 - (i + 1) / 20), lh / 20 + .5, viridis((i + .5) / 20)))
    parts.append('<text x="%.1f" y="%.1f">%s%s</text>' % (lx + 18, top + 8, "≥ " if clipped
                                                          else "", esc(fmt(hi))))
    parts.append('<text x="%.1f" y="%.1f">%s%s</text>' % (lx + 18, top + lh, "≤ " if clipped
                                                          else "", esc(fmt(lo))))
    parts.append('<text x="%d" y="%d">step →</text>' % (left, height - 8))
    return ('<svg id="%s" viewBox="0 0 %d %d" width="%d" height="%d" role="img" '
            'aria-label="%s">%s</svg>' % (svg_id, width, height, width, height, esc(title),
                                          "".join(parts)))


def latency_svg(series, flagged):
    lat = series.get("issueLatency") or {}
    probs = lat.get("probabilities") or []
    job = (lat.get("job") or {}).get("ns") or []
    if not probs or len(job) != len(probs):
        return empty("latency-cdf", "No issue latencies after the warm-up in this window.")
    base = lat.get("baseline") if isinstance(lat.get("baseline"), dict) else None
    per_rank = lat.get("perRank") or []
    curves = [job] + ([base["ns"]] if base and len(base.get("ns") or []) == len(probs) else [])
    curves += [r["ns"] for r in per_rank if len(r.get("ns") or []) == len(probs)]
    # x range: up to the largest 99th percentile, so one outlier does not squash the curves.
    i99 = min(range(len(probs)), key=lambda i: abs(probs[i] - 0.99))
    hi = max(c[i99] for c in curves if _finite(c[i99]))
    lo = min(min(0.0, c[0]) for c in curves if _finite(c[0]))
    p = Plot("latency-cdf", "issue-latency CDF")
    x1 = nice_max(hi * 1.05) if hi > 0 else 1.0
    p.scale(lo, x1, 0, 1)
    p.axes("issue latency (ms): GPU start − host launch", "fraction of kernels",
           ticks(lo, x1, 6), [0, .25, .5, .75, 1], xfmt=ms, yfmt=lambda v: "%g" % v)
    drawn = 0
    for r in per_rank:
        qs = r.get("ns") or []
        if len(qs) != len(probs):
            continue
        is_flagged = r.get("rank") in flagged
        if not is_flagged and drawn >= MAX_LINES:
            continue
        drawn += 0 if is_flagged else 1
        p.path(list(zip(qs, probs)), "rank-line flagged" if is_flagged else "rank-line",
               rank=r.get("rank"), title="rank %s (%s kernels)" % (r.get("rank"),
                                                                   r.get("samples")))
    p.parts.sort(key=lambda s: "flagged" in s)
    p.path(list(zip(job, probs)), "median-line", title="job: every rank")
    legend = ['<span><i style="background:#212529"></i>job (all ranks)</span>']
    if base and len(base.get("ns") or []) == len(probs):
        p.path(list(zip(base["ns"], probs)), "baseline-line",
               title="baseline job %s" % base.get("jobId", ""))
        legend.append('<span><i style="background:#2b8a3e"></i>healthy baseline %s (W1 %s)'
                      '</span>' % (esc(base.get("jobId", "")), esc(fmt_latency(base.get("w1Ns")))))
    else:
        legend.append('<span>no baseline job (flare report --baseline JOB)</span>')
    legend.append('<span><i style="background:%s"></i>diagnosed rank(s)</span>' % FLAG)
    return p.svg() + '<div class="legend">%s</div>' % "".join(legend)


LATENCY_POINTS = ((0.1, "p10"), (0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


def latency_table_html(data, series, flagged):
    """The issue-latency distributions as numbers: the job (ranks pooled), the baseline job and
    each rank at p10/p50/p90/p99, in the unit of the diagnoses (fmt_latency: ms, 3 decimals)."""
    lat = series.get("issueLatency") or {}
    probs = lat.get("probabilities") or []
    job = lat.get("job") or {}
    if quantile_at(probs, job.get("ns") or [], 0.5) is None:
        return empty("latency-table", "Issue latency %s: no GPU kernel issued after the warm-up "
                     "step in the daemon's window." % NOT_MEASURED)
    base = lat.get("baseline") if isinstance(lat.get("baseline"), dict) else None
    rows = [("job", "", "job (all ranks pooled)", job)]
    if base:
        rows.append(("baseline", "", "baseline job %s" % base.get("jobId", ""), base))
    for r in sorted(lat.get("perRank") or [], key=lambda r: r.get("rank", 0)):
        rows.append(("rank", r.get("rank"), "rank %s%s" % (
            r.get("rank"), " (diagnosed)" if r.get("rank") in flagged else ""), r))
    body = []
    for kind, rank, name, q in rows:
        qs = q.get("ns") or []
        cells = ['<td>%s</td><td class="n">%s</td>' % (esc(name), esc(q.get("samples", "-")))]
        for p, _label in LATENCY_POINTS:
            v = quantile_at(probs, qs, p)
            cells.append('<td class="n"%s>%s</td>' % (' data-v="%g"' % v if v is not None else "",
                                                      esc(fmt_latency(v) if v is not None
                                                          else NOT_MEASURED)))
        body.append('<tr data-row="%s"%s%s>%s</tr>' % (
            kind, ' data-rank="%s"' % rank if kind == "rank" else "",
            ' class="flagged"' if kind == "rank" and rank in flagged else "", "".join(cells)))
    if not base:
        body.append('<tr data-row="baseline"><td>baseline job</td><td class="n unmeasured" '
                    'colspan="5">%s: no baseline job given (flare report --baseline '
                    'HEALTHY_JOB)</td></tr>' % NOT_MEASURED)
    return ('<div class="scroll"><table id="latency-table" class="sortable"><thead><tr>'
            '<th>distribution</th><th>kernels</th>%s</tr></thead><tbody>%s</tbody></table></div>'
            % ("".join("<th>%s</th>" % lbl for _p, lbl in LATENCY_POINTS), "".join(body)))


def latency_w1_html(data, series):
    """Every issue-latency W1 the daemon computed for the job, each with what it compares, in
    the diagnoses' unit; "not measured" and why for the ones it did not."""
    items = []
    lat = series.get("issueLatency") or {}
    base = lat.get("baseline") if isinstance(lat.get("baseline"), dict) else None

    def item(what, value, detail, kind):
        unmeasured = value.startswith(NOT_MEASURED)
        items.append('<li data-w1="%s"><b%s>%s</b> %s</li>' % (
            kind, ' class="unmeasured"' if unmeasured else "", esc(value), esc(what + detail)))
    if base and _finite(base.get("w1Ns")) and base.get("w1Ns"):
        item("this job (ranks pooled) to baseline job %s" % base.get("jobId", ""),
             "W1 " + fmt_latency(base["w1Ns"]), "", "baseline")
    else:
        item("this job to a baseline job", NOT_MEASURED, ": %s" % (
            "the daemon computed no W1 for this pair" if base else
            "no baseline job given (flare report --baseline HEALTHY_JOB)"), "baseline")
    jm = ((data.get("report") or {}).get("metrics")) or {}
    if jm.get("hasBaseline"):
        item("this job to the healthy history of its backend and scale (%s run%s)" % (
            jm.get("baselineRuns", "?"), "" if jm.get("baselineRuns") == 1 else "s"),
            "W1 " + fmt_latency(_num(jm.get("issueLatencyW1Ns"))),
            ", alarm threshold %s" % fmt_latency(_num(jm.get("issueLatencyW1ThresholdNs"))),
            "history")
    else:
        item("this job to healthy history", NOT_MEASURED, ": %s" % (
            "no healthy baseline of this backend and scale yet (flare baseline add --job "
            "HEALTHY_JOB)" if jm else "the detectors have not run on this job"), "history")
    found = False
    for d in data.get("diagnoses", []):
        for e in d.get("evidence", []):
            if e.get("metric") != "issue_latency_w1":
                continue
            found = True
            who = ("rank %s" % ",".join(str(r) for r in d.get("ranks", []))
                   if d.get("ranks") else "the job")
            item("%s, from the %s diagnosis: %s" % (who, d.get("kind", ""), e.get("text", "")),
                 "W1 " + fmt_latency(_num(e.get("value"))), "", "diagnosis")
    if not found:
        items.append('<li data-w1="ranks">Per rank, W1 to the other ranks: no rank crossed the '
                     'detectors\' fence (no issue-latency diagnosis in this window).</li>')
    return '<ul id="latency-w1">%s</ul>' % "".join(items)


def void_maps_html(series, flagged):
    """V_inter and V_minority per rank and step, as two heat maps on one 0..max scale."""
    ranks = series.get("ranks", [])
    vi, vm = series.get("vInter") or [], series.get("vMinority") or []
    values = [v for rows in (vi, vm) for row in rows for v in row if _finite(v)]
    if not values:
        return (empty("void-inter-map", "V_inter %s: no step boundaries in the window (a "
                      "DataLoader or flare.step() marks them)." % NOT_MEASURED) +
                empty("void-minority-map", "V_minority %s: no step boundaries in the window."
                      % NOT_MEASURED))
    hi = max(max(values), 0.01)

    def why_inter(ri, i):
        return "no step statistics for this step (no kernel ran in it)"

    def why_minority(ri, i):
        row = vi[ri] if ri < len(vi) else []
        if i < len(row) and _finite(row[i]):
            return "the GPU was idle around the DataLoader call for the whole step"
        return why_inter(ri, i)
    return ('<div class="grid2"><div><h3>V_inter per rank and step</h3>%s</div>'
            '<div><h3>V_minority per rank and step</h3>%s</div></div>' % (
                matrix_svg("void-inter-map", "V_inter per rank and step", series, "vInter",
                           flagged, fmt_pct, "vcell", "V_inter", (0.0, hi), why_inter),
                matrix_svg("void-minority-map", "V_minority per rank and step", series,
                           "vMinority", flagged, fmt_pct, "vcell", "V_minority", (0.0, hi),
                           why_minority))) if ranks else ""


def algorithm_html(data, series, flagged, thresholds):
    """The algorithm team's view: how kernels were issued (issue latency: job, ranks, baseline,
    and every W1) and where the GPU idled (void per rank and step)."""
    return ('<div id="algorithm">'
            '<h3>Issue latency</h3><p class="note">Kernel start on the GPU minus its launch on '
            'the host, after the warm-up. Healthy jobs queue kernels ahead of the GPU (a broad '
            'distribution); a stalled host (GC, needless synchronization) collapses it toward '
            'zero. W1: the 1-Wasserstein distance between two distributions, in the unit of the '
            'diagnoses.</p>%s<div class="grid2"><div>%s</div><div>%s</div></div>'
            '<h3>Void</h3><p class="note">V_inter: GPU idle from the last kernel before the '
            'DataLoader call to the first after it, over the step. V_minority: GPU time in '
            'kernels outside GEMM/attention/communication, over the rest of the step. Grey '
            'cells: not measured (hover for the reason).</p>%s%s</div>' % (
                latency_w1_html(data, series), latency_table_html(data, series, flagged),
                latency_svg(series, flagged), void_maps_html(series, flagged),
                void_svg(series, flagged, thresholds)))


def compute_signatures(series):
    return [s for s in series.get("signatures", []) or [] if (s.get("tflops") or 0) > 0]


def sig_label(s):
    shape = s.get("shape") or []
    return "%s [%s]" % (s.get("name", ""), ",".join(str(d) for d in shape))


def flops_sig_svg(series):
    sigs = compute_signatures(series)[:16]
    if not sigs:
        return empty("flops-sig", "No GEMM/attention signature with a FLOP count.")
    bar_h, left, width = 20, 300, 700
    height = 24 + bar_h * len(sigs) + 24
    top = max(s["tflops"] for s in sigs)
    x1 = nice_max(top)
    scale = (width - left - 60) / x1
    parts = []
    for i, s in enumerate(sigs):
        y = 20 + i * bar_h
        parts.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (
            left - 6, y + 13, esc(sig_label(s)[:48])))
        parts.append('<rect class="bar" x="%d" y="%d" width="%.1f" height="%d" fill="#1971c2">'
                     '<title>%s: %.1f TFLOPS over %d calls</title></rect>' % (
                         left, y + 2, s["tflops"] * scale, bar_h - 5, esc(sig_label(s)),
                         s["tflops"], s.get("count", 0)))
        parts.append('<text x="%.1f" y="%.1f">%.1f</text>' % (
            left + s["tflops"] * scale + 4, y + 13, s["tflops"]))
    parts.append('<text x="%d" y="12">TFLOPS (job-wide, all ranks)</text>' % left)
    return ('<svg id="flops-sig" viewBox="0 0 %d %d" width="%d" height="%d" role="img" '
            'aria-label="TFLOPS per signature">%s</svg>' % (width, height, width, height,
                                                           "".join(parts)))


def flops_rank_svg(series, flagged):
    """GEMM/attention TFLOPS per rank over every compute signature: Σ flops / Σ time."""
    flops, time = {}, {}
    for s in compute_signatures(series):
        for r in s.get("perRank", []):
            t = r.get("totalNs") or 0
            flops[r["rank"]] = flops.get(r["rank"], 0) + (r.get("tflops") or 0) * t
            time[r["rank"]] = time.get(r["rank"], 0) + t
    ranks = [r for r in series.get("ranks", []) if time.get(r)]
    if not ranks:
        return empty("flops-rank", "No GEMM/attention FLOPs per rank.")
    values = {r: flops[r] / time[r] for r in ranks}
    p = Plot("flops-rank", "TFLOPS per rank", width=max(420, min(1200, 60 + 26 * len(ranks))))
    y1 = nice_max(max(values.values()) * 1.1)
    p.scale(0, len(ranks), 0, y1)
    step = max(1, len(ranks) // 16)
    p.axes("rank", "TFLOPS (GEMM + attention)", [], ticks(0, y1))
    bw = (p.w - p.l - p.r) / len(ranks)
    for i, r in enumerate(ranks):
        colour = FLAG if r in flagged else "#1971c2"
        p.parts.append('<rect class="bar" data-rank="%s" x="%.1f" y="%.1f" width="%.1f" '
                       'height="%.1f" fill="%s"><title>rank %s: %.1f TFLOPS</title></rect>' % (
                           r, p.x(i) + bw * .1, p.y(values[r]), bw * .8,
                           p.y(0) - p.y(values[r]), colour, r, values[r]))
        if i % step == 0 or r in flagged:
            p.parts.append('<text x="%.1f" y="%.1f" text-anchor="middle"%s>%s</text>' % (
                p.x(i) + bw / 2, p.h - p.b + 14, ' fill="%s"' % FLAG if r in flagged else "",
                r))
    return p.svg()


def void_svg(series, flagged, thresholds):
    cols = steady_columns(series)
    ranks = series.get("ranks", [])

    def medians(key):
        out = {}
        for rank, row in zip(ranks, series.get(key, []) or []):
            vals = sorted(row[i] for i in cols if i < len(row) and _finite(row[i]))
            if vals:
                n = len(vals)
                out[rank] = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
        return out
    vi, vm = medians("vInter"), medians("vMinority")
    if not vi and not vm:
        return empty("void", "No void percentages (no step boundaries in the window).")
    p = Plot("void", "void percentages per rank", width=max(420, min(1200, 60 + 30 * len(ranks))))
    top = max(list(vi.values()) + list(vm.values()) + [t for t in thresholds.values() if t])
    y1 = min(1.0, nice_max(top * 1.15)) if top > 0 else 0.1
    p.scale(0, len(ranks), 0, y1)
    p.axes("rank", "share of the step (median over steps)", [], ticks(0, y1),
           yfmt=lambda v: "%g%%" % round(v * 100, 1))
    bw = (p.w - p.l - p.r) / len(ranks)
    step = max(1, len(ranks) // 16)
    for i, r in enumerate(ranks):
        for j, (vals, colour, name) in enumerate(((vi, "#f08c00", "V_inter"),
                                                  (vm, "#7048e8", "V_minority"))):
            v = vals.get(r)
            if v is None:
                continue
            p.parts.append('<rect class="bar %s" data-rank="%s" x="%.1f" y="%.1f" width="%.1f" '
                           'height="%.1f" fill="%s"><title>rank %s %s: %s</title></rect>' % (
                               name.lower(), r, p.x(i) + bw * (.1 + .4 * j), p.y(v), bw * .4,
                               p.y(0) - p.y(v), colour, r, name, fmt_pct(v)))
        if i % step == 0 or r in flagged:
            p.parts.append('<text x="%.1f" y="%.1f" text-anchor="middle"%s>%s</text>' % (
                p.x(i) + bw / 2, p.h - p.b + 14, ' fill="%s"' % FLAG if r in flagged else "",
                r))
    for name, t in thresholds.items():
        if t:
            p.parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c92a2a" '
                           'stroke-dasharray="4 3"><title>%s threshold %s</title></line>' % (
                               p.l, p.w - p.r, p.y(t), p.y(t), name, fmt_pct(t)))
    legend = ('<div class="legend"><span><i style="background:#f08c00"></i>V_inter (GPU idle '
              'around the DataLoader call)</span><span><i style="background:#7048e8"></i>'
              'V_minority (time in kernels outside GEMM/attention/communication)</span></div>')
    return p.svg() + legend


def kernels_html(data):
    kernels = data.get("kernels", [])
    if not kernels:
        return '<p class="note">No kernels reported for this job.</p>'
    extra_keys = []
    for k in kernels:
        for key, _v in flatten(k.get("extra", {})):
            if key not in extra_keys:
                extra_keys.append(key)
    head = ["signature", "kind", "shape", "dtype", "layout", "count", "GPU time", "share",
            "p50", "p99", "TFLOPS / job busbw", "rank busbw", "spread across ranks"] + extra_keys
    tips = {"TFLOPS / job busbw": "GEMM/attention: TFLOPS. Collectives: " + JOB_BUSBW,
            "rank busbw": RANK_BUSBW}
    if any(k.get("estimated") for k in kernels):
        tips["count"] = SAMPLED
    rows = []
    for k in kernels[:MAX_TABLE_ROWS]:
        extra = dict(flatten(k.get("extra", {})))
        cells = [("", k["name"], None), ("", k["kind"] + (" " + k["collective"]
                                                          if k["collective"] else ""), None),
                 ("", k["shape"], None), ("", k["dtype"], None), ("", k["layout"], None),
                 ("n", ("~%d" if k.get("estimated") else "%d") % k["count"], k["count"]),
                 ("n", fmt_ns(k["totalNs"]), k["totalNs"]),
                 ("n", fmt_pct(k["timeShare"]), k["timeShare"]),
                 ("n", fmt_ns(k["p50Ns"]), k["p50Ns"]), ("n", fmt_ns(k["p99Ns"]), k["p99Ns"]),
                 ("n", rate_text(k), k["tflops"] or k["jobBusbwGbps"]),
                 ("n", rank_busbw_text(k), k["busbwGbps"]),
                 ("n", spread_text(k), k["spread"] if k["spread"] is not None else -1)]
        cells += [("", extra.get(key, ""), None) for key in extra_keys]
        rows.append('<tr data-kind="%s">%s</tr>' % (esc(k["kind"]), "".join(
            '<td%s%s%s>%s</td>' % (' class="n%s"' % (" soft" if i in (10, 12) else "") if cls
                                   else ' class="wrap"' if i in (0, 2) else
                                   ' class="soft"' if i == 1 else "",
                                   ' data-v="%s"' % v if v is not None else "",
                                   ' title="job busbw %s: %s"' % (NOT_MEASURED,
                                                                  JOB_BUSBW_UNMEASURED)
                                   if i == 10 and text == NOT_MEASURED else "", esc(text))
            for i, (cls, text, v) in enumerate(cells))))
    note = ""
    if len(kernels) > MAX_TABLE_ROWS:
        note = '<p class="note">First %d of %d signatures.</p>' % (MAX_TABLE_ROWS, len(kernels))
    return ('<div class="scroll"><table id="kernels" class="sortable"><thead><tr>%s</tr></thead>'
            '<tbody>%s</tbody></table></div>%s' % ("".join(
                '<th%s>%s</th>' % (' title="%s"' % esc(tips[h]) if h in tips else "", esc(h))
                for h in head), "".join(rows), note))


def ranks_html(data, flagged):
    ranks = data.get("ranks", [])
    if not ranks:
        return '<p class="note">The daemon lists no ranks for this job.</p>'
    rows = []
    for r in ranks:
        drops = ", ".join("%s=%s" % (k, v) for k, v in sorted((r.get("drops") or {}).items())
                          if str(v) not in ("0", ""))
        rows.append('<tr data-rank="%s"%s><td class="n">%s</td><td>%s</td><td>%s</td><td>%s</td>'
                    '<td class="n">%s</td><td class="n">%s</td><td>%s</td></tr>' % (
                        esc(r.get("rank", 0)), ' class="flagged"' if r.get("rank", 0) in flagged
                        else "", esc(r.get("rank", 0)), esc(r.get("host", "")),
                        esc(r.get("deviceName", "")),
                        "connected" if r.get("connected") else "gone",
                        esc(r.get("records", 0)), esc(r.get("lostBatches", 0)),
                        esc(drops or "none")))
    return ('<div class="scroll"><table id="ranks" class="sortable"><thead><tr><th>rank</th>'
            '<th>host</th><th>device</th><th>state</th><th>records</th><th>lost batches</th>'
            '<th>drops</th></tr></thead><tbody>%s</tbody></table></div>' % "".join(rows))


def by_rank(series):
    """The series with its per-rank rows in rank order (the daemon puts priority ranks first)."""
    if not series:
        return series
    order = sorted(range(len(series.get("ranks", []))), key=lambda i: series["ranks"][i])
    out = dict(series)
    for key in ("ranks", "stepTimeNs", "vInter", "vMinority"):
        rows = series.get(key) or []
        out[key] = [rows[i] for i in order if i < len(rows)]
    return out


def render(data):
    """The whole page for `data` (flare.report.collect + derive)."""
    job = data.get("jobId", "")
    series = by_rank(data.get("series") or {})
    flagged = set(flagged_ranks(data))
    thresholds = {}
    for d in data.get("diagnoses", []):
        for e in d.get("evidence", []):
            if e.get("metric") in ("v_inter", "v_minority") and e.get("reference"):
                thresholds[e["metric"]] = e["reference"]
    steps = series.get("steps") or {}
    trunc = series.get("truncated") or {}
    window_note = ""
    if series:
        cols = steady_columns(series)
        first = int(steps.get("first", 0))
        drawn = ("steps %d-%d drawn" % (first + cols[0], first + cols[-1]) if cols
                 else "no step drawn")
        skipped = ("; step %d, the warm-up, is left out" % first
                   if cols and cols[0] > 0 else "")
        window_note = ("%d of the window's %d ranks; %s of its %d (indexed from 0)%s%s." % (
            len(series.get("ranks", [])), series.get("rankCount", 0), drawn,
            steps.get("total", 0), skipped, " (cut to the last ones)" if trunc.get("steps")
            else ""))
    body = [
        summary_html(data),
        section("diagnoses", "Diagnoses", diagnoses_html(data)),
        section("metrics", "Metrics", metrics_html(data)),
    ]
    if series:
        body.append('<div class="grid2">%s%s</div>' % (
            section("step-time", "Step time", step_time_svg(series, flagged), window_note),
            section("heatmap", "Step time: rank × step", heatmap_svg(series, flagged),
                    "Colour: step time (yellow = slow). Diagnosed ranks are outlined.")))
        body.append('<div class="grid2">%s%s</div>' % (
            section("flops-sig", "TFLOPS per signature", flops_sig_svg(series)),
            section("flops-rank", "TFLOPS per rank", flops_rank_svg(series, flagged),
                    "GEMM and attention FLOPs over their GPU time, each rank.")))
        body.append(section("algorithm", "For the algorithm team: issue latency and void",
                            algorithm_html(data, series, flagged, thresholds), window_note))
    else:
        body.append(section("series", "Series", '<p class="note" id="no-series">The daemon has '
                            'no per-step series for this job (no detector window: flared runs '
                            'with --diagnose-interval-s 0, or the job is older than the '
                            'window).</p>'))
    body.append(section("kernels", "Kernel report", kernels_html(data),
                        "Share: of the job's GPU time. Spread: (slowest − fastest) / median of "
                        "the ranks' median durations. Collectives have two bus bandwidths: the "
                        + JOB_BUSBW + "; the " + RANK_BUSBW + "."))
    body.append(section("ranks", "Ranks", ranks_html(data, flagged)))
    _rows, unknown = reported_rows((data.get("metrics") or {}).get("reported", {}))
    if unknown:
        # Fields a newer daemon sends that this page does not know how to show: kept visible,
        # folded away and outside the panels people read.
        body.append('<details id="unknown-fields"><summary>%d field(s) the daemon sent that this '
                    'version of flare does not display</summary><ul>%s</ul></details>' % (
                        len(unknown), "".join("<li><code>%s</code> %s</li>" % (esc(k), esc(v))
                                              for k, v in unknown)))
    ranks = data.get("ranks", [])
    subtitle = "%d ranks · %d diagnoses · %d kernel signatures" % (
        len(ranks), len(data.get("diagnoses", [])), len(data.get("kernels", [])))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            "<title>Flare report: %s</title><style>%s</style></head><body>"
            "<header><h1>Flare report: job %s</h1><p>%s</p></header><main>%s</main>"
            "<script>%s</script></body></html>\n" % (esc(job), CSS, esc(job), esc(subtitle),
                                                      "".join(body), JS))
