"""One rank-list syntax (issue 20): python/flare/ranks.py and src/common/rank_list.h accept and
reject the same forms with the same message; the C++ side is reached through flare-timeline's
--ranks, which parses it before it looks at its input."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from flare.ranks import MAX_RANK, RankListError, parse_rank_list  # noqa: E402

ACCEPTED = {
    "3": [3],
    "0,2,4-7": [0, 2, 4, 5, 6, 7],
    " 7 , 1 - 2 ,0": [0, 1, 2, 7],
    "0-3,2,3-4": [0, 1, 2, 3, 4],
    "5-5": [5],
    str(MAX_RANK): [MAX_RANK],
    "*": None,
    "all": None,
    " ALL ": None,
}
REJECTED = ["", " ", "0,,2", "0,", ",0", "7-4", "-1", "+1", "1.0", "0x2", "a", "1-", "-",
            "1-2-3", "0,*", "all,1", str(MAX_RANK + 1), "0-%d" % (MAX_RANK + 1), "99999999999"]


@pytest.mark.parametrize("text", sorted(ACCEPTED))
def test_python_accepts(text):
    assert parse_rank_list(text) == ACCEPTED[text]


@pytest.mark.parametrize("text", REJECTED)
def test_python_rejects_naming_the_variable(text):
    with pytest.raises(RankListError) as e:
        parse_rank_list(text, "FLARE_SOME_RANKS")
    assert str(e.value).startswith("bad FLARE_SOME_RANKS '%s': " % text)


def test_python_message():
    with pytest.raises(RankListError) as e:
        parse_rank_list("0,x")
    assert str(e.value) == ("bad --ranks '0,x': 'x' is not a rank N or a range A-B (a rank list "
                            "is like 0,2,4-7, or * for every rank)")
    with pytest.raises(RankListError) as e:
        parse_rank_list(" ")
    assert "the list is empty" in str(e.value)


def timeline_ranks(build_dir, tmp_path, text):
    return subprocess.run([os.path.join(build_dir, "bin", "flare-timeline"), "--input",
                           str(tmp_path / "missing"), "--ranks", text, "-o", str(tmp_path / "t")],
                          capture_output=True, text=True, timeout=30)


def test_cpp_and_python_agree(build_dir, tmp_path):
    for text in ACCEPTED:
        res = timeline_ranks(build_dir, tmp_path, text)
        # Past the rank list: the missing input is the complaint.
        assert res.returncode == 1 and "is not a directory" in res.stderr, (text, res.stderr)
    for text in REJECTED:
        res = timeline_ranks(build_dir, tmp_path, text)
        with pytest.raises(RankListError) as e:
            parse_rank_list(text)
        assert res.returncode == 2 and res.stderr == "flare-timeline: %s\n" % e.value, text


def test_cli_flags_use_it(tmp_path):
    """flare deep-trace --ranks and flare timeline --job --ranks both report the one syntax."""
    flare = [sys.executable, "-m", "flare"]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "python"))
    for args in (["deep-trace", "--job", "j", "--steps", "3", "--ranks", "2-x",
                  "--daemon-http", "127.0.0.1:9"],
                 ["timeline", "--job", "j", "--ranks", "0,,1", "-o", str(tmp_path / "t.json"),
                  "--daemon-http", "127.0.0.1:9"]):
        res = subprocess.run(flare + args, capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
        assert "bad --ranks" in res.stderr and "is not a rank N or a range A-B" in res.stderr
