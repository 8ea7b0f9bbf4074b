"""FLARE_SAMPLE_STEPS=K: step sampling in summary mode (src/timing/step_sampling.h), on the
simulated stack. The truth is the workload's own: FLARE_SIM_KERNEL_LOG lists every kernel the
simulated GPU ran.

- every op of a measured step is timed and none of a sampled-out step's kernels, GEMMs, copies
  and sets, but for a GEMM, copy or set signature's first calls (a shape of a few steps keeps its
  exact count); the first 3 steps are measured; about one step in K after that, the same steps
  on every rank;
- the kernel summaries' counts estimate every step's launches (each measured step stands for the
  steps sampled out before it, the last one for those after it): exact for alike steps;
- every step reaches the detectors, the sampled-out ones with their times only, and what the
  detectors looked at says how many were measured;
- an underclocked GPU is still named, through flared, with nothing refused; a healthy job raises
  nothing;
- raw mode times every step; a malformed value is refused with one warning;
- FLARE_TIMING_BUDGET_PCT picks K from the timing cost the hook measures."""

import collections
import json
import os
import subprocess

import pytest

from test_sample_kernels import kernel_key, traced_run, truth  # noqa: F401 (fixtures' helpers)

K = 4
STEPS = 100  # test_sample_kernels.STEPS: traced_run's job


def looked_at(build_dir, spool):
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input",
                          str(spool), "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 3), res.stderr
    out = json.loads(res.stdout)
    return out["diagnoses"], out["lookedAt"]


def summary_counts(records):
    """{(rank, kernel key): [estimated count, timed]} of the plain kernels' summaries."""
    out = collections.defaultdict(lambda: [0, 0])
    for r in records:
        if r["kind"] != "summary" or r["op_kind"] not in ("kernel", "attention"):
            continue
        n = sum(c["count"] for c in r["clusters"])
        e = out[(r["rank"], kernel_key(r["name"]))]
        e[0] += n
        e[1] += r.get("sampled_ops", n)
    return out


def test_summary_counts_estimate_every_steps_launches(sim_train, build_dir, tmp_path):
    records, true, res = traced_run(sim_train, build_dir, tmp_path, "steps", mode="summary",
                                    env_extra={"FLARE_SAMPLE_STEPS": str(K)})
    assert "FLARE_SAMPLE_STEPS=%d" % K in res.stderr  # said once, where the user looks
    assert "had no effect" not in res.stderr
    per_sig = summary_counts(records)
    assert per_sig
    for key, (count, timed) in per_sig.items():
        made = true[key][0]
        per_step = made / STEPS
        # Timed: the 3 warm-up steps and about one step in K of the rest (binomial, 4.5 sigma).
        p = 1.0 / K
        n = STEPS - 3
        lo = 3 + n * p - 4.5 * (n * p * (1 - p)) ** 0.5
        hi = 3 + n * p + 4.5 * (n * p * (1 - p)) ** 0.5
        assert lo * per_step <= timed <= hi * per_step, (key, timed, made)
        # The weights cover every step: each measured step the sampled-out ones before it, and
        # the last one those after it, the loop's last step included (the steps are alike).
        assert count == made, (key, count, made)


def test_a_job_that_ends_in_sampled_out_steps_counts_them(sim_train, build_dir, tmp_path):
    """A job whose last steps are sampled out (job "steps-tail", 24 steps at K = 4: steps 20-22
    and the loop's last one, after the last marker): no measured step comes after them, so the
    last measured one stands for them at the rank's last flush. Before that, a 6-step job's
    kernels came out half counted and its synchronizations' rates per GPU op doubled (the CI at
    2aaa587 named the wrong synchronization)."""
    records, true, _ = traced_run(sim_train, build_dir, tmp_path, "steps-tail", mode="summary",
                                  env_extra={"FLARE_SAMPLE_STEPS": str(K)}, steps=24)
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                          str(tmp_path / "steps-tail"), "--steps"],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    steps = collections.defaultdict(list)
    for r in map(json.loads, exp.stdout.splitlines()):
        if r["kind"] == "step":
            steps[r["rank"]].append(r.get("gpu_ops", 0) > 0)
    # The premise: every rank's last steps were sampled out (the selection is a hash of the job
    # and the step index, the same on every run).
    assert steps and all(not any(m[-3:]) for m in steps.values()), steps
    per_sig = summary_counts(records)
    assert per_sig
    for key, (count, _) in per_sig.items():
        assert count == true[key][0], (key, count, true[key][0])


