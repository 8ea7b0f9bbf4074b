#!/usr/bin/env python3
"""Flare's GPU overhead benchmark (issue 19, acceptance part d): bare, Flare summary mode, Flare
raw mode and torch.profiler, side by side, designed to resolve a 0.5% overhead.

What makes a 0.5% difference visible (the first H100 run's bare arm alone ranged 26.7-31.0 ms
between process-per-repetition runs):
  - one long-lived process per arm (overhead_worker.py), each with its own CUDA context, all
    built and warmed up once per workload; only one measures at a time, the others wait idle on
    a pipe;
  - many short interleaved windows: a round runs every arm once for --window-s seconds, in a
    shuffled order (seeded), and rounds repeat until the workload's share of --budget-s is
    spent, so drift of the machine (clocks, thermals) hits every arm alike;
  - every arm measures on the same CPU cores (--cpus): a worker moves all its threads (Flare's
    included) onto them for its window and back onto --idle-cpus after it, so the waiting arms
    stay off the measurement cores; the same torch.set_num_threads everywhere;
  - the overhead of an arm is the median over rounds of (its mean step time in the window / the
    bare arm's in the same round), with a bootstrap 95% interval over rounds (resampling rounds,
    --boot times). The verdict needs the interval to be narrower than the budget.

Workloads (overhead_worker.py): gpt-small, gpt-medium, gpt-large, launch-bound (~300 kernels of
5-20 us per step), cuda-graph (a whole captured step), compile (torch.compile, Triton). Budgets
(issue 19): summary mode under 0.5% on the GPT sizes, under 2% on launch-bound.

Run (GPU machine): python3 tests/gpu/bench/overhead.py --build KIT --budget-s 540 --json o.json
Results are written after every workload, so a run cut short keeps what it measured. --worker
replaces the worker (the harness's own test drives a stand-in that needs no GPU).
"""

import argparse
import atexit
import json
import os
import random
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_readings import cpu_mhz, cpu_times, steal_pct

HERE = os.path.dirname(os.path.abspath(__file__))
# flare-summary: summary mode as a job gets it (the hook's defaults).
ARMS = ("bare", "flare-summary", "flare-raw", "torch-profiler")
# Also selectable with --arms: summary mode with every op of every step timed (-exact:
# FLARE_TIMING_BUDGET_PCT=0), with one CUDA event per op (FLARE_TIMING=end), with 1-in-N timing
# of plain kernel launches (FLARE_SAMPLE_KERNELS=--sample-kernels), and with that and GEMMs,
# copies and sets sampled per signature too (-sampled-all: FLARE_SAMPLE_CALLS, same N), with
# step sampling (-steps) and with the budget set and every choice of K logged (-budget). The
# hook refuses FLARE_TIMING=end with sampling, so those do not combine.
EXTRA_ARMS = ("flare-summary-end", "flare-summary-sampled", "flare-summary-sampled-all",
              "flare-summary-steps", "flare-summary-budget", "flare-summary-exact")
WORKLOADS = ("gpt-small", "gpt-medium", "gpt-large", "launch-bound", "cuda-graph", "compile")
BUDGET_PCT = {"gpt-small": 0.5, "gpt-medium": 0.5, "gpt-large": 0.5, "launch-bound": 2.0}

# The hook's log lines that say what timing every op costs (FLARE_TIMING_BUDGET_PCT, src/hook/
# step.cc: the first choice at info, later ones at debug) and the event gap it measured
# (src/timing/tracer_poller.cc). The -budget arm logs both, so that each workload's entry can set
# the hook's own estimate of exact timing's cost beside the flare-summary-exact arm's measured one.
BUDGET_LINE = re.compile(r"timing every op costs ([0-9.]+)% of a step here \(([0-9.]+)% the "
                         r"launching threads' time, ([0-9.]+)% the GPU time of the event "
                         r"records\); timing one step in ([0-9]+)")
EVENT_GAP_LINE = re.compile(r"two CUDA events queued back to back run ([0-9]+) ns apart")


