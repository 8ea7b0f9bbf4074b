"""The GPU benchmark harnesses without a GPU. overhead.py, driven by a stand-in worker
(bench/standin_workload.py): every arm's long-lived worker runs every round with the right
environment and the same pinned CPUs, the overhead is the median per-round ratio to the bare arm
with a bootstrap interval (so drift cancels), and a failing arm is a clear error. accuracy.py's
matching of Flare's records and CUPTI's activities to calls, and its per-class statistics, on
synthetic records. The real measurements need a GPU (tests/gpu/README.md)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tests", "gpu", "bench")


def run(build_dir, tmp_path, *extra, env=None):
    out = tmp_path / "overhead.json"
    cmd = [sys.executable, os.path.join(BENCH, "overhead.py"), "--build", str(build_dir),
           "--worker", os.path.join(BENCH, "standin_workload.py"), "--workloads",
           "gpt-small,launch-bound", "--max-rounds", "6", "--window-s", "0.01", "--warmup-s", "0",
           "--budget-s", "60", "--boot", "200", "--json", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {}))), out


def test_overhead_is_the_median_per_round_ratio_to_the_bare_arm(build_dir, tmp_path):
    proc, out = run(build_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert len(data["windows"]) == 2 * 6 * 4  # workloads x rounds x arms
    for workload in ("gpt-small", "launch-bound"):
        rows = data["summary"][workload]["arms"]
        assert set(rows) == {"bare", "flare-summary", "flare-raw", "torch-profiler"}
        assert rows["flare-summary"]["overhead_pct"] == pytest.approx(5.0)
        assert rows["flare-raw"]["overhead_pct"] == pytest.approx(10.0)
        assert rows["torch-profiler"]["overhead_pct"] == pytest.approx(30.0)
        # Each arm drifts 1% per window it measures: the per-round ratio cancels it, so the
        # bootstrap interval has no width; the raw step times do not.
        lo, hi = rows["flare-raw"]["ci95_pct"]
        assert lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
        assert rows["flare-summary"]["rounds"] == 6
        assert rows["flare-summary"]["resolved"] and not rows["flare-summary"]["within_budget"]
        assert data["summary"][workload]["spool_bytes_per_step"]["flare-raw"] > 0
    assert rows["flare-summary"]["budget_pct"] == 2.0  # launch-bound's budget
    assert "| gpt-small | flare-raw |" in proc.stdout and "+10.00% [+10.00, +10.00]" in proc.stdout
    # Shuffled order: not every round runs the arms in the same sequence.
    orders = {}
    for w in data["windows"]:
        orders.setdefault((w["workload"], w["round"]), []).append(w["arm"])
    assert len({tuple(v) for v in orders.values()}) > 1


def test_every_arm_measures_on_the_same_cores_and_waits_off_them(build_dir, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU")
    proc, out = run(build_dir, tmp_path, "--cpus", "1", "--idle-cpus", "0", "--max-rounds", "2")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert {tuple(w["affinity"]) for w in data["windows"]} == {(1,)}
    assert len({w["arm"] for w in data["windows"]}) == 4
    assert all("pinning" not in e for e in data["summary"].values())


def test_a_failing_arm_is_a_clear_error(build_dir, tmp_path):
    proc, out = run(build_dir, tmp_path, env={"STANDIN_FAIL_ARM": "flare-raw"})
    assert proc.returncode != 0
    assert "flare-raw" in proc.stderr and "failing flare-raw as asked" in proc.stderr
    rows = json.loads(out.read_text())["summary"]["gpt-small"]["arms"]
    assert "flare-raw" not in rows and rows["flare-summary"]["overhead_pct"] == pytest.approx(5.0)


def test_an_arm_whose_worker_dies_after_starting_is_an_error_not_a_missing_row(build_dir,
                                                                                tmp_path):
    proc, out = run(build_dir, tmp_path, env={"STANDIN_EXIT_ARM": "flare-raw"})
    assert proc.returncode != 0
    summary = json.loads(out.read_text())["summary"]
    for workload in ("gpt-small", "launch-bound"):
        assert "worker is gone (exit 3)" in summary[workload]["arm_errors"]["flare-raw"]
        assert "flare-raw" not in summary[workload]["arms"]
        assert summary[workload]["arms"]["flare-summary"]["overhead_pct"] == pytest.approx(5.0)


def test_the_sampled_arm_runs_summary_mode_with_one_in_n_kernel_timing(build_dir, tmp_path):
    proc, out = run(build_dir, tmp_path, "--arms", "bare,flare-summary,flare-summary-sampled",
                    "--sample-kernels", "16", env={"STANDIN_SAMPLE_KERNELS": "16"})
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["summary"]["launch-bound"]["arms"]
    assert rows["flare-summary-sampled"]["overhead_pct"] == pytest.approx(1.0)
    assert rows["flare-summary"]["overhead_pct"] == pytest.approx(5.0)


def test_the_sampled_all_arm_also_samples_gemms_copies_and_sets(build_dir, tmp_path):
    """-sampled-all: FLARE_SAMPLE_CALLS at the same N as FLARE_SAMPLE_KERNELS (the stand-in
    refuses any other pairing), the other arms with neither."""
    proc, out = run(build_dir, tmp_path, "--arms",
                    "bare,flare-summary-sampled,flare-summary-sampled-all", "--sample-kernels",
                    "16", env={"STANDIN_SAMPLE_KERNELS": "16"})
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["summary"]["gpt-small"]["arms"]
    assert rows["flare-summary-sampled-all"]["overhead_pct"] == pytest.approx(0.5)
    assert rows["flare-summary-sampled"]["overhead_pct"] == pytest.approx(1.0)


@pytest.mark.parametrize("arm,flag,value,standin,pct", [
    ("flare-summary-steps", "--sample-steps", "8", "STANDIN_SAMPLE_STEPS", 0.25),
    ("flare-summary-budget", "--timing-budget", "0.25", "STANDIN_TIMING_BUDGET", 0.4)])
def test_the_step_sampling_arms_set_their_one_setting(build_dir, tmp_path, arm, flag, value,
                                                      standin, pct):
    """-steps: FLARE_SAMPLE_STEPS=--sample-steps; -budget: FLARE_TIMING_BUDGET_PCT=
    --timing-budget; neither with per-launch or per-call sampling (the stand-in refuses them
    together)."""
    proc, out = run(build_dir, tmp_path, "--arms", "bare,flare-summary," + arm, flag, value,
                    env={standin: value})
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["summary"]["gpt-small"]["arms"]
    assert rows[arm]["overhead_pct"] == pytest.approx(pct)
    assert rows["flare-summary"]["overhead_pct"] == pytest.approx(5.0)


def test_the_budget_arm_sets_the_hooks_estimate_beside_the_measured_overhead(build_dir,
                                                                             tmp_path):
    """The -budget arm logs every choice of K (debug, hook and timing only): each workload's
    entry has the choices its process made and the one in force, the event gap, and the notes
    under the table set the hook's estimate of exact timing's cost beside what the
    flare-summary-exact arm (FLARE_TIMING_BUDGET_PCT=0) measured. A workload whose process made
    no choice says so (the stand-in logs its choice at gpt-small's load only)."""
    proc, out = run(build_dir, tmp_path, "--arms",
                    "bare,flare-summary,flare-summary-exact,flare-summary-budget",
                    env={"STANDIN_TIMING_BUDGET": "0.5"})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["gpt-small"]["arms"]["flare-summary-exact"]["overhead_pct"] == pytest.approx(6)
    small = summary["gpt-small"]["timing_budget"]["flare-summary-budget"]
    want = {"cost_pct": 4.0, "host_pct": 0.8, "gpu_pct": 3.2, "k": 16}
    assert small == {"choices": [want], "in_force": want, "event_gap_ns": 1300}
    bound = summary["launch-bound"]["timing_budget"]["flare-summary-budget"]
    assert bound == {"choices": [], "in_force": None, "event_gap_ns": None}
    assert ("- gpt-small, flare-summary-budget: the hook's estimate of timing every op: 4.00% of "
            "a step (launching threads 0.80%, event records' GPU time 3.20%), K = 16; event gap "
            "1300 ns; flare-summary-exact measured +6.00%") in proc.stdout
    assert ("- launch-bound, flare-summary-budget: the hook said nothing of its timing cost"
            in proc.stdout)


def test_every_workload_runs_in_fresh_processes(build_dir, tmp_path):
    """A job is one process: the hook's state (step markers seen, the budget's K) must not
    carry from one workload into the next (H200, 2026-11-28: launch-bound's flare_step() calls
    hid the GPT loops' DataLoader steps from step sampling)."""
    proc, out = run(build_dir, tmp_path, "--arms", "bare,flare-summary,flare-summary-steps",
                    "--max-rounds", "2")
    assert proc.returncode == 0, proc.stderr
    pids = {}
    for w in json.loads(out.read_text())["windows"]:
        pids.setdefault(w["workload"], {}).setdefault(w["arm"], set()).add(w["pid"])
    for arms in pids.values():
        assert all(len(p) == 1 for p in arms.values())  # one process per arm and workload
    small = set().union(*pids["gpt-small"].values())
    bound = set().union(*pids["launch-bound"].values())
    assert len(small) == len(bound) == 3 and not small & bound


def test_the_budget_line_parser_reads_the_hooks_own_line(build_dir, tmp_path):
    """overhead.py's parser against the line the hook really writes (the simulated stack)."""
    sys.path.insert(0, BENCH)
    try:
        import overhead
    finally:
        sys.path.pop(0)
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(tmp_path / "spool"), FLARE_MODE="summary",
               FLARE_TIMING_BUDGET_PCT="0.5", FLARE_SIM_COMMAND_GAP_US="1.3")
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "1",
                          "--tp", "1", "--steps", "8", "--layers", "2", "--quiet"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    choices = overhead.budget_choices(res.stderr)
    assert len(choices) == 1 and choices[0]["gpu_pct"] > 0 and choices[0]["k"] >= 1, res.stderr
    assert choices[0]["cost_pct"] == pytest.approx(choices[0]["host_pct"] + choices[0]["gpu_pct"],
                                                   abs=0.011)
    assert overhead.EVENT_GAP_LINE.findall(res.stderr) == ["1300"], res.stderr


