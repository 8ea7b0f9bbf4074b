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

  daemon     flared's scale in steady state: tools/bench/daemon_load.sh (flared on core 0, the
             load generator on core 1) for each --daemon-ranks, the detectors' 2-minute window
             filled first (--daemon-warmup-s): batches accepted per second, daemon CPU per batch
             and share of its core, RSS per rank, latency of the per-job report and of
             /diagnoses. ~3-4 minutes per size.

  diagnosis  the scenario matrix on the sim stack (healthy runs and every fault, several
             severities, 8 and 16 ranks in several TP x DP layouts, sparse faults; repeated
             over five shapes and one FLARE_SIM_SEED per repetition): detection rate, false
             alarms, detection delay in steps, culprit rank and routed team; flare-diagnose on
             each run's spool; a markdown table of the result.

The GPU half (tests/gpu/bench) runs on a GPU machine only.
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


# The scenario matrix on the sim (issue 6's scenarios, issue 9 item 4, issue 21 item 8). Each
# entry: name; env (FLARE_SIM_* faults); args (extra flare-sim-train arguments); kind, ranks, team
# (the expected diagnosis; kind None = healthy: any alert is a false alarm); onset (the step the
# fault starts, for the detection delay); baseline (diagnose against healthy runs of the same
# shape: the regression detector and learned void thresholds); python (the Python workload, 4
# ranks: the traced DataLoader that V_inter needs); world and tp (the layout: WORLD ranks as
# TP x DP, default 8 ranks with TP 2); truth (a function of the run's records that says whether
# the fault, as injected, meets the definition the detector implements; None = always);
# steps (default DIAG_STEPS); extended (issue 21's classes: more severities, 16 ranks, other
# TP x DP layouts, sparse faults; skipped with --diag-classic).
#
# Every repetition runs with its own FLARE_SIM_SEED (--diag-seed + rep), so that the simulator's
# noise (src/sim/noise.h: kernel, step, rank and host jitter calibrated on real H200 traces)
# differs between runs as it does between real runs; the five shapes cycle over the repetitions.
DIAG_SHAPES = [(4096, 4), (8192, 2), (2048, 6), (4096, 3), (6144, 2)]
DIAG_STEPS = 16
ALL = list(range(8))
SCENARIOS = [
    dict(name="healthy"),
    dict(name="healthy-python", python=True),
    dict(name="healthy-vs-baseline", baseline=True),
    dict(name="gpu-20%", env={"FLARE_SIM_CLOCK_FACTOR": "3:0.8"}, kind="gpu_slow", ranks=[3],
         team="operations"),
    dict(name="gpu-10%", env={"FLARE_SIM_CLOCK_FACTOR": "2:0.9"}, kind="gpu_slow", ranks=[2],
         team="operations"),
    dict(name="fail-slow-gpu-20%-from-step-8", env={"FLARE_SIM_CLOCK_FACTOR": "3:0.8:8"},
         kind="gpu_slow", ranks=[3], team="operations", onset=8),
    dict(name="link-50%", env={"FLARE_SIM_LINK_FACTOR": "5:0.5"}, kind="link_slow", ranks=[5],
         team="operations"),
    dict(name="link-25%", env={"FLARE_SIM_LINK_FACTOR": "1:0.75"}, kind="link_slow", ranks=[1],
         team="operations"),
    dict(name="stall-5ms", env={"FLARE_SIM_HOST_STALL": "6:5"}, kind="issue_stall", ranks=[6],
         team="algorithm"),
    dict(name="stall-2ms", env={"FLARE_SIM_HOST_STALL": "4:2"}, kind="issue_stall", ranks=[4],
         team="algorithm"),
    # A bare cudaStreamSynchronize at the start of every layer's forward (FLARE_SIM_INJECT_SYNC_US
    # = 0): the GPU drains and idles while the host refills it. What it cost is measured from the
    # records (added GPU idle per step, as a share of the baseline step: about 2% at the median
    # on this machine) and reported with the result.
    dict(name="sync-per-layer (2% regression)", env={"FLARE_SIM_INJECT_SYNC_US": "0"},
         kind="issue_latency_regression", ranks=[], team="algorithm", baseline=True),
    dict(name="slow-dataloader-25ms", python=True, args=["--data-ms", "25"], kind="void_inter",
         ranks=[0, 1, 2, 3], team="algorithm"),
    dict(name="unaligned-ffn", args=["--ffn", "16380"], kind="unoptimized_gemm", ranks=[],
         team="infrastructure"),
    dict(name="minority-kernels-120 (fixed 60% threshold)", args=["--extra-kernels", "120"],
         kind="void_minority", ranks=ALL, team="algorithm", truth="v_minority"),
    dict(name="minority-kernels-120 (threshold learned from baseline)",
         args=["--extra-kernels", "120"], kind="void_minority", ranks=ALL, team="algorithm",
         baseline=True),
    # --- issue 21, item 8: the extended classes ---
    # Severities beyond the classic ones.
    dict(name="gpu-5%", env={"FLARE_SIM_CLOCK_FACTOR": "5:0.95"}, kind="gpu_slow", ranks=[5],
         team="operations", extended=True),
    dict(name="gpu-30%", env={"FLARE_SIM_CLOCK_FACTOR": "1:0.7"}, kind="gpu_slow", ranks=[1],
         team="operations", extended=True),
    dict(name="link-10%", env={"FLARE_SIM_LINK_FACTOR": "6:0.9"}, kind="link_slow", ranks=[6],
         team="operations", extended=True),
    dict(name="stall-10ms", env={"FLARE_SIM_HOST_STALL": "2:10"}, kind="issue_stall", ranks=[2],
         team="algorithm", extended=True),
    # Other layouts: 8 ranks as TP 4 x DP 2 and as pure DP; 16 ranks as TP 2 x DP 8 and
    # TP 4 x DP 4.
    dict(name="healthy-8-tp4", tp=4, extended=True),
    dict(name="healthy-8-dp8", tp=1, extended=True),
    dict(name="healthy-16", world=16, extended=True),
    dict(name="healthy-16-tp4", world=16, tp=4, extended=True),
    dict(name="gpu-20%-8-tp4", tp=4, env={"FLARE_SIM_CLOCK_FACTOR": "6:0.8"}, kind="gpu_slow",
         ranks=[6], team="operations", extended=True),
    dict(name="link-50%-8-dp8", tp=1, env={"FLARE_SIM_LINK_FACTOR": "2:0.5"}, kind="link_slow",
         ranks=[2], team="operations", extended=True),
    # The same against healthy runs of the layout: the one communicator is compared with them,
    # and all its ranks are named (the data cannot tell whose link), so the expected culprits are
    # all eight.
    dict(name="healthy-8-dp8-vs-baseline", tp=1, baseline=True, extended=True),
    dict(name="link-50%-8-dp8-vs-baseline", tp=1, env={"FLARE_SIM_LINK_FACTOR": "2:0.5"},
         kind="link_slow", ranks=ALL, team="operations", baseline=True, extended=True),
    dict(name="gpu-20%-16", world=16, env={"FLARE_SIM_CLOCK_FACTOR": "11:0.8"}, kind="gpu_slow",
         ranks=[11], team="operations", extended=True),
    dict(name="gpu-10%-16-tp4", world=16, tp=4, env={"FLARE_SIM_CLOCK_FACTOR": "9:0.9"},
         kind="gpu_slow", ranks=[9], team="operations", extended=True),
    dict(name="link-50%-16-tp4", world=16, tp=4, env={"FLARE_SIM_LINK_FACTOR": "13:0.5"},
         kind="link_slow", ranks=[13], team="operations", extended=True),
    dict(name="stall-5ms-16", world=16, env={"FLARE_SIM_HOST_STALL": "14:5"},
         kind="issue_stall", ranks=[14], team="algorithm", extended=True),
    # Sparse faults (issue 21, item 1): one rank's host pauses for a long time every Nth step
    # only (a periodic GC, a checkpoint stall), over 40 steps so that there are several (the
    # slow_steps detector needs at least 3 slow steps); the issue's own case is every 10th.
    dict(name="sparse-stall-30ms-every-5th", env={"FLARE_SIM_HOST_STALL": "3:30:5"}, steps=40,
         kind="issue_stall", ranks=[3], team="algorithm", extended=True),
    dict(name="sparse-stall-40ms-every-10th", env={"FLARE_SIM_HOST_STALL": "5:40:10"}, steps=40,
         kind="issue_stall", ranks=[5], team="algorithm", extended=True),
    dict(name="sparse-stall-60ms-every-8th-16", world=16, env={"FLARE_SIM_HOST_STALL": "10:60:8"},
         steps=40, kind="issue_stall", ranks=[10], team="algorithm", extended=True),
    # A burst: one rank's host pauses in five consecutive steps only (FLARE_SIM_HOST_STALL's
    # step range); and healthy runs as long, where the slow_steps detector sees the most steps.
    dict(name="burst-stall-30ms-steps-20-24", env={"FLARE_SIM_HOST_STALL": "1:30:1:20-24"},
         steps=40, kind="issue_stall", ranks=[1], team="algorithm", extended=True),
    dict(name="healthy-40-steps", steps=40, extended=True),
]
DIAG_BASELINES = 3  # healthy runs per shape for the baseline scenarios


