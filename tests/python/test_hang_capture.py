"""Hang stack capture in a Python process: the Python stacks of every thread, taken from a native
thread without the GIL while the main thread sleeps inside a known function (src/hang)."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import python_interpreters

# The child: loads the capture library with ctypes, parks a second thread in `worker_waits` (the
# main thread goes on only once it waits there) and its main thread in `main_sleeper`, blocked
# reading a pipe; the library's native thread
# captures once the main thread is blocked in that read (never after a fixed delay: under load
# the main thread was once caught on its way, inside os.path.exists), writes the file, then
# writes the byte the read returns with. Mode "gil": the main thread reads through
# ctypes.PyDLL, which keeps the GIL for the whole call, so the capture cannot take the GIL.
CHILD = textwrap.dedent('''
    import ctypes, os, sys, threading
    lib = ctypes.CDLL(sys.argv[1])
    out = sys.argv[2]
    hold_gil = sys.argv[3] == "gil"
    read_holding_gil = ctypes.PyDLL(None).read
    buf = ctypes.create_string_buffer(1)
    cond = threading.Condition()

    def worker_waits():
        with cond:
            cond.notify()
            cond.wait(30)          # WORKER_LINE

    def main_sleeper(fd):
        if hold_gil:
            while read_holding_gil(fd, buf, 1) != 1: pass  # MAIN_LINE_GIL
        else:
            os.read(fd, 1)  # MAIN_LINE

    t = threading.Thread(target=worker_waits, name="worker")
    with cond:
        t.start()
        cond.wait(30)  # back once the worker waits at WORKER_LINE (its wait released cond)
    wait_fd, done_fd = os.pipe()
    assert lib.flare_hang_test_capture_when_blocked(wait_fd, done_fd, out.encode()) == 0
    main_sleeper(wait_fd)
    assert os.path.exists(out)
    with cond:
        cond.notify()
    t.join()
''')


def line_of(marker):
    """The line of the child that ends with `marker` (a trailing newline makes it exact)."""
    for i, line in enumerate(CHILD.splitlines(), 1):
        if (line + "\n").endswith(marker) or (not marker.endswith("\n") and marker in line):
            return i
    raise AssertionError(marker)


def parse(path):
    threads, status = [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("status "):
                status = line
            elif line.startswith("thread "):
                threads.append({"main": line.endswith("main=1"), "py": [], "native": []})
            elif line.startswith("py "):
                fn, file, lineno = line[3:].split("\t")
                threads[-1]["py"].append((fn, file, int(lineno)))
            elif line.startswith("native "):
                threads[-1]["native"].append(line[7:])
    return status, threads


@pytest.mark.parametrize("mode", ["sleep", "gil"])
@pytest.mark.parametrize("version", sorted(python_interpreters()))
def test_python_stacks_of_all_threads_without_the_gil(build_dir, tmp_path, version, mode):
    lib = os.path.join(build_dir, "lib", "libflare_hang_capture_test.so")
    if not os.path.exists(lib):
        pytest.fail("%s not built (make flare_hang_capture_test)" % lib)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "stacks.txt"
    proc = subprocess.run([python_interpreters()[version], str(script), lib, str(out), mode],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    status, threads = parse(out)
    assert status.startswith("status ok python=ok"), status
    main = [t for t in threads if t["main"]]
    assert len(main) == 1
    # The main thread: innermost Python frame is main_sleeper at the sleep line, called from
    # <module> in the script.
    fn, file, lineno = main[0]["py"][0]
    marker = "MAIN_LINE_GIL" if mode == "gil" else "MAIN_LINE"
    assert (fn, file, lineno) == ("main_sleeper", str(script), line_of(marker + "\n"))
    assert main[0]["py"][-1][0] == "<module>"
    # The worker thread: worker_waits at its line, below threading's wait frames.
    workers = [t for t in threads if any(f[0] == "worker_waits" for f in t["py"])]
    assert len(workers) == 1
    assert not workers[0]["main"]
    frame = next(f for f in workers[0]["py"] if f[0] == "worker_waits")
    assert frame[1:] == (str(script), line_of("WORKER_LINE"))
    assert workers[0]["py"][0][1].endswith("threading.py")
    # Both Python threads were also captured natively (joined by pthread id).
    assert main[0]["native"] and workers[0]["native"]
