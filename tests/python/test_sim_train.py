"""flare-sim-train: the simulated multi-rank job, its faults, and the launcher's contract."""
import os
import stat

import pytest

from conftest import python_interpreters

SMALL = ["--layers", 2, "--hidden", 2048, "--seq", 1024]


def test_eight_ranks_run_every_step(sim_train):
    run = sim_train("--ranks", 8, "--steps", 4, *SMALL)
    assert run.returncode == 0, run.stderr
    assert len(run.ranks) == 8
    for r in run.ranks:
        assert len(r["step_ms"]) == 4
        assert all(ms > 0 for ms in r["step_ms"])


def test_underclocked_rank_slows_everyone_and_owns_the_slow_gemms(sim_train):
    # Large GEMMs so that GPU time, not the host (2 shared cores), sets the step time.
    args = ["--ranks", 4, "--steps", 6, "--tp", 2, "--hidden", 8192]
    healthy = sim_train(*args)
    faulty = sim_train(*args, env={"FLARE_SIM_CLOCK_FACTOR": "3:0.8"})
    assert healthy.returncode == 0 and faulty.returncode == 0, faulty.stderr
    for rank in range(4):
        # Synchronous training: the slow GPU holds back every rank's step.
        assert faulty.median(rank, "step_ms") > 1.08 * healthy.median(rank, "step_ms"), rank
    # The GEMM's event-timed duration, its least host-inflated step (the median of 6 steps on a
    # rank sharing 2 cores with 3 others read 7% high once, 1.175x instead of 1.25x).
    slow = faulty.low(3, "gemm_ms")
    for rank in range(3):
        assert slow > 1.2 * faulty.low(rank, "gemm_ms"), rank
    # 0.8 of the clock: GEMMs take 1/0.8 = 1.25x as long.
    assert slow == pytest.approx(1.25 * healthy.low(3, "gemm_ms"), rel=0.08)


@pytest.mark.parametrize("version", sorted(python_interpreters()))
def test_python_workload_on_each_interpreter(sim_train, version):
    exe = python_interpreters()[version]
    run = sim_train("--ranks", 2, "--steps", 3, "--python", "--python-exe", exe, *SMALL)
    assert run.returncode == 0, run.stderr
    assert [len(r["step_ms"]) for r in run.ranks] == [3, 3]
    assert all(g > 0 for r in run.ranks for g in r["gemm_ms"])


def test_ranks_get_torchrun_variables_and_pass_through_flare_and_preload(
        sim_train, build_dir, tmp_path):
    dump = tmp_path / "env"
    dump.mkdir()
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text('#!/bin/sh\nenv > "%s/rank$RANK"\nexec python3 "$@"\n' % dump)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    preload = os.path.join(build_dir, "lib", "sim", "libcuda.so.1")  # harmless to preload
    run = sim_train("--ranks", 2, "--steps", 1, "--python", "--python-exe", wrapper, *SMALL,
                    env={"LD_PRELOAD": preload, "FLARE_OUTPUT_DIR": "/tmp/x"})
    assert run.returncode == 0, run.stderr
    for rank in range(2):
        env = dict(line.split("=", 1) for line in
                   (dump / ("rank%d" % rank)).read_text().splitlines() if "=" in line)
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RUN_ID"]
        assert env["LD_PRELOAD"] == preload
        assert env["FLARE_OUTPUT_DIR"] == "/tmp/x"


def test_a_crashing_rank_fails_the_job(sim_train):
    run = sim_train("--ranks", 4, "--steps", 6, *SMALL, env={"FLARE_SIM_CRASH": "1:2"})
    assert run.returncode == 1
    assert "rank 1 failed" in run.stderr
    assert len(run.ranks[1]["step_ms"]) == 2


@pytest.mark.parametrize("kind", ["collective", "compute", "skip"])
def test_injected_hang_stops_every_rank(sim_train, kind):
    run = sim_train("--ranks", 4, "--steps", 6, "--timeout", 3, *SMALL,
                    env={"FLARE_SIM_HANG": "2:%s:2" % kind})
    assert run.returncode == 124, run.stderr
    assert "timed out" in run.stderr
    # Nobody finishes step 2: a synchronous job hangs everywhere.
    for r in run.ranks:
        assert len(r["step_ms"]) <= 2, r
    if kind == "skip":
        assert "rank 2 stuck" in run.stderr


def test_bad_fault_values_warn_once_and_run(sim_train):
    run = sim_train("--ranks", 2, "--steps", 2, *SMALL,
                    env={"FLARE_SIM_CLOCK_FACTOR": "1:fast", "FLARE_SIM_HANG": "0:sideways:1"})
    assert run.returncode == 0, run.stderr
    assert "FLARE_SIM_CLOCK_FACTOR" in run.stderr and "'fast'" in run.stderr
    assert "FLARE_SIM_HANG" in run.stderr and "sideways" in run.stderr
    # Each rank says it once.
    assert run.stderr.count("'fast'") == 1


@pytest.mark.parametrize("args,message", [
    (["--ranks", 0], "--ranks"),
    (["--steps", "x"], "bad value for --steps"),
    (["--frobnicate", 1], "unknown option"),
])
def test_bad_arguments(sim_train, args, message):
    run = sim_train(*args)
    assert run.returncode == 2
    assert message in run.stderr
