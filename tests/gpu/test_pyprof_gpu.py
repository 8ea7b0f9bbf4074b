"""Python API tracing's built-in defaults on a real PyTorch loop (needs a GPU and PyTorch).

Run: FLARE_BUILD_DIR=build python3 -m pytest tests/gpu/test_pyprof_gpu.py
Skipped on machines without a GPU or without PyTorch. The workload (pyprof_workload.py) is not
modified for Flare: LD_PRELOAD alone turns Python tracing on, with the defaults (DataLoader
__next__, torch.autograd.backward, torch.optim.Optimizer.step, torch.cuda.synchronize, GC).
"""
import collections
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

BUILD = os.environ.get("FLARE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                       "build"))


def test_defaults_on_a_pytorch_training_loop(tmp_path):
    hook = os.path.join(BUILD, "lib", "libflare_hook.so")
    spool, out = tmp_path / "spool", tmp_path / "counts.json"
    env = dict(os.environ, LD_PRELOAD=hook, FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="gpu-py")
    env.pop("TRACED_PYTHON_API", None)
    env.pop("FLARE_PYTHON_DEFAULTS", None)
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                        "pyprof_workload.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    ref = json.loads(out.read_text())
    exp = subprocess.run([os.path.join(BUILD, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, check=True)
    recs = [json.loads(l) for l in exp.stdout.splitlines()]
    spans = [r for r in recs if r["kind"] == "span"]
    names = collections.Counter(s["name"] for s in spans)
    # The tracer starts at the first CUDA call (model.cuda()), before the loop: every step counts.
    assert names["torch.utils.data.dataloader._BaseDataLoaderIter@__next__"] == ref["next_calls"]
    assert names["torch.autograd@backward"] == ref["steps"]
    assert names["torch.optim.Optimizer@step"] == ref["steps"]
    assert names["torch.cuda@synchronize"] == ref["steps"]
    gcs = [s for s in spans if s["name"] == "gc@collect" and s.get("gc_generation") == 2]
    assert gcs and gcs[-1]["gc_collected"] == ref["gc_collected"]
    # Kernels launched by backward() nest under its span; the synchronize's host wait under its.
    by_id = {s["id"]: s for s in spans}
    ops = [r for r in recs if r["kind"] != "span"]
    backward_ids = {s["id"] for s in spans if s["name"] == "torch.autograd@backward"}
    assert any(o["parent_span"] in backward_ids for o in ops)
    sync_ids = {s["id"] for s in spans if s["name"] == "torch.cuda@synchronize"}
    syncs = [o for o in ops if o["parent_span"] in sync_ids]
    assert syncs and all(o["kind"] == "sync" for o in syncs)
    for o in ops:
        if o["parent_span"]:
            span = by_id[o["parent_span"]]
            assert span["start_ns"] <= o["issue_ns"] <= span["end_ns"]
