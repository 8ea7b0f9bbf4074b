#!/usr/bin/env python3
"""Replays a recorded Flare trace on the simulated stack, with the preload library loaded.

The second replay mode of issue 19 (the first, tools/flare_replay.cc, streams a fixture's records
into flared without running anything). This one re-issues a fixture's recorded API sequence
against the simulated CUDA/cuBLAS/NCCL libraries, so that Flare's own hook, timing thread,
encoder and exporter meet the recorded launch pattern: its threads, streams, issue times,
durations, host synchronizations and traced Python spans.

Started by `flare-sim-train --trace FIXTURE [--ranks N] [--speed X] [--source-rank R]
[--rank-map A,B,...] [--repeat N [--warmup W]]` (one
process per rank, identity from RANK / WORLD_SIZE / LOCAL_RANK; the launcher sets up the sim
libraries and the NCCL rendezvous folder). FIXTURE is what flare-replay reads: a raw-mode spool
folder or its archive (converted with `flare-export --input`), or flare-export JSON lines
(`rank<R>.jsonl[.gz]`, or a folder of them: tests/fixtures/gpu/<fixture>/).

Per replayed rank (rank r replays recorded rank r when the fixture holds every rank of the
replay, else the lowest recorded rank or --source-rank, as a copy; --rank-map A,B,... names the
recorded rank of each, as flare-replay's does):

- one Python thread per recorded launching thread; the thread of the first DataLoader
  `__next__` span (else the lowest thread id) is the process's main thread;
- one simulated stream per recorded stream (0: the legacy default stream);
- every op at its recorded issue time relative to the rank's first record, divided by --speed
  (GPU durations too: FLARE_SIM_TIME_SCALE); late ops go at once, never skipped;
- kernels (and attention kernels) launched by their recorded (demangled) name, costed
  FLARE_SIM_COST_NANOS with their recorded GPU duration;
- GEMMs through cublasGemmEx / cublasGemmStridedBatchedEx / cublasLtMatmul / cublasSgemm /
  cublasHgemm with the recorded shape, dtype, transposes and leading dimensions, each running
  its recorded GPU duration (flareSimSetNextGemmNs; a shape's first call its warm median:
  recorded_gemm_ns), and the cold first call of a shape gets the fixture's median cold penalty
  (FLARE_SIM_COLD_GEMM_MS, unless set); the simulator's GEMM model, its peak fitted to the
  fixture's warm GEMMs (FLARE_SIM_PEAK_TFLOPS, unless set), times only a GEMM without a recorded
  duration; a GEMM of another name is a named kernel with its
  recorded duration, declared a GEMM with its FLOPs through flare_register_kernel_linear;
- memcpys and memsets with their bytes and direction (cudaMemcpyAsync / cudaMemsetAsync);
- host synchronizations at their times: cudaStreamSynchronize of the recorded stream,
  cudaDeviceSynchronize, cudaEventSynchronize of an event recorded on the thread's last stream,
  cudaStreamWaitEvent (the waiting stream is the one the thread's next op goes to, the event is
  recorded on the stream of the latest op issued on another stream: the records carry neither),
  flare_step markers;
- CUDA graph launches as launches of a graph captured before the clock starts (one per launch
  name: a kernel of the launches' median recorded duration);
- collectives as NCCL calls on communicators rebuilt across the replayed ranks when the replay
  has several ranks (the recorded communicators of a copied rank laid out as a grid, smallest
  first, as flare-replay does); with one rank, or a communicator that would have one member,
  as named kernels with the recorded duration; point-to-point calls always as named kernels;
- traced Python spans as calls of the stand-in torch's functions of the same qualified name
  (share/flare/torch_shim), whose bodies replay the span's own ops and last until its recorded
  end: the DataLoader's `_BaseDataLoaderIter.__next__` (the step boundary, as recorded),
  `torch.autograd.backward` (the engine's device thread waits out the span; the recorded
  backward thread launches its kernels meanwhile), `Optimizer.step` (AdamW's, its own kernels
  suppressed), `torch.save`, `torch.cuda.synchronize`; `sim_train`'s `_LoaderIter.__next__`
  and `injected_sync` (the Python sim workload's, traced when TRACED_PYTHON_API names them, as
  when they were recorded); `gc@collect` as gc.collect(generation) with automatic collection
  off. Other spans are not reproduced (counted in the summary line).

--repeat N plays the steps after the warm-up (W steps: loop.json's "warmup" beside a GPU
capture, else 0) N times in all, back to back (repeat_steps): a longer job of the fixture's
steady state, for what needs more steps than a capture holds (step sampling, the detectors'
windows).

At the end each rank prints one line `FLARE_TRACE_REPLAY {json}`: ops issued per kind, how GEMMs
were timed ("gemm_durations": recorded or model) and how many graphs were captured, spans
reproduced and skipped, how late the ops were issued against the schedule. See src/sim/README.md.
"""

import argparse
import collections
import gc
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_SPANS = ("torch.utils.data.dataloader._BaseDataLoaderIter@__next__",
              "sim_train@_LoaderIter.__next__")
CUBLAS_GEMMS = ("cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasLtMatmul", "cublasSgemm_v2",
                "cublasHgemm")
NCCL_CALLS = ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast",
              "ncclReduce", "ncclAlltoAll")
CUDA_TYPES = {"f32": 0, "f64": 1, "f16": 2, "i8": 3, "i32": 10, "bf16": 14, "e4m3": 28,
              "e5m2": 29}
NCCL_TYPES = {"i8": 0, "u8": 1, "i32": 2, "u32": 3, "i64": 4, "u64": 5, "f16": 6, "f32": 7,
              "f64": 8, "bf16": 9, "e4m3": 10, "e5m2": 11}
COPY_KINDS = {"HtoH": 0, "HtoD": 1, "DtoH": 2, "DtoD": 3}
MAX_COPY_BYTES = 1 << 30  # larger copies are replayed as named kernels (no such buffer here)


class TraceError(RuntimeError):
    pass


# ---- reading a fixture (the layouts flare-replay reads: tools/replay/fixture_reader.h) -------

def _jsonl_rank(name):
    """'rank3.jsonl.gz' -> 3, else None."""
    if not name.startswith("rank"):
        return None
    for tail in (".jsonl.gz", ".jsonl"):
        if name.endswith(tail) and name[4:-len(tail)].isdigit():
            return int(name[4:-len(tail)])
    return None