def test_the_clocks_while_each_window_ran_are_recorded_beside_the_spread(build_dir, tmp_path):
    """The GPU's clocks, temperature, power and throttle reasons (nvidia-smi's own loop, here a
    stand-in that checks its arguments) are averaged over each window; each workload's entry
    says what limits its interval: the per-round ratio's spread and the rounds an interval
    narrower than the budget would need at it, bare's spread, and how bare followed the clocks."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/bash\n"
                   "[ \"$1\" = --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,"
                   "clocks_throttle_reasons.active ] && [ \"$2\" = --format=csv,noheader,nounits ]"
                   " && [ \"$3\" = -lms ] || exit 2\n"
                   "while true; do echo '1980, 2619, 45, 300.50, 0x0000000000000004'; "
                   "sleep 0.001; done\n")
    smi.chmod(0o755)
    proc, out = run(build_dir, tmp_path, "--arms", "bare,flare-summary", "--nvidia-smi",
                    str(smi), "--window-s", "0.05")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    with_clocks = [w for w in data["windows"] if "sm_mhz" in w]
    assert len(with_clocks) >= 0.8 * len(data["windows"]), data["windows"]
    # The measurement cores' stolen time, from this machine's /proc/stat, beside every window.
    assert all(0 <= w["steal_pct"] <= 100 for w in data["windows"]), data["windows"]
    for w in with_clocks:
        assert (w["sm_mhz"], w["mem_mhz"], w["gpu_temp_c"], w["power_w"], w["throttle"]) == (
            1980.0, 2619.0, 45.0, 300.5, "0x4"), w
    nz = data["summary"]["gpt-small"]["noise"]
    assert nz["clocks"]["sm_mhz"] == {"min": 1980.0, "max": 1980.0, "r_with_bare_step": None}
    assert nz["throttle_reasons_seen"] == ["0x4"]
    # The stand-in's ratio is exact every round: no spread, one round suffices.
    assert nz["arms"]["flare-summary"]["ratio_sd_pct"] == pytest.approx(0, abs=1e-9)
    assert nz["arms"]["flare-summary"]["rounds_for_budget"] == 1
    assert nz["bare_cv_pct"] > 0  # bare drifts 1% a window; the ratio cancels it
    assert ("- gpt-small: bare's window-to-window spread" in proc.stdout and
            "flare-summary's per-round ratio sd 0.00% (an interval narrower than 0.5% needs ~1 "
            "rounds); sm_mhz 1980-1980" in proc.stdout and
            "throttle reasons seen: 0x4" in proc.stdout), proc.stdout
    # No reader: said under the table, the windows without clocks, the run otherwise the same.
    for smi_arg, said in (("", "GPU clocks not recorded (--nvidia-smi '')"),
                          (str(tmp_path / "absent"), "GPU clocks not recorded (%s not found)"
                           % (tmp_path / "absent"))):
        proc, out = run(build_dir, tmp_path, "--arms", "bare,flare-summary", "--nvidia-smi",
                        smi_arg, "--max-rounds", "3")
        assert proc.returncode == 0, proc.stderr
        assert "- " + said in proc.stdout, proc.stdout
        assert not any("sm_mhz" in w for w in json.loads(out.read_text())["windows"])


def test_the_machines_readings_of_a_window():
    """proc_readings: the cores' stolen time from /proc/stat (a VM's hypervisor running another
    tenant on them), a thread's wait for a CPU (schedstat), the cores' frequency; and noise()
    sets bare's step time against each (r), so that a regime of stolen time shows."""
    sys.path.insert(0, BENCH)
    try:
        import overhead
        import proc_readings as pr
    finally:
        sys.path.pop(0)
    stat0 = ("cpu  1 2 3 4 5 6 7 8 0 0\ncpu2 100 0 50 800 0 0 0 50 0 0\n"
             "cpu3 100 0 50 850 0 0 0 0 0 0\nintr 1 2 3\n")
    stat1 = ("cpu  1 2 3 4 5 6 7 8 0 0\ncpu2 150 0 60 900 0 0 0 90 0 0\n"
             "cpu3 150 0 60 950 0 0 0 0 0 0\n")
    before, after = pr.cpu_times([2, 3], stat0), pr.cpu_times([2, 3], stat1)
    assert before == {2: (1000, 50), 3: (1000, 0)} and after[2] == (1200, 90)
    # 40 of the two cores' 360 jiffies in between were stolen (all on cpu2).
    assert pr.steal_pct(before, after) == pytest.approx(100 * 40 / 360)
    assert pr.steal_pct({}, after) is None and pr.cpu_times([7], stat0) == {}
    assert pr.cpu_times([0], "") == {}
    here = sorted(os.sched_getaffinity(0))
    assert set(pr.cpu_times(here)) == set(here)  # this machine's /proc/stat
    assert isinstance(pr.thread_run_delay_ns(), int)
    mhz = pr.cpu_mhz(here)
    assert mhz is None or mhz > 0
    windows = []
    for r in range(10):
        stolen = 5.0 * (r % 3)
        windows.append({"round": r, "arm": "bare", "mean_ms": 10 * (1 + stolen / 100),
                        "steal_pct": stolen, "run_delay_pct": 1.0})
        windows.append({"round": r, "arm": "flare-summary", "mean_ms": 10.5,
                        "steal_pct": stolen})
    clocks = overhead.noise("gpt-small", windows, ["bare", "flare-summary"])["clocks"]
    assert clocks["steal_pct"] == {"min": 0.0, "max": 10.0, "r_with_bare_step": pytest.approx(1)}
    assert clocks["run_delay_pct"]["r_with_bare_step"] is None  # no spread: no r
    # A reading no window has is said under the table, not left as a missing column.
    assert overhead.unread_notes(windows) == [] and overhead.unread_notes([]) == []
    unread = overhead.unread_notes([{"arm": "bare", "mean_ms": 10.0}])
    assert len(unread) == 2 and "/proc/stat" in unread[0] and "schedstat" in unread[1]
    meta = {"window_s": 0.5, "cpus": "", "idle_cpus": "", "threads": 1, "rounds_note": "0",
            "clock_notes": unread}
    assert "stolen CPU time not recorded" in overhead.markdown("H200", {}, meta)


