#!/usr/bin/env python3
"""Flare's evaluation harness: `make bench` (issue 9).

Runs the measurements that can run on this machine and writes one JSON file of results
(default build/bench/results.json) plus a readable summary on stdout. docs/benchmarks.md quotes
these numbers with the command, the machine and the date.

Sections (select with --only; all by default):
  overhead   step time of the 8-rank sim job with and without LD_PRELOAD=libflare_hook.so,
             interleaved (A B A B ...) so that drift of a shared machine hits both arms alike;
             reported as the ratio of medians with the spread of per-pair ratios.
  hotpath    the Google Benchmarks of the tracer hot path and of intercepted calls on the sim
             (traced vs FLARE_DISABLE=1), and, when valgrind is installed, instructions per
             intercepted launch from callgrind (stable on noisy machines).
  volume     bytes per rank per step written by a traced rank in raw mode (the spool), and the
             added RSS per rank (peak RSS with vs without the hook).

The GPU half (tests/gpu/bench) runs on a GPU machine only. Sections for the daemon's scale and
the diagnosis matrix are added as those parts land.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(cmd, env=None, timeout=900):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": time.strftime("%Y-%m-%d")}


def sim_job(build, env, ranks, steps, extra=()):
    """Runs the sim job once; returns per-rank median step times (ms) and peak RSS (KiB)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = ["/usr/bin/time", "-f", "%M", os.path.join(build, "bin", "flare-sim-train"),
               "--ranks", str(ranks), "--steps", str(steps), "--quiet", "--json", out, *extra]
        res = sh(cmd, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"sim job failed: {res.stderr[-2000:]}")
        with open(out) as f:
            data = json.load(f)
        # Skip the first step of every rank (warm-up: first sightings, pool growth).
        medians = [statistics.median(r["step_ms"][1:]) for r in data["ranks"]]
        # GNU time's %M for the launcher: the largest peak RSS among the ranks it waited for.
        rss = int(res.stderr.strip().splitlines()[-1])
        return statistics.median(medians), rss


def overhead(build, args):
    hook = os.path.join(build, "lib", "libflare_hook.so")
    spool = tempfile.mkdtemp(prefix="flare-bench-")
    base_env = {"FLARE_OUTPUT_DIR": spool}
    traced_env = dict(base_env, LD_PRELOAD=hook)
    pairs = []
    try:
        for i in range(args.reps):
            order = [("off", base_env), ("on", traced_env)]
            if i % 2:
                order.reverse()  # A B, B A, ...: neither arm always runs first
            got = {}
            for name, env in order:
                got[name] = sim_job(build, env, args.ranks, args.steps)[0]
            pairs.append(got)
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    ratios = [p["on"] / p["off"] for p in pairs]
    return {
        "ranks": args.ranks, "steps": args.steps, "repetitions": args.reps,
        "median_step_ms_without": statistics.median(p["off"] for p in pairs),
        "median_step_ms_with": statistics.median(p["on"] for p in pairs),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "pairs": pairs,
    }


def run_gbench(binary, env=None, filt=None):
    cmd = [binary, "--benchmark_format=json"]
    if filt:
        cmd.append(f"--benchmark_filter={filt}")
    res = sh(cmd, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{binary} failed: {res.stderr[-2000:]}")
    data = json.loads(res.stdout)
    return {b["name"]: {"cpu_ns": b["cpu_time"], "real_ns": b["real_time"]}
            for b in data["benchmarks"]}


def callgrind_instructions(build, env):
    """Instructions per kernel launch, counted by callgrind in `hook_probe launches N` for two
    values of N (the difference cancels start-up and exit): on the launching thread, and in all
    threads together (the sim's stream threads and Flare's poller included)."""
    if not shutil.which("valgrind"):
        return None
    probe = os.path.join(build, "bin", "hook_probe")
    counts = {}
    for n in (2000, 4000):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cg.out")
            cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes",
                   f"--callgrind-out-file={out}", probe, "launches", str(n)]
            res = sh(cmd, env=env, timeout=1800)
            if res.returncode != 0:
                raise RuntimeError(f"callgrind failed: {res.stderr[-1500:]}")
            per_thread = {}
            for name in os.listdir(tmp):
                with open(os.path.join(tmp, name)) as f:
                    for line in f:
                        if line.startswith(("totals:", "summary:")):
                            per_thread[name] = int(line.split()[1])
                            break
            main = [v for k, v in per_thread.items() if k.endswith("-01")]
            counts[n] = {"launching_thread": main[0] if main else 0,
                         "all_threads": sum(per_thread.values())}
    return {k: (counts[4000][k] - counts[2000][k]) / 2000 for k in counts[2000]}


def hotpath(build, args):
    out = {}
    tracer = os.path.join(build, "bin", "tracer_benchmark")
    hook = os.path.join(build, "bin", "hook_benchmark")
    spool = tempfile.mkdtemp(prefix="flare-bench-")
    try:
        if os.path.exists(tracer):
            out["tracer"] = run_gbench(tracer)
        if os.path.exists(hook):
            out["hook_untraced"] = run_gbench(hook, env={"FLARE_DISABLE": "1"})
            out["hook_traced"] = run_gbench(hook, env={"FLARE_OUTPUT_DIR": spool})
            if args.callgrind:
                lib = os.path.join(build, "lib", "libflare_hook.so")
                off = callgrind_instructions(build, {"LD_PRELOAD": lib, "FLARE_DISABLE": "1"})
                on = callgrind_instructions(build, {"LD_PRELOAD": lib, "FLARE_OUTPUT_DIR": spool})
                if off is not None and on is not None:
                    out["callgrind_instructions_per_launch"] = {
                        "untraced": off, "traced": on,
                        "added": {k: on[k] - off[k] for k in on}}
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    return out