def _union(intervals):
    total, cur_s, cur_e = 0, None, None
    for a, b in sorted(intervals):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def _records_by_rank(build, spool):
    res = sh([os.path.join(build, "bin", "flare-export"), "--input", spool])
    by_rank = {}
    for line in res.stdout.splitlines():
        r = json.loads(line)
        by_rank.setdefault(r["rank"], []).append(r)
    return by_rank


def gpu_idle_ms(build, spool):
    """GPU idle time per step (step time minus the union of the rank's GPU ops), median over the
    steps (the first skipped) and then over the ranks, in ms: what a needless synchronize costs,
    measured from the records rather than from step times (which swing by ±10% with the load of
    a shared machine)."""
    per_rank = []
    for recs in _records_by_rank(build, spool).values():
        steps = sorted(r["start_ns"] for r in recs if r["kind"] == "sync" and r["name"] == "flare_step")
        ops = [(r["start_ns"], r["end_ns"]) for r in recs if r["kind"] not in ("sync", "span", "summary")]
        vals = [(s1 - s0 - _union([(max(a, s0), min(b, s1)) for a, b in ops if b > s0 and a < s1])) / 1e6
                for s0, s1 in zip(steps[1:], steps[2:])]
        if vals:
            per_rank.append(statistics.median(vals))
    return statistics.median(per_rank) if per_rank else 0.0


