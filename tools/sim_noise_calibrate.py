#!/usr/bin/env python3
"""The dispersion of real traces that the simulator's noise reproduces (issue 21, item 7).

Reads flare-export JSON lines (tests/fixtures/gpu/<fixture>/rank<R>.jsonl.gz, recorded on an H200
with PyTorch; or a sim run's `flare-export --input SPOOL` output) and prints, as JSON:

  kernel_cv        the same kernel in different steps: per (signature, occurrence in the step),
                   the robust coefficient of variation (1.4826 * MAD / median) of its duration
                   over the measured steps; the median over those positions (positions whose
                   median duration is under `--min-us` are left out: timer resolution)
  kernel_iqr_rel   the same positions' interquartile range / median, median over positions
  step_gpu_cv      the per-step common factor: the robust CV over steps of the summed GPU time of
                   the positions above (iid kernel noise averages out in the sum)
  step_cv          the robust CV of step times (DataLoader __next__ to the next one)
  gap_us           launch gaps: host time between consecutive issues on the launching thread
                   inside a step (p50, p90, p99, in us), and gap_cv the robust CV of the gap at
                   the same position over steps (median over positions)
  host_ms_cv       the per-step host time outside the GPU's reach: robust CV over steps of the
                   summed launch gaps of a step
  hiccup_rate      random host hiccups: the share of launch gaps more than 3x (and 50 us above)
                   the same position's median over steps; hiccup_us_median their median excess

Warm-up steps (the first `--warmup`, default: loop.json's, else 3) are left out. Usage:

    python3 tools/sim_noise_calibrate.py tests/fixtures/gpu/healthy-small tests/fixtures/gpu/healthy-medium
    python3 tools/sim_noise_calibrate.py --jsonl run.jsonl          # a sim run, exported
"""

import argparse
import gzip
import json
import os
import statistics
import sys

STEP_SPANS = ("torch.utils.data.dataloader._BaseDataLoaderIter@__next__",
              "sim_train@_LoaderIter.__next__")
OP_KINDS = ("kernel", "gemm", "attention", "memcpy", "memset")