def volume(build, args):
    hook = os.path.join(build, "lib", "libflare_hook.so")
    spool = tempfile.mkdtemp(prefix="flare-bench-")
    try:
        steps = args.steps
        _, rss_without = sim_job(build, {}, args.ranks, steps)
        _, rss_with = sim_job(build, {"LD_PRELOAD": hook, "FLARE_OUTPUT_DIR": spool,
                                      "FLARE_JOB_ID": "vol"}, args.ranks, steps)
        sizes = []
        for dirpath, _, files in os.walk(spool):
            for f in files:
                sizes.append(os.path.getsize(os.path.join(dirpath, f)))
        return {"mode": "raw records to the local spool", "ranks": args.ranks, "steps": steps,
                "bytes_per_rank_per_step": sum(sizes) / max(1, args.ranks) / steps,
                "peak_rss_kib_without": rss_without, "peak_rss_kib_with": rss_with,
                "added_rss_kib": rss_with - rss_without}
    finally:
        shutil.rmtree(spool, ignore_errors=True)


# The scenario matrix on the sim: (name, env, expected kind, expected culprit ranks).
SCENARIOS = [
    ("healthy", {}, None, None),
    ("gpu-20%", {"FLARE_SIM_CLOCK_FACTOR": "3:0.8"}, "gpu_slow", [3]),
    ("gpu-10%", {"FLARE_SIM_CLOCK_FACTOR": "2:0.9"}, "gpu_slow", [2]),
    ("link-50%", {"FLARE_SIM_LINK_FACTOR": "5:0.5"}, "link_slow", [5]),
    ("link-25%", {"FLARE_SIM_LINK_FACTOR": "1:0.75"}, "link_slow", [1]),
    ("stall-5ms", {"FLARE_SIM_HOST_STALL": "6:5"}, "issue_stall", [6]),
    ("stall-2ms", {"FLARE_SIM_HOST_STALL": "4:2"}, "issue_stall", [4]),
    ("unaligned-ffn", {"@args": ["--ffn", "16380"]}, "unoptimized_gemm", []),
    ("minority-kernels", {"@args": ["--extra-kernels", "120"]}, "void_minority", list(range(8))),
]


def diagnosis(build, args):
    """Detection rate, false alarms and culprit accuracy of flare-diagnose over repeated runs of
    each scenario (different shapes per repetition stand in for seeds)."""
    hook = os.path.join(build, "lib", "libflare_hook.so")
    shapes = [(4096, 4), (8192, 2), (2048, 6), (4096, 3), (6144, 2)]
    out = {}
    for name, env, kind, ranks in SCENARIOS:
        detected = culprit_right = false_alarms = 0
        alarm_kinds = {}
        for rep in range(args.diag_reps):
            hidden, layers = shapes[rep % len(shapes)]
            spool = tempfile.mkdtemp(prefix="flare-diag-")
            try:
                extra = env.get("@args", [])
                full = {k: v for k, v in env.items() if not k.startswith("@")}
                full.update(LD_PRELOAD=hook, FLARE_OUTPUT_DIR=spool, FLARE_JOB_ID=name)
                res = sh([os.path.join(build, "bin", "flare-sim-train"), "--ranks", "8", "--steps",
                          "6", "--layers", str(layers), "--hidden", str(hidden), "--tp", "2",
                          "--quiet", *extra], env=full)
                if res.returncode != 0:
                    raise RuntimeError(f"{name}: sim job failed: {res.stderr[-1000:]}")
                d = sh([os.path.join(build, "bin", "flare-diagnose"), "--input", spool, "--json"])
                found = json.loads(d.stdout)["diagnoses"]
            finally:
                shutil.rmtree(spool, ignore_errors=True)
            hits = [x for x in found if x["kind"] == kind]
            for x in found:
                if x["kind"] != kind:
                    false_alarms += 1
                    alarm_kinds[x["kind"]] = alarm_kinds.get(x["kind"], 0) + 1
            if hits:
                detected += 1
                culprit_right += int(hits[0]["ranks"] == ranks)
        out[name] = {"runs": args.diag_reps, "detected": detected if kind else None,
                     "culprit_right": culprit_right if kind else None,
                     "false_alarms": false_alarms, "false_alarm_kinds": alarm_kinds}
    return out


SECTIONS = {"overhead": overhead, "hotpath": hotpath, "volume": volume, "diagnosis": diagnosis}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default=os.environ.get("FLARE_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--only", action="append", choices=sorted(SECTIONS))
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=6, help="interleaved pairs for the overhead")
    p.add_argument("--no-callgrind", dest="callgrind", action="store_false")
    p.add_argument("--diag-reps", type=int, default=10, help="runs per diagnosis scenario")
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args()
    build = os.path.abspath(args.build)
    if not os.path.exists(os.path.join(build, "bin", "flare-sim-train")):
        sys.exit(f"bench: {build}/bin/flare-sim-train not found; run `make build` first")
    results = {"machine": machine()}
    for name in args.only or list(SECTIONS):
        t0 = time.time()
        print(f"bench: {name} ...", flush=True)
        try:
            results[name] = SECTIONS[name](build, args)
        except Exception as e:  # one failing section does not lose the others
            results[name] = {"error": str(e)}
        results[name]["seconds"] = round(time.time() - t0, 1)
        print(json.dumps({name: results[name]}, indent=1, default=str)[:4000], flush=True)
    out = args.output or os.path.join(build, "bench", "results.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"bench: results in {out}")
    return 1 if any(isinstance(v, dict) and "error" in v for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
