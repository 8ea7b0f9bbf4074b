"""Ranks that share one GPU (the same DeviceInfo.uuid; src/engine/diagnosis/shared_gpu.cc), end to
end on the simulated stack: FLARE_SIM_DEVICES=1 puts every rank of the node on the one simulated
GPU, as a launcher that never calls torch.cuda.set_device(LOCAL_RANK) does. Rank 2 is also
underclocked, which gpu_slow names when every rank has its own GPU.

- flare-diagnose (raw spool) and flared (summary mode, streamed) name shared_gpu with the four
  ranks, routed to infrastructure, and leave out the GPU-time finding on them, saying so in what
  they looked at;
- with a GPU per rank the same fault is gpu_slow on rank 2 and nothing is said about sharing."""
import json
import os
import subprocess

import pytest

import contention
from offline_diagnose import diagnose

RANKS = 4


def run_job(build_dir, out, env):
    full = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
                FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="job", FLARE_SIM_CLOCK_FACTOR="2:0.8")
    full.update(env)
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", str(RANKS),
                          "--steps", "8", "--layers", "4", "--hidden", "4096", "--tp", "2",
                          "--quiet", "--json", os.path.join(out, "sim.json")], env=full,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def test_ranks_on_one_gpu_are_named_and_their_gpu_time_findings_left_out(build_dir, tmp_path):
    run_job(build_dir, tmp_path, {"FLARE_SIM_DEVICES": "1"})
    found = diagnose(build_dir, tmp_path)
    assert [(d["kind"], d["ranks"], d["team"]) for d in found] == \
        [("shared_gpu", [0, 1, 2, 3], "infrastructure")], found
    assert "torch.cuda.set_device(LOCAL_RANK)" in found[0]["summary"]
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    assert "left out 1 finding on ranks that share a GPU" in res.stdout, res.stdout


def test_a_gpu_per_rank_names_the_slow_gpu_and_no_sharing(build_dir, tmp_path):
    run_job(build_dir, tmp_path, {})
    # Beyond a host finding this machine's load explains (contention.py).
    found = contention.beyond_load(diagnose(build_dir, tmp_path), tmp_path / "sim.json")
    assert [(d["kind"], d["ranks"]) for d in found] == [("gpu_slow", [2])], found
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input",
                          str(tmp_path), "--json"], capture_output=True, text=True, timeout=120)
    looked = {d["name"]: d for d in json.loads(res.stdout)["lookedAt"]["detectors"]}
    assert looked["shared_gpu"]["ran"] and looked["shared_gpu"]["note"] == ""


def test_flared_names_the_shared_gpu_from_a_summary_mode_stream(build_dir, tmp_path):
    from flared_process import Flared
    from pipeline_health import assert_nothing_refused
    if not os.path.exists(os.path.join(build_dir, "bin", "flared")):
        pytest.skip("build/bin/flared not built")
    d = Flared(build_dir, tmp_path)
    try:
        run_job(build_dir, tmp_path / "spool", {"FLARE_SIM_DEVICES": "1", "FLARE_MODE": "summary",
                                                "FLARE_DAEMON": "127.0.0.1:%d" % d.grpc})
        res = subprocess.run([os.path.join(build_dir, "bin", "flare"), "diagnose",
                              "--daemon-http", "127.0.0.1:%d" % d.http, "--job", "job", "--json"],
                             capture_output=True, text=True, timeout=120)
        out = json.loads(res.stdout)
        assert [(x["kind"], x["ranks"]) for x in out["diagnoses"]] == \
            [("shared_gpu", [0, 1, 2, 3])], out["diagnoses"]
        notes = [x["note"] for x in out["lookedAt"]["detectors"]]
        assert any("share a GPU" in n for n in notes), notes
        assert_nothing_refused(d.http)
    finally:
        d.stop()
