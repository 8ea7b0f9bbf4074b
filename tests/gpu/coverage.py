#!/usr/bin/env python3
"""Coverage on a real GPU (issue 19, acceptance part e): CUDA graphs and torch.compile's Triton
kernels show up in Flare's records and in the timeline.

Two short raw-mode runs of tests/gpu/bench/gpt_train.py (size tiny), spooled:
  - --cuda-graph: the whole step captured once and replayed; every replay is a `graph` record
    (cudaGraphLaunch) with a GPU duration;
  - --compile: torch.compile's Triton kernels, launched through the driver API (Triton's launcher
    takes cuLaunchKernelEx by dlsym on its own dlopen("libcuda.so.1") handle, which the hook's
    dlsym answers with its wrapper, src/hook/dlsym_interpose.cc), are `kernel` records named by
    their Triton function (triton_*), with durations, every step (the most frequent one at least
    once per step: the compiled forward runs each step); flare-timeline draws them.
Writes OUT/coverage.json and OUT/coverage.md; exits 1 when a check fails.

  python3 tests/gpu/coverage.py --kit KIT --out OUT [--budget-s 60]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(kit, work, name, extra, steps, timeout):
    spool = os.path.join(work, "spool-" + name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(LD_PRELOAD=os.path.join(kit, "lib", "libflare_hook.so"), FLARE_OUTPUT_DIR=spool,
               FLARE_JOB_ID="coverage-" + name, FLARE_MODE="raw")
    out = os.path.join(work, name + ".json")
    cmd = [sys.executable, os.path.join(HERE, "bench", "gpt_train.py"), "--size", "tiny",
           "--warmup", "3", "--steps", str(steps), "--json", out, *extra]
    with open(os.path.join(work, name + ".log"), "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                       check=True)
    exp = subprocess.run([os.path.join(kit, "bin", "flare-export"), "--input", spool],
                         capture_output=True, text=True, check=True, timeout=120)
    recs = [json.loads(x) for x in exp.stdout.splitlines() if x.strip()]
    with open(out) as f:
        loop = json.load(f)
    return spool, recs, loop


def write(out, checks, facts):
    """coverage.json and coverage.md (after each run: a cut-off part keeps the first)."""
    ok = bool(checks) and all(v for v, _ in checks.values())
    with open(os.path.join(out, "coverage.json"), "w") as f:
        json.dump({"ok": ok, "checks": {k: {"ok": v, "detail": d} for k, (v, d) in
                                        checks.items()}, "facts": facts}, f, indent=1)
    lines = ["# Coverage: CUDA graphs and torch.compile", "", "| check | result | detail |",
             "|---|---|---|"] + ["| %s | %s | %s |" % (k, "ok" if v else "FAILED", d)
                                 for k, (v, d) in checks.items()]
    with open(os.path.join(out, "coverage.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=60)
    args = ap.parse_args()
    kit = os.path.abspath(args.kit)
    work = os.path.join(args.out, "coverage")
    os.makedirs(work, exist_ok=True)
    checks, facts = {}, {}
    t0 = time.monotonic()
    try:
        _, recs, loop = run(kit, work, "graph", ["--cuda-graph"], args.steps, args.budget_s)
        graphs = [r for r in recs if r["kind"] == "graph"]
        facts["graph"] = {"loop_steps": loop["total_steps"], "graph_records": len(graphs),
                          "median_ms": sorted(r["duration_ns"] for r in graphs)[len(graphs) // 2]
                          / 1e6 if graphs else None,
                          "kinds": dict(collections.Counter(r["kind"] for r in recs))}
        # Replays: every step after capture (warm-up steps replay too).
        checks["every CUDA-graph replay recorded"] = (
            len(graphs) >= loop["total_steps"] and all(r["duration_ns"] > 0 for r in graphs),
            "%d graph records for %d steps" % (len(graphs), loop["total_steps"]))
    except Exception as e:  # noqa: BLE001
        checks["every CUDA-graph replay recorded"] = (False, "run failed: %s" % str(e)[-500:])
    write(args.out, checks, facts)
    try:
        left = max(20.0, args.budget_s - (time.monotonic() - t0))
        spool, recs, loop = run(kit, work, "compile", ["--compile"], args.steps, left)
        triton = [r for r in recs if r["kind"] == "kernel" and "triton" in r["name"]]
        names = collections.Counter(r["name"] for r in triton)
        facts["compile"] = {"loop_steps": loop["total_steps"], "triton_records": len(triton),
                            "triton_kernels": len(names), "examples": sorted(names)[:5],
                            "kinds": dict(collections.Counter(r["kind"] for r in recs))}
        checks["Triton kernels recorded by name"] = (
            len(names) > 0 and all(r["duration_ns"] > 0 for r in triton),
            "%d records of %d Triton kernels" % (len(triton), len(names)))
        most = max(names.values()) if names else 0
        checks["Triton kernels recorded every step"] = (
            most >= loop["total_steps"] > 0,
            "the most frequent Triton kernel: %d records for %d steps" % (most,
                                                                          loop["total_steps"]))
        trace = os.path.join(work, "compile-timeline.json")
        tl = subprocess.run([os.path.join(kit, "bin", "flare-timeline"), "--input", spool,
                             "-o", trace], capture_output=True, text=True, timeout=120)
        drawn = tl.returncode == 0 and os.path.exists(trace) and "triton" in open(trace).read()
        checks["Triton kernels in the timeline"] = (drawn, tl.stderr[-300:] if not drawn else
                                                    "flare-timeline drew them")
    except Exception as e:  # noqa: BLE001
        checks["Triton kernels recorded by name"] = (False, "run failed: %s" % str(e)[-500:])
    ok, lines = write(args.out, checks, facts)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
