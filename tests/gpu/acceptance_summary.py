#!/usr/bin/env python3
"""Bookkeeping for tests/gpu/acceptance.sh: one JSON per part while it runs, then OUT/summary.md
and OUT/summary.json (each part's status, time and budget, and its own results), and the
archive of everything else.

  acceptance_summary.py part OUT NAME TITLE STATUS RC SECONDS BUDGET REASON
  acceptance_summary.py finish OUT MODE TOTAL_BUDGET
"""

import glob
import json
import os
import sys
import tarfile
import time

# What each part leaves in OUT (its own results), merged into the summary.
RESULTS = {"a": ["gpu-tests.log"], "b": ["e2e.md", "e2e.json"],
           "c": ["accuracy.md", "accuracy.json", "accuracy-end.md", "accuracy-end.json"],
           "d": ["overhead.md", "overhead.json"], "e": ["coverage.md", "coverage.json"]}
KEEP = {"summary.md", "summary.json", "nvidia-smi.txt", "details.tar.gz"}


def part(out, name, title, status, rc, seconds, budget, reason):
    os.makedirs(os.path.join(out, "parts"), exist_ok=True)
    with open(os.path.join(out, "parts", name + ".json"), "w") as f:
        json.dump({"part": name, "title": title, "status": status, "rc": int(rc),
                   "seconds": float(seconds), "budget_s": float(budget),
                   "reason": reason or None}, f)


def pytest_line(out):
    path = os.path.join(out, "gpu-tests.log")
    if not os.path.exists(path):
        return None
    lines = [x.strip() for x in open(path, errors="replace") if x.strip()]
    tail = [x for x in lines if x.startswith("=") and (" passed" in x or " skipped" in x or
                                                      " failed" in x or " error" in x)]
    return tail[-1].strip("= ") if tail else None


def finish(out, mode, total_budget):
    total_budget = float(total_budget)
    parts = []
    for path in glob.glob(os.path.join(out, "parts", "*.json")):
        with open(path) as f:
            parts.append(json.load(f))
    parts.sort(key=lambda p: (p["part"] != "env", p["part"]))
    for p in parts:
        for name in RESULTS.get(p["part"], []):
            full = os.path.join(out, name)
            if name.endswith(".json") and os.path.exists(full):
                try:
                    with open(full) as f:
                        result = json.load(f)
                except ValueError:
                    result = None
                # The part's first JSON is its "result"; a further one (accuracy-end.json)
                # goes under "more_results" by file name.
                if "result" not in p:
                    p["result"] = result
                else:
                    p.setdefault("more_results", {})[name] = result
        if p["part"] == "a":
            p["pytest"] = pytest_line(out)
    env = {}
    env_path = os.path.join(out, "environment.json")
    if os.path.exists(env_path):
        with open(env_path) as f:
            env = json.load(f)
    total = sum(p["seconds"] for p in parts)
    overall = ("passed" if all(p["status"] in ("passed", "skipped") for p in parts)
               else "failed")
    summary = {"mode": mode, "status": overall, "seconds": round(total, 1),
               "budget_s": float(total_budget), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                           time.gmtime()),
               "environment": env, "parts": parts}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    lines = ["# Flare GPU acceptance (%s): %s" % (mode, overall.upper()), "",
             "%s; GPU: %s; driver %s; CUDA %s; PyTorch %s; kit %s" % (
                 summary["date_utc"], env.get("gpu", "none"), env.get("driver", "—"),
                 env.get("cuda", "—"), env.get("torch", "—"), env.get("kit_version", "—")), "",
             "| part | what | status | seconds (budget) | note |", "|---|---|---|---|---|"]
    for p in parts:
        note = p.get("reason") or ""
        if p["part"] == "a" and p.get("pytest"):
            note = (note + "; " if note else "") + "pytest: " + p["pytest"]
        lines.append("| %s | %s | %s | %.0f (%.0f) | %s |" % (
            p["part"], p["title"], p["status"], p["seconds"], p["budget_s"], note))
    lines += ["", "Total %.0f s of a %.0f s budget." % (total, total_budget)]
    for p in parts:
        md = [n for n in RESULTS.get(p["part"], []) if n.endswith(".md")]
        for name in md:
            full = os.path.join(out, name)
            if os.path.exists(full):
                body = [("###" + x[1:]) if x.startswith("# ") else x
                        for x in open(full).read().rstrip().splitlines()]
                lines += ["", "## Part %s: %s" % (p["part"], p["title"]), ""] + body
    lines += ["", "Everything else (logs, reports, per-run files): details.tar.gz."]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # The archive: everything but the handful kept at the top.
    names = sorted(n for n in os.listdir(out) if n not in KEEP)
    with tarfile.open(os.path.join(out, "details.tar.gz"), "w:gz") as tar:
        for n in names:
            tar.add(os.path.join(out, n), arcname=n)
    for n in names:
        full = os.path.join(out, n)
        if os.path.isdir(full) and not os.path.islink(full):
            import shutil
            shutil.rmtree(full, ignore_errors=True)
        else:
            os.remove(full)
    print("\n".join(lines[:len(parts) + 8]))
    return 0 if overall == "passed" else 1


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "part" and len(sys.argv) == 10:
        part(*sys.argv[2:])
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "finish":
        return finish(*sys.argv[2:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