def test_the_ratio_spread_says_how_many_rounds_the_budget_needs():
    """At run 4's spread (gpt-medium's budget arm on the H200: per-round ratio sd 2.19%), an
    interval narrower than 0.5% needs ~460 rounds: about 8 minutes of 0.5 s windows for two
    arms alone."""
    sys.path.insert(0, BENCH)
    try:
        import overhead
    finally:
        sys.path.pop(0)
    import random
    rng = random.Random(3)
    windows = []
    for r in range(400):
        base = 50 * (1 + 0.05 * rng.random())  # the machine's drift, shared within a round
        windows.append({"round": r, "arm": "bare", "mean_ms": base})
        windows.append({"round": r, "arm": "flare-summary",
                        "mean_ms": base * (1.004 + rng.gauss(0, 0.0219))})
    nz = overhead.noise("gpt-medium", windows, ["bare", "flare-summary"])
    row = nz["arms"]["flare-summary"]
    assert row["ratio_sd_pct"] == pytest.approx(2.19, rel=0.1)
    assert row["rounds_for_budget"] == pytest.approx(
        (2 * 1.96 * 1.2533 * row["ratio_sd_pct"] / 0.5) ** 2, abs=1)
    assert 380 < row["rounds_for_budget"] < 560
    # And the median's bootstrap interval at that many rounds is about that wide.
    ratios = [1.004 + rng.gauss(0, 0.0219) for _ in range(row["rounds_for_budget"])]
    _, lo, hi = overhead.bootstrap(ratios, 400, rng)
    assert 100 * (hi - lo) == pytest.approx(0.5, abs=0.15)