def budget_choices(text):
    """The timing budget's choices in a hook log, in order: [{cost_pct, host_pct, gpu_pct, k}]."""
    return [{"cost_pct": float(m.group(1)), "host_pct": float(m.group(2)),
             "gpu_pct": float(m.group(3)), "k": int(m.group(4))}
            for m in BUDGET_LINE.finditer(text)]


def read_text(path):
    """A worker's log ("" when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


# What the machine did while each window ran (Clocks): the GPU's SM and memory clocks, its
# temperature, power and throttle reasons (nvidia-smi's own loop, 5 readings a second, on the
# idle cores), and the measurement cores' CPU frequency; beside them the share of those cores'
# time the hypervisor stole (steal_pct, /proc/stat) and the worker's main thread's wait for a
# CPU (run_delay_pct, its schedstat; the worker reports it). Run 4 on the H200 (2026-11-28) had the
# bare arm's window mean move in regimes (launch-bound 2.5 -> 3.8 ms for ten rounds, gpt-small
# 23.5 -> 27 ms), which the per-round ratio cancels only in part: these say whether clocks moved.
SMI_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw",
              "clocks_throttle_reasons.active")
SMI_KEYS = ("sm_mhz", "mem_mhz", "gpu_temp_c", "power_w", "throttle")


class Clocks:
    """Readings of the GPU (nvidia-smi -lms) and of the measurement cores' frequency, each with
    its monotonic time, taken by a thread and a child process for the whole run; window(t0, t1)
    averages those inside a window. `note` says what could not be recorded."""

    def __init__(self, smi, cpus, idle_cpus, period_ms=200):
        self.readings, self.cpu, self.note = [], [], []
        self.lock, self.stop_flag = threading.Lock(), threading.Event()
        self.proc = None
        path = shutil.which(smi) if smi else None
        if path is None:
            self.note.append("GPU clocks not recorded (%s)" % (
                "--nvidia-smi ''" if not smi else "%s not found" % smi))
        else:
            cmd = [path, "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits",
                   "-lms", str(period_ms)]
            if idle_cpus and shutil.which("taskset"):
                cmd = ["taskset", "-c", ",".join(str(c) for c in idle_cpus)] + cmd
            try:
                self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True, bufsize=1)
                threading.Thread(target=self._read_smi, daemon=True).start()
            except OSError as e:
                self.note.append("GPU clocks not recorded (%s: %s)" % (path, e))
        self.cpus = cpus or sorted(os.sched_getaffinity(0))
        if cpu_mhz(self.cpus) is None:
            self.note.append("CPU frequency not recorded (no cpufreq, no /proc/cpuinfo MHz)")
        else:
            threading.Thread(target=self._read_cpu, args=(period_ms / 1000.0,),
                             daemon=True).start()

    def _read_smi(self):
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(SMI_FIELDS):
                continue
            row = {}
            for key, value in zip(SMI_KEYS, parts):
                try:
                    row[key] = int(value, 16) if key == "throttle" else float(value)
                except ValueError:  # "[N/A]", "[Not Supported]"
                    pass
            with self.lock:
                self.readings.append((time.monotonic(), row))

    def _read_cpu(self, period):
        while not self.stop_flag.wait(period):
            mhz = cpu_mhz(self.cpus)
            if mhz is not None:
                with self.lock:
                    self.cpu.append((time.monotonic(), mhz))

    def window(self, t0, t1):
        """The readings' means within [t0, t1] (throttle: every reason seen, OR-ed)."""
        with self.lock:
            rows = [r for t, r in self.readings if t0 <= t <= t1]
            cpu = [m for t, m in self.cpu if t0 <= t <= t1]
        out = {}
        for key in SMI_KEYS:
            vals = [r[key] for r in rows if key in r]
            if vals and key == "throttle":
                reasons = 0
                for v in vals:
                    reasons |= int(v)
                out[key] = "0x%x" % reasons
            elif vals:
                out[key] = round(sum(vals) / len(vals), 1)
        if cpu:
            out["cpu_mhz"] = round(sum(cpu) / len(cpu), 1)
        return out

    def close(self):
        if self.stop_flag.is_set():
            return
        self.stop_flag.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.proc is not None and not self.readings:
            self.note.append("nvidia-smi gave no reading")


