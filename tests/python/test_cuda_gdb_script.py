"""The parts of tools/cuda-gdb-scripts/flare_nccl_steps.py that do not need cuda-gdb: the
`info cuda kernels` table, the kernel choice, the output lines and the layouts."""
import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tools", "cuda-gdb-scripts")

spec = importlib.util.spec_from_file_location("flare_nccl_steps",
                                              os.path.join(SCRIPTS, "flare_nccl_steps.py"))
steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(steps)

# The column layout of `info cuda kernels` as the cuda-gdb manual shows it (section "info cuda
# kernels"); the argument list after the name varies.
TABLE = """\
  Kernel Parent Dev Grid Status   SMs Mask   GridDim  BlockDim Invocation
       0      -   0    1 Active 0x00000001 (1,1,1) (128,1,1) gemm_kernel(float*)
*      1      -   0    7 Active 0x000000fe (8,1,1) (640,1,1) ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)
       2      -   1    9 Terminated 0x00000000 (4,1,1) (64,1,1) ncclDevKernel_Generic()
"""


def test_parse_kernels_table():
    rows = steps.parse_kernels(TABLE)
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert rows[1]["grid"] == (8, 1, 1)
    assert rows[1]["name"].startswith("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert rows[2]["dev"] == 1 and rows[2]["status"] == "Terminated"


def test_pick_kernel_takes_the_first_active_match():
    rows = steps.parse_kernels(TABLE)
    assert steps.pick_kernel(rows, r"^ncclDevKernel|^ncclKernel")["id"] == 1
    assert steps.pick_kernel(rows, r"ncclDevKernel_Generic") is None  # terminated
    assert steps.pick_kernel([], r".") is None


def test_step_lines_are_what_the_rank_parses():
    assert steps.step_lines(3, 5, 120, 7, 96) == [
        "FLARE-STEP channel=3 peer=5 step=120 send=1",
        "FLARE-STEP channel=3 peer=7 step=96 send=0",
    ]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SCRIPTS, "layouts", "*.json"))))
def test_layouts_load(path):
    layout = steps.load_layout(path)
    assert layout["kernel_regex"]


def test_incomplete_layout_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kernel_regex": "x"}')
    with pytest.raises(ValueError):
        steps.load_layout(str(bad))