def test_arms_must_include_the_bare_one(build_dir, tmp_path):
    proc, _ = run(build_dir, tmp_path, "--arms", "flare-raw")
    assert proc.returncode == 2 and "bare" in proc.stderr


# ---- the accuracy harness's matching and statistics (tests/gpu/bench/accuracy.py) -------------

def _accuracy_inputs(flare_factor):
    """Two cases of CALLS calls each, as the child would record them: a GEMM whose CUPTI kernel
    takes 1 ms (Flare's record `flare_factor` times that, cuBLAS's swapped shape), and a one-rank
    in-place all-reduce with no GPU activity at all (Flare times a few microseconds)."""
    sys.path.insert(0, BENCH)
    import accuracy
    calls = accuracy.CALLS
    cases = [{"tag": "gemm_16384x4096x4096", "class": "gemm",
              "meta": {"flops": 2 * 16384 * 4096 * 4096}},
             {"tag": "allreduce_inplace_1rank_64MiB", "class": "collective",
              "meta": {"bytes": 64 << 20}}]
    sequence, spans, recs, trace, events = [], [], [], [], {}
    t = 1_000_000  # ns, Flare's clock; CUPTI's trace is in us on another origin
    corr = 0
    for case in cases:
        events[case["tag"]] = []
        for i in [-1] + list(range(calls)):
            sequence.append([case["tag"], i])
            span_id = len(spans) + 1
            spans.append({"kind": "span", "name": "accuracy_call@call", "id": span_id,
                          "start_ns": t, "end_ns": t + 50_000})
            corr += 1
            host_us = 5_000 + t / 1e3
            if case["class"] == "gemm":
                recs.append({"kind": "gemm", "shape": [4096, 16384, 4096, 1],
                             "issue_ns": t + 10_000, "start_ns": t + 100_000,
                             "end_ns": t + 100_000 + int(1_000_000 * flare_factor)})
                if i >= 0:
                    trace.append({"cat": "user_annotation", "name": "flare-acc:%s#%d" % (
                        case["tag"], i), "ts": host_us, "dur": 50})
                    trace.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                  "ts": host_us + 10, "dur": 5, "args": {"correlation": corr}})
                    trace.append({"cat": "kernel", "name": "sm90_gemm", "ts": host_us + 100,
                                  "dur": 1000.0, "args": {"correlation": corr}})
                    events[case["tag"]].append(1.003)
            else:
                recs.append({"kind": "collective", "issue_ns": t + 10_000,
                             "start_ns": t + 20_000, "end_ns": t + 23_000})
                if i >= 0:
                    trace.append({"cat": "user_annotation", "name": "flare-acc:%s#%d" % (
                        case["tag"], i), "ts": host_us, "dur": 50})
                    events[case["tag"]].append(0.075)
            t += 2_000_000
    # A kernel launched outside every call (the _sleep that keeps the queue busy) is nobody's.
    recs.append({"kind": "kernel", "issue_ns": t + 10, "start_ns": t + 20, "end_ns": t + 900})
    ref = {"device": "test", "torch": "none", "sequence": sequence, "events_ms": events,
           "cases": cases}
    return accuracy, ref, spans + recs, {"traceEvents": trace}


