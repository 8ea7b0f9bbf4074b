"""Control characters out of what Flare prints and writes (issue 22).

Kernel names, job ids, host names and error texts come from training processes and from the
daemon: a name holding ANSI escape sequences (ESC [ ...), carriage returns or BEL would otherwise
rewrite the operator's terminal or hide lines. Every control character but newline and tab
(C0, DEL and the C1 range U+0080-U+009F) is written as the six characters \\u00XX instead:
readable, and inside JSON strings a valid escape of the same character, so JSON output stays
valid JSON with the same values.

`flare`'s main() wraps sys.stdout in SafeStream (text reports, --json, tables) and escapes its
error messages; the --html page is passed through escape_controls before it is written.
"""
import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text):
    """`text` with every control character but \\n and \\t as \\u00XX."""
    if not isinstance(text, str):
        return text
    return _CONTROL.sub(lambda m: "\\u%04x" % ord(m.group()), text)


class SafeStream:
    """A text stream that escapes control characters on the way to `stream`."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(escape_controls(text))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)
