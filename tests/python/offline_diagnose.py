"""`flare-diagnose --json` on a spool, as the scenario tests run it.

Its exit status is part of the contract: 0 when nothing was found, 3 when something was, so the
answer is checked against the status before it is returned.
"""
import json
import os
import subprocess


def diagnose(build_dir, out, *extra):
    """The diagnoses flare-diagnose finds in the spool `out` (extra flags appended)."""
    res = subprocess.run([os.path.join(build_dir, "bin", "flare-diagnose"), "--input", str(out),
                          "--json", *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 3), res.stderr
    found = json.loads(res.stdout)["diagnoses"]
    assert (res.returncode == 3) == bool(found), (res.returncode, found)
    return found
