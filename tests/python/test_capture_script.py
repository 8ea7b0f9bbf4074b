"""tests/gpu/capture.sh in its simulated mode (issue 19, part 2): the fixture layout that the GPU
capture writes and tests/fixtures/gpu/README.md documents, from the simulated Python workload, so
that what consumes fixtures can be tested before the first GPU capture exists."""
import gzip
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 4


def test_simulated_capture_writes_the_documented_layout(build_dir, tmp_path):
    out = tmp_path / "fixtures"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(OUT=str(out), FLARE_BUILD_DIR=build_dir, FLARE_CAPTURE_SIM="1")
    proc = subprocess.run(["bash", os.path.join(ROOT, "tests", "gpu", "capture.sh"), "--steps",
                           str(STEPS)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["schema"] == 1 and meta["environment"]["mode"] == "sim"
    for key in ("gpu", "driver", "cuda", "torch", "flare"):
        assert key in meta["environment"]
    fixtures = {f["name"]: f for f in meta["fixtures"]}
    assert set(fixtures) == {"healthy-small", "healthy-medium", "host-stall", "stray-sync",
                             "slow-dataloader", "unaligned-gemm", "cuda-graph", "compile"}
    for name in ("cuda-graph", "compile"):
        assert "needs PyTorch+GPU" in fixtures[name]["skipped"]
        assert not (out / name).exists()
    assert fixtures["host-stall"]["expect"] == {"kind": "issue_stall", "rank": 1,
                                                "team": "algorithm"}
    total = 0
    for name, f in fixtures.items():
        if "skipped" in f:
            continue
        assert "error" not in f, f
        assert f["files"] == ["%s/rank%d.jsonl.gz" % (name, r) for r in range(f["ranks"])]
        loop = json.loads((out / name / "loop.json").read_text())["ranks"]
        assert sorted(loop) == [str(r) for r in range(f["ranks"])]
        records = 0
        for r, rel in enumerate(f["files"]):
            with gzip.open(out / rel, "rt") as fh:
                recs = [json.loads(line) for line in fh]
            records += len(recs)
            assert {x["rank"] for x in recs} == {r}
            kinds = {x["kind"] for x in recs}
            assert "gemm" in kinds and "summary" not in kinds, kinds  # raw mode
            assert loop[str(r)]["steps"] == STEPS
        assert records == f["records"]
        total += f["bytes"]
    assert total == meta["total_bytes"] <= 5 << 20