def true_v_minority(build, spool):
    """V_minority as docs/metrics.md defines it, recomputed here from the exported records (not by
    the detector): per rank and step (the first skipped), the union of `kernel` ops over the step
    (no DataLoader gap in the C++ workload); the median over steps, per rank."""
    per_rank = {}
    for rank, recs in _records_by_rank(build, spool).items():
        steps = sorted(r["start_ns"] for r in recs if r["kind"] == "sync" and r["name"] == "flare_step")
        kernels = [(r["start_ns"], r["end_ns"]) for r in recs if r["kind"] == "kernel"]
        vals = []
        for s0, s1 in zip(steps[1:], steps[2:]):
            vals.append(_union([(max(a, s0), min(b, s1)) for a, b in kernels if b > s0 and a < s1])
                        / (s1 - s0))
        if vals:
            per_rank[rank] = statistics.median(vals)
    return per_rank


def _sim_run(build, scenario, shape, spool, json_out, seed=1):
    hook = os.path.join(build, "lib", "libflare_hook.so")
    hidden, layers = shape
    env = dict(scenario.get("env", {}), LD_PRELOAD=hook, FLARE_OUTPUT_DIR=spool,
               FLARE_JOB_ID="job", FLARE_SIM_SEED=str(seed))
    cmd = [os.path.join(build, "bin", "flare-sim-train"),
           "--steps", str(scenario.get("steps", DIAG_STEPS)),
           "--layers", str(layers), "--hidden", str(hidden), "--tp", str(scenario.get("tp", 2)),
           "--quiet", "--json", json_out]
    if scenario.get("python"):
        env["TRACED_PYTHON_API"] = "sim_train@_LoaderIter.__next__,sim_train@injected_sync"
        cmd += ["--python", "--ranks", "4"]
    else:
        cmd += ["--ranks", str(scenario.get("world", 8))]
    cmd += scenario.get("args", [])
    res = sh(cmd, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{scenario['name']}: sim job failed: {res.stderr[-1000:]}")
    with open(json_out) as f:
        data = json.load(f)
    return statistics.median(statistics.median(r["step_ms"][1:]) for r in data["ranks"])


def _layout(scenario):
    """(ranks, TP) of a scenario's sim job (_sim_run); baseline scenarios run without --python."""
    assert not (scenario.get("baseline") and scenario.get("python")), scenario["name"]
    return scenario.get("world", 8), scenario.get("tp", 2)


def _diagnose(build, spool, baselines, until=None):
    cmd = [os.path.join(build, "bin", "flare-diagnose"), "--input", spool, "--json"]
    for b in baselines:
        cmd += ["--baseline", b]
    if until is not None:
        cmd += ["--until-step", str(until)]
    d = sh(cmd)
    if d.returncode not in (0, 3):
        raise RuntimeError(f"flare-diagnose failed: {d.stderr[-500:]}")
    return json.loads(d.stdout)["diagnoses"]


def _detection_delay(build, spool, baselines, kind, onset, steps=DIAG_STEPS):
    """Steps of data after the onset the detectors needed: the smallest N such that the first N
    steps (flare-diagnose --until-step N) give the expected diagnosis, minus the onset step
    (binary search; detection is taken as monotone in N)."""
    lo, hi = onset + 2, steps  # fewer than two steps past the onset cannot show it
    if not any(x["kind"] == kind for x in _diagnose(build, spool, baselines, hi)):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if any(x["kind"] == kind for x in _diagnose(build, spool, baselines, mid)):
            hi = mid
        else:
            lo = mid + 1
    return hi - onset


def diagnosis(build, args):
    """Detection rate, false alarms, detection delay and culprit/team accuracy of flare-diagnose
    over repeated runs of each scenario (five shapes cycled over the repetitions stand in for
    seeds: each shape changes every kernel's duration and the job's timing)."""
    work = tempfile.mkdtemp(prefix="flare-diag-")
    out = {"steps": DIAG_STEPS, "shapes": DIAG_SHAPES, "scenarios": {}}
    only = set(args.diag_scenario or [])
    scenarios = [sc for sc in SCENARIOS if (not only or sc["name"] in only)
                 and (only or args.diag_extended or not sc.get("extended"))]
    out["seeds"] = [args.diag_seed + rep
                    for rep in range(max(args.diag_reps, args.diag_healthy_reps or 0))]
    try:
        # Healthy baselines per shape and layout (only those the repetitions use).
        baselines, base_step_ms, base_idle_ms = {}, {}, {}
        shapes_used = [DIAG_SHAPES[i % len(DIAG_SHAPES)]
                       for i in range(max(args.diag_reps, args.diag_healthy_reps or 0))]
        layouts = sorted({_layout(sc) for sc in scenarios if sc.get("baseline")})
        for world, tp in layouts:
            for shape in sorted(set(shapes_used)):
                key = (shape, (world, tp))
                baselines[key], times = [], []
                for i in range(DIAG_BASELINES):
                    spool = os.path.join(work, f"base-{shape[0]}-{shape[1]}-{world}-{tp}-{i}")
                    # Baselines draw their own seeds, apart from the runs they judge.
                    times.append(_sim_run(build, {"name": "baseline", "world": world, "tp": tp},
                                          shape, spool, spool + ".json",
                                          seed=args.diag_seed + 100000 + i))
                    baselines[key].append(spool)
                base_step_ms[key] = statistics.median(times)
                base_idle_ms[key] = statistics.median(gpu_idle_ms(build, b)
                                                      for b in baselines[key])
        for sc in scenarios:
            kind, team = sc.get("kind"), sc.get("team")
            onset = sc.get("onset", 0)
            row = {"runs": 0, "expected": 0, "detected": 0, "culprit_right": 0, "team_right": 0,
                   "runs_with_false_alarm": 0, "false_alarm_kinds": {}, "delays": [],
                   "expected_silent": 0, "silent_right": 0, "truth": [], "step_change": [],
                   "added_gpu_idle_share": []}
            t0 = time.time()
            reps = args.diag_reps
            if kind is None and args.diag_healthy_reps:
                reps = args.diag_healthy_reps
            for rep in range(reps):
                want_ranks = sc.get("ranks")
                shape = DIAG_SHAPES[rep % len(DIAG_SHAPES)]
                seed = args.diag_seed + rep
                spool = os.path.join(work, f"run-{rep}")
                shutil.rmtree(spool, ignore_errors=True)
                step_ms = _sim_run(build, sc, shape, spool, spool + ".json", seed)
                key = (shape, _layout(sc))
                bases = baselines.get(key, []) if sc.get("baseline") else []
                if sc.get("baseline"):
                    row["step_change"].append(round(step_ms / base_step_ms[key] - 1, 4))
                    row["added_gpu_idle_share"].append(round(
                        (gpu_idle_ms(build, spool) - base_idle_ms[key]) / base_step_ms[key], 4))
                found = _diagnose(build, spool, bases)
                expected = kind is not None
                if sc.get("truth") == "v_minority":
                    # The ranks whose true V_minority exceeds the fixed threshold are the ones the
                    # definition calls faulty (it differs between ranks by a point or two). In
                    # summary mode the spool holds no kernel records to recompute it from: a
                    # raw-mode twin of the same shape (the sim's kernel durations follow the shape)
                    # gives the truth.
                    truth_spool = spool
                    if os.environ.get("FLARE_MODE", "raw") == "summary":
                        truth_spool = spool + "-raw-twin"
                        shutil.rmtree(truth_spool, ignore_errors=True)
                        twin = dict(sc, env=dict(sc.get("env", {}), FLARE_MODE="raw"))
                        _sim_run(build, twin, shape, truth_spool, truth_spool + ".json", seed)
                        row["truth_from"] = "raw-mode twin run"
                    v = true_v_minority(build, truth_spool)
                    row["truth"].append(round(statistics.median(v.values()), 3))
                    want_ranks = sorted(r for r, x in v.items() if x > 0.60)
                    expected = bool(want_ranks)
                row["runs"] += 1
                hits = [x for x in found if x["kind"] == kind]
                wrong = [x for x in found if x["kind"] != kind or not expected]
                if wrong:
                    row["runs_with_false_alarm"] += 1
                    for x in wrong:
                        row["false_alarm_kinds"][x["kind"]] = row["false_alarm_kinds"].get(
                            x["kind"], 0) + 1
                        # Which evidence carried it (the detectors list the signal that fired).
                        row.setdefault("false_alarm_detail", []).append(
                            f"rep {rep} seed {seed} {shape}: {x['kind']} ranks {x['ranks']}: " +
                            " | ".join(e["text"] for e in x["evidence"][:3]))
                if kind is None:
                    continue
                if not expected:
                    row["expected_silent"] += 1
                    row["silent_right"] += int(not hits)
                    continue
                row["expected"] += 1
                if hits:
                    row["detected"] += 1
                    row["culprit_right"] += int(hits[0]["ranks"] == want_ranks)
                    row["team_right"] += int(hits[0]["team"] == team)
                    if args.diag_delay:
                        row["delays"].append(_detection_delay(build, spool, bases, kind, onset,
                                                              sc.get("steps", DIAG_STEPS)))
                else:
                    row.setdefault("missed", []).append(
                        f"rep {rep} seed {seed} {shape}: found "
                        f"{[(x['kind'], x['ranks']) for x in found]}")
                if hits and hits[0]["ranks"] != want_ranks:
                    row.setdefault("wrong_culprit", []).append(
                        f"rep {rep} seed {seed} {shape}: named {hits[0]['ranks']}")
                shutil.rmtree(spool, ignore_errors=True)
            row["seconds"] = round(time.time() - t0, 1)
            row["layout"] = (f"{4 if sc.get('python') else sc.get('world', 8)} ranks, "
                             f"TP {sc.get('tp', 2)}")
            row["steps"] = sc.get("steps", DIAG_STEPS)
            out["scenarios"][sc["name"]] = row
            print(f"  {sc['name']}: {json.dumps(row)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fault = [r for r in out["scenarios"].values() if r["expected"]]
    healthy = [r for n, r in out["scenarios"].items() if n.startswith("healthy")]
    out["totals"] = {
        "fault_runs": sum(r["expected"] for r in fault),
        "detected": sum(r["detected"] for r in fault),
        "culprit_right": sum(r["culprit_right"] for r in fault),
        "team_right": sum(r["team_right"] for r in fault),
        "healthy_runs": sum(r["runs"] for r in healthy),
        "healthy_runs_with_alarm": sum(r["runs_with_false_alarm"] for r in healthy),
        "all_runs": sum(r["runs"] for r in out["scenarios"].values()),
        "runs_with_wrong_alarm": sum(r["runs_with_false_alarm"] for r in out["scenarios"].values()),
    }
    out["table"] = diagnosis_table(out)
    print(out["table"], flush=True)
    return out


def diagnosis_table(out):
    """The matrix as the markdown table docs/benchmarks.md quotes."""
    lines = ["| scenario | layout | detected (culprit right / team right) | runs with a wrong "
             "alarm | false-alarm kinds |", "|---|---|---|---|---|"]
    for name, r in out["scenarios"].items():
        if r["expected"]:
            det = f"{r['detected']}/{r['expected']} ({r['culprit_right']} / {r['team_right']})"
        elif r.get("expected_silent"):
            det = f"silent {r['silent_right']}/{r['expected_silent']}"
        else:
            det = "— (healthy)"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["false_alarm_kinds"].items())) or "—"
        lines.append(f"| {name} | {r.get('layout', '')} | {det} | "
                     f"{r['runs_with_false_alarm']}/{r['runs']} | {kinds} |")
    t = out.get("totals", {})
    if t:
        lines.append(f"| **total** | | {t['detected']}/{t['fault_runs']} ({t['culprit_right']} / "
                     f"{t['team_right']}) | healthy {t['healthy_runs_with_alarm']}/"
                     f"{t['healthy_runs']}, all {t['runs_with_wrong_alarm']}/{t['all_runs']} | |")
    return "\n".join(lines)


