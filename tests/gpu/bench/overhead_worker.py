#!/usr/bin/env python3
"""One arm of the overhead benchmark (tests/gpu/bench/overhead.py): a long-lived process that
builds a workload once, then runs measurement windows on request, so that the arms can be
interleaved window by window without paying process start-up, model build and warm-up each time.

The arm is set from outside: Flare by LD_PRELOAD and FLARE_* (summary or raw mode), the profiler
by --profiler (each window recorded with torch.profiler, CPU and CUDA activities; the profile's
post-processing happens after the window's clock stops). CPU pinning comes from the coordinator:
every thread of the process (Flare's included) moves to the measurement cores for a window and
back to the idle cores after it, so every arm measures on the same cores and the idle arms stay
off them; --threads sets torch's intra-op threads.

Protocol: one JSON object per line. Requests on stdin; replies on the file descriptor that was
stdout when the process started (fd 1 is pointed at stderr, so nothing a library prints can
corrupt a reply):
  {"op": "load", "workload": W, "warmup_s": S}  -> {"ok": true, "load_s": ..., "steps": ...}
  {"op": "measure", "seconds": T, "cpus": [..], "idle_cpus": [..]}
                                                 -> {"ok": true, "steps": n, "mean_ms": ...,
                                                     "median_ms": ..., "rss_kib": ...,
                                                     "affinity": [the cores it measured on],
                                                     "pid": ..., "run_delay_pct": ...}
  {"op": "unload"} -> {"ok": true};   {"op": "quit"} -> exits
Errors are replies too: {"ok": false, "error": "..."}.

Workloads:
  gpt-small, gpt-medium, gpt-large   the GPT loop of gpt_train.py (bf16 autocast, AdamW,
                                     DataLoader, loss.item() per step); large is sized so that
                                     four arms fit on one 80 GB GPU together
  launch-bound                       ~300 kernels of 5-20 us per step (adds, scales, small GEMMs)
                                     and one .item(): per-launch cost dominates, the worst case;
                                     a flare_step() marker per step where the hook is loaded
  cuda-graph                         gpt-small's whole step captured once, replayed per step
  compile                            a 4-layer GPT under torch.compile (Triton kernels launched
                                     through the driver API)
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

from proc_readings import thread_run_delay_ns

HERE = os.path.dirname(os.path.abspath(__file__))
# name: (layers, hidden, heads, sequence, micro-batch)
GPT_SIZES = {"gpt-small": (12, 768, 12, 1024, 8), "gpt-medium": (24, 1024, 16, 1024, 8),
             "gpt-large": (24, 1536, 12, 1024, 4), "cuda-graph": (12, 768, 12, 1024, 8),
             "compile": (4, 512, 8, 512, 8)}
WORKLOADS = ("gpt-small", "gpt-medium", "gpt-large", "launch-bound", "cuda-graph", "compile")


def pin(cpus):
    """Every thread of this process onto `cpus` (threads started later inherit it)."""
    if not cpus:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class Gpt:
    def __init__(self, torch, name):
        sys.path.insert(0, HERE)
        import gpt_train  # noqa: E402 (the benchmark's model, shared with the loop)
        import torch.nn.functional as F
        layers, d, heads, seq, batch = GPT_SIZES[name]
        self.torch, self.F, self.vocab = torch, F, gpt_train.VOCAB
        dev = torch.device("cuda", 0)
        self.dev = dev
        torch.manual_seed(0)
        self.model = gpt_train.GPT(layers, d, heads, seq).to(dev)
        self.graph = name == "cuda-graph"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4,
                                     **({"capturable": True} if self.graph else {"fused": True}))
        self.fwd = torch.compile(self.model) if name == "compile" else self.model
        tokens = torch.randint(0, self.vocab, (64, seq + 1))

        class Cycle(torch.utils.data.Dataset):
            def __len__(self):
                return 1 << 30

            def __getitem__(self, i):
                return tokens[i % 64]

        # A DataLoader with no workers: the __next__ Flare traces, no extra processes.
        self.it = iter(torch.utils.data.DataLoader(Cycle(), batch_size=batch, num_workers=0,
                                                   pin_memory=True))
        if self.graph:
            self._capture(batch, seq)

    def _loss(self, tokens):
        torch, F = self.torch, self.F
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not self.graph):
            logits = self.fwd(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, self.vocab).float(),
                                   tokens[:, 1:].reshape(-1))

    def _capture(self, batch, seq):
        torch = self.torch
        self.static = torch.zeros((batch, seq + 1), dtype=torch.long, device=self.dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._loss(self.static).backward()
                self.opt.step()
        torch.cuda.current_stream().wait_stream(side)
        self.g = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.g):
            self.static_loss = self._loss(self.static)
            self.static_loss.backward()
            self.opt.step()

    def step(self):
        tokens = next(self.it)
        if self.graph:
            self.static.copy_(tokens, non_blocking=True)
            self.g.replay()
            return self.static_loss.item()
        tokens = tokens.to(self.dev, non_blocking=True)
        loss = self._loss(tokens)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()


class LaunchBound:
    """Many short kernels per step: the per-launch cost of the hook dominates here."""

    def __init__(self, torch):
        import ctypes
        self.torch = torch
        # No DataLoader here: under Flare, a step marker (flare_step) at each step's start, as a
        # loop without a DataLoader marks its steps (step sampling needs steps); bare: nothing.
        self.mark = getattr(ctypes.CDLL(None), "flare_step", None)
        dev = torch.device("cuda", 0)
        n = 1 << 21
        self.a, self.b, self.c = (torch.randn(n, device=dev) for _ in range(3))
        self.x, self.y, self.z = (torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
                                  for _ in range(3))

    def step(self):
        torch = self.torch
        if self.mark is not None:
            self.mark()
        for _ in range(100):
            torch.add(self.a, self.b, out=self.c)
            torch.mul(self.c, 0.5, out=self.a)
            torch.mm(self.x, self.y, out=self.z)
        return self.a[0].item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiler", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch
    torch.set_num_threads(args.threads)
    torch.cuda.init()

    def reply(**kw):
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    # Loading (model build, torch.compile, warm-up; every arm at once) runs on every core the
    # process started with, not on the one idle core the previous window left it on.
    loading = sorted(os.sched_getaffinity(0))
    reply(ok=True, ready=True, device=torch.cuda.get_device_name(0), torch=torch.__version__,
          affinity=loading)
    work = prof = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "load":
                work = None  # a workload left loaded (its unload skipped after an error)
                gc.collect()
                torch.cuda.empty_cache()
                pin(loading)
                t0 = time.perf_counter()
                name = req["workload"]
                work = LaunchBound(torch) if name == "launch-bound" else Gpt(torch, name)
                steps = 0
                while steps < 3 or time.perf_counter() - t0 < req.get("warmup_s", 0):
                    work.step()
                    steps += 1
                torch.cuda.synchronize()
                pin(req.get("idle_cpus"))
                reply(ok=True, load_s=time.perf_counter() - t0, steps=steps)
            elif req["op"] == "measure":
                pin(req.get("cpus"))
                for _ in range(2):
                    work.step()
                torch.cuda.synchronize()
                if args.profiler:
                    prof = torch.profiler.profile(activities=[
                        torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                    prof.__enter__()
                times = []
                waited0 = thread_run_delay_ns()
                t0 = time.perf_counter()
                end = t0 + req["seconds"]
                last = t0
                while True:
                    work.step()
                    now = time.perf_counter()
                    times.append((now - last) * 1e3)
                    last = now
                    if now >= end and len(times) >= 3:
                        break
                elapsed = last - t0
                waited1 = thread_run_delay_ns()
                affinity = sorted(os.sched_getaffinity(0))
                pin(req.get("idle_cpus"))
                if prof is not None:
                    prof.__exit__(None, None, None)
                    prof = None
                extra = {}
                if waited0 is not None and waited1 is not None and elapsed > 0:
                    # The main thread's wait for a CPU in the window, as a share of it.
                    extra["run_delay_pct"] = round(100 * (waited1 - waited0) / 1e9 / elapsed, 3)
                reply(ok=True, steps=len(times), mean_ms=elapsed * 1e3 / len(times),
                      median_ms=statistics.median(times), rss_kib=rss_kib(), affinity=affinity,
                      pid=os.getpid(), **extra)
            elif req["op"] == "unload":
                work = None
                gc.collect()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                reply(ok=True)
            elif req["op"] == "quit":
                reply(ok=True)
                return 0
        except Exception as e:  # noqa: BLE001 (reported to the coordinator, which goes on)
            if prof is not None:  # a window that failed must not leave the profiler on
                try:
                    prof.__exit__(None, None, None)
                except Exception:  # noqa: BLE001
                    pass
                prof = None
            reply(ok=False, error="%s: %s" % (type(e).__name__, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
