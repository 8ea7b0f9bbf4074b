"""No orphaned spool (issue 22): a job that ends while flared is down leaves its pending batches
in the spool (DIR/<job>/<rank>/pending-<pid>.pb with its .meta); once flared is back they are
uploaded exactly once, by `flare upload --spool DIR` or in the background by the next Flare
process on the node (FLARE_SPOOL_SWEEP), and deleted.

Each test kills flared (SIGKILL) while an 4-rank simulated job streams to it, lets the job end,
restarts flared on the same ports and database, uploads, and compares every rank's record count
with the same workload traced into a local spool only (the truth).
"""
import collections
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import test_daemon_stream

RANKS = 4
STEPS = 120
JOB = "uploadtest"


class Flared(test_daemon_stream.Flared):
    """test_daemon_stream's flared, persisting every 200 ms; ranks() maps rank -> records held."""

    def __init__(self, build_dir, workdir):
        super().__init__(build_dir, workdir, extra=["--persist-interval-ms", "200"])

    def ranks(self, job):
        import urllib.error
        try:
            return {r: int(x["records"]) for r, x in super().ranks(job).items()}
        except urllib.error.HTTPError:
            return {}

    @property
    def address(self):
        return "127.0.0.1:%d" % self.grpc_port


@pytest.fixture
def flared(build_dir, tmp_path):
    for tool in ("flared", "flare-upload", "flare-export"):
        if not os.path.exists(os.path.join(build_dir, "bin", tool)):
            pytest.skip("build/bin/%s not built" % tool)
    d = Flared(build_dir, tmp_path).start()
    yield d
    d.stop(signal.SIGKILL)


def hook_env(build_dir, spool, **extra):
    env = {"LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
           "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": JOB, "FLARE_MODE": "raw",
           "FLARE_EXIT_FLUSH_SECONDS": "1"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def truth(sim_train, build_dir, tmp_path):
    """Records per rank of the same workload traced into a local spool only."""
    spool = tmp_path / "truth"
    res = sim_train("--ranks", RANKS, "--steps", STEPS, env=hook_env(build_dir, spool))
    assert res.returncode == 0, res.stderr
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    return dict(collections.Counter(json.loads(line)["rank"] for line in exp.stdout.splitlines()))


def pending(spool):
    return sorted(p for p in spool.rglob("pending-*.pb"))


def job_ends_while_flared_is_down(sim_train, build_dir, tmp_path, daemon):
    """Runs the job, kills flared once every rank streamed to it, waits for the job's end."""
    spool = tmp_path / "spool"
    env = hook_env(build_dir, spool, FLARE_DAEMON=daemon.address, FLARE_SPOOL_SWEEP=0)
    result = {}
    t = threading.Thread(target=lambda: result.update(
        res=sim_train("--ranks", RANKS, "--steps", STEPS, env=env, timeout=300)))
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = daemon.ranks(JOB)
        if len(got) == RANKS and all(n > 0 for n in got.values()):
            break
        time.sleep(0.05)
    assert t.is_alive(), "the job ended before flared was killed; make it longer"
    daemon.stop(signal.SIGKILL)
    t.join(300)
    assert result["res"].returncode == 0, result["res"].stderr
    files = pending(spool)
    assert len(files) == RANKS, files  # one pending file per rank, each with its meta
    for f in files:
        assert os.path.exists(str(f)[:-3] + ".meta"), f
        assert os.stat(str(f)[:-3] + ".meta").st_mode & 0o077 == 0  # it holds the token
    return spool


def wait_for_records(daemon, want, seconds=30):
    deadline = time.monotonic() + seconds
    got = daemon.ranks(JOB)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.2)
        got = daemon.ranks(JOB)
    return got


def test_flare_upload_sends_every_record_of_a_job_that_ended_during_an_outage_exactly_once(
        sim_train, build_dir, tmp_path, flared):
    want = truth(sim_train, build_dir, tmp_path)
    spool = job_ends_while_flared_is_down(sim_train, build_dir, tmp_path, flared)
    flared.start()  # same ports, same database
    assert flared.ranks(JOB) != want  # the outage's batches are still in the spool
    flare = os.path.join(build_dir, "bin", "flare")
    up = subprocess.run([flare, "upload", "--spool", str(spool), "--daemon", flared.address],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "%d uploaded" % RANKS in up.stdout, up.stdout
    assert wait_for_records(flared, want) == want
    assert not pending(spool) and not list(spool.rglob("*.meta"))
    # Again: nothing left, nothing twice.
    up = subprocess.run([flare, "upload", "--spool", str(spool), "--daemon", flared.address],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0 and up.stdout.startswith("0 uploaded"), up.stdout + up.stderr
    # Exactly once even when the files come back (a crash between the stream's end and the
    # unlink): flared answers with a resume point past every batch.
    time.sleep(0.5)
    assert flared.ranks(JOB) == want


def test_the_next_flare_process_on_the_node_sweeps_the_spool_in_the_background(
        sim_train, build_dir, tmp_path, flared):
    want = truth(sim_train, build_dir, tmp_path)
    spool = job_ends_while_flared_is_down(sim_train, build_dir, tmp_path, flared)
    flared.start()
    # Another job on the node streams to flared: its process uploads the orphans while it runs
    # (a cut-short sweep leaves whole files for the next process: retried a few times).
    env = hook_env(build_dir, spool, FLARE_DAEMON=flared.address, FLARE_JOB_ID="nextjob")
    got = {}
    for _ in range(3):
        res = sim_train("--ranks", 1, "--steps", 40, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        got = wait_for_records(flared, want, seconds=10)
        if got == want:
            break
    assert got == want
    assert not pending(spool) or all(JOB not in str(p) for p in pending(spool))


def test_a_live_process_spool_is_left_alone(build_dir, tmp_path, flared):
    """A pending file whose process is alive (it holds the lock) is not uploaded or deleted."""
    import fcntl
    folder = tmp_path / "spool" / JOB / "0"
    folder.mkdir(parents=True)
    pb = folder / "pending-4242.pb"
    pb.write_bytes(b"")
    (folder / "pending-4242.meta").write_bytes(b"")
    with open(pb, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        up = subprocess.run([os.path.join(build_dir, "bin", "flare-upload"), "--spool",
                             str(tmp_path / "spool"), "--daemon", flared.address],
                            capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert "1 left to live processes" in up.stdout, up.stdout
    assert pb.exists()


def test_a_premade_symlink_in_the_spool_is_not_written_through(sim_train, build_dir, tmp_path):
    """The issue's probe: SPOOL/<job>/0 -> elsewhere made before the job. The rank writes
    nothing there (one warning names the link); the other rank's folder is private (0700)."""
    spool, elsewhere = tmp_path / "spool", tmp_path / "elsewhere"
    (spool / JOB).mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(spool / JOB / "0"))
    res = sim_train("--ranks", 2, "--steps", 3, env=hook_env(build_dir, spool))
    assert res.returncode == 0, res.stderr
    assert not list(elsewhere.iterdir())
    assert "symbolic link" in res.stderr
    assert os.stat(str(spool / JOB / "1")).st_mode & 0o777 == 0o700
    files = list((spool / JOB / "1").iterdir())
    assert files and all(os.stat(str(f)).st_mode & 0o077 == 0 for f in files)