def test_every_step_reaches_the_detectors_and_ranks_measure_the_same_steps(sim_train, build_dir,
                                                                          tmp_path):
    traced_run(sim_train, build_dir, tmp_path, "exact", mode="summary",
               env_extra={"FLARE_TIMING_BUDGET_PCT": "0"})
    traced_run(sim_train, build_dir, tmp_path, "sampled", mode="summary",
               env_extra={"FLARE_SAMPLE_STEPS": str(K)})
    found_exact, exact = looked_at(build_dir, tmp_path / "exact")
    found, sampled = looked_at(build_dir, tmp_path / "sampled")
    assert exact["stepsSampledOut"] == 0 and exact["stepsMeasured"] > 0
    # Every rank-step present in both; about one in K measured after the warm-up.
    assert sampled["steps"] == exact["steps"]
    total = sampled["stepsMeasured"] + sampled["stepsSampledOut"]
    assert total == exact["stepsMeasured"], (sampled, exact)
    assert 0.1 * total <= sampled["stepsMeasured"] <= 0.45 * total, sampled
    assert "sampled out by step sampling" in sampled["text"]
    # Two ranks, the same steps measured on each: the measured count is even.
    assert sampled["stepsMeasured"] % 2 == 0
    assert found == [] and found_exact == []


def test_raw_mode_times_every_step(sim_train, build_dir, tmp_path):
    records, true, res = traced_run(sim_train, build_dir, tmp_path, "raw", mode="raw",
                                    env_extra={"FLARE_SAMPLE_STEPS": str(K)})
    counts = collections.Counter((r["rank"], kernel_key(r["name"])) for r in records
                                 if r["kind"] in ("kernel", "attention"))
    assert counts
    for key, n in counts.items():
        assert n == true[key][0], key
    assert all("weight" not in r for r in records)
    # Asked for and never applied: said once per rank at exit, with the reason.
    said = [line for line in res.stderr.splitlines() if "had no effect" in line]
    assert len(said) == 2 and all("raw mode times every step" in line for line in said), said


def test_a_job_without_steps_is_told_that_step_sampling_never_applied(probe):
    """hook_probe launches kernels with no DataLoader and no flare_step(): no step boundary, so
    every op is timed and the rank says why at exit."""
    proc, _ = probe("launches", 50, env={"FLARE_MODE": "summary", "FLARE_SAMPLE_STEPS": str(K)})
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "had no effect" in line]
    assert len(said) == 1 and "no step boundary was seen" in said[0], proc.stderr[-2000:]
    assert " W " in said[0], said  # the job's own setting: a warning
    # The default budget: the same reason, as information (the job is timed as it would be
    # without the default).
    proc, _ = probe("launches", 50, env={"FLARE_MODE": "summary"})
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "had no effect" in line]
    assert len(said) == 1 and "no step boundary was seen" in said[0], proc.stderr[-2000:]
    assert "(the default in summary mode)" in said[0] and " I " in said[0], said


@pytest.mark.parametrize("value", ["0", "2000", "four"])
def test_a_malformed_value_is_refused_once_and_every_step_timed(sim_train, build_dir, tmp_path,
                                                               value):
    records, true, res = traced_run(sim_train, build_dir, tmp_path, "bad", mode="summary",
                                    env_extra={"FLARE_SAMPLE_STEPS": value})
    assert res.stderr.count("FLARE_SAMPLE_STEPS") >= 1
    for key, (count, timed) in summary_counts(records).items():
        assert count == timed == true[key][0], key


def budget_k(k, cost_pct, budget_pct):
    """Whether `k` is the K a budget chooses for a cost as the hook printed it (two decimals):
    the smallest power of 2 that brings the cost within the budget, 1 when it is within already
    (0.23% against 0.5% on one CI machine), at most 1024."""
    low, high = (cost_pct - 0.005) / budget_pct, (cost_pct + 0.005) / budget_pct
    return k & (k - 1) == 0 and (k == 1024 or k >= low and (k == 1 or high > k / 2))


