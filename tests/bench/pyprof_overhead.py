#!/usr/bin/env python3
"""Per-call overhead of Python API tracing (src/pyprof): the time of one call of a traced and of
an untraced Python function, with and without libflare_hook.so preloaded, per interpreter.

    python3 tests/bench/pyprof_overhead.py [--build build] [--python PATH ...]

Each configuration runs in a fresh interpreter. The program times batches of 200 calls with
time.perf_counter_ns (the timing thread drains the span ring between batches, which it does
every millisecond; the pause is not timed) and reports the median per-call time over the
batches, in ns. "added" rows subtract the no-preload figure of the same function."""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

PROGRAM = r"""
import ctypes, json, os, sys, time
lib = os.environ.get("SIM_LIB_DIR")
if lib:
    for n in ("libcuda.so.1", "libcudart.so.13"):
        ctypes.CDLL(os.path.join(lib, n), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(None).cudaDeviceSynchronize()   # brings the tracer up (spans are recorded)
sys.path.insert(0, os.environ["BENCH_DIR"])
import benchmod
f, g = benchmod.traced, benchmod.untraced
pc = time.perf_counter_ns
def per_call(fn, batches=400, n=200):
    out = []
    for _ in range(batches):
        t0 = pc()
        for _ in range(n):
            fn(1)
        out.append((pc() - t0) / n)
        time.sleep(0.0015)
    out.sort()
    return out[len(out) // 2]
def loop_only(batches=400, n=200):
    out = []
    for _ in range(batches):
        t0 = pc()
        for _ in range(n):
            pass
        out.append((pc() - t0) / n)
    out.sort()
    return out[len(out) // 2]
print(json.dumps({"traced": per_call(f), "untraced": per_call(g), "loop": loop_only()}))
"""

MODULE = "def traced(x):\n    return x\n\ndef untraced(x):\n    return x\n"


def run(python, build, preload, tmp):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
    env.update({"BENCH_DIR": tmp, "SIM_LIB_DIR": os.path.join(build, "lib", "sim"),
                "FLARE_OUTPUT_DIR": os.path.join(tmp, "spool"), "FLARE_LOG_LEVEL": "warn",
                "TRACED_PYTHON_API": "benchmod@traced"})
    if preload:
        env["LD_PRELOAD"] = os.path.join(build, "lib", "libflare_hook.so")
    out = subprocess.run([python, "-c", PROGRAM], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--python", action="append")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    pythons = a.python or sorted(glob.glob("/root/.pyenv/versions/3.1[1-3]*/bin/python3"))
    tmp = os.path.abspath(os.path.join(a.build, "bench-pyprof"))
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "benchmod.py"), "w") as f:
        f.write(MODULE)
    build = os.path.abspath(a.build)
    for python in pythons:
        version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout.strip()
        base, traced = [], []
        for _ in range(a.rounds):  # interleaved: drift on a shared machine hits both alike
            base.append(run(python, build, False, tmp))
            traced.append(run(python, build, True, tmp))
        med = lambda rows, k: statistics.median(r[k] for r in rows)
        print("Python %s: per call, ns (median of %d rounds; loop overhead %.1f ns)"
              % (version, a.rounds, med(base, "loop")))
        print("  untraced fn: no preload %.1f, preloaded %.1f, added %+.1f"
              % (med(base, "untraced"), med(traced, "untraced"),
                 med(traced, "untraced") - med(base, "untraced")))
        print("  traced fn:   no preload %.1f, preloaded %.1f, added %+.1f"
              % (med(base, "traced"), med(traced, "traced"),
                 med(traced, "traced") - med(base, "traced")))
        print("  rounds (untraced no-preload/preloaded): %s" % ", ".join(
            "%.1f/%.1f" % (b["untraced"], t["untraced"]) for b, t in zip(base, traced)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
