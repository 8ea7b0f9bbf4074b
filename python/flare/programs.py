"""The console scripts `flared`, `flare-export`, `flare-timeline`, `flare-diagnose` (and
`flare-upload` where the build had it) of the wheel (tools/packaging/make-wheel.sh): each
replaces itself with the program the wheel carries in flare/bin/ (os.execv: same pid,
arguments, environment and exit code). The programs find their
vendored libraries through their own RUNPATH, so nothing is added to the environment.

From a source checkout (no flare/bin/) they run the build tree's programs, like `flare export`.
"""
import os
import sys


def program(name):
    """The path of program `name`: the wheel's flare/bin/, else a source checkout's build/bin/.
    Never PATH: there, `name` is this very console script."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "bin", name),
                 os.path.join(here, "..", "..", "build", "bin", name)):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def _run(name):
    path = program(name)
    if path is None:
        print("%s: not part of this installation of the flare package (install the wheel, "
              "`make wheel`, or build Flare: `make build`)" % name, file=sys.stderr)
        sys.exit(127)
    os.execv(path, [path] + sys.argv[1:])


def flared():
    _run("flared")


def flare_export():
    _run("flare-export")


def flare_timeline():
    _run("flare-timeline")


def flare_diagnose():
    _run("flare-diagnose")


def flare_upload():
    _run("flare-upload")
