#!/usr/bin/env python3
"""The hook's cost for a launch that 1-in-N sampling does not time (FLARE_SAMPLE_KERNELS), on
the simulated stack (docs/benchmarks.md, "Sampled launches").

Runs build/bin/hook_benchmark in ROUNDS processes, each with FLARE_SAMPLE_KERNELS=1024 (all but
the warm-up and ~1 launch in 1024 untimed) and the two stub arms in random interleaving
(--benchmark_enable_random_interleaving, REPS repetitions each):

  BM_BareStubLaunch    the simulated runtime's __cudaLaunchKernel called directly with a null
                       kernel, which it refuses at once (a "real function" of ~15 ns);
  BM_HookedStubLaunch  the same call through libflare_hook.so's __cudaLaunchKernel wrapper.

Per round the difference of the arms' medians is the hook's added cost per launch; the figure is
the median over rounds with a bootstrap 95% interval. With --with-kernels it also runs the
launches of a real simulated kernel (BM_BareLaunch, BM_InterceptedLaunch) in the same processes:
their simulated enqueue adds ~0.2-0.5 us per launch and its noise, so they resolve less. (The
timed path is not compared this way: in one process the bare arm would share the poller and the
simulated streams the timed arm keeps busy; its real cost is a GPU figure, launch_cost.cu.)

  tools/bench/untimed_launch.py [--build build] [--rounds 15] [--reps 3] [--cpu 1] [--json F]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys


def run_round(binary, sample, pattern, reps, cpu, metric):
    env = dict(os.environ, FLARE_SAMPLE_KERNELS=str(sample), FLARE_LOG_LEVEL="warn")
    env.setdefault("FLARE_OUTPUT_DIR", "/tmp/flare-untimed-launch-bench")
    cmd = [binary, "--benchmark_filter=" + pattern, "--benchmark_format=json",
           "--benchmark_repetitions=%d" % reps, "--benchmark_enable_random_interleaving=true"]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    per = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        per.setdefault(b["run_name"].split("/")[0], []).append(b[metric])
    return {name: statistics.median(v) for name, v in per.items()}


def bootstrap(values, n=2000, seed=1):
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def figure(diffs):
    lo, hi = bootstrap(diffs)
    return {"median_ns": statistics.median(diffs), "ci95_ns": [lo, hi], "rounds": len(diffs),
            "per_round_ns": diffs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=1, help="pin to this CPU (-1: no pinning)")
    ap.add_argument("--metric", default="cpu_time", choices=["cpu_time", "real_time"])
    ap.add_argument("--with-kernels", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bin", "hook_benchmark")
    if not os.path.exists(binary):
        sys.exit("no %s (built with Google Benchmark and the simulator)" % binary)
    cpu = None if args.cpu < 0 else args.cpu
    stub, untimed, bare = [], [], []
    for _ in range(args.rounds):
        r = run_round(binary, 1024, "StubLaunch", args.reps, cpu, args.metric)
        stub.append(r["BM_HookedStubLaunch"] - r["BM_BareStubLaunch"])
        bare.append(r["BM_BareStubLaunch"])
        if args.with_kernels:
            r = run_round(binary, 1024, "BareLaunch|InterceptedLaunch", args.reps, cpu,
                          args.metric)
            untimed.append(r["BM_InterceptedLaunch"] - r["BM_BareLaunch"])
    result = {"metric": args.metric, "untimed_stub_added": figure(stub),
              "bare_stub_ns": statistics.median(bare)}
    if args.with_kernels:
        result["untimed_kernel_added"] = figure(untimed)
    for key in ("untimed_stub_added", "untimed_kernel_added"):
        if key in result:
            f = result[key]
            print("%-22s %+7.1f ns  [%+.1f, %+.1f]  (%d rounds, %s)" % (
                key, f["median_ns"], f["ci95_ns"][0], f["ci95_ns"][1], f["rounds"], args.metric))
    print("bare stub launch        %7.1f ns" % result["bare_stub_ns"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