def _read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _export_spool(folder, flare_export):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.run([flare_export, "--input", folder], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env)
    if proc.returncode != 0:
        raise TraceError("flare-export --input %s failed: %s" % (folder, proc.stderr.strip()))
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def read_fixture(path, flare_export):
    """{recorded rank: [records]} in the fixture's order (flare-export's JSON objects)."""
    by_rank = collections.defaultdict(list)
    if os.path.isfile(path) and _jsonl_rank(os.path.basename(path)) is not None:
        records = _read_lines(path)
    elif os.path.isdir(path) and any(_jsonl_rank(n) is not None for n in os.listdir(path)):
        records = []
        for name in sorted(os.listdir(path), key=lambda n: (_jsonl_rank(n) is None, n)):
            if _jsonl_rank(name) is not None:
                records.extend(_read_lines(os.path.join(path, name)))
    elif os.path.isdir(path):
        records = _export_spool(path, flare_export)
    elif path.endswith((".tar.gz", ".tgz", ".tar.xz", ".tar.zst")):
        tmp = tempfile.mkdtemp(prefix="flare-trace-")
        try:
            flags = ["--zstd", "-xf"] if path.endswith(".zst") else \
                ["-xJf"] if path.endswith(".xz") else ["-xzf"]
            if subprocess.run(["tar"] + flags + [path, "-C", tmp]).returncode != 0:
                raise TraceError("cannot unpack " + path)
            records = _export_spool(tmp, flare_export)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        raise TraceError("not a fixture: %s (a spool folder or archive, or rank<R>.jsonl[.gz] "
                         "files)" % path)
    for r in records:
        if r.get("kind") == "summary":
            raise TraceError("%s holds summary-mode records; fixtures are raw mode" % path)
        by_rank[int(r.get("rank", 0))].append(r)
    if not by_rank:
        raise TraceError("no records in " + path)
    return dict(by_rank)


# ---- the plan: what each thread does, when ---------------------------------------------------

def _t(r):
    return r["start_ns"] if r["kind"] == "span" else r["issue_ns"]


def step_boundaries(records):
    """The recorded step boundaries (ns): the DataLoader calls' starts, else the flare_step
    markers' issue times."""
    loader = sorted(r["start_ns"] for r in records
                    if r["kind"] == "span" and r["name"] in STEP_SPANS)
    return loader or sorted(r["issue_ns"] for r in records
                            if r["kind"] == "sync" and r["name"] == "flare_step")