def test_accuracy_matches_calls_by_span_and_correlation(tmp_path):
    accuracy, ref, recs, trace = _accuracy_inputs(1.01)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    rows, classes = accuracy.analyse(ref, recs, accuracy.cupti_per_call(str(path)))
    gemm = rows[0]
    assert gemm["flare_calls"] == accuracy.CALLS  # the swapped cuBLAS shape is still this case
    assert gemm["flare_gemm_shapes"] == [[4096, 16384, 4096]]
    assert gemm["cupti_ms"] == pytest.approx(1.0)
    assert gemm["flare_err_median"] == pytest.approx(0.01, abs=1e-6)
    assert gemm["cupti_tflops"] == pytest.approx(2 * 16384 * 4096 * 4096 / 1e9 / 1.0)
    assert classes["gemm"]["calls"] == accuracy.CALLS
    assert classes["gemm"]["within_2pct_at_median"]
    assert classes["gemm"]["event_err_median"] == pytest.approx(0.003, abs=1e-6)
    noop = rows[1]
    assert noop["cupti_ms"] == 0 and "no GPU activity" in noop["note"]
    assert noop["flare_err_median"] is None and "collective" not in classes
    text = accuracy.markdown("test", rows, classes)
    assert "| gemm | %d | +1.00%% |" % accuracy.CALLS in text
    # The constant part: Flare's GEMM reads 1.01 ms against CUPTI's 1.0 (+10 us per call); the
    # no-op collective (no CUPTI activity) is left out; the empty pairs' median beside it.
    ref["empty_pair_ms"] = [0.002, 0.003, 0.004]
    offset = accuracy.offset_summary(ref, rows)
    assert offset["flare_minus_cupti_us_median"] == pytest.approx(10.0, abs=1e-6)
    assert offset["flare_minus_cupti_us_range"] == pytest.approx([10.0, 10.0], abs=1e-6)
    assert offset["empty_pair_us_median"] == pytest.approx(3.0)
    text = accuracy.markdown("test", rows, classes, offset)
    assert "median +10.00 us" in text and "empty event pair behind the same busy queue: 3.00 us" \
        in text


