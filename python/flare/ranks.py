"""The one rank-list syntax of Flare, the twin of src/common/rank_list.h (same rules, same
messages; tests/python/test_ranks.py holds both to the same accepted and rejected forms).

    LIST := '*' | 'all' | ITEM (',' ITEM)*        "0,2,4-7"   "*"
    ITEM := N | A '-' B                           decimal, 0 <= A <= B <= MAX_RANK

Whitespace around items is ignored; items may repeat or overlap. Rejected: the empty list, an
empty item ("0,,2", "0,"), a reversed range ("7-4"), a sign or anything but digits, a rank above
MAX_RANK. '*' and 'all' (any case) mean every rank and stand alone.
"""

MAX_RANK = (1 << 20) - 1
_SYNTAX = "a rank list is like 0,2,4-7, or * for every rank"
_DIGITS = frozenset("0123456789")


class RankListError(ValueError):
    """A malformed rank list; the message names the variable or flag it came from."""


def _rank(text):
    text = text.strip()
    if not text or len(text) > 8 or not set(text) <= _DIGITS:
        return None
    value = int(text)
    return value if value <= MAX_RANK else None


def _item(text):
    first, dash, last = text.strip().partition("-")
    a = _rank(first)
    b = _rank(last) if dash else a
    if a is None or b is None or a > b:
        return None
    return a, b


def parse_rank_list(text, what="--ranks"):
    """`text` -> None (every rank: '*' or 'all') or the sorted list of the ranks it names.
    Raises RankListError naming `what` (a variable or flag) on a malformed list."""
    if text.strip().lower() in ("*", "all"):
        return None
    if not text.strip():
        raise RankListError("bad %s '%s': the list is empty (%s)" % (what, text, _SYNTAX))
    ranks = set()
    for item in text.split(","):
        got = _item(item)
        if got is None:
            raise RankListError("bad %s '%s': '%s' is not a rank N or a range A-B (%s)"
                                % (what, text, item.strip(), _SYNTAX))
        ranks.update(range(got[0], got[1] + 1))
    return sorted(ranks)
