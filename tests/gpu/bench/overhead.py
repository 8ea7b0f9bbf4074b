#!/usr/bin/env python3
"""Flare's GPU overhead benchmark (issue 9): the same training loop without Flare, with Flare in
summary mode, with Flare in raw mode, and with torch.profiler, side by side in one run.

Every repetition runs each arm once, in a shuffled order (seeded), each arm in a fresh process,
so drift of the machine (clocks, thermals, other tenants) hits all arms alike. The overhead of an
arm is the ratio of its median step time to the bare arm's in the same repetition; the report
gives the median ratio over repetitions and its range. Flare arms spool to a temporary directory
(FLARE_OUTPUT_DIR, no daemon), whose size per step is reported as the volume; peak RSS against
the bare arm is the added memory per rank.

Run (GPU machine): python3 tests/gpu/bench/overhead.py --build build --sizes small,medium \
    --reps 5 --json overhead.json
The workload is tests/gpu/bench/gpt_train.py; --workload replaces it (the harness's own test
drives it with a stand-in that needs no GPU).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("bare", "flare-summary", "flare-raw", "torch-profiler")


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def run_arm(args, arm, size, rep, workdir):
    out = os.path.join(workdir, f"{arm}-{size}-{rep}.json")
    spool = os.path.join(workdir, f"spool-{arm}-{size}-{rep}")
    cmd = [sys.executable, args.workload, "--size", size, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--seed", str(rep), "--json", out]
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("FLARE_") and k != "FLARE_BUILD_DIR"]:
        del env[k]
    env.pop("LD_PRELOAD", None)
    if arm.startswith("flare-"):
        env.update(LD_PRELOAD=os.path.join(args.build, "lib", "libflare_hook.so"),
                   FLARE_OUTPUT_DIR=spool, FLARE_JOB_ID=f"bench-{size}-{rep}",
                   FLARE_MODE=arm.split("-", 1)[1])
    if arm == "torch-profiler":
        cmd.append("--profiler")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} {size} rep {rep} failed (rc {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    with open(out) as f:
        result = json.load(f)
    result["arm"] = arm
    result["rep"] = rep
    if arm.startswith("flare-"):
        result["spool_bytes"] = dir_bytes(spool)
        result["spool_bytes_per_step"] = result["spool_bytes"] / (args.steps + args.warmup)
    return result


def summarize(runs):
    """Per size and arm: median step time, overhead ratio vs the bare arm of the same repetition
    (median, min, max), added peak RSS, spool bytes per step."""
    out = {}
    sizes = sorted({r["size"] for r in runs})
    for size in sizes:
        by_rep = {}
        for r in runs:
            if r["size"] == size:
                by_rep.setdefault(r["rep"], {})[r["arm"]] = r
        rows = {}
        for arm in ARMS:
            ratios, medians, rss, spool = [], [], [], []
            for rep, arms in sorted(by_rep.items()):
                if arm not in arms:
                    continue
                medians.append(arms[arm]["median_ms"])
                if "bare" in arms:
                    ratios.append(arms[arm]["median_ms"] / arms["bare"]["median_ms"])
                    rss.append(arms[arm]["max_rss_kib"] - arms["bare"]["max_rss_kib"])
                if "spool_bytes_per_step" in arms[arm]:
                    spool.append(arms[arm]["spool_bytes_per_step"])
            if not medians:
                continue
            row = {"median_step_ms": statistics.median(medians), "reps": len(medians)}
            if ratios:
                row.update(overhead_pct=100 * (statistics.median(ratios) - 1),
                           overhead_pct_min=100 * (min(ratios) - 1),
                           overhead_pct_max=100 * (max(ratios) - 1),
                           added_rss_mib=statistics.median(rss) / 1024)
            if spool:
                row["spool_bytes_per_step"] = statistics.median(spool)
            rows[arm] = row
        out[size] = rows
    return out


def markdown(summary, device):
    lines = [f"GPU: {device}", "",
             "| size | arm | median step (ms) | overhead (median, range) | added RSS (MiB) | "
             "spool bytes/step |", "|---|---|---|---|---|---|"]
    for size, rows in summary.items():
        for arm, row in rows.items():
            ov = ("—" if arm == "bare" or "overhead_pct" not in row else
                  f"{row['overhead_pct']:+.2f}% ({row['overhead_pct_min']:+.2f}…"
                  f"{row['overhead_pct_max']:+.2f})")
            rss = "—" if arm == "bare" or "added_rss_mib" not in row else \
                f"{row['added_rss_mib']:.1f}"
            sp = f"{row['spool_bytes_per_step']:.0f}" if "spool_bytes_per_step" in row else "—"
            lines.append(f"| {size} | {arm} | {row['median_step_ms']:.2f} | {ov} | {rss} | {sp} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FLARE_BUILD_DIR", "build"))
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per process")
    ap.add_argument("--workload", default=os.path.join(HERE, "gpt_train.py"))
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or "bare" not in arms:
        ap.error(f"--arms: choose from {', '.join(ARMS)}, bare included (got {args.arms})")
    hook = os.path.join(args.build, "lib", "libflare_hook.so")
    if any(a.startswith("flare-") for a in arms) and not os.path.exists(hook):
        ap.error(f"{hook} not found (--build)")
    rng = random.Random(args.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="flare-gpu-bench-") as work:
        for rep in range(args.reps):
            for size in args.sizes.split(","):
                order = list(arms)
                rng.shuffle(order)
                for arm in order:
                    r = run_arm(args, arm, size, rep, work)
                    print(f"rep {rep} {size:>6} {arm:<15} {r['median_ms']:8.2f} ms/step",
                          file=sys.stderr, flush=True)
                    runs.append(r)
    summary = summarize(runs)
    device = next((r.get("device") for r in runs if r.get("device")), "unknown")
    print(markdown(summary, device))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "summary": summary, "runs": runs,
                       "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
