"""Gathers gpu-session.sh's interleaved launch_cost runs into one launch-cost.json.

Each arm (bare, or the hook in one setting) ran once per round, in a shuffled order, so that a
drift of the machine over the minute spreads over every arm instead of landing on one. Input: a
directory with ARM.jsonl per arm, one launch_cost output line per round ("null" for a run that
failed). Output (stdout): {"rounds": R, "order": [...], "arms": {ARM: {"runs": [...], "median":
{ROW: ns}, "min": {...}, "max": {...}}}, "hook_minus_bare": {ARM: {ROW: [median, min, max]}}}.
hook_minus_bare pairs each round's arm run with the same round's bare run: the per-call cost the
hook adds to that row, with its spread over the rounds. With --table, a text table of the
medians and differences goes to stderr (the session log).

Usage: launch_cost_rounds.py DIR [--order FILE] [--table] > launch-cost.json
"""
import argparse
import json
import os
import statistics
import sys


def load_runs(path):
    runs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                got = json.loads(line)
            except ValueError:
                got = None
            runs.append(got if isinstance(got, dict) and isinstance(got.get("ns_per_call"), dict)
                        else None)
    return runs


def rows_of(runs):
    rows = []
    for run in runs:
        for row in (run or {}).get("ns_per_call", {}):
            if row not in rows:
                rows.append(row)
    return rows


def spread(values):
    return (statistics.median(values), min(values), max(values)) if values else None


def gather(directory, order=()):
    arms = {}
    names = sorted(f[:-len(".jsonl")] for f in os.listdir(directory) if f.endswith(".jsonl"))
    for arm in names:
        runs = load_runs(os.path.join(directory, arm + ".jsonl"))
        entry = {"runs": runs, "median": {}, "min": {}, "max": {}}
        for row in rows_of(runs):
            s = spread([r["ns_per_call"][row] for r in runs
                        if r and isinstance(r["ns_per_call"].get(row), (int, float))])
            if s:
                entry["median"][row], entry["min"][row], entry["max"][row] = s
        arms[arm] = entry
    diffs = {}
    bare = arms.get("bare", {}).get("runs", [])
    for arm, entry in arms.items():
        if arm == "bare":
            continue
        per_row = {}
        for row in rows_of(entry["runs"]):
            paired = [r["ns_per_call"][row] - b["ns_per_call"][row]
                      for r, b in zip(entry["runs"], bare)
                      if r and b and row in r["ns_per_call"] and row in b["ns_per_call"]]
            s = spread(paired)
            if s:
                per_row[row] = [round(v, 1) for v in s]
        diffs[arm] = per_row
    rounds = max((len(e["runs"]) for e in arms.values()), default=0)
    return {"rounds": rounds, "order": list(order), "arms": arms, "hook_minus_bare": diffs}


def table(doc):
    lines = []
    arms = list(doc["arms"])
    rows = []
    for entry in doc["arms"].values():
        for row in entry["median"]:
            if row not in rows:
                rows.append(row)
    lines.append("launch cost, ns per call, median of %d interleaved rounds "
                 "(hook arms: + median paired difference from bare [min, max]):" % doc["rounds"])
    for row in rows:
        cells = []
        for arm in arms:
            m = doc["arms"][arm]["median"].get(row)
            if m is None:
                continue
            d = doc["hook_minus_bare"].get(arm, {}).get(row)
            cells.append("%s %.0f" % (arm, m) + (" (%+.0f [%+.0f, %+.0f])" % tuple(d) if d else ""))
        lines.append("  %-32s %s" % (row, "; ".join(cells)))
    for arm in arms:  # a run that failed is left out of the figures above: said here
        failed = sum(1 for r in doc["arms"][arm]["runs"] if r is None)
        if failed:
            lines.append("  %s: %d of %d runs failed (null; see the session log)" % (
                arm, failed, len(doc["arms"][arm]["runs"])))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory")
    p.add_argument("--order", help="a file with the arms in the order they ran, one per line")
    p.add_argument("--table", action="store_true", help="a text table on stderr as well")
    args = p.parse_args(argv)
    order = []
    if args.order and os.path.exists(args.order):
        order = [l.strip() for l in open(args.order) if l.strip()]
    doc = gather(args.directory, order)
    json.dump(doc, sys.stdout, indent=1)
    print()
    if args.table:
        print(table(doc), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