def unread_notes(windows):
    """What the windows lack of the machine's readings that a window takes itself (the clocks
    say theirs): the cores' stolen time (/proc/stat) and the worker's wait for a CPU (its
    schedstat). Said once under the table, so that a missing column is not read as none."""
    if not windows:
        return []
    notes = []
    if not any("steal_pct" in w for w in windows):
        notes.append("stolen CPU time not recorded (/proc/stat unreadable, or without the "
                     "measurement cores)")
    if not any("run_delay_pct" in w for w in windows):
        notes.append("the worker's wait for a CPU not recorded (no /proc/thread-self/schedstat "
                     "in the worker)")
    return notes


def correlation(xs, ys):
    """Pearson's r of two equal-length lists, or None (fewer than 5 pairs, or no spread)."""
    if len(xs) < 5:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def noise(workload, windows, arms):
    """What limits the interval: per arm, the spread of its per-round ratio to bare and the
    rounds an interval narrower than the budget would need at that spread (the median's
    standard error is ~1.2533 sd / sqrt(n); a 95% interval ~2 x 1.96 of it); the bare arm's own
    spread; and how its window times follow the clocks."""
    rounds = {}
    for w in windows:
        rounds.setdefault(w["round"], {})[w["arm"]] = w
    bare = [r["bare"] for r in rounds.values() if "bare" in r]
    out = {}
    if len(bare) >= 2:
        means = [w["mean_ms"] for w in bare]
        out["bare_cv_pct"] = 100 * statistics.stdev(means) / statistics.fmean(means)
    budget = BUDGET_PCT.get(workload)
    per_arm = {}
    for arm in arms:
        ratios = [r[arm]["mean_ms"] / r["bare"]["mean_ms"] for r in rounds.values()
                  if arm != "bare" and arm in r and "bare" in r]
        if len(ratios) < 2:
            continue
        sd = 100 * statistics.stdev(ratios)
        row = {"ratio_sd_pct": sd}
        if budget:
            row["rounds_for_budget"] = int((2 * 1.96 * 1.2533 * sd / budget) ** 2) + 1
        per_arm[arm] = row
    if per_arm:
        out["arms"] = per_arm
    for key in ("sm_mhz", "cpu_mhz", "gpu_temp_c", "power_w", "steal_pct", "run_delay_pct"):
        pairs = [(w["mean_ms"], w[key]) for w in bare if key in w]
        if not pairs:
            continue
        vals = [v for _, v in pairs]
        out.setdefault("clocks", {})[key] = {
            "min": min(vals), "max": max(vals),
            "r_with_bare_step": correlation([m for m, _ in pairs], vals)}
    throttled = sorted({w["throttle"] for w in windows if w.get("throttle") not in (None, "0x0")})
    if throttled:
        out["throttle_reasons_seen"] = throttled
    return out


