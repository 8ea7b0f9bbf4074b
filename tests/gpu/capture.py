#!/usr/bin/env python3
"""Records real training workloads in raw mode as compact test fixtures (issue 19, part 2).
Started by tests/gpu/capture.sh; the layout it writes is tests/fixtures/gpu/README.md's.

Each scenario runs its ranks (processes sharing GPU 0, torchrun's variables set) under the kit's
hook in FLARE_MODE=raw, spooling (no daemon); the spool is exported (flare-export) and stored as
one gzip'd JSON-lines file per rank, beside the loop's own truth (steps and step times per rank)
and the scenario's expected diagnosis. metadata.json names the GPU, driver, CUDA, PyTorch and
Flare versions.

GPU mode: tests/gpu/bench/gpt_train.py (PyTorch). Sim mode (--sim): the simulated Python workload
(flare-sim-train --python) on the simulated CUDA stack, the same layout, for tests of the tools
that consume fixtures; scenarios the simulator cannot express (CUDA graphs, torch.compile) are
listed as skipped, with the reason.
"""

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = 1

# name: (description, ranks, gpt_train.py args, sim args, sim env, expected diagnosis or None)
SCENARIOS = [
    ("healthy-small", "healthy GPT loop, small", 1, ["--size", "small"],
     ["--layers", "2", "--hidden", "1024", "--seq", "512"], {}, None),
    ("healthy-medium", "healthy GPT loop, medium", 1, ["--size", "medium"],
     ["--layers", "4", "--hidden", "2048", "--seq", "1024"], {}, None),
    ("host-stall", "2 ranks; rank 1 pauses ~10 ms in a real gc.collect() every step", 2,
     ["--size", "small", "--stall-ms", "10", "--stall-rank", "1", "--stall-kind", "gc"],
     ["--layers", "2", "--hidden", "1024", "--seq", "512"], {"FLARE_SIM_HOST_STALL": "1:10"},
     {"kind": "issue_stall", "rank": 1, "team": "algorithm"}),
    ("stray-sync", "a torch.cuda.synchronize() in the middle of every forward", 1,
     ["--size", "small", "--sync"], ["--layers", "2", "--hidden", "1024", "--seq", "512"],
     {"FLARE_SIM_INJECT_SYNC": "1"}, {"kind": "issue_stall", "rank": 0, "team": "algorithm"}),
    ("slow-dataloader", "30 ms of host work per batch, no DataLoader workers", 1,
     ["--size", "small", "--workers", "0", "--data-ms", "30"],
     ["--layers", "2", "--hidden", "1024", "--seq", "512", "--data-ms", "30"], {},
     {"kind": "void_inter", "rank": 0, "team": "algorithm"}),
    ("unaligned-gemm", "MLP width 4d+8: GEMMs with a dimension not a multiple of 128 bytes", 1,
     ["--size", "small", "--unaligned"], ["--layers", "2", "--hidden", "1000", "--seq", "512"],
     {}, {"kind": "unoptimized_gemm", "team": "infrastructure"}),
    ("cuda-graph", "the whole step captured once in a CUDA graph and replayed", 1,
     ["--size", "small", "--cuda-graph"], None, {}, None),
    ("compile", "torch.compile: Triton kernels through the driver API", 1,
     ["--size", "tiny", "--compile"], None, {}, None),
]


def gz_jsonl(lines, path):
    with gzip.open(path, "wt", compresslevel=9) as f:
        for line in lines:
            f.write(line + "\n")


def versions(kit, sim):
    env = {"python": platform.python_version(), "mode": "sim" if sim else "gpu"}
    try:
        env["flare"] = open(os.path.join(kit, "VERSION")).read().strip()
    except OSError:
        env["flare"] = "unknown"
    if sim:
        env.update(gpu="simulated (src/sim)", driver=None, cuda="simulated", torch=None)
        return env
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=30).stdout.splitlines()
        env["gpu"], env["driver"] = [x.strip() for x in q[0].split(",")[:2]]
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        pass
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version())
    env.setdefault("gpu", torch.cuda.get_device_name(0))
    return env


def hook_env(kit, spool, job):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLARE_", "FLARE_SIM_")) and k not in ("LD_PRELOAD",
                                                                      "TRACED_PYTHON_API")}
    env.update(LD_PRELOAD=os.path.join(kit, "lib", "libflare_hook.so"), FLARE_OUTPUT_DIR=spool,
               FLARE_JOB_ID=job, FLARE_MODE="raw")
    return env


def run_gpu(kit, name, ranks, extra, spool, work, steps, timeout):
    procs = []
    for r in range(ranks):
        out = os.path.join(work, "%s-rank%d.json" % (name, r))
        env = hook_env(kit, spool, name)
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks),
                   LOCAL_WORLD_SIZE=str(ranks), GROUP_RANK="0", TORCHELASTIC_RUN_ID=name)
        cmd = [sys.executable, os.path.join(HERE, "bench", "gpt_train.py"), "--warmup", "3",
               "--steps", str(steps), "--json", out, *extra]
        log = open(os.path.join(work, "%s-rank%d.log" % (name, r)), "w")
        procs.append((out, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)))
    truth = {}
    give_up = time.monotonic() + timeout
    try:
        for r, (out, p) in enumerate(procs):
            p.wait(timeout=max(1.0, give_up - time.monotonic()))
    except subprocess.TimeoutExpired:
        for _, p in procs:  # none may go on using the GPU under the next scenario
            p.kill()
            p.wait()
        raise RuntimeError("ranks still running after %.0f s (killed)" % timeout)
    for r, (out, p) in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError("rank %d exited %d" % (r, p.returncode))
        with open(out) as f:
            res = json.load(f)
        truth[r] = {"steps": res["total_steps"], "warmup": res["warmup"],
                    "step_ms": [round(x, 3) for x in res["steps_ms"]], "options": res["options"]}
    return truth


