#!/usr/bin/env python3
"""A stand-in for overhead_worker.py with no GPU, for the harness's own test
(tests/python/test_gpu_bench_harness.py): it speaks the same protocol and reports the step times
a model of each arm gives (bare 10 ms; FLARE_MODE summary +5%, raw +10%; --profiler +30%;
summary with FLARE_SAMPLE_KERNELS, which must be STANDIN_SAMPLE_KERNELS or 32, +1%; with
FLARE_SAMPLE_CALLS at the same N as well, +0.5%; with FLARE_SAMPLE_STEPS, which must be
STANDIN_SAMPLE_STEPS or 32, +0.25%; with FLARE_TIMING_BUDGET_PCT, which must be
STANDIN_TIMING_BUDGET or 0.5, +0.4%; with FLARE_TIMING_BUDGET_PCT=0 (exact), +6%; its logging at debug for hook and timing, and at its
gpt-small load the hook's budget and event-gap lines), times a
drift of +1% per window it has measured, which the per-round ratio must cancel. It checks what
the harness passes (LD_PRELOAD set exactly for the Flare arms, the same CPU affinity for every
arm, moved onto the measurement cores for each window), fails its load when STANDIN_FAIL_ARM
names its arm, and exits right after its ready line when STANDIN_EXIT_ARM does."""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--profiler", action="store_true")
ap.add_argument("--threads", type=int, default=4)
a = ap.parse_args()
proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
mode = os.environ.get("FLARE_MODE", "")
preload = os.environ.get("LD_PRELOAD", "")
sample = os.environ.get("FLARE_SAMPLE_KERNELS", "")
calls = os.environ.get("FLARE_SAMPLE_CALLS", "")
steps = os.environ.get("FLARE_SAMPLE_STEPS", "")
budget = os.environ.get("FLARE_TIMING_BUDGET_PCT", "")
arm = "torch-profiler" if a.profiler else ("flare-%s" % mode if mode else "bare")
if budget == "0":
    arm += "-exact"
elif budget:
    arm += "-budget"
    if sample or calls or steps or budget != os.environ.get("STANDIN_TIMING_BUDGET", "0.5"):
        sys.exit("stand-in: FLARE_TIMING_BUDGET_PCT=%r" % budget)
    if (os.environ.get("FLARE_LOG_LEVEL"), os.environ.get("FLARE_LOG_SUBSYSTEMS")) != (
            "debug", "hook,timing"):
        sys.exit("stand-in: the -budget arm logs at debug for hook,timing")
if steps:
    arm += "-steps"
    if sample or calls or steps != os.environ.get("STANDIN_SAMPLE_STEPS", "32"):
        sys.exit("stand-in: FLARE_SAMPLE_STEPS=%r (kernels %r, calls %r)" % (steps, sample, calls))
if sample:
    arm += "-sampled"
if calls:
    arm += "-all"
    if calls != sample:
        sys.exit("stand-in: FLARE_SAMPLE_CALLS=%r with FLARE_SAMPLE_KERNELS=%r" % (calls, sample))
if bool(mode) != ("libflare_hook.so" in preload):
    sys.exit("stand-in: FLARE_MODE=%r with LD_PRELOAD=%r" % (mode, preload))
if sample and sample != os.environ.get("STANDIN_SAMPLE_KERNELS", "32"):
    sys.exit("stand-in: FLARE_SAMPLE_KERNELS=%r" % sample)
factor = {"bare": 1.0, "flare-summary": 1.05, "flare-raw": 1.10, "torch-profiler": 1.30,
          "flare-summary-sampled": 1.01, "flare-summary-sampled-all": 1.005,
          "flare-summary-steps": 1.0025, "flare-summary-budget": 1.004,
          "flare-summary-exact": 1.06}[arm]


def reply(**kw):
    proto.write(json.dumps(kw) + "\n")


reply(ok=True, ready=True, device="stand-in (no GPU)")
if os.environ.get("STANDIN_EXIT_ARM") == arm:  # gone right after saying it is ready
    proto.flush()
    sys.exit(3)
measured = 0
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "load":
        if os.environ.get("STANDIN_FAIL_ARM") == arm:
            reply(ok=False, error="stand-in: failing %s as asked" % arm)
            continue
        if budget and req.get("workload") == "gpt-small":  # as the hook logs them
            print("[flare rank 0 I timing] device 0: two CUDA events queued back to back run "
                  "1300 ns apart (median of 64 readings); ...", file=sys.stderr, flush=True)
            print("[flare rank 0 I hook] flare: FLARE_TIMING_BUDGET_PCT=%s: timing every op "
                  "costs 4.00%% of a step here (0.80%% the launching threads' time, 3.20%% the "
                  "GPU time of the event records); timing one step in 16 (every op of it)"
                  % budget, file=sys.stderr, flush=True)
        if mode:  # something in the spool, as Flare would write
            spool = os.path.join(os.environ["FLARE_OUTPUT_DIR"], "standin")
            os.makedirs(spool, exist_ok=True)
            with open(os.path.join(spool, "records.pb"), "ab") as f:
                f.write(b"x" * 1000)
        reply(ok=True, load_s=0.0, steps=3)
    elif req["op"] == "measure":
        if req.get("cpus"):
            os.sched_setaffinity(0, req["cpus"])
        # Up to 50 ms: a window shorter than a few of /proc/stat's 10 ms ticks can see none
        # pass on the measured CPUs, and then has no steal reading (proc_readings.steal_pct).
        time.sleep(min(req["seconds"], 0.05))
        affinity = sorted(os.sched_getaffinity(0))
        if req.get("idle_cpus"):
            os.sched_setaffinity(0, req["idle_cpus"])
        step = 10.0 * factor * (1 + 0.01 * measured)
        measured += 1
        reply(ok=True, steps=100, mean_ms=step, median_ms=step, rss_kib=1000 + 100 * factor,
              affinity=affinity, pid=os.getpid())
    elif req["op"] == "unload":
        reply(ok=True)
    elif req["op"] == "quit":
        reply(ok=True)
        break