def _robust_cv(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 3:
        return None
    med = statistics.median(xs)
    if med <= 0:
        return None
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.4826 * mad / med


def _quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def _read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def _ranks(records):
    by_rank = {}
    for r in records:
        by_rank.setdefault(r.get("rank", 0), []).append(r)
    return by_rank


def _step_bounds(recs):
    """Step start times: the DataLoader spans' starts, else flare_step sync records."""
    starts = sorted(r["start_ns"] for r in recs if r["kind"] == "span" and r["name"] in STEP_SPANS)
    if len(starts) < 3:
        starts = sorted(r["issue_ns"] for r in recs
                        if r["kind"] == "sync" and r["name"] == "flare_step")
    return starts


def measure_rank(recs, warmup):
    bounds = _step_bounds(recs)
    # Step i runs from bounds[i] to bounds[i+1]; keep the measured ones.
    steps = list(zip(bounds[:-1], bounds[1:]))[warmup:]
    if len(steps) < 3:
        return None
    ops = sorted((r for r in recs if r["kind"] in OP_KINDS and r.get("issue_ns")),
                 key=lambda r: r["issue_ns"])
    per_step = []  # per step: {(sig, occurrence): duration_ns}, gaps by position
    for s0, s1 in steps:
        seen, durs, gaps = {}, {}, {}
        prev_by_thread = {}
        for r in ops:
            if not (s0 <= r["issue_ns"] < s1):
                continue
            sig = (r["kind"], r["name"][:120], tuple(r.get("shape") or ()), r.get("stream"))
            n = seen.get(sig, 0)
            seen[sig] = n + 1
            durs[(sig, n)] = r["duration_ns"]
            th = r.get("thread")
            if th in prev_by_thread:
                gaps[(th, len(gaps))] = r["issue_ns"] - prev_by_thread[th]
            prev_by_thread[th] = r["issue_ns"]
        per_step.append((s1 - s0, durs, gaps))
    positions = set.intersection(*(set(d) for _, d, _ in per_step))
    kernel_cv, iqr_rel, kept = [], [], []
    for p in positions:
        xs = [d[p] for _, d, _ in per_step]
        med = statistics.median(xs)
        if med < args_min_ns:
            continue
        kept.append(p)
        cv = _robust_cv(xs)
        if cv is not None:
            kernel_cv.append(cv)
        iqr_rel.append((_quantile(xs, 0.75) - _quantile(xs, 0.25)) / med)
    gpu_sums = [sum(d[p] for p in kept) for _, d, _ in per_step]
    gap_positions = set.intersection(*(set(g) for _, _, g in per_step))
    gap_cv = [_robust_cv([g[p] for _, _, g in per_step]) for p in gap_positions]
    gap_cv = [c for c in gap_cv if c is not None]
    all_gaps = [v / 1e3 for _, _, g in per_step for v in g.values()]
    host_sums = [sum(g.values()) for _, _, g in per_step]
    # Random host hiccups: a gap far above the same position's median in the other steps.
    hiccups, n_gaps = [], 0
    for p in gap_positions:
        xs = [g[p] for _, _, g in per_step]
        med = statistics.median(xs)
        for x in xs:
            n_gaps += 1
            if x > 3 * med and x - med > 50_000:
                hiccups.append((x - med) / 1e3)
    return {
        "steps": len(per_step),
        "positions": len(kept),
        "kernel_cv": statistics.median(kernel_cv) if kernel_cv else None,
        "kernel_iqr_rel": statistics.median(iqr_rel) if iqr_rel else None,
        "step_gpu_cv": _robust_cv(gpu_sums),
        "step_cv": _robust_cv([t for t, _, _ in per_step]),
        "step_ms_median": statistics.median(t for t, _, _ in per_step) / 1e6,
        "gap_us": {"p50": _quantile(all_gaps, 0.5), "p90": _quantile(all_gaps, 0.9),
                   "p99": _quantile(all_gaps, 0.99)},
        "gap_cv": statistics.median(gap_cv) if gap_cv else None,
        "host_ms_cv": _robust_cv(host_sums),
        "hiccup_rate": len(hiccups) / n_gaps if n_gaps else None,
        "hiccup_us_median": statistics.median(hiccups) if hiccups else None,
    }


args_min_ns = 50000


def _round(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def main():
    global args_min_ns
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("fixtures", nargs="*", help="fixture folders (rank<R>.jsonl[.gz], loop.json)")
    p.add_argument("--jsonl", action="append", default=[], help="a JSON-lines file (any ranks)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-us", type=float, default=50.0)
    a = p.parse_args()
    args_min_ns = a.min_us * 1000
    out = {}
    sources = []
    for d in a.fixtures:
        files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("rank"))
        warm = a.warmup
        if warm is None:
            try:
                with open(os.path.join(d, "loop.json")) as f:
                    warm = min(int(r["warmup"]) for r in json.load(f)["ranks"].values())
            except (OSError, ValueError, KeyError):
                warm = 3
        sources.append((os.path.basename(os.path.normpath(d)), files, warm))
    for path in a.jsonl:
        sources.append((os.path.basename(path), [path], 3 if a.warmup is None else a.warmup))
    for name, files, warm in sources:
        records = [r for f in files for r in _read(f)]
        for rank, recs in sorted(_ranks(records).items()):
            m = measure_rank(recs, warm)
            if m:
                out[f"{name}/rank{rank}"] = _round(m)
    keys = ("kernel_cv", "kernel_iqr_rel", "step_gpu_cv", "step_cv", "gap_cv", "host_ms_cv",
            "hiccup_rate", "hiccup_us_median")
    vals = {k: [m[k] for m in out.values() if m.get(k) is not None] for k in keys}
    out["median_over_ranks"] = _round({k: statistics.median(v) for k, v in vals.items() if v})
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
