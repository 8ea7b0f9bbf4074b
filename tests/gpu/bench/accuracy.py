#!/usr/bin/env python3
"""Flare's timings against independent measurements on a GPU (issue 9, "accuracy").

In one process, run under LD_PRELOAD=libflare_hook.so (FLARE_MODE=raw, spooling to a directory)
with torch.profiler recording CUDA activity (CUPTI) at the same time:
  - bf16 GEMMs of several shapes (one with a dimension that is not a multiple of 128 bytes),
    each call timed with a pair of torch.cuda.Event;
  - single-rank NCCL all-reduces of several sizes, timed the same way.
Then compare, per shape and per size: Flare's median duration per call (flare-export of the
spool) with the torch.cuda.Event median and with the profiler's CUDA kernel time per call;
GEMM TFLOPS and all-reduce algorithm bandwidth from each.

Run (GPU machine): python3 tests/gpu/bench/accuracy.py --build build --json accuracy.json
It re-executes itself under the hook (--child) and prints a markdown table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GEMMS = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1000), (16384, 4096, 4096)]
ALLREDUCE_MIB = [16, 64, 256]
CALLS = 20


def child(out_path):
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", 0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    results = {"gemm": {}, "allreduce": {}, "device": torch.cuda.get_device_name(0)}

    def timed(fn, calls):
        for _ in range(3):
            fn()  # warm-up: heuristics, workspaces, communicator set-up
        torch.cuda.synchronize()
        ms = []
        for _ in range(calls):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        return ms

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    regions = []
    with prof:
        for m, n, k in GEMMS:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            tag = f"gemm_{m}x{n}x{k}"
            with torch.profiler.record_function(tag):
                ms = timed(lambda: x @ y, CALLS)
            results["gemm"][tag] = {"m": m, "n": n, "k": k, "event_ms": ms, "calls": CALLS + 3}
            regions.append(tag)
        for mib in ALLREDUCE_MIB:
            t = torch.ones(mib << 18, device=dev, dtype=torch.float32)
            tag = f"allreduce_{mib}MiB"
            with torch.profiler.record_function(tag):
                ms = timed(lambda: dist.all_reduce(t), CALLS)
            results["allreduce"][tag] = {"bytes": t.numel() * 4, "event_ms": ms,
                                         "calls": CALLS + 3}
            regions.append(tag)
    # The profiler's GPU time per region: CUDA kernels whose launch ran inside the region's
    # record_function (CPU parent chain), summed, per call.
    gpu_us = {tag: 0.0 for tag in regions}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        parent = evt.cpu_parent
        while parent is not None and parent.name not in gpu_us:
            parent = parent.cpu_parent
        if parent is not None:
            gpu_us[parent.name] += evt.device_time if hasattr(evt, "device_time") else \
                evt.cuda_time
    for group in ("gemm", "allreduce"):
        for tag, r in results[group].items():
            r["profiler_ms_per_call"] = gpu_us[tag] / 1e3 / r["calls"]
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(results, f)


def flare_records(build, spool):
    exp = subprocess.run([os.path.join(build, "bin", "flare-export"), "--input", spool],
                         capture_output=True, text=True, check=True)
    return [json.loads(line) for line in exp.stdout.splitlines() if line.strip()]


def compare(ref, recs):
    rows = []
    for tag, r in ref["gemm"].items():
        durs = [x["duration_ns"] / 1e6 for x in recs
                if x.get("kind") == "gemm" and list(x.get("shape", [])[:3]) == [r["m"], r["n"],
                                                                                 r["k"]]]
        flops = 2 * r["m"] * r["n"] * r["k"]
        rows.append(row(tag, durs, r, lambda ms: flops / ms / 1e9, "TFLOPS"))
    for tag, r in ref["allreduce"].items():
        durs = [x["duration_ns"] / 1e6 for x in recs
                if x.get("name") == "ncclAllReduce" and x.get("bytes") == r["bytes"]]
        rows.append(row(tag, durs, r, lambda ms: r["bytes"] / ms / 1e6, "GB/s algbw"))
    return rows


def row(tag, flare_ms, ref, rate, unit):
    ev = statistics.median(ref["event_ms"])
    out = {"what": tag, "unit": unit, "event_ms": ev, "event_rate": rate(ev),
           "profiler_ms": ref["profiler_ms_per_call"], "flare_calls": len(flare_ms)}
    if flare_ms:
        fl = statistics.median(flare_ms)
        out.update(flare_ms=fl, flare_rate=rate(fl), flare_vs_event_pct=100 * (fl / ev - 1),
                   flare_vs_profiler_pct=100 * (fl / ref["profiler_ms_per_call"] - 1)
                   if ref["profiler_ms_per_call"] > 0 else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FLARE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory(prefix="flare-accuracy-") as work:
        ref_path, spool = os.path.join(work, "ref.json"), os.path.join(work, "spool")
        env = dict(os.environ, LD_PRELOAD=os.path.join(args.build, "lib", "libflare_hook.so"),
                   FLARE_OUTPUT_DIR=spool, FLARE_JOB_ID="accuracy", FLARE_MODE="raw")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", ref_path],
                       env=env, check=True, timeout=900)
        with open(ref_path) as f:
            ref = json.load(f)
        rows = compare(ref, flare_records(args.build, spool))
    print(f"GPU: {ref['device']}\n")
    print("| what | Flare ms | event ms | profiler ms/call | Flare vs event | Flare vs profiler "
          "| rate (Flare / event) |\n|---|---|---|---|---|---|---|")
    for r in rows:
        if "flare_ms" not in r:
            print(f"| {r['what']} | (no Flare record) | {r['event_ms']:.3f} | "
                  f"{r['profiler_ms']:.3f} | — | — | — |")
            continue
        vp = "—" if r["flare_vs_profiler_pct"] is None else f"{r['flare_vs_profiler_pct']:+.1f}%"
        print(f"| {r['what']} | {r['flare_ms']:.3f} | {r['event_ms']:.3f} | "
              f"{r['profiler_ms']:.3f} | {r['flare_vs_event_pct']:+.1f}% | {vp} | "
              f"{r['flare_rate']:.1f} / {r['event_rate']:.1f} {r['unit']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ref["device"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
