"""One job-id rule (issue 22): the CLI's copy equals src/common/job_id.h (the hook's and flared's),
and `flare run` refuses an invalid id before it starts the job."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

from flare import cli  # noqa: E402


def test_the_cli_rule_is_the_one_of_job_id_h():
    header = open(os.path.join(ROOT, "src", "common", "job_id.h")).read()
    assert int(re.search(r"kMaxJobIdLength = (\d+);", header).group(1)) == cli.JOB_ID_MAX
    assert re.search(r'kJobIdPunctuation = "([^"]*)";', header).group(1) == cli.JOB_ID_PUNCTUATION
    assert re.search(r'kJobIdRule = "([^"]*)";', header).group(1) == cli.JOB_ID_RULE


@pytest.mark.parametrize("job,ok", [
    ("job-1.a_b:c@d", True), ("a" * 128, True), ("a" * 129, False), ("", False),
    ("a+b", False), ("a/b", False), ("a b", False), ("\x1b[31m", False), ("\u00e9", False)])
def test_valid_job_id(job, ok):
    assert cli.valid_job_id(job) == ok


def test_flare_run_refuses_an_invalid_id_before_starting_the_job(build_dir, tmp_path):
    marker = tmp_path / "started"
    flare = os.path.join(build_dir, "bin", "flare")
    env = {k: v for k, v in os.environ.items() if k != "FLARE_JOB_ID"}
    res = subprocess.run([flare, "run", "--job-id", "a+b", "--", "touch", str(marker)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2, res.stderr
    assert "1 to 128 of A-Z a-z 0-9 . _ - : @" in res.stderr
    assert not marker.exists()
    env["FLARE_JOB_ID"] = "bad id"
    res = subprocess.run([flare, "run", "--", "touch", str(marker)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 2 and "FLARE_JOB_ID" in res.stderr, res.stderr
    assert not marker.exists()
    # A valid one runs.
    res = subprocess.run([flare, "run", "--job-id", "ok-1", "--", "touch", str(marker)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert marker.exists()