def daemon(build, args):
    """flared under flare-loadgen's summary-mode load, one run per size (daemon_load.sh)."""
    if not shutil.which("taskset") or (os.cpu_count() or 1) < 2:
        return {"skipped": "needs taskset and two cores (flared and the generator pinned apart)"}
    out = {}
    for ranks in [int(r) for r in str(args.daemon_ranks).split(",") if r]:
        cmd = ["bash", os.path.join(ROOT, "tools", "bench", "daemon_load.sh"), build, str(ranks),
               "--mode", "summary", "--sigs", "50", "--warmup-s", str(args.daemon_warmup_s),
               "--duration-s", str(args.daemon_duration_s)]
        r = sh(cmd, env={"FLARE_LOAD_QUERIES": "1"},
               timeout=args.daemon_warmup_s + args.daemon_duration_s + 300)
        text = r.stdout + r.stderr
        row = {"rc": r.returncode}

        def grab(key, pattern, conv=float):
            m = re.search(pattern, text)
            if m:
                row[key] = conv(m.group(1))

        grab("accepted_batches_per_s", r"daemon accepted: ([0-9.]+) batches/s")
        grab("daemon_core_share_pct", r"daemon CPU in window: .*\(([0-9.]+)% of a core\)")
        grab("daemon_us_per_batch", r"daemon CPU in window: .*, ([0-9.]+) us per batch")
        grab("rss_kib_per_rank", r"daemon RSS: .*: ([0-9.]+) KiB per rank")
        grab("rss_mib", r"daemon RSS: .* MiB before, ([0-9.]+) MiB with")
        m = re.search(r"whole run: daemon accepted ([0-9.]+) of ([0-9]+) batches written", text)
        if m:
            row["accepted_of_written"] = [int(float(m.group(1))), int(m.group(2))]
        for q in ("report", "diagnoses"):
            times = [float(t) for t in re.findall(rf"/{q} #\d: HTTP 200, ([0-9.]+) s", text)]
            if times:
                row[f"{q}_s"] = times
        if "accepted_batches_per_s" not in row:
            row["error"] = text[-2000:]
        row["real_time"] = bool(row.get("accepted_batches_per_s", 0) >= 0.99 * ranks)
        out[str(ranks)] = row
    return out