def test_a_timing_budget_picks_k_from_the_measured_cost(sim_train, build_dir, tmp_path):
    """FLARE_TIMING_BUDGET_PCT: the hook measures what timing every op costs its launching
    threads (on the simulated stack a few percent of a step) and times one step in the power of
    2 that keeps it within the budget; a budget it is already within keeps every step."""
    import re
    _, _, res = traced_run(sim_train, build_dir, tmp_path, "tight", mode="summary",
                           env_extra={"FLARE_TIMING_BUDGET_PCT": "0.25"})
    chosen = re.findall(r"FLARE_TIMING_BUDGET_PCT=0.25: timing every op costs ([0-9.]+)% of a "
                        r"step here \([0-9.]+% the launching threads' time, [0-9.]+% the GPU "
                        r"time of the event records\); timing one step in ([0-9]+)", res.stderr)
    assert len(chosen) == 2, res.stderr  # each rank says it once, where the user looks
    for cost, k in chosen:
        k, cost = int(k), float(cost)
        assert budget_k(k, cost, 0.25), (cost, k)
    k = min(int(k) for _, k in chosen)
    assert k >= 2, chosen  # timing every op costs the simulated ranks more than 0.25%
    _, tight = looked_at(build_dir, tmp_path / "tight")
    total = tight["stepsMeasured"] + tight["stepsSampledOut"]
    assert tight["stepsSampledOut"] > 0 and tight["stepsMeasured"] <= total * (3.0 / k + 0.15)
    _, _, res = traced_run(sim_train, build_dir, tmp_path, "loose", mode="summary",
                           env_extra={"FLARE_TIMING_BUDGET_PCT": "100"})
    assert "timing one step in 1 " in res.stderr, res.stderr
    _, loose = looked_at(build_dir, tmp_path / "loose")
    assert loose["stepsSampledOut"] == 0 and loose["stepsMeasured"] == total


@pytest.mark.parametrize("tag,mode,extra,applies", [
    ("default", "summary", {}, True),
    ("malformed", "summary", {"FLARE_TIMING_BUDGET_PCT": "lots"}, True),
    ("raw", "raw", {}, False),
    ("steps", "summary", {"FLARE_SAMPLE_STEPS": "4"}, False),
    ("kernels", "summary", {"FLARE_SAMPLE_KERNELS": "2"}, False),
    ("end", "summary", {"FLARE_TIMING": "end"}, False),
])
def test_the_default_budget_applies_in_summary_mode_unless_the_job_chose_how_to_time(
        sim_train, build_dir, tmp_path, tag, mode, extra, applies):
    """FLARE_TIMING_BUDGET_PCT unset (or refused): 0.5 in summary mode, said once per rank as the
    default; a job that chose how to time (a fixed K, 1-in-N kernels, end-only events) or raw
    mode keeps its choice, with nothing said of the budget and nothing refused."""
    records, true, res = traced_run(sim_train, build_dir, tmp_path, tag, mode=mode,
                                    env_extra=extra)
    said = [line for line in res.stderr.splitlines()
            if "FLARE_TIMING_BUDGET_PCT=0.5 (the default in summary mode): timing every op "
               "costs" in line]
    assert len(said) == (2 if applies else 0), res.stderr[-3000:]
    assert "had no effect" not in res.stderr, res.stderr[-3000:]
    assert "FLARE_TIMING=end is not used" not in res.stderr, res.stderr[-3000:]
    if tag == "malformed":
        assert any("FLARE_TIMING_BUDGET_PCT" in line and "lots" in line
                   for line in res.stderr.splitlines()), res.stderr[-3000:]
    counts = summary_counts(records)
    if applies:
        # Timing every op costs the simulated ranks a few percent: steps were sampled out, and
        # the summaries estimate counts from fewer timed ops.
        assert any(timed < count for count, timed in counts.values()), counts
    elif tag == "end":
        assert counts and all(count == timed == true[key][0]
                              for key, (count, timed) in counts.items()), counts