def fixture_warmup(path, rank):
    """The warm-up steps loop.json beside a GPU capture records for `rank` (0 without one)."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        with open(os.path.join(folder, "loop.json")) as f:
            ranks = json.load(f).get("ranks", {})
        return int((ranks.get(str(rank)) or {}).get("warmup", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


_TIMES = ("issue_ns", "start_ns", "end_ns")


def repeat_steps(records, warmup, repeat):
    """One rank's records with its steps after the first `warmup` played `repeat` times in all:
    a longer job of the same steady state (a fixture holds a few steps; step sampling and the
    detectors' windows need more). The steps from the boundary after the warm-up to the last
    boundary are copied back to back, each copy shifted by their span of time, its spans given
    ids of their own (children and lent ops follow their copy); what comes after the last
    boundary (the loop's end) follows the last copy; a span open across the whole window (an
    enclosing traced call) is stretched over the copies. The warm-up, with its cold first calls,
    is played once."""
    if repeat <= 1:
        return records
    bounds = step_boundaries(records)
    if len(bounds) < warmup + 2:
        raise TraceError("--repeat needs a step after the %d warm-up step(s): the fixture has "
                         "%d step boundaries" % (warmup, len(bounds)))
    lo, hi = bounds[warmup], bounds[-1]
    width = hi - lo
    spans = [r for r in records if r["kind"] == "span"]
    window_ids = {r["id"] for r in spans if lo <= r["start_ns"] < hi}
    id_stride = max([r["id"] for r in spans] + [0]) + 1

    def copy(r, k):
        c = dict(r)
        for key in _TIMES:
            if key in c:
                c[key] += k * width
        if c["kind"] == "span":
            if c["id"] in window_ids:
                c["id"] += k * id_stride
            if c.get("parent") in window_ids:
                c["parent"] += k * id_stride
        elif c.get("parent_span") in window_ids:
            c["parent_span"] += k * id_stride
        return c

    out = []
    for r in records:
        t = _t(r)
        if t < lo:
            if r["kind"] == "span" and r["end_ns"] >= hi:
                r = dict(r, end_ns=r["end_ns"] + (repeat - 1) * width,
                         duration_ns=r["duration_ns"] + (repeat - 1) * width)
            out.append(r)
        elif t >= hi:
            out.append(copy(r, repeat - 1))
        else:
            out.extend(copy(r, k) for k in range(repeat))
    return out


def _layout(layout):
    """'tn lda=2048 ldb=2048 ldc=6144 out=bf16' -> ('t', 'n', {'lda': '2048', ...})."""
    parts = (layout or "").split()
    trans = parts[0] if parts and len(parts[0]) == 2 else "nn"
    fields = dict(p.split("=", 1) for p in parts if "=" in p)
    return trans[0], trans[1], fields


def model_gemm_ns(m, n, k, batch, dtype, layout_fields, peak_tflops):
    """The simulator's GEMM duration (src/sim/gemm_model.cc, gemmDurationNs), without the time
    scale: used only to fit FLARE_SIM_PEAK_TFLOPS to a fixture's warm GEMMs."""
    import math
    flops = 2.0 * m * n * k * batch
    tiles = math.ceil(m / 128.0) * math.ceil(n / 128.0) * batch
    waves = math.ceil(tiles / 132.0)
    eff = 0.75 * max(tiles / (waves * 132.0), 0.05)
    size = {"f64": 8, "f32": 4, "i32": 4, "f16": 2, "bf16": 2}.get(dtype, 1)
    if any((d * size) % 128 for d in (m, n, k)):
        eff *= 0.5
    scale = {"e4m3": 2.0, "e5m2": 2.0, "i8": 2.0, "f32": 0.5, "f64": 0.067}.get(dtype, 1.0)
    return 3e3 + flops / (peak_tflops * 1e12 * scale * eff) * 1e9


def fit_gemm_settings(records):
    """(peak TFLOPS, cold ms) that make the simulator's GEMMs match the fixture's: the peak from
    the median ratio of warm calls to the model at 1 TFLOPS, the cold penalty from the median
    excess of each shape's first call over its warm median. None where nothing to fit."""
    calls = collections.defaultdict(list)
    for r in records:
        if r["kind"] == "gemm" and r["name"] in CUBLAS_GEMMS and len(r.get("shape") or []) >= 3:
            key = (r["name"], tuple(r["shape"]), r.get("dtype"), r.get("layout"))
            calls[key].append(r["duration_ns"])
    ratios, cold = [], []
    for (_, shape, dtype, layout), durs in calls.items():
        m, n, k = shape[:3]
        batch = shape[3] if len(shape) > 3 else 1
        work = model_gemm_ns(m, n, k, batch, dtype, _layout(layout)[2], 1.0) - 3e3
        warm = sorted(durs[1:])
        for d in warm:
            if d > 3e3 and work > 0:
                ratios.append(work / (d - 3e3))
        if warm:
            cold.append(durs[0] - warm[len(warm) // 2])
    peak = sorted(ratios)[len(ratios) // 2] if ratios else None
    cold_ms = None
    if cold:
        c = sorted(cold)[len(cold) // 2]
        cold_ms = c / 1e6 if c > 1e5 else 0.0  # below 0.1 ms: noise, no cold penalty
    return peak, cold_ms


def recorded_gemm_ns(records):
    """{id(record): the GPU duration the simulated library gives that cuBLAS call}: as recorded,
    except a shape's first call, which gets the shape's median warm duration (its recorded one
    holds the library's cold-start wait, which the simulator adds itself: FLARE_SIM_COLD_GEMM_MS,
    fitted by fit_gemm_settings). The simulator's GEMM model (tiles and alignment) would time
    them otherwise; on the H200 fixtures it put a weight-gradient shape ([768,768,8192] nt, split
    over K by the real cuBLAS) at 193 TFLOPS where the real one ran at 402."""
    calls = collections.defaultdict(list)
    for r in sorted((r for r in records if r["kind"] == "gemm" and r["name"] in CUBLAS_GEMMS
                     and len(r.get("shape") or []) >= 3), key=_t):
        calls[(r["name"], tuple(r["shape"]), r.get("dtype"), r.get("layout"))].append(r)
    out = {}
    for recs in calls.values():
        warm = sorted(int(r.get("duration_ns") or 0) for r in recs[1:])
        for i, r in enumerate(recs):
            ns = int(r.get("duration_ns") or 0) if i else (warm[len(warm) // 2] if warm else 0)
            if ns > 0:
                out[id(r)] = ns
    return out


class Plan:
    """One replayed rank's schedule, computed identically in every rank process."""

    def __init__(self, fixture, rank, world, source_rank, rank_map=None):
        ranks = sorted(fixture)
        self.exact = len(ranks) > 1 and len(ranks) == world and source_rank is None and \
            rank_map is None
        if rank_map is not None:
            if len(rank_map) != world:
                raise TraceError("--rank-map names %d ranks for a replay of %d"
                                 % (len(rank_map), world))
            if rank_map[rank] not in fixture:
                raise TraceError("--rank-map: no rank %d (the fixture holds %s)"
                                 % (rank_map[rank], ranks))
            self.source = rank_map[rank]
        elif self.exact:
            self.source = ranks[rank]
        elif source_rank is not None:
            if source_rank not in fixture:
                raise TraceError("no recorded rank %d (the fixture holds %s)"
                                 % (source_rank, ranks))
            self.source = source_rank
        else:
            self.source = ranks[0]
        self.records = fixture[self.source]
        self.t0 = min(_t(r) for r in self.records)
        self.t_end = max(r.get("end_ns", _t(r)) for r in self.records)
        spans = [r for r in self.records if r["kind"] == "span"]
        ops = sorted((r for r in self.records if r["kind"] != "span"), key=_t)
        threads = sorted({r["thread"] for r in self.records})
        loader = [s for s in spans if s["name"] in STEP_SPANS]
        self.main = min(loader, key=_t)["thread"] if loader else threads[0]
        self.threads = [self.main] + [t for t in threads if t != self.main]
        self.streams = sorted({r["stream"] for r in ops if r.get("stream")})
        self._wait_streams(ops)
        # Per thread: top-level events; a span's children are its own thread's events.
        self.span_by_id = span_by_id = {s["id"]: s for s in spans}
        self.children = collections.defaultdict(list)  # span id -> events
        self.top = collections.defaultdict(list)       # thread -> events
        for r in self.records:
            parent = r.get("parent") if r["kind"] == "span" else r.get("parent_span")
            owner = span_by_id.get(parent)
            if owner is not None and owner["thread"] == r["thread"]:
                self.children[owner["id"]].append(r)
            else:
                self.top[r["thread"]].append(r)
        for events in list(self.children.values()) + list(self.top.values()):
            events.sort(key=_t)
        # Ops another thread launched inside a span (lent to it: the autograd engine's device
        # thread while the main thread waits in backward): the span lasts until they are issued.
        self.lent = collections.Counter()
        for r in self.records:
            owner = span_by_id.get(r.get("parent_span")) if r["kind"] != "span" else None
            if owner is not None and owner["thread"] != r["thread"]:
                self.lent[owner["id"]] += 1
        self.comms = self._communicators(fixture, rank, world)

    def _wait_streams(self, ops):
        """cudaStreamWaitEvent and cudaEventSynchronize records carry no stream: the waiting
        stream is the one the same thread's next GPU op goes to, the event's stream the one of
        the latest op issued (by any thread) on another stream; an event synchronize waits for
        the thread's latest stream."""
        self.wait_of = {}  # id(record) -> (waiting stream, event stream)
        last_on = {}       # stream -> index in `ops` of its latest op
        thread_last = {}
        for i, r in enumerate(ops):
            if r["kind"] != "sync":
                last_on[r.get("stream", 0)] = i
                thread_last[r["thread"]] = r.get("stream", 0)
                continue
            if r["name"] == "cudaEventSynchronize":
                self.wait_of[id(r)] = (None, thread_last.get(r["thread"], 0))
            elif r["name"] == "cudaStreamWaitEvent":
                nxt = next((o for o in ops[i + 1:] if o["kind"] != "sync" and
                            o["thread"] == r["thread"]), None)
                waiting = nxt.get("stream", 0) if nxt else 0
                others = [(j, s) for s, j in last_on.items() if s != waiting]
                source = max(others)[1] if others else waiting
                self.wait_of[id(r)] = (waiting, source)

    def _communicators(self, fixture, rank, world):
        """{comm_hash: (key, nranks, rank in communicator)} for the communicators this rank
        joins; a hash not in the map is replayed as kernels."""
        first = collections.OrderedDict()
        for r in self.records:
            if r["kind"] == "collective" and r.get("comm_hash"):
                first.setdefault(r["comm_hash"], int(r.get("nranks") or 0))
        out = {}
        if world < 2:
            return out
        if self.exact:
            ranks = sorted(fixture)
            for h in first:
                members = [i for i, rr in enumerate(ranks)
                           if any(x.get("comm_hash") == h for x in fixture[rr])]
                if len(members) > 1 and rank in members:
                    out[h] = ("%s" % h, len(members), members.index(rank))
            return out
        stride = 1
        for h, n in sorted(first.items(), key=lambda kv: (kv[1], list(first).index(kv[0]))):
            s = min(n, world // stride)
            if s >= 2 and world % (stride * s) == 0:
                base = rank // (stride * s) * stride * s + rank % stride
                out[h] = ("%s-%d" % (h, base), s, (rank - base) // stride)
                stride *= s
            elif n >= world:  # as large as the job: every replayed rank
                out[h] = ("%s-all" % h, world, rank)
        return out


# ---- the replay ------------------------------------------------------------------------------

class Replayer:
    """Runs one rank's Plan against the simulated libraries (through the process's global
    symbol scope, so that the preloaded hook sees every call). Built and set up on the main
    thread (streams, buffers, communicators, kernel registrations: before the clock starts);
    `run` then replays the main thread's events itself and each other recorded thread's on a
    thread of its own. Shared state (kernel table, span bookkeeping, counters) is guarded by
    `lock` / `cond`; each replay thread has its own cuBLAS handles and event (`_tls`)."""

    def __init__(self, plan, speed, rank):
        import ctypes
        import sim_train as S
        sys.path.insert(0, os.path.join(HERE, "torch_shim"))
        import torch
        from torch import _sim
        self.ct, self.S, self.torch, self._sim = ctypes, S, torch, _sim
        self.plan, self.speed, self.rank = plan, speed, rank
        self.device = int(os.environ.get("LOCAL_RANK", rank)) % 8
        torch.cuda.set_device(self.device)
        c_void_p, c_int, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        fn = S._fn
        self.cudaStreamSynchronize = fn("cudaStreamSynchronize", c_int, c_void_p)
        self.cudaMemsetAsync = fn("cudaMemsetAsync", c_int, c_void_p, c_int, c_size_t, c_void_p)
        self.gemmStrided = fn("cublasGemmStridedBatchedEx", c_int, c_void_p, c_int, c_int, c_int,
                              c_int, c_int, c_void_p, c_void_p, c_int, c_int, ctypes.c_longlong,
                              c_void_p, c_int, c_int, ctypes.c_longlong, c_void_p, c_void_p,
                              c_int, c_int, ctypes.c_longlong, c_int, c_int, c_int)
        self.sgemm = fn("cublasSgemm_v2", c_int, c_void_p, c_int, c_int, c_int, c_int, c_int,
                        c_void_p, c_void_p, c_int, c_void_p, c_int, c_void_p, c_void_p, c_int)
        self.hgemm = fn("cublasHgemm", c_int, c_void_p, c_int, c_int, c_int, c_int, c_int,
                        c_void_p, c_void_p, c_int, c_void_p, c_int, c_void_p, c_void_p, c_int)
        self.ltCreate = fn("cublasLtCreate", c_int, ctypes.POINTER(c_void_p))
        self.ltDescCreate = fn("cublasLtMatmulDescCreate", c_int, ctypes.POINTER(c_void_p), c_int,
                               c_int)
        self.ltDescSet = fn("cublasLtMatmulDescSetAttribute", c_int, c_void_p, c_int, c_void_p,
                            c_size_t)
        self.ltLayoutCreate = fn("cublasLtMatrixLayoutCreate", c_int, ctypes.POINTER(c_void_p),
                                 c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64)
        self.ltLayoutSet = fn("cublasLtMatrixLayoutSetAttribute", c_int, c_void_p, c_int,
                              c_void_p, c_size_t)
        self.ltMatmul = fn("cublasLtMatmul", c_int, c_void_p, c_void_p, c_void_p, c_void_p,
                           c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                           c_void_p, c_void_p, c_void_p, c_size_t, c_void_p)
        self.nccl = {
            "ncclAllReduce": fn("ncclAllReduce", c_int, c_void_p, c_void_p, c_size_t, c_int,
                                c_int, c_void_p, c_void_p),
            "ncclReduceScatter": fn("ncclReduceScatter", c_int, c_void_p, c_void_p, c_size_t,
                                    c_int, c_int, c_void_p, c_void_p),
            "ncclAllGather": fn("ncclAllGather", c_int, c_void_p, c_void_p, c_size_t, c_int,
                                c_void_p, c_void_p),
            "ncclAlltoAll": fn("ncclAlltoAll", c_int, c_void_p, c_void_p, c_size_t, c_int,
                               c_void_p, c_void_p),
            "ncclBroadcast": fn("ncclBroadcast", c_int, c_void_p, c_void_p, c_size_t, c_int,
                                c_int, c_void_p, c_void_p),
            "ncclReduce": fn("ncclReduce", c_int, c_void_p, c_void_p, c_size_t, c_int, c_int,
                             c_int, c_void_p, c_void_p),
        }
        set_gemm = getattr(S._G, "flareSimSetNextGemmNs", None)
        if set_gemm is not None:
            set_gemm.restype, set_gemm.argtypes = None, [ctypes.c_int64]
        self.set_gemm_ns = set_gemm
        self.gemm_ns = recorded_gemm_ns(plan.records)
        self.flare_step = getattr(S._G, "flare_step", None)
        reg = getattr(S._G, "flare_register_kernel_linear", None)
        if reg is not None:
            reg.restype = c_int
            reg.argtypes = [ctypes.c_char_p, c_int] + [ctypes.c_double] * 4
        self.register_kernel = reg
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.opened = set()                       # spans whose body started
        self.lent_issued = collections.Counter()  # span id -> lent ops issued
        self.kernels = {}
        self.stats = collections.Counter()
        self.skipped_spans = collections.Counter()
        self.lateness = []
        self.step = 0
        self.step_t = None
        self._setup()

    # -- set-up (before the clock starts) --

    def _setup(self):
        S, ct, plan = self.S, self.ct, self.plan
        self.stream = {0: None}
        for s in plan.streams:
            self.stream[s] = self._sim.new_stream()
        copy_bytes = [r.get("bytes") or 0 for r in plan.records if r["kind"] in ("memcpy",
                                                                               "memset")]
        self.buf_bytes = min(max(copy_bytes + [4]), MAX_COPY_BYTES)
        self.dev = [ct.c_void_p(), ct.c_void_p()]
        for d in self.dev:
            S.check(S.cudaMalloc(ct.byref(d), self.buf_bytes), "cudaMalloc")
        self.host = [ct.create_string_buffer(self.buf_bytes) for _ in range(2)]
        self.alpha, self.beta = ct.c_float(1.0), ct.c_float(0.0)
        self.halpha = ct.c_uint16(0x3c00)  # 1.0 and 0.0 in fp16 (cublasHgemm)
        self.hbeta = ct.c_uint16(0)
        self.comm = {}
        for h in sorted(plan.comms):
            key, n, r = plan.comms[h]
            # sim_train's rendezvous (the unique id through FLARE_SIM_RDZV_DIR); it uses no
            # Model state.
            self.comm[h] = S.init_comm("trace-%s" % key, n, r)
        self.graph_exec = self._capture_graphs()
        for r in plan.records:  # every kernel registered before the clock starts
            if self._as_kernel(r):
                self._kernel(r["name"], r)

    def _capture_graphs(self):
        """{graph launch name: an instantiated CUDA graph}: one kernel running the median
        recorded duration of the name's launches, captured on a stream of its own, so that a
        recorded cudaGraphLaunch is a graph launch again (the hook's step rule takes one as
        training work: a step captured whole has no backward or optimizer call on the host).
        Empty when the simulated runtime has no graphs."""
        S, ct = self.S, self.ct
        durations = collections.defaultdict(list)
        for r in self.plan.records:
            if r["kind"] == "graph":
                durations[r["name"]].append(int(r.get("duration_ns") or 0))
        out = {}
        if not durations or not hasattr(S._G, "cudaGraphLaunch"):
            return out
        begin = S._fn("cudaStreamBeginCapture", ct.c_int, ct.c_void_p, ct.c_int)
        end = S._fn("cudaStreamEndCapture", ct.c_int, ct.c_void_p, ct.POINTER(ct.c_void_p))
        instantiate = S._fn("cudaGraphInstantiate", ct.c_int, ct.POINTER(ct.c_void_p),
                            ct.c_void_p, ct.c_ulonglong)
        self.cudaGraphLaunch = S._fn("cudaGraphLaunch", ct.c_int, ct.c_void_p, ct.c_void_p)
        stream = self._sim.new_stream()
        for name, durs in sorted(durations.items()):
            durs.sort()
            kernel = self.S.Kernel("%s_body_replayed" % name, 3)  # FLARE_SIM_COST_NANOS
            graph, exe = ct.c_void_p(), ct.c_void_p()
            S.check(begin(stream, 0), "cudaStreamBeginCapture")  # global mode, as PyTorch's
            kernel(durs[len(durs) // 2], stream)
            S.check(end(stream, ct.byref(graph)), "cudaStreamEndCapture")
            S.check(instantiate(ct.byref(exe), graph, 0), "cudaGraphInstantiate")
            out[name] = exe
        return out

    def _as_kernel(self, r):
        k = r["kind"]
        if k == "graph":
            return r["name"] not in self.graph_exec
        if k in ("kernel", "attention", "p2p"):
            return True
        if k == "gemm":
            return r["name"] not in CUBLAS_GEMMS or len(r.get("shape") or []) < 3
        if k == "collective":
            return r.get("comm_hash") not in self.comm or r["name"] not in NCCL_CALLS
        if k in ("memcpy", "memset"):
            return (r.get("bytes") or 0) > MAX_COPY_BYTES
        return False

    def _kernel(self, name, r):
        with self.lock:
            k = self.kernels.get(name)
            if k is None:
                k = self.kernels[name] = self.S.Kernel(name, 3)  # FLARE_SIM_COST_NANOS
                kind = {"gemm": 2, "attention": 3}.get(r["kind"])
                if kind and self.register_kernel is not None:
                    # Declared with the recorded kind and FLOPs per launch, as a program
                    # registers its custom kernels (include/flare/kernels.h).
                    self.register_kernel(name.encode(), kind, float(r.get("flops") or 0), 0.0,
                                         float(r.get("bytes") or 0), 0.0)
            return k

    # -- per thread --

    def _thread_state(self):
        tls = self._tls
        if not getattr(tls, "ready", False):
            self._sim._ensure_device()
            tls.blas = self.ct.c_void_p()
            self.S.check(self.S.cublasCreate(self.ct.byref(tls.blas)), "cublasCreate")
            tls.lt = None
            tls.event = self._sim.new_event()
            tls.ready = True
        return tls

    def at(self, t_ns):
        """Monotonic seconds at which recorded time t_ns is due."""
        return self.start + (t_ns - self.plan.t0) / 1e9 / self.speed

    def wait_until(self, t_ns, record_lateness=False):
        due = self.at(t_ns)
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        elif record_lateness:
            self.lateness.append(now - due)
        if record_lateness and due > now:
            self.lateness.append(0.0)

    def run_events(self, events):
        for r in events:
            if r["kind"] == "span":
                self.wait_until(r["start_ns"])
                self.span(r)
                continue
            self.wait_until(r["issue_ns"], True)
            lender = r.get("parent_span") in self.plan.lent and \
                self.plan.span_by_id[r["parent_span"]]["thread"] != r["thread"]
            if lender:  # nested under another thread's span: not before it opened
                with self.cond:
                    self.cond.wait_for(lambda: r["parent_span"] in self.opened, timeout=60)
            self.issue(r)
            if lender:
                with self.cond:
                    self.lent_issued[r["parent_span"]] += 1
                    self.cond.notify_all()

    def body(self, span):
        """The replay of a span's own events, then its recorded end, and not before the ops
        other threads launched inside it were issued."""
        def run():
            with self.cond:
                self.opened.add(span["id"])
                self.cond.notify_all()
            self.run_events(self.plan.children.get(span["id"], []))
            self.wait_until(span["end_ns"])
            want = self.plan.lent.get(span["id"], 0)
            if want:
                with self.cond:
                    self.cond.wait_for(lambda: self.lent_issued[span["id"]] >= want, timeout=60)
        return run

    # -- traced Python spans --

    def span(self, s):
        name, body = s["name"], self.body(s)
        self.stats["span " + name] += 1
        torch = self.torch
        if name in STEP_SPANS:
            self._step_boundary()
        if name == "torch.utils.data.dataloader._BaseDataLoaderIter@__next__":
            it = _LoaderIter(body)
            next(it)
        elif name == "sim_train@_LoaderIter.__next__":
            it = self.S._LoaderIter.__new__(self.S._LoaderIter)
            it.loader, it.i, it.batch = _SimLoader(body), 0, None
            next(it)
        elif name == "torch.autograd@backward":
            torch.autograd.backward(_GradTensor(body))
        elif name == "torch.optim.Optimizer@step":
            self._optimizer_step(body)
        elif name == "torch@save":
            torch.save(_BodyList(body), _NullFile())
        elif name in ("torch.cuda@synchronize", "sim_train@injected_sync"):
            rest = list(self.plan.children.get(s["id"], []))
            syncs = [r for r in rest if r.get("name") == "cudaDeviceSynchronize"]
            if syncs:  # the function issues it itself
                rest.remove(syncs[0])
                self.stats["sync"] += 1
            with self.cond:  # no body of ours runs inside: open for lent ops from here
                self.opened.add(s["id"])
                self.cond.notify_all()
            (torch.cuda.synchronize if name.startswith("torch") else
             self.S.injected_sync)()
            self.run_events(rest)
        elif name == "gc@collect":
            gc.collect(int(s.get("gc_generation", 0)))
            body()
        else:
            self.stats["span " + name] -= 1
            self.skipped_spans[name] += 1
            body()

    def _optimizer_step(self, body):
        """AdamW.step of the stand-in (traced as torch.optim.Optimizer@step), its own kernels
        suppressed: its only parameter runs the recorded body when AdamW reads its size."""
        _sim = self._sim
        with self.lock:
            if not hasattr(self, "_adamw"):
                from torch.optim import adamw
                for kernel_name in (adamw._STEP, adamw._ADAM):
                    _sim._kernels[kernel_name] = lambda amount, stream: None
                self._adamw = self.torch.optim.AdamW([])
        opt = self._adamw
        opt.param_groups[0]["params"] = [_BodyParam(body)]
        opt.step()

    def _step_boundary(self):
        now = time.monotonic()
        if self.step_t is not None:
            print('FLARE_SIM_STEP {"rank":%d,"step":%d,"step_ms":%.3f,"gemm_ms":0}'
                  % (self.rank, self.step, (now - self.step_t) * 1000), flush=True)
            self.step += 1
        self.step_t = now
        self.S.flareSimSetStep(self.step)

    # -- ops --

    def issue(self, r):
        S, ct = self.S, self.ct
        kind, name = r["kind"], r["name"]
        stream = self.stream.get(r.get("stream") or 0)
        tls = self._thread_state()
        if kind == "sync":
            self._sync(r, tls)
            return
        if self._as_kernel(r):
            k = self._kernel(name, r)
            k(max(0, int(r.get("duration_ns") or 0)), stream)
            self.stats["kernel (%s)" % kind if kind not in ("kernel", "attention") else kind] += 1
            return
        elif kind == "gemm":
            self._gemm(r, stream, tls)
        elif kind == "collective":
            self._collective(r, stream)
        elif kind == "graph":
            S.check(self.cudaGraphLaunch(self.graph_exec[name], stream), "cudaGraphLaunch")
        elif kind == "memcpy":
            direction = name.split()[-1] if name.startswith("Memcpy ") else "DtoD"
            ck = COPY_KINDS.get(direction, 3)
            dst = self.host[0] if ck in (0, 2) else self.dev[0]
            src = self.host[1] if ck in (0, 1) else self.dev[1]
            S.check(S.cudaMemcpyAsync(ct.cast(dst, ct.c_void_p), ct.cast(src, ct.c_void_p),
                                      int(r.get("bytes") or 0), ck, stream), "cudaMemcpyAsync")
        elif kind == "memset":
            S.check(self.cudaMemsetAsync(self.dev[0], 0, int(r.get("bytes") or 0), stream),
                    "cudaMemsetAsync")
        self.stats[kind] += 1

    def _sync(self, r, tls):
        S, name = self.S, r["name"]
        if name == "cudaStreamSynchronize":
            S.check(self.cudaStreamSynchronize(self.stream.get(r.get("stream") or 0)), name)
        elif name == "cudaDeviceSynchronize":
            S.check(S.cudaDeviceSynchronize(), name)
        elif name == "cudaEventSynchronize":
            _, source = self.plan.wait_of.get(id(r), (None, 0))
            S.check(S.cudaEventRecord(tls.event, self.stream.get(source)), "cudaEventRecord")
            S.check(S.cudaEventSynchronize(tls.event), name)
        elif name == "cudaStreamWaitEvent":
            waiting, source = self.plan.wait_of.get(id(r), (0, 0))
            S.check(S.cudaEventRecord(tls.event, self.stream.get(source)), "cudaEventRecord")
            S.check(S.cudaStreamWaitEvent(self.stream.get(waiting), tls.event, 0), name)
        elif name == "flare_step":
            if self.flare_step is not None:
                self.flare_step()
            if not any(s["name"] in STEP_SPANS for s in self.plan.records
                       if s["kind"] == "span"):
                self._step_boundary()
        else:
            self.stats["sync not replayed " + name] += 1
            return
        self.stats["sync"] += 1

    def _gemm(self, r, stream, tls):
        S, ct = self.S, self.ct
        shape = list(r["shape"]) + [1]
        m, n, k, batch = (int(x) for x in shape[:4])
        ta, tb, f = _layout(r.get("layout"))
        op = {"n": 0, "t": 1, "c": 2}
        a_type = CUDA_TYPES.get(r.get("dtype"), 14)
        c_type = CUDA_TYPES.get(f.get("out"), a_type)
        lda = int(f.get("lda", k if ta == "t" else m))
        ldb = int(f.get("ldb", n if tb == "t" else k))
        ldc = int(f.get("ldc", m))
        compute = {1: 70, 3: 72, 10: 72}.get(a_type, 68)  # CUBLAS_COMPUTE_64F/32I/32F
        name = r["name"]
        ns = self.gemm_ns.get(id(r))
        if ns and self.set_gemm_ns is not None:
            self.set_gemm_ns(ns)
        if name == "cublasLtMatmul":
            self._lt_matmul(r, stream, tls, (m, n, k, batch, ta, tb, a_type, c_type, lda, ldb,
                                             ldc))
            return
        S.check(S.cublasSetStream(tls.blas, stream), "cublasSetStream")
        a, b = ct.byref(self.alpha), ct.byref(self.beta)
        if name == "cublasGemmStridedBatchedEx":
            err = self.gemmStrided(tls.blas, op[ta], op[tb], m, n, k, a, None, a_type, lda, 0,
                                   None, a_type, ldb, 0, b, None, c_type, ldc, 0, batch,
                                   compute, -1)
        elif name == "cublasSgemm_v2":
            err = self.sgemm(tls.blas, op[ta], op[tb], m, n, k, a, None, lda, None, ldb, b, None,
                             ldc)
        elif name == "cublasHgemm":
            err = self.hgemm(tls.blas, op[ta], op[tb], m, n, k, ct.byref(self.halpha), None, lda,
                             None, ldb, ct.byref(self.hbeta), None, ldc)
        else:
            err = S.cublasGemmEx(tls.blas, op[ta], op[tb], m, n, k, a, None, a_type, lda, None,
                                 a_type, ldb, b, None, c_type, ldc, compute, -1)
        S.check(err, name)

    def _lt_matmul(self, r, stream, tls, g):
        S, ct = self.S, self.ct
        m, n, k, batch, ta, tb, a_type, c_type, lda, ldb, ldc = g
        if tls.lt is None:
            tls.lt = ct.c_void_p()
            S.check(self.ltCreate(ct.byref(tls.lt)), "cublasLtCreate")
        desc = ct.c_void_p()
        S.check(self.ltDescCreate(ct.byref(desc), 68, 0), "cublasLtMatmulDescCreate")
        for attr, t in ((3, ta), (4, tb)):  # CUBLASLT_MATMUL_DESC_TRANSA / TRANSB
            v = ct.c_int({"n": 0, "t": 1, "c": 2}[t])
            self.ltDescSet(desc, attr, ct.byref(v), 4)
        layouts = []
        for typ, rows, cols, ld in ((a_type, m if ta == "n" else k, k if ta == "n" else m, lda),
                                    (a_type, k if tb == "n" else n, n if tb == "n" else k, ldb),
                                    (c_type, m, n, ldc)):
            lay = ct.c_void_p()
            S.check(self.ltLayoutCreate(ct.byref(lay), typ, rows, cols, ld),
                    "cublasLtMatrixLayoutCreate")
            if batch > 1:
                v = ct.c_int(batch)
                self.ltLayoutSet(lay, 5, ct.byref(v), 4)  # CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
            layouts.append(lay)
        a, b, d = layouts
        S.check(self.ltMatmul(tls.lt, desc, ct.byref(self.alpha), None, a, None, b,
                              ct.byref(self.beta), None, d, None, d, None, None, 0, stream),
                "cublasLtMatmul")

    def _collective(self, r, stream):
        S = self.S
        comm = self.comm[r["comm_hash"]]
        count = int((r.get("shape") or [0])[0])
        dtype = NCCL_TYPES.get(r.get("dtype"), 9)
        f, name = self.nccl[r["name"]], r["name"]
        if name in ("ncclAllReduce", "ncclReduceScatter"):
            err = f(None, None, count, dtype, 0, comm, stream)
        elif name in ("ncclAllGather", "ncclAlltoAll"):
            err = f(None, None, count, dtype, comm, stream)
        elif name == "ncclBroadcast":
            err = f(None, None, count, dtype, 0, comm, stream)
        else:  # ncclReduce
            err = f(None, None, count, dtype, 0, 0, comm, stream)
        S.check_nccl(err, name)

    # -- the whole replay --

    def _common_start(self, world):
        """Monotonic time at which every replayed rank starts its clock: ranks set up at their
        own pace (reading the fixture, communicators), and a collective would otherwise find
        its peers' schedules shifted by that difference. A file barrier in the launcher's
        rendezvous folder; 0.1 s after the last rank is ready."""
        folder = os.environ.get("FLARE_SIM_RDZV_DIR")
        if world < 2 or not folder:
            return time.monotonic() + 0.05
        run = os.environ.get("FLARE_SIM_RUN_ID", "")
        path = os.path.join(folder, "trace-ready-%s-%d" % (run, self.rank))
        with open(path + ".tmp", "w") as f:
            f.write("%.6f" % time.time())
        os.rename(path + ".tmp", path)
        deadline = time.monotonic() + 120
        while True:
            stamps = []
            for r in range(world):
                try:
                    with open(os.path.join(folder, "trace-ready-%s-%d" % (run, r))) as f:
                        stamps.append(float(f.read()))
                except (OSError, ValueError):
                    break
            if len(stamps) == world:
                return time.monotonic() + (max(stamps) + 0.1 - time.time())
            if time.monotonic() > deadline:
                raise TraceError("timed out waiting for the other ranks to be ready")
            time.sleep(0.002)

    def run(self, world):
        self._tls = threading.local()
        plan = self.plan
        self.start = self._common_start(world)
        errors = []

        def worker(tid):
            try:
                self.run_events(plan.top.get(tid, []))
            except BaseException as e:  # noqa: B902 - reported by the main thread
                errors.append((tid, e))

        others = []
        for tid in plan.threads[1:]:
            backward = any(plan.top.get(tid)) and all(
                r["kind"] == "span" or _parent_name(plan, r) == "torch.autograd@backward"
                for r in plan.top[tid])
            name = "replay-autograd-%d" % tid if backward else "replay-%d" % tid
            others.append(threading.Thread(target=worker, args=(tid,), name=name, daemon=True))
        for t in others:
            t.start()
        worker(plan.main)
        for t in others:
            t.join()
        if errors:
            tid, e = errors[0]
            raise TraceError("thread %d: %s" % (tid, e))
        self.wait_until(plan.t_end)  # the last GPU work completes before the process exits
        if self.step_t is not None:
            print('FLARE_SIM_STEP {"rank":%d,"step":%d,"step_ms":%.3f,"gemm_ms":0}'
                  % (self.rank, self.step, (time.monotonic() - self.step_t) * 1000), flush=True)


def _parent_name(plan, r):
    s = plan.span_by_id.get(r.get("parent_span"))
    return s["name"] if s else None


# ---- bodies handed to the stand-in torch's traced functions -------------------------------

def _make_loader_iter():
    from torch.utils.data import dataloader

    class LoaderIter(dataloader._BaseDataLoaderIter):
        """A DataLoader iterator whose batch is the replay of the recorded `__next__` body; the
        traced code is the base class's `__next__`."""

        def __init__(self, body):  # no loader: nothing but the body
            self._index = self._num_yielded = 0
            self._body = body

        def _next_data(self):
            self._body()
    return LoaderIter


_LOADER_ITER = []


def _LoaderIter(body):
    if not _LOADER_ITER:
        _LOADER_ITER.append(_make_loader_iter())
    return _LOADER_ITER[0](body)


class _SimLoader:
    """sim_train's SyntheticLoader as `_LoaderIter.__next__` reads it: the step count is read
    first, inside the traced call, and runs the body; no data wait of its own."""
    data_ms = 0.0

    def __init__(self, body):
        self._body = body

    @property
    def steps(self):
        self._body()
        return 1 << 62


class _GradTensor:
    """A loss whose backward graph is one node: waiting out the recorded span on the engine's
    device thread while the main thread waits in torch.autograd.backward."""

    def __init__(self, body):
        self.grad_fn = [body]


class _BodyParam:
    """AdamW.step's only parameter: reading its size runs the recorded body; it has none."""

    def __init__(self, body):
        self._body = body

    @property
    def nbytes(self):
        self._body()
        return 0


class _BodyList(list):
    """torch.save's object: walking it for tensors runs the recorded body; it holds none."""

    def __init__(self, body):
        super().__init__()
        self._body = body

    def __iter__(self):
        self._body()
        return iter(())


class _NullFile:
    def write(self, data):
        return len(data)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, help="the fixture")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--source-rank", type=int, default=None)
    p.add_argument("--rank-map", default=None,
                   help="the recorded rank each replayed rank replays, e.g. 0,0,0,1")
    p.add_argument("--steps", type=int, default=0, help="ignored (the fixture's steps)")
    p.add_argument("--repeat", type=int, default=1,
                   help="play the steps after the warm-up this many times (repeat_steps)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps played once (default: the fixture's loop.json, else 0)")
    p.add_argument("--flare-export",
                   default=os.path.join(HERE, os.pardir, os.pardir, "bin", "flare-export"))
    args = p.parse_args(argv)
    if not args.speed > 0:
        raise TraceError("--speed must be positive")
    if args.repeat < 1 or (args.warmup is not None and args.warmup < 0):
        raise TraceError("--repeat must be at least 1 and --warmup at least 0")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fixture = read_fixture(args.trace, args.flare_export)
    for r in fixture:
        warmup = args.warmup if args.warmup is not None else fixture_warmup(args.trace, r)
        fixture[r] = repeat_steps(fixture[r], warmup, args.repeat)
    rank_map = None
    if args.rank_map is not None:
        try:
            rank_map = [int(x) for x in args.rank_map.split(",")]
        except ValueError:
            raise TraceError("--rank-map takes recorded ranks, comma-separated: %r"
                             % args.rank_map)
    plan = Plan(fixture, rank, world, args.source_rank, rank_map)
    # Settings the simulated libraries read at their first use: before they are loaded.
    peak, cold_ms = fit_gemm_settings(plan.records)
    scale = float(os.environ.get("FLARE_SIM_TIME_SCALE", "1") or 1)
    if peak and "FLARE_SIM_PEAK_TFLOPS" not in os.environ:
        # The simulator scales a GEMM by FLARE_SIM_TIME_SCALE twice (gemm_model.cc's duration,
        # then the core's cost of the kernel it launches): a peak slower by the --speed factor
        # makes its work 1/speed of the recorded one (the 3 us overhead comes out 1/speed^2).
        os.environ["FLARE_SIM_PEAK_TFLOPS"] = "%.6g" % (peak / args.speed)
    if cold_ms is not None and "FLARE_SIM_COLD_GEMM_MS" not in os.environ:
        os.environ["FLARE_SIM_COLD_GEMM_MS"] = "%.6g" % (cold_ms / args.speed)
    # Recorded kernel durations already hold their first launch's wait.
    os.environ["FLARE_SIM_FIRST_LAUNCH_MS"] = "0"
    os.environ["FLARE_SIM_TIME_SCALE"] = "%.9g" % (scale / args.speed)
    traced = set(filter(None, os.environ.get("TRACED_PYTHON_API", "").split(",")))
    missing = sorted({r["name"] for r in plan.records if r["kind"] == "span" and
                      r["name"].startswith("sim_train@")} - traced)
    if missing:
        sys.stderr.write("flare-sim (trace) rank %d: spans %s are traced only when "
                         "TRACED_PYTHON_API names them (as when recorded)\n"
                         % (rank, ",".join(missing)))
    gc.disable()  # collections happen where the fixture had them (gc@collect spans)
    replayer = Replayer(plan, args.speed, rank)
    replayer.run(world)
    late = sorted(replayer.lateness)
    summary = {
        "rank": rank, "source_rank": plan.source, "fixture": args.trace,
        "threads": len(plan.threads), "streams": len(plan.streams),
        "communicators": len(plan.comms),
        "step_boundaries": replayer.step + (replayer.step_t is not None),
        "repeat": args.repeat,
        "issued": dict(sorted(replayer.stats.items())),
        "spans_not_reproduced": dict(replayer.skipped_spans),
        "late_ms_median": round(late[len(late) // 2] * 1e3, 3) if late else 0,
        "late_ms_p99": round(late[int(len(late) * 0.99)] * 1e3, 3) if late else 0,
        "gemm_peak_tflops": os.environ.get("FLARE_SIM_PEAK_TFLOPS"),
        # How the GEMMs were timed and the graphs replayed: said, so that a simulated library
        # without flareSimSetNextGemmNs or graphs does not pass for a faithful replay.
        "gemm_durations": "recorded" if replayer.set_gemm_ns is not None else "model",
        "graphs_captured": len(replayer.graph_exec),
        "cold_gemm_ms": os.environ.get("FLARE_SIM_COLD_GEMM_MS"),
    }
    print("FLARE_TRACE_REPLAY " + json.dumps(summary, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TraceError as e:
        sys.stderr.write("flare-sim (trace) rank %s: %s\n" % (os.environ.get("RANK", "0"), e))
        sys.exit(2)
    except RuntimeError as e:  # sim_train.SimError
        sys.stderr.write("flare-sim (trace) rank %s: %s\n" % (os.environ.get("RANK", "0"), e))
        sys.exit(1)
