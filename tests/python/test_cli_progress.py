"""flare export / timeline: a progress line on stderr only when stderr is a terminal, none with
--quiet or when stderr is a pipe; the output itself is unchanged either way."""
import os
import pty
import subprocess

import pytest


@pytest.fixture(scope="module")
def spool(build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("progress") / "spool"
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(out), FLARE_JOB_ID="progress")
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "2",
                          "--steps", "3", "--layers", "1", "--quiet"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


def flare_cmd(build_dir):
    return [os.path.join(build_dir, "bin", "flare")]


def run_on_pty(command, stdout_path):
    """Runs `command` with stderr on a pseudo-terminal (stdout to a file); returns (rc, what
    the terminal received)."""
    master, slave = pty.openpty()
    with open(stdout_path, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=slave)
    os.close(slave)
    received = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO once the child side is closed
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    return proc.wait(timeout=120), received.decode(errors="replace")


def test_export_progress_on_a_terminal_only(build_dir, spool, tmp_path):
    direct = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                             str(spool)], capture_output=True, timeout=120)
    assert direct.returncode == 0
    records = direct.stdout.count(b"\n")
    assert records > 10

    # Not a terminal: stderr stays empty, stdout is the tool's output byte for byte.
    piped = subprocess.run(flare_cmd(build_dir) + ["export", "--input", str(spool)],
                           capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == b""
    assert piped.stdout == direct.stdout

    # A terminal: the last progress line counts every record; stdout unchanged.
    rc, tty = run_on_pty(flare_cmd(build_dir) + ["export", "--input", str(spool)],
                         tmp_path / "out.jsonl")
    assert rc == 0
    assert (tmp_path / "out.jsonl").read_bytes() == direct.stdout
    assert "\r" in tty and ("%d records" % records) in tty, tty

    # --quiet on a terminal: nothing on stderr, and --quiet is not passed to the tool.
    rc, tty = run_on_pty(flare_cmd(build_dir) + ["export", "--quiet", "--input", str(spool)],
                         tmp_path / "quiet.jsonl")
    assert rc == 0 and tty == ""
    assert (tmp_path / "quiet.jsonl").read_bytes() == direct.stdout


def test_timeline_progress_counts_the_file_written(build_dir, spool, tmp_path):
    trace = tmp_path / "t.json"
    rc, tty = run_on_pty(flare_cmd(build_dir) + ["timeline", "--input", str(spool), "-o",
                                                 str(trace)], tmp_path / "stdout")
    assert rc == 0 and trace.exists()
    size = trace.stat().st_size
    shown = ("%d B" % size) if size < 1024 else ("%.1f KiB" % (size / 1024.0)
                                                  if size < 1024 * 1024
                                                  else "%.1f MiB" % (size / 1024.0 / 1024.0))
    assert ("flare: " + shown) in tty, tty

    piped = subprocess.run(flare_cmd(build_dir) + ["timeline", "--input", str(spool), "-o",
                                                   str(tmp_path / "t2.json")],
                           capture_output=True, timeout=120)
    assert piped.returncode == 0 and b"\rflare: " not in piped.stderr
    rc, tty = run_on_pty(flare_cmd(build_dir) + ["timeline", "--quiet", "--input", str(spool),
                                                 "-o", str(tmp_path / "t3.json")],
                         tmp_path / "stdout3")
    # (the terminal turns the tool's own "\n" into "\r\n"; a progress line starts "\rflare: ")
    assert rc == 0 and "\rflare: " not in tty