def test_a_timing_budget_counts_the_gpu_time_of_the_event_records(build_dir, tmp_path):
    """Each event record holds its stream for one command gap (~1.3 us on an H200), so timing
    every op costs a GPU-bound step about 2 gaps per op: FLARE_TIMING_BUDGET_PCT counts that
    GPU time beside the launching threads' (the gap as the hook measured it), and chooses K from
    both. With the simulated gap at 0 the GPU share is 0; at 20 us it is what the job's own ops
    make of it: 2 x 20 us per timed op a step, over the step time."""
    import re
    shares = {}
    for gap_us in (0, 20):
        out, sim = tmp_path / ("gap%d" % gap_us), tmp_path / ("gap%d.json" % gap_us)
        log = tmp_path / ("gap%d-log" % gap_us)
        log.mkdir()
        env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
                   FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="gap%d" % gap_us, FLARE_MODE="summary",
                   FLARE_TIMING_BUDGET_PCT="0.5", FLARE_SIM_COMMAND_GAP_US=str(gap_us),
                   FLARE_SIM_KERNEL_LOG=str(log))
        steps = 12
        res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "1",
                              "--tp", "1", "--steps", str(steps), "--layers", "2", "--hidden",
                              "2048", "--seq", "1024", "--quiet", "--json", str(sim)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        found = re.findall(r"timing every op costs ([0-9.]+)% of a step here \(([0-9.]+)% the "
                           r"launching threads' time, ([0-9.]+)% the GPU time of the event "
                           r"records\); timing one step in ([0-9]+)", res.stderr)
        assert len(found) == 1, res.stderr
        total, host, gpu, k = float(found[0][0]), float(found[0][1]), float(found[0][2]), \
            int(found[0][3])
        assert total == pytest.approx(host + gpu, abs=0.011)
        assert budget_k(k, total, 0.5), found
        kernels = sum(n for n, _ in truth(str(log)).values()) / steps  # GEMMs included
        # The budget divides by the measured steps' time (the event records lengthen them),
        # the sampled-out steps are shorter: the share lies between the extremes (step 0, the
        # cold start, left out).
        step_ms = json.loads(sim.read_text())["ranks"][0]["step_ms"][1:]
        gpu_ms = kernels * 2 * gap_us / 1000
        shares[gap_us] = (gpu, 100 * gpu_ms / max(step_ms), 100 * gpu_ms / min(step_ms))
    assert shares[0][0] == 0, shares
    gpu, low, high = shares[20]
    # The timed ops are the logged kernels and the collectives and copies (a few a step).
    assert 0.8 * low <= gpu <= 1.3 * high, shares


def test_end_only_timing_is_refused_with_a_timing_budget(sim_train, build_dir, tmp_path):
    """A budget may leave steps untimed, whose ops an end-only op after them would count in its
    duration: FLARE_TIMING=end is refused once per rank and the pair is used (whose event gap the
    budget then measures), as with FLARE_SAMPLE_STEPS."""
    _, _, res = traced_run(sim_train, build_dir, tmp_path, "endbudget", mode="summary",
                           env_extra={"FLARE_TIMING": "end", "FLARE_TIMING_BUDGET_PCT": "0.5",
                                      "FLARE_SIM_COMMAND_GAP_US": "1.3"})
    lines = [line for line in res.stderr.splitlines() if "FLARE_TIMING=end is not used" in line]
    assert len(lines) == 2 and all("FLARE_TIMING_BUDGET_PCT=0.5" in line for line in lines), \
        res.stderr
    assert "the event gap is not measured" not in res.stderr, res.stderr