def test_accuracy_reports_what_a_calibration_by_empty_pairs_would_give(tmp_path):
    # Flare reads 1.01 ms where CUPTI reads 1.0: less one empty pair of 5 us, +0.5%; less two,
    # 0.0%. Three events back to back give the gap between two event commands.
    accuracy, ref, recs, trace = _accuracy_inputs(1.01)
    ref["empty_pair_ms"] = [0.004, 0.005, 0.006]
    ref["event_chain_ms"] = [[0.0025, 0.0030]] * 5
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    rows, classes = accuracy.analyse(ref, recs, accuracy.cupti_per_call(str(path)))
    assert classes["gemm"]["calibrated_1_err_median"] == pytest.approx(0.005, abs=1e-6)
    assert classes["gemm"]["calibrated_2_err_median"] == pytest.approx(0.0, abs=1e-6)
    offset = accuracy.offset_summary(ref, rows)
    assert offset["event_chain_gap_us_medians"] == pytest.approx([2.5, 3.0])
    text = accuracy.markdown("test", rows, classes, offset)
    assert "gaps 2.50 and 3.00 us" in text and "gemm: +0.50% / +0.00%" in text


def test_accuracy_flags_a_class_outside_the_budget_and_a_missing_span(tmp_path):
    accuracy, ref, recs, trace = _accuracy_inputs(1.05)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    _, classes = accuracy.analyse(ref, recs, accuracy.cupti_per_call(str(path)))
    assert not classes["gemm"]["within_2pct_at_median"]
    with pytest.raises(RuntimeError, match="spans"):
        accuracy.analyse(ref, [r for r in recs if r.get("kind") != "span"][:-1] +
                         [r for r in recs if r.get("kind") == "span"][1:],
                         accuracy.cupti_per_call(str(path)))


