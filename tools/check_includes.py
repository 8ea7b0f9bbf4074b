#!/usr/bin/env python3
"""Checks the include directions between Flare's modules (docs/architecture.md, "Modules: the dependency graph").

Derives the module graph from the `#include "..."` lines of every C/C++ file under src/, tools/,
tests/ and include/, and fails when an edge is not in ALLOWED below, when src/sim is included
from anything but test code, or when a diagnosis helper includes a detector (DIAGNOSIS_HELPERS).
Run by ctest (test `include_directions`, label unit: `make test`) and by hand:
`python3 tools/check_includes.py [--graph]` (--graph prints the edges and counts).
Standard library only; reads ~500 files in well under a second.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The one table: module -> the modules it may include. Bottom to top: the public headers
# (include/flare) and the wire schema (proto), then common; stats (no Flare types) and records
# (what rank and daemon agree on); timing, engine, timeline, pyprof, hang; hook and the
# programs in tools/ on top. A module may always include itself.
BOTTOM = {"include", "proto"}
ALLOWED = {
    "include": set(),
    "proto": set(),
    "common": set(BOTTOM),
    "stats": BOTTOM | {"common"},
    "records": BOTTOM | {"common", "stats"},
    "hang": BOTTOM | {"common"},
    "pyprof": BOTTOM | {"common"},
    "timing": BOTTOM | {"common", "stats", "records"},
    "engine": BOTTOM | {"common", "stats", "records", "hang"},
    "timeline": BOTTOM | {"common", "stats", "records"},
    "hook": BOTTOM | {"common", "stats", "records", "timing", "hang", "pyprof"},
    "tools": BOTTOM | {"common", "stats", "records", "timing", "engine", "timeline", "hang"},
    "sim": BOTTOM | {"common"},
    "tests": None,  # test trees may include anything
}
# Edges that exist today against the target layout (design.md "Layout"), each with its way out.
# Allowed until fixed; listed so that nobody adds a second one unnoticed.
PENDING = {}

# Files that may include src/sim besides src/sim itself: test code and the sim tools.
SIM_USERS = (
    re.compile(r"(^|/)tests/"),
    re.compile(r"(^|/)testing/"),
    re.compile(r"_test\.cc$"),
    re.compile(r"_integration_test\.cc$"),
    re.compile(r"_benchmark\.cc$"),  # hand-run benchmarks on the simulated stack, not shipped
)

# Inside src/engine/diagnosis: the helper layer — what measures or summarises a job without
# diagnosing it — includes no detector; the detectors (detector.h, one file per family, listed in
# registry.cc) call it, never the other way round.
DIAGNOSIS_DIR = "src/engine/diagnosis"
DIAGNOSIS_HELPERS = ("diagnosis", "signals", "job_model", "history", "job_metrics", "series",
                     "own_change")
DETECTOR_HEADERS = tuple(DIAGNOSIS_DIR + "/" + h for h in
                         ("detector.h", "detectors.h", "gpu_slow.h", "summary_detectors.h"))

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".cc", ".h", ".cpp", ".hpp", ".c", ".inc")


def module_of(path):
    """The module of a repository path or a rooted include path; None for anything else."""
    parts = path.split("/")
    if parts[0] == "flare":  # "flare/v1/..." (generated from proto/) or "flare/step.h" (include/)
        return "proto" if len(parts) > 1 and parts[1] == "v1" else "include"
    if parts[0] == "include":
        return "include"
    if parts[0] in ("proto", "tools", "tests"):
        return parts[0]
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    return None


def edges():
    """Yields (file, included path, from module, to module) for every rooted include."""
    for top in ("src", "tools", "tests", "include", "proto"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            for name in filenames:
                if not name.endswith(SOURCE_EXT):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, ROOT)
                src = module_of(rel)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        dst = module_of(m.group(1))
                        if dst and dst != src:
                            yield rel, m.group(1), src, dst


def diagnosis_layer_errors():
    """Includes of a detector header from the diagnosis helper layer (DIAGNOSIS_HELPERS)."""
    errors = []
    folder = os.path.join(ROOT, DIAGNOSIS_DIR)
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        if ext not in SOURCE_EXT or stem not in DIAGNOSIS_HELPERS:
            continue
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                m = INCLUDE_RE.match(line)
                if m and m.group(1) in DETECTOR_HEADERS:
                    errors.append(f"{DIAGNOSIS_DIR}/{name}: includes {m.group(1)}: the diagnosis "
                                  "helpers call no detector (tools/check_includes.py "
                                  "DIAGNOSIS_HELPERS)")
    return errors


def check_table():
    """The allowed graph must be acyclic (PENDING edges included)."""
    graph = {m: set(d or ()) for m, d in ALLOWED.items()}
    for a, b in PENDING:
        graph[a].add(b)
    state = {}

    def visit(m, stack):
        state[m] = 1
        for n in graph.get(m, ()):
            if state.get(n) == 1:
                sys.exit("check_includes.py: the allowed graph has a cycle: " +
                         " -> ".join(stack + [m, n]))
            if n not in state:
                visit(n, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print the module graph")
    args = parser.parse_args()
    check_table()
    errors, counts = [], {}
    for rel, inc, src, dst in edges():
        counts[(src, dst)] = counts.get((src, dst), 0) + 1
        if dst == "sim":
            if src != "sim" and not any(p.search(rel) for p in SIM_USERS):
                errors.append(f"{rel}: includes {inc}: only tests and the sim tools may "
                              "include src/sim")
            continue
        allowed = ALLOWED.get(src, set())
        if allowed is None or dst in allowed or (src, dst) in PENDING:
            continue
        errors.append(f"{rel}: includes {inc}: {src} may not depend on {dst} "
                      f"(allowed: {', '.join(sorted(allowed)) or 'nothing'}; "
                      "tools/check_includes.py ALLOWED)")
    errors += diagnosis_layer_errors()
    if args.graph:
        for (src, dst), n in sorted(counts.items()):
            note = "  (pending: " + PENDING[(src, dst)] + ")" if (src, dst) in PENDING else ""
            print(f"{src} -> {dst}: {n}{note}")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_includes.py: {len(errors)} include(s) against the module graph",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