def test_underclocked_rank_is_named_through_flared_with_nothing_refused(build_dir, tmp_path):
    from test_flared_diagnosis import Daemon, alerts, flare, wait_alerts
    from pipeline_health import assert_nothing_refused
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Daemon(build_dir, tmp_path)
    try:
        for job, fault in (("healthy", {}), ("slowgpu", {"FLARE_SIM_CLOCK_FACTOR": "3:0.8"})):
            env = dict(fault, FLARE_MODE="summary", FLARE_SAMPLE_STEPS=str(K),
                       FLARE_OUTPUT_DIR=str(tmp_path / ("spool-" + job)))
            res = flare(build_dir, "run", "--daemon", "127.0.0.1:%d" % d.grpc, "--job-id", job,
                        "--quiet", "--", os.path.join(build_dir, "bin", "flare-sim-train"),
                        "--ranks", "8", "--steps", "24", "--layers", "4", "--tp", "2", "--quiet",
                        "--json", str(tmp_path / ("sim-%s.json" % job)), env=env)
            assert res.returncode == 0, res.stderr
        # Alerts beyond what this machine's load explains (test_flared_diagnosis.alerts).
        found = wait_alerts(d, tmp_path, "slowgpu", 1)
        assert [(a["kind"], a["rank"], a["team"]) for a in found] == [("gpu_slow", 3, "operations")]
        assert alerts(d, tmp_path, "healthy") == []
        looked = json.loads(d.get("/api/v1/jobs/slowgpu/diagnoses"))["lookedAt"]
        assert looked["stepsSampledOut"] > 0 and looked["stepsMeasured"] > 0, looked
        # `flare status` counts each rank's steps and those sampled out: the rank-steps the
        # detectors looked at and each rank's warm-up step 0, which they leave out (measured).
        http = "127.0.0.1:%d" % d.http
        res = flare(build_dir, "status", "--all", "--daemon-http", http, "--json")
        assert res.returncode == 0, res.stderr
        job = {j["jobId"]: j for j in json.loads(res.stdout)["jobs"]}["slowgpu"]
        ranks = job["ranks"]
        assert len(ranks) == 8 and len({r["steps"] for r in ranks}) == 1, ranks
        assert sum(r["stepsSampledOut"] for r in ranks) == looked["stepsSampledOut"], ranks
        assert sum(r["steps"] for r in ranks) == looked["stepsMeasured"] + \
            looked["stepsSampledOut"] + len(ranks), (ranks, looked)
        text = flare(build_dir, "status", "--all", "--daemon-http", http).stdout
        assert "step sampling: %d of %d rank-steps sampled out" % (
            looked["stepsSampledOut"], sum(r["steps"] for r in ranks)) in text, text
        assert_nothing_refused(d.http)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# The job id seeds which steps are measured (the same on every rank): with "sampled" the
# evaluation pass falls in a sampled-out step, with "x" in a measured step that stands for 4.
@pytest.mark.parametrize("job", ["sampled", "x"])
def test_a_gemm_shape_of_a_few_steps_only_keeps_its_exact_count(build_dir, tmp_path, job):
    """The PyTorch-like workload's evaluation pass (no-grad forward GEMMs of shapes the training
    steps do not use, 4 calls each in 100 steps) at K = 8. In a sampled-out step its GEMMs were
    untimed, and the kernel report had no record of those shapes; in a measured step they were
    weighted as if they ran in every step that step stands for. A signature's first calls on a
    thread are timed in any step and stand for themselves: every GEMM shape of the raw run is in
    the summaries, and the evaluation's with its exact count."""
    from conftest import exported
    shapes = {}
    for tag, mode, extra in (("raw", "raw", {}), (job, "summary", {"FLARE_SAMPLE_STEPS": "8"})):
        spool = tmp_path / tag
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FLARE_") and k != "LD_PRELOAD"}
        env.update(LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
                   FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID=tag, FLARE_MODE=mode, **extra)
        res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--pytorch-like",
                              "--ranks", "1", "--steps", "100", "--layers", "2", "--setup-ms",
                              "0", "--eval-ms", "50", "--save-ms", "10", "--quiet"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        counts = collections.Counter()
        for r in exported(build_dir, spool):
            if r["kind"] == "gemm":  # a raw record
                counts[(r["name"], tuple(r["shape"]))] += r.get("weight", 1)
            elif r["kind"] == "summary" and r["op_kind"] == "gemm":
                counts[(r["name"], tuple(r["shape"]))] += sum(c["count"] for c in r["clusters"])
        shapes[mode] = counts
    rare = {k: n for k, n in shapes["raw"].items() if n <= 8}
    assert len(rare) == 4 and set(rare.values()) == {4}, shapes["raw"]  # the evaluation's
    assert set(shapes["summary"]) == set(shapes["raw"]), (shapes["summary"], shapes["raw"])
    for key, n in rare.items():
        assert shapes["summary"][key] == n, (key, shapes["summary"][key], n)