def test_accuracy_compares_flares_kernel_with_the_cupti_kernel_of_its_name():
    # SDPA: CUPTI sees a small kernel ahead of the attention kernel; Flare times the attention
    # kernel only. The reference is then CUPTI's attention kernel, not the span of both.
    sys.path.insert(0, BENCH)
    import accuracy
    acts = [(0.0, 3.0, "kernel", "void at::native::fill_kernel<float>(float*)"),
            (5.0, 65.0, "kernel", "void pytorch_flash::flash_fwd_kernel<Traits, true>(Params)")]
    flare = [{"kind": "attention",
              "name": "void pytorch_flash::flash_fwd_kernel<Traits, true>(Params)"}]
    assert accuracy.matching_activities(flare, acts) == [acts[1]]
    # As many records as activities (a GEMM and its reduction both timed as one cuBLAS call is
    # one record for two activities: the whole span), or no name in common: every activity.
    assert accuracy.matching_activities([{"kind": "gemm", "name": "cublasLtMatmul"}], acts) == acts
    assert accuracy.matching_activities([{"kind": "kernel", "name": "other(int)"}], acts) == acts


def test_launch_cost_rounds_pair_each_arm_with_the_same_rounds_bare_run(tmp_path):
    """bench/launch_cost_rounds.py (gpu-session.sh's launch-cost.json): each row's median over
    the rounds, and the hook's cost as the median of per-round differences from the bare run, so
    that a machine drifting between rounds moves both arms and cancels; a failed run ("null" or a
    truncated line) is kept as null and left out of the figures, not taken for a zero."""
    runs = tmp_path / "runs"
    runs.mkdir()

    def line(launch, memset):
        return json.dumps({"batch": 512, "reps": 41,
                           "ns_per_call": {"launch": launch, "memset_async": memset}})
    # The machine drifts by 1000 ns per round; the hook adds 2800 ns to a launch, 2000 to a memset.
    (runs / "bare.jsonl").write_text("\n".join(line(3000 + 1000 * r, 800 + 1000 * r)
                                               for r in range(3)) + "\n")
    (runs / "summary.jsonl").write_text("\n".join(
        [line(5800 + 1000 * r, 2800 + 1000 * r) for r in range(2)] + ["null"]) + "\n")
    (runs / "raw.jsonl").write_text(line(9000, 5000) + '\n{"batch": 51\n' + line(11000, 7000)
                                    + "\n")
    (runs / "order").write_text("bare\nsummary\nraw\n")
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "launch_cost_rounds.py"),
                           str(runs), "--order", str(runs / "order"), "--table"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["rounds"] == 3 and doc["order"] == ["bare", "summary", "raw"]
    assert doc["arms"]["bare"]["median"] == {"launch": 4000, "memset_async": 1800}
    assert doc["arms"]["summary"]["runs"][2] is None
    assert doc["arms"]["summary"]["median"]["launch"] == 6300  # of the two runs that ran
    assert doc["hook_minus_bare"]["summary"] == {"launch": [2800, 2800, 2800],
                                                 "memset_async": [2000, 2000, 2000]}
    # raw's round 2 was cut short: rounds 1 and 3 pair with bare's rounds 1 and 3 (a
    # 2000 ns drift between them, none in the differences).
    assert doc["arms"]["raw"]["runs"][1] is None
    assert doc["hook_minus_bare"]["raw"]["launch"] == [6000, 6000, 6000]
    assert "summary 6300 (+2800 [+2800, +2800])" in proc.stderr
    assert "raw: 1 of 3 runs failed" in proc.stderr and "summary: 1 of 3 runs failed" in proc.stderr
