#!/usr/bin/env python3
"""A stand-in for gpt_train.py with no GPU, for the harness's own test: reports the step times a
model of each arm gives (bare 100 ms; FLARE_MODE summary +5%, raw +10%; --profiler +30%), with
the same arguments and JSON as gpt_train.py. It checks what the harness passes (LD_PRELOAD set
exactly for the Flare arms) and fails when STANDIN_FAIL_ARM names the arm."""
import argparse
import json
import os
import resource
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--size", required=True)
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--warmup", type=int, required=True)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--profiler", action="store_true")
ap.add_argument("--json", required=True)
a = ap.parse_args()
mode = os.environ.get("FLARE_MODE", "")
preload = os.environ.get("LD_PRELOAD", "")
arm = "torch-profiler" if a.profiler else (f"flare-{mode}" if mode else "bare")
if bool(mode) != ("libflare_hook.so" in preload):
    sys.exit(f"stand-in: FLARE_MODE={mode!r} with LD_PRELOAD={preload!r}")
if os.environ.get("STANDIN_FAIL_ARM") == arm:
    sys.exit(f"stand-in: failing {arm} as asked")
factor = {"bare": 1.0, "flare-summary": 1.05, "flare-raw": 1.10, "torch-profiler": 1.30}[arm]
base = 100.0 * (1 + 0.01 * a.seed)  # drift between repetitions: the ratio must cancel it
steps = [base * factor] * a.steps
with open(a.json, "w") as f:
    json.dump({"size": a.size, "steps_ms": steps, "median_ms": statistics.median(steps),
               "tokens_per_step": 1, "max_rss_kib":
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "profiler": a.profiler,
               "params": 0, "device": "stand-in (no GPU)"}, f)
