#!/usr/bin/env python3
"""Median step time of the 8-rank sim job: no hook, spool only, streaming to a daemon
(flare-fake-ingest), and streaming with the daemon killed and restarted mid-run.
Usage: tools/bench_stream.py [BUILD_DIR]  (docs/benchmarks.md, "Streaming to the daemon")."""
import json, os, signal, subprocess, statistics, sys, threading, time, tempfile
B = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
def run(env_extra, kill=None, steps=80):
    d = tempfile.mkdtemp()
    out = os.path.join(d, "r.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(env_extra)
    env.setdefault("FLARE_OUTPUT_DIR", os.path.join(d, "spool"))
    p = subprocess.Popen([B + "/bin/flare-sim-train", "--ranks", "8", "--steps", str(steps), "--quiet", "--json", out], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kill: kill()
    p.wait()
    r = json.load(open(out))["ranks"]
    return statistics.median(statistics.median(x["step_ms"][1:]) for x in r)
def ingest(port=0):
    p = subprocess.Popen([B + "/bin/flare-fake-ingest", "--out", tempfile.mkdtemp(), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return p, int(p.stdout.readline().split()[1])
hook = {"LD_PRELOAD": B + "/lib/libflare_hook.so", "FLARE_JOB_ID": "bench"}
res = {}
for rep in range(3):
    res.setdefault("no hook", []).append(run({}))
    res.setdefault("hook, spool only", []).append(run(hook))
    p, port = ingest()
    res.setdefault("hook, streaming", []).append(run(dict(hook, FLARE_DAEMON="127.0.0.1:%d" % port)))
    state = {"p": p}
    def kill():
        time.sleep(1.0); state["p"].kill(); state["p"].wait(); time.sleep(1.5)
        state["p"], _ = ingest(port)
    res.setdefault("hook, streaming, daemon killed 1.0-2.5 s", []).append(run(dict(hook, FLARE_DAEMON="127.0.0.1:%d" % port), kill=kill))
    state["p"].kill()
for k, v in res.items():
    print("%-42s median step %.2f ms (runs: %s)" % (k, statistics.median(v), ", ".join("%.2f" % x for x in v)))
