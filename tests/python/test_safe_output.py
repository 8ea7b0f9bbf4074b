"""Control characters from ranks and the daemon (kernel names, job and host names, error texts)
never reach the terminal raw (issue 22): `flare report` text, --json and --html, and the CLI's
error lines, escape them as \\u00XX (flare/safe_text.py); JSON stays valid with the same values."""
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from flare import cli, report, safe_text  # noqa: E402

EVIL = "gemm\x1b[2J\x1b]0;owned\x07\r\x9b31m\x7f"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_escape_controls():
    assert safe_text.escape_controls("a\x1b[31mb\tc\nd\r") == "a\\u001b[31mb\tc\nd\\u000d"
    assert safe_text.escape_controls("\u00e9\u4e2d") == "\u00e9\u4e2d"  # text stays text
    assert json.loads(safe_text.escape_controls(json.dumps("x\x7f\x9b", ensure_ascii=False))) \
        == "x\x7f\x9b"


def synthetic(job):
    sig = {"name": EVIL, "kind": "OP_KIND_GEMM", "dtype": "DTYPE_BF16", "shape": ["8", "16", "32"]}
    return {"jobId": job, "ranks": [{"rank": 0, "host": "host\x1b[8m"}], "diagnoses": [],
            "series": None, "hangs": [], "alerts": [], "metrics": {}, "kernels": [],
            "report": {"jobId": job, "signatures": [
                {"signature": sig, "count": "3", "totalNs": "300", "timeShare": 1.0,
                 "tflops": 1.5, "p50Ns": "100", "p99Ns": "100"}]}}


@pytest.fixture
def fake_daemon(monkeypatch):
    monkeypatch.setattr(report, "collect", lambda get, job, **kw: synthetic(job))


@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_report_output_has_no_raw_control_character(fake_daemon, capsys, mode):
    assert cli.main(["report", "--job", "job1", *mode]) in (0, None)
    out = capsys.readouterr().out
    assert "gemm" in out
    assert not RAW.search(out), repr(out)
    assert "\\u001b[2J" in out
    if mode:
        got = json.loads(out)  # still JSON, with the true name inside
        assert got["report"]["signatures"][0]["signature"]["name"] == EVIL


def test_html_report_has_no_raw_control_character(fake_daemon, tmp_path):
    page = tmp_path / "r.html"
    assert cli.main(["report", "--job", "job1", "--html", str(page), "--quiet"]) in (0, None)
    text = page.read_text(encoding="utf-8")
    assert "gemm" in text
    assert not RAW.search(text.replace("\n", "").replace("\t", ""))


def test_error_lines_are_escaped(monkeypatch, capsys):
    def refuse(get, job, **kw):
        raise cli.CliError("daemon says: bad \x1b[31mthing\x1b[0m")
    monkeypatch.setattr(report, "collect", refuse)
    assert cli.main(["report", "--job", "job1"]) == 2
    err = capsys.readouterr().err
    assert "bad \\u001b[31mthing" in err and "\x1b" not in err