class Worker:
    """One arm's process for one workload: a job is one process, so each workload starts fresh
    ones (step sampling's state, the timing budget's K, the hook's signatures and event pool
    begin anew, as they do in a job; one process running every workload carried launch-bound's
    explicit step markers into the GPT loops, whose DataLoader steps they then hid: H200,
    2026-11-28)."""

    def __init__(self, args, arm, workdir, workload):
        self.arm, self.error = arm, None
        self.spool = os.path.join(workdir, "spool-%s-%s" % (arm, workload))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FLARE_") or k == "FLARE_BUILD_DIR"}
        env.pop("LD_PRELOAD", None)
        env.pop("TRACED_PYTHON_API", None)
        if arm.startswith("flare-"):
            env.update(LD_PRELOAD=os.path.join(args.build, "lib", "libflare_hook.so"),
                       FLARE_OUTPUT_DIR=self.spool, FLARE_JOB_ID="overhead-%s-%s" % (arm, workload),
                       FLARE_MODE=arm.split("-")[1])
            if arm.endswith("-end"):
                env["FLARE_TIMING"] = "end"
            if arm.endswith("-sampled") or arm.endswith("-sampled-all"):
                env["FLARE_SAMPLE_KERNELS"] = str(args.sample_kernels)
            if arm.endswith("-sampled-all"):
                env["FLARE_SAMPLE_CALLS"] = str(args.sample_kernels)
            if arm.endswith("-steps"):  # step sampling: every op of one step in K timed
                env["FLARE_SAMPLE_STEPS"] = str(args.sample_steps)
            if arm.endswith("-exact"):  # every op of every step timed (the default budget off)
                env["FLARE_TIMING_BUDGET_PCT"] = "0"
            if arm.endswith("-budget"):  # step sampling with K from the measured timing cost
                env["FLARE_TIMING_BUDGET_PCT"] = str(args.timing_budget)
                # Every choice of K, not only the first (two debug lines in all of hook and
                # timing, neither per op), and the event gap.
                env.update(FLARE_LOG_LEVEL="debug", FLARE_LOG_SUBSYSTEMS="hook,timing")
        cmd = [sys.executable, args.worker, "--threads", str(args.threads)]
        if arm == "torch-profiler":
            cmd.append("--profiler")
        if args.cpus and shutil.which("taskset"):  # loading: spread over every core given
            cmd = ["taskset", "-c", ",".join(str(c) for c in sorted(set(args.cpu_set) |
                                                                   set(args.idle_set)))] + cmd
        self.log_path = os.path.join(workdir, "%s-%s.log" % (arm, workload))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)

    def send(self, **req):
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:  # a worker that is gone (broken pipe)
            self.kill("cannot send to it (%s; exit %s)" % (e, self.proc.poll()))
            raise RuntimeError(self.error)

    def receive(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], max(0.1, timeout))
        line = self.proc.stdout.readline() if ready else ""
        if not line and ready:  # its output closed: the worker is gone
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.kill("its worker is gone (exit %s)" % self.proc.poll())
            raise RuntimeError(self.error)
        if not line:
            self.kill("no answer within %.0f s (exit %s)" % (timeout, self.proc.poll()))
            raise RuntimeError(self.error)
        rep = json.loads(line)
        if not rep.get("ok"):
            raise RuntimeError(rep.get("error", "failed"))
        return rep

    def request(self, timeout, **req):
        self.send(**req)
        return self.receive(timeout)

    def kill(self, why):
        if self.error is None:
            try:  # the worker's own last words (its log goes away with the temporary folder)
                with open(self.log_path, errors="replace") as f:
                    tail = " // ".join(f.read()[-800:].strip().splitlines())
            except OSError:
                tail = ""
            self.error = "%s: %s%s" % (self.arm, why, " [log: ...%s]" % tail if tail else "")
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)  # reaped: poll() says it is gone from now on
            except subprocess.TimeoutExpired:
                pass

    def quit(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
            except (OSError, ValueError, RuntimeError):
                pass

    def close(self, deadline):
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_list(text):
    """'2-9,12' -> [2, 3, ..., 9, 12]; '' -> []."""
    out = []
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return sorted(set(out))


def bootstrap(ratios, boot, rng):
    """Median of the ratios and its percentile-bootstrap 95% interval (resampling rounds)."""
    s = sorted(ratios)
    med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    if len(s) < 2:
        return med, None, None
    meds = []
    for _ in range(boot):
        r = sorted(rng.choice(s) for _ in s)
        meds.append(r[len(r) // 2] if len(r) % 2 else (r[len(r) // 2 - 1] + r[len(r) // 2]) / 2)
    meds.sort()
    return med, meds[int(0.025 * (boot - 1))], meds[int(0.975 * (boot - 1))]


def summarize(workload, windows, arms, boot, seed):
    """Per arm: overhead median and 95% interval over rounds, step time, RSS, spool volume."""
    rng = random.Random(seed)
    rounds = {}
    for w in windows:
        rounds.setdefault(w["round"], {})[w["arm"]] = w
    rows = {}
    for arm in arms:
        mine = [r[arm] for r in rounds.values() if arm in r]
        if not mine:
            continue
        means = sorted(w["mean_ms"] for w in mine)
        row = {"rounds": len(mine), "step_ms": means[len(means) // 2],
               "steps": sum(w["steps"] for w in mine)}
        ratios = [r[arm]["mean_ms"] / r["bare"]["mean_ms"] for r in rounds.values()
                  if arm in r and "bare" in r]
        if arm != "bare" and ratios:
            med, lo, hi = bootstrap(ratios, boot, rng)
            row.update(overhead_pct=100 * (med - 1),
                       ci95_pct=None if lo is None else [100 * (lo - 1), 100 * (hi - 1)])
            bare_rss = [r["bare"]["rss_kib"] for r in rounds.values() if "bare" in r]
            row["added_rss_mib"] = (sorted(w["rss_kib"] for w in mine)[len(mine) // 2] -
                                    sorted(bare_rss)[len(bare_rss) // 2]) / 1024
            budget = BUDGET_PCT.get(workload)
            if budget is not None and arm == "flare-summary":
                row["budget_pct"] = budget
                ci = row["ci95_pct"]
                row["resolved"] = ci is not None and ci[1] - ci[0] < budget
                row["within_budget"] = (ci[1] if ci else row["overhead_pct"]) < budget
        rows[arm] = row
    return rows


def markdown(device, summary, meta):
    lines = ["GPU: %s. %s rounds of %.2f s windows per arm, interleaved; measured on CPUs %s "
             "(waiting on %s), %d torch threads; overhead = median over rounds of mean step time "
             "/ bare's, [bootstrap 95%%]." % (device, meta["rounds_note"], meta["window_s"],
                                               meta["cpus"] or "not pinned",
                                               meta["idle_cpus"] or "any", meta["threads"]), "",
             "| workload | arm | step (ms) | overhead [95% CI] | rounds | added RSS (MiB) | "
             "spool B/step | budget | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for workload, entry in summary.items():
        if "error" in entry and not entry.get("arms"):
            lines.append("| %s | — | — | — | — | — | — | — | %s |" % (workload, entry["error"]))
            continue
        for arm, row in entry["arms"].items():
            ov = "—"
            if "overhead_pct" in row:
                ci = row.get("ci95_pct")
                ov = "%+.2f%%" % row["overhead_pct"] + (" [%+.2f, %+.2f]" % tuple(ci) if ci
                                                         else "")
            verdict = "—"
            if "resolved" in row:
                verdict = ("%s, %s" % ("within" if row["within_budget"] else "OVER",
                                       "resolved" if row["resolved"] else "NOT resolved"))
            sp = entry.get("spool_bytes_per_step", {}).get(arm)
            lines.append("| %s | %s | %.3f | %s | %d | %s | %s | %s | %s |" % (
                workload, arm, row["step_ms"], ov, row["rounds"],
                "—" if "added_rss_mib" not in row else "%.1f" % row["added_rss_mib"],
                "—" if sp is None else "%.0f" % sp,
                "%.1f%%" % row["budget_pct"] if "budget_pct" in row else "—", verdict))
        for what in [entry.get("error")] + ["%s failed: %s" % kv for kv in
                                            entry.get("arm_errors", {}).items()]:
            if what:
                lines.append("| %s | | | | | | | | %s |" % (workload, what[:300]))
    notes = []
    for workload, entry in summary.items():
        for arm, tb in entry.get("timing_budget", {}).items():
            c = tb.get("in_force")
            # Exact timing's measured cost: the -exact arm's (flare-summary is the default
            # budget since 2026-11-28, not exact timing).
            exact_arm = "flare-summary-exact"
            exact = entry.get("arms", {}).get(exact_arm, {}).get("overhead_pct")
            notes.append("- %s, %s: %s%s%s" % (
                workload, arm,
                "the hook said nothing of its timing cost" if not c else
                "the hook's estimate of timing every op: %.2f%% of a step (launching threads "
                "%.2f%%, event records' GPU time %.2f%%), K = %d%s" % (
                    c["cost_pct"], c["host_pct"], c["gpu_pct"], c["k"],
                    "" if len(tb["choices"]) < 2 else " (its last choice of %d: %s)" % (
                        len(tb["choices"]), ", ".join("K %d at %.2f%%" % (x["k"], x["cost_pct"])
                                                      for x in tb["choices"]))),
                "" if tb.get("event_gap_ns") is None else
                "; event gap %d ns" % tb["event_gap_ns"],
                "; no %s arm in this run to compare with" % exact_arm if exact is None else
                "; %s measured %+.2f%%" % (exact_arm, exact)))
    if notes:
        lines += ["", "Timing budget (FLARE_TIMING_BUDGET_PCT), what the hook estimated against "
                  "what exact timing measured:"] + notes
    spread = []
    for workload, entry in summary.items():
        nz = entry.get("noise") or {}
        parts = []
        if "bare_cv_pct" in nz:
            parts.append("bare's window-to-window spread %.2f%%" % nz["bare_cv_pct"])
        for arm, row in nz.get("arms", {}).items():
            parts.append("%s's per-round ratio sd %.2f%%%s" % (
                arm, row["ratio_sd_pct"], "" if "rounds_for_budget" not in row else
                " (an interval narrower than %.1f%% needs ~%d rounds)" % (
                    BUDGET_PCT[workload], row["rounds_for_budget"])))
        for key, c in nz.get("clocks", {}).items():
            r = c["r_with_bare_step"]
            parts.append("%s %.0f-%.0f%s" % (key, c["min"], c["max"], "" if r is None else
                                             " (r = %+.2f with bare's step time)" % r))
        if nz.get("throttle_reasons_seen"):
            parts.append("throttle reasons seen: %s" % ", ".join(nz["throttle_reasons_seen"]))
        if parts:
            spread.append("- %s: %s" % (workload, "; ".join(parts)))
    if spread or meta.get("clock_notes"):
        lines += ["", "What limits the interval (the spread, and what the clocks did while the "
                  "bare arm ran):"] + spread + ["- %s" % n for n in meta.get("clock_notes", [])]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FLARE_BUILD_DIR", "build"))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--budget-s", type=float, default=540, help="wall time for everything")
    ap.add_argument("--window-s", type=float, default=1.0, help="one arm's measurement window")
    ap.add_argument("--max-rounds", type=int, default=1000)
    ap.add_argument("--warmup-s", type=float, default=2.0, help="warm-up per workload and arm")
    ap.add_argument("--cpus", default=None, help="the cores every arm measures on (default: "
                    "2-9, or all but core 0 on smaller machines; '' for no pinning)")
    ap.add_argument("--idle-cpus", default=None, help="where waiting arms wait (default: 1, or "
                    "core 0 on smaller machines)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads per arm")
    ap.add_argument("--sample-steps", type=int, default=32, help="FLARE_SAMPLE_STEPS of the "
                    "-steps arm (every op of one step in K timed, none of the others)")
    ap.add_argument("--timing-budget", type=float, default=0.5, help="FLARE_TIMING_BUDGET_PCT "
                    "of the -budget arm (step sampling with K chosen from the measured cost)")
    ap.add_argument("--sample-kernels", type=int, default=32, help="FLARE_SAMPLE_KERNELS of the "
                    "-sampled arms (1-in-N timing of plain kernel launches; -sampled-all: also "
                    "FLARE_SAMPLE_CALLS, GEMMs, copies and sets per signature)")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker", default=os.path.join(HERE, "overhead_worker.py"))
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help="what reads the GPU's clocks, "
                    "temperature, power and throttle reasons during the run ('' for none)")
    ap.add_argument("--json", help="write every window and the summary here")
    ap.add_argument("--md", help="write the markdown table here too (after every workload, like "
                    "--json, so that a run cut short keeps what it measured)")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS + EXTRA_ARMS]
    if unknown or "bare" not in arms:
        ap.error("--arms: choose from %s, bare included (got %s)" % (
            ", ".join(ARMS + EXTRA_ARMS), args.arms))
    args.build = os.path.abspath(args.build)
    hook = os.path.join(args.build, "lib", "libflare_hook.so")
    if any(a.startswith("flare-") for a in arms) and not os.path.exists(hook):
        ap.error("%s not found (--build)" % hook)
    # The cores this process may use (a container's cpuset need not start at 0 or match
    # os.cpu_count(); taskset with a core outside it fails every worker).
    allowed = sorted(os.sched_getaffinity(0))
    n = len(allowed)
    if args.cpus is None:
        args.cpus = ",".join(str(c) for c in (allowed[2:10] if n >= 10 else allowed[1:]))
    if args.idle_cpus is None:
        args.idle_cpus = str(allowed[1] if n >= 10 else allowed[0]) if args.cpus else ""
    try:
        args.cpu_set, args.idle_set = cpu_list(args.cpus), cpu_list(args.idle_cpus)
    except ValueError:
        ap.error("--cpus/--idle-cpus: lists like 2-9,12 (got %r, %r)" % (args.cpus,
                                                                          args.idle_cpus))
    workloads = [w for w in args.workloads.split(",") if w]
    rng = random.Random(args.seed)
    start = time.monotonic()
    deadline = start + args.budget_s - 3
    summary, windows, device = {}, [], "unknown"

    clocks = Clocks(args.nvidia_smi, args.cpu_set, args.idle_set)
    atexit.register(clocks.close)  # its nvidia-smi child goes with the run, however it ends

    def write():
        meta = {"window_s": args.window_s, "cpus": args.cpus, "idle_cpus": args.idle_cpus,
                "threads": args.threads, "clock_notes": clocks.note + unread_notes(windows),
                "rounds_note": "/".join(str(max((r.get("rounds", 0) for r in
                                                 e.get("arms", {}).values()), default=0))
                                        for e in summary.values()) or "0"}
        text = markdown(device, summary, meta)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": device, "summary": summary, "windows": windows,
                           "args": vars(args)}, f, indent=1)
        if args.md:
            with open(args.md, "w") as f:
                f.write(text + "\n")
        return text

    with tempfile.TemporaryDirectory(prefix="flare-overhead-",
                                     ignore_cleanup_errors=True) as work:
        for i, workload in enumerate(workloads):
            left = deadline - time.monotonic()
            share = left / (len(workloads) - i)
            w_end = time.monotonic() + share
            entry = summary.setdefault(workload, {"arms": {}})
            # Fresh workers for every workload (Worker): started together, each one's start-up
            # (imports, CUDA context) inside the workload's share of the budget.
            workers = {arm: Worker(args, arm, work, workload) for arm in arms}
            try:
                for arm, w in workers.items():
                    try:
                        rep = w.receive(max(5.0, w_end - time.monotonic()))
                    except RuntimeError as e:  # reported with the workload; the others go on
                        entry.setdefault("arm_errors", {})[arm] = "did not start: %s" % e
                        w.kill("did not start")
                        print("overhead: %s: %s did not start: %s" % (workload, arm, e),
                              file=sys.stderr, flush=True)
                        continue
                    device = rep.get("device", device)
                    print("overhead: %s: %s ready" % (workload, arm), file=sys.stderr, flush=True)
                errors = entry.setdefault("arm_errors", {})
                for a, w in workers.items():  # started, then gone: said, not left out silently
                    if a not in errors and w.proc.poll() is not None:
                        errors[a] = w.error or "%s: its worker is gone (exit %s)" % (
                            a, w.proc.poll())
                live = {a: w for a, w in workers.items() if a not in errors}
                if not errors:
                    del entry["arm_errors"]
                if "bare" not in live:
                    entry["error"] = "the bare arm's worker is gone: %s" % entry.get(
                        "arm_errors", {}).get("bare", "")
                    continue
                steps = {a: 0 for a in live}
                try:
                    for a, w in list(live.items()):
                        try:
                            w.send(op="load", workload=workload, warmup_s=args.warmup_s,
                                   idle_cpus=args.idle_set)
                        except RuntimeError as e:
                            entry.setdefault("arm_errors", {})[a] = str(e)
                            del live[a]
                    for a, w in list(live.items()):
                        try:
                            steps[a] += w.receive(max(5.0, w_end - time.monotonic()))["steps"]
                        except RuntimeError as e:
                            entry.setdefault("arm_errors", {})[a] = str(e)
                            del live[a]
                    if "bare" not in live:
                        raise RuntimeError("bare arm could not load: %s" %
                                           entry["arm_errors"]["bare"])
                    rounds, round_s = 0, 0.0
                    while rounds < args.max_rounds and (
                            rounds == 0 or time.monotonic() + round_s < w_end - 2):
                        if time.monotonic() + round_s > deadline:
                            break
                        t0 = time.monotonic()
                        order = list(live)
                        rng.shuffle(order)
                        for a in order:
                            try:
                                # A window that hangs must not outlive the budget.
                                limit = min(args.window_s * 10 + 60,
                                            max(5.0, deadline + 2 - time.monotonic()))
                                t_send, cpu0 = time.monotonic(), cpu_times(clocks.cpus)
                                rep = live[a].request(limit, op="measure",
                                                      seconds=args.window_s,
                                                      cpus=args.cpu_set, idle_cpus=args.idle_set)
                                rep.update(clocks.window(t_send, time.monotonic()))
                                stolen = steal_pct(cpu0, cpu_times(clocks.cpus))
                                if stolen is not None:
                                    rep["steal_pct"] = round(stolen, 3)
                            except RuntimeError as e:
                                entry.setdefault("arm_errors", {})[a] = str(e)
                                del live[a]
                                if a == "bare":
                                    raise
                                continue
                            steps[a] += rep["steps"] + 2
                            windows.append(dict(rep, arm=a, round=rounds, workload=workload))
                            if args.cpu_set and rep.get("affinity") != args.cpu_set:
                                entry.setdefault("pinning", {})[a] = rep.get("affinity")
                        rounds += 1
                        round_s = time.monotonic() - t0
                except RuntimeError as e:
                    entry["error"] = str(e)[-500:]
            finally:
                for w in workers.values():
                    w.quit()
                give_up = time.monotonic() + 10
                for w in workers.values():
                    w.close(give_up)
            mine = [w for w in windows if w["workload"] == workload]
            entry["arms"] = summarize(workload, mine, arms, args.boot, args.seed)
            entry["noise"] = noise(workload, mine, arms)
            # After the workers exited: the spool holds what each one flushed at exit too.
            entry["spool_bytes_per_step"] = {
                a: dir_bytes(w.spool) / steps[a] for a, w in workers.items()
                if a.startswith("flare-") and steps.get(a)}
            for a, w in workers.items():
                if a.endswith("-budget"):
                    text = read_text(w.log_path)
                    choices = budget_choices(text)
                    gaps = EVENT_GAP_LINE.findall(text)
                    entry.setdefault("timing_budget", {})[a] = {
                        "choices": choices, "in_force": choices[-1] if choices else None,
                        "event_gap_ns": int(gaps[-1]) if gaps else None}
            print("overhead: %s: %d rounds" % (workload, max(
                (r["rounds"] for r in entry["arms"].values()), default=0)),
                file=sys.stderr, flush=True)
            write()
    clocks.close()
    print(write())
    failed = {w: e.get("error") or e.get("arm_errors") for w, e in summary.items()
              if e.get("error") or e.get("arm_errors")}
    for w, e in failed.items():
        print("overhead: %s: %s" % (w, e), file=sys.stderr)
    return 1 if failed or not summary else 0


if __name__ == "__main__":
    sys.exit(main())