def run_sim(kit, name, ranks, extra, extra_env, spool, work, steps, timeout):
    out = os.path.join(work, name + "-sim.json")
    env = hook_env(kit, spool, name)
    env.update(extra_env)
    if "FLARE_SIM_INJECT_SYNC" in extra_env:
        env["TRACED_PYTHON_API"] = "sim_train@injected_sync"
    cmd = [os.path.join(kit, "bin", "flare-sim-train"), "--ranks", str(ranks), "--steps",
           str(steps), "--python", "--tp", "1", "--json", out, "--quiet", *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError("flare-sim-train exited %d: %s" % (proc.returncode,
                                                             proc.stderr[-800:]))
    with open(out) as f:
        return {r["rank"]: {"steps": len(r["step_ms"]), "warmup": 0,
                            "step_ms": [round(x, 3) for x in r["step_ms"]]}
                for r in json.load(f)["ranks"]}


def export(kit, spool):
    exp = subprocess.run([os.path.join(kit, "bin", "flare-export"), "--input", spool],
                         capture_output=True, text=True, timeout=300)
    if exp.returncode != 0:
        raise RuntimeError("flare-export: " + exp.stderr[-800:])
    per_rank = {}
    for line in exp.stdout.splitlines():
        if line.strip():
            per_rank.setdefault(json.loads(line)["rank"], []).append(line)
    return per_rank


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--steps", type=int, default=30, help="measured steps per scenario")
    ap.add_argument("--only", help="comma list of scenario names")
    ap.add_argument("--budget-s", type=float, default=300, help="wall time for all scenarios")
    ap.add_argument("--max-bytes", type=int, default=5 << 20)
    args = ap.parse_args()
    kit = os.path.abspath(args.kit)
    os.makedirs(args.out, exist_ok=True)
    meta = {"schema": SCHEMA, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "environment": versions(kit, args.sim), "record_format": "flare-export JSON lines "
            "(tools/flare_export.cc), one gzip'd file per rank", "fixtures": []}
    chosen = [s for s in SCENARIOS if not args.only or s[0] in args.only.split(",")]
    deadline = time.monotonic() + args.budget_s
    failed = 0
    with tempfile.TemporaryDirectory(prefix="flare-capture-") as work:
        for i, (name, desc, ranks, gpu_args, sim_args, sim_env, expect) in enumerate(chosen):
            entry = {"name": name, "description": desc, "ranks": ranks, "expect": expect}
            meta["fixtures"].append(entry)
            if args.sim and sim_args is None:
                entry["skipped"] = "needs PyTorch+GPU (the simulator has no counterpart)"
                continue
            left = deadline - time.monotonic()
            if left < 10:
                entry["skipped"] = "out of time (--budget-s)"
                continue
            timeout = max(10.0, left / (len(chosen) - i) * 2)
            spool = os.path.join(work, "spool-" + name)
            t0 = time.monotonic()
            try:
                if args.sim:
                    truth = run_sim(kit, name, ranks, sim_args, sim_env, spool, work, args.steps,
                                    timeout)
                    entry["workload"] = {"program": "flare-sim-train --python",
                                         "args": sim_args, "env": sim_env}
                else:
                    truth = run_gpu(kit, name, ranks, gpu_args, spool, work, args.steps, timeout)
                    entry["workload"] = {"program": "tests/gpu/bench/gpt_train.py",
                                         "args": gpu_args}
                per_rank = export(kit, spool)
                folder = os.path.join(args.out, name)
                shutil.rmtree(folder, ignore_errors=True)
                os.makedirs(folder)
                files, records = [], 0
                for rank, lines in sorted(per_rank.items()):
                    path = os.path.join(folder, "rank%d.jsonl.gz" % rank)
                    gz_jsonl(lines, path)
                    files.append(os.path.relpath(path, args.out))
                    records += len(lines)
                with open(os.path.join(folder, "loop.json"), "w") as f:
                    json.dump({"ranks": {str(r): t for r, t in truth.items()}}, f)
                entry.update(files=files, records=records, steps=args.steps,
                             bytes=sum(os.path.getsize(os.path.join(folder, n))
                                       for n in os.listdir(folder)),
                             seconds=round(time.monotonic() - t0, 1))
                if len(per_rank) != ranks:
                    raise RuntimeError("records from %d of %d ranks" % (len(per_rank), ranks))
            except Exception as e:  # noqa: BLE001 (one scenario's failure; the others go on)
                entry["error"] = str(e)[-1000:]
                failed += 1
            print("capture: %s: %s" % (name, entry.get("error") or "%d records, %d bytes" % (
                entry.get("records", 0), entry.get("bytes", 0))), file=sys.stderr, flush=True)
    total = sum(e.get("bytes", 0) for e in meta["fixtures"])
    meta["total_bytes"] = total
    if total > args.max_bytes:
        meta["warning"] = "fixtures total %d bytes, over the %d budget: lower --steps" % (
            total, args.max_bytes)
        print("capture: " + meta["warning"], file=sys.stderr)
    with open(os.path.join(args.out, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return 1 if failed or total > args.max_bytes else 0


if __name__ == "__main__":
    sys.exit(main())