SECTIONS = {"overhead": overhead, "hotpath": hotpath, "volume": volume, "daemon": daemon,
            "diagnosis": diagnosis}


def main():
    global DIAG_STEPS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default=os.environ.get("FLARE_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--only", action="append", choices=sorted(SECTIONS))
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=6, help="interleaved pairs for the overhead")
    p.add_argument("--no-callgrind", dest="callgrind", action="store_false")
    p.add_argument("--diag-reps", type=int, default=10, help="runs per diagnosis scenario")
    p.add_argument("--diag-healthy-reps", type=int, default=0,
                   help="runs per healthy scenario (default: --diag-reps); the false-alarm rate "
                        "needs many")
    p.add_argument("--diag-scenario", action="append",
                   help="run only this diagnosis scenario (repeatable; default all)")
    p.add_argument("--diag-steps", type=int, default=DIAG_STEPS,
                   help="steps per diagnosis run, for scenarios that do not set their own "
                        "(default %d; longer runs show what sampled timing needs)" % DIAG_STEPS)
    p.add_argument("--diag-seed", type=int, default=1,
                   help="FLARE_SIM_SEED of the first repetition (rep i runs with seed + i)")
    p.add_argument("--diag-classic", dest="diag_extended", action="store_false",
                   help="only the classic scenarios (leave out issue 21's extended classes: "
                        "more severities, 16 ranks, TP x DP layouts, sparse faults)")
    p.add_argument("--no-diag-delay", dest="diag_delay", action="store_false",
                   help="skip the detection-delay search (flare-diagnose --until-step)")
    p.add_argument("--daemon-ranks", default="1024,10000",
                   help="comma-separated rank counts for the daemon section")
    p.add_argument("--daemon-warmup-s", type=int, default=130,
                   help="load before measuring (the detectors' window is 120 s)")
    p.add_argument("--daemon-duration-s", type=int, default=30)
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args()
    DIAG_STEPS = args.diag_steps
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
