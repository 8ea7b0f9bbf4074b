"""cuda-gdb script: read the per-connection step counters of the hung NCCL kernel.

Run by the rank on itself (src/hang/inspect.h):
    FLARE_CUDA_GDB_LAYOUT=layouts/<name>.json cuda-gdb -batch -nx -p <pid> -x flare_nccl_steps.py

Finds the active kernel whose name matches the layout's "kernel_regex" (`info cuda kernels`),
puts the focus on thread 0 of each of its blocks (NCCL runs one block per channel), evaluates
the layout's expressions there, and prints one line per connection:
    FLARE-STEP channel=<c> peer=<rank> step=<n> send=<0|1>
or `FLARE-ERROR <why>` lines. Then it detaches, so the process goes on (still hung).

A layout is a JSON object:
    {"kernel_regex": "...",             # which kernel
     "channel": "blockIdx.x",          # expression: this block's channel
     "send_peer": "...", "send_step": "...",   # expressions, evaluated per block
     "recv_peer": "...", "recv_step": "..."}
Expressions are cuda-gdb expressions in the focused thread: variables when the kernel has
debug information (the test kernel, built with -G), or casts of raw shared/local memory at
offsets measured for one NCCL build (NCCL ships without device debug information; its layout
depends on the version). The parsing helpers below do not need gdb and are unit-tested.
"""
import json
import os
import re

KERNEL_LINE = re.compile(
    r"^\s*\*?\s*(?P<id>\d+)\s+\S+\s+(?P<dev>\d+)\s+(?P<grid>\d+)\s+(?P<status>\S+)\s+"
    r"(?P<sms>0x[0-9a-fA-F]+)\s+\((?P<gx>\d+),(?P<gy>\d+),(?P<gz>\d+)\)\s+"
    r"\((?P<bx>\d+),(?P<by>\d+),(?P<bz>\d+)\)\s+(?P<name>.+?)\s*$")


def parse_kernels(text):
    """Rows of `info cuda kernels`: dicts with id, dev, status, grid (x,y,z) and name."""
    rows = []
    for line in text.splitlines():
        m = KERNEL_LINE.match(line)
        if not m:
            continue
        rows.append({
            "id": int(m.group("id")), "dev": int(m.group("dev")), "status": m.group("status"),
            "grid": (int(m.group("gx")), int(m.group("gy")), int(m.group("gz"))),
            "name": m.group("name"),
        })
    return rows


def pick_kernel(rows, kernel_regex):
    """The first active kernel whose name matches, or None."""
    pattern = re.compile(kernel_regex)
    for row in rows:
        if row["status"].lower() == "active" and pattern.search(row["name"]):
            return row
    return None


def step_lines(channel, send_peer, send_step, recv_peer, recv_step):
    """The two FLARE-STEP lines of one channel."""
    return [
        "FLARE-STEP channel=%d peer=%d step=%d send=1" % (channel, send_peer, send_step),
        "FLARE-STEP channel=%d peer=%d step=%d send=0" % (channel, recv_peer, recv_step),
    ]


def load_layout(path):
    with open(path) as f:
        layout = json.load(f)
    for key in ("kernel_regex", "channel", "send_peer", "send_step", "recv_peer", "recv_step"):
        if key not in layout:
            raise ValueError("layout %s lacks %r" % (path, key))
    return layout


def _run_in_gdb():
    import gdb  # only inside cuda-gdb

    def say(line):
        gdb.write(line + "\n")
        gdb.flush()

    layout_path = os.environ.get("FLARE_CUDA_GDB_LAYOUT", "")
    try:
        layout = load_layout(layout_path)
    except (OSError, ValueError) as e:
        say("FLARE-ERROR cannot load layout %r: %s" % (layout_path, e))
        return
    kernels = parse_kernels(gdb.execute("info cuda kernels", to_string=True))
    kernel = pick_kernel(kernels, layout["kernel_regex"])
    if kernel is None:
        say("FLARE-ERROR no active kernel matches %s (%d kernels)" %
            (layout["kernel_regex"], len(kernels)))
        return
    say("FLARE-KERNEL id=%d name=%s grid=%s" % (kernel["id"], kernel["name"], kernel["grid"]))
    for block in range(kernel["grid"][0]):
        try:
            gdb.execute("cuda kernel %d block (%d,0,0) thread (0,0,0)" % (kernel["id"], block),
                        to_string=True)
            values = [int(gdb.parse_and_eval(layout[k])) for k in
                      ("channel", "send_peer", "send_step", "recv_peer", "recv_step")]
        except gdb.error as e:  # block not resident, expression not readable
            say("FLARE-ERROR block %d: %s" % (block, str(e).splitlines()[0] if str(e) else e))
            continue
        for line in step_lines(*values):
            say(line)


if __name__ == "__main__":
    try:
        _run_in_gdb()
    finally:
        try:
            import gdb
            gdb.execute("detach", to_string=True)
        except Exception:  # not in gdb, or nothing attached
            pass
