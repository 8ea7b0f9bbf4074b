"""The trace-event format rules that Perfetto's JSON importer applies, as a checker.

check(trace) returns a list of violations (empty: the trace is well formed):
  - the document is an object with a `traceEvents` list; every event has `ph`, `pid`, and
    (except process-scoped metadata) `tid`, and numeric `ts` (and `dur` >= 0 for `X`);
  - metadata names every process (`process_name`) and every thread (`thread_name`) that holds
    an event;
  - complete slices (`X`) on one track (pid, tid) nest: a slice that starts inside another
    ends inside it too (Perfetto drops slices that partially overlap);
  - every flow id has exactly one start (`s`) and one end (`f`); each flow event binds to a slice
    on its own track: `s` (and `f` with "bp":"e") to a slice that encloses its timestamp, `f`
    without "bp" to the next slice that starts at or after it.
"""

import bisect
import collections


def _num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check(trace):
    errors = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["document is not an object with a traceEvents list"]
    events = trace["traceEvents"]
    proc_names, thread_names = set(), set()
    slices = collections.defaultdict(list)  # (pid, tid) -> [(ts, end)]
    flows = collections.defaultdict(lambda: {"s": [], "f": []})
    used_tracks, used_pids = set(), set()
    for i, e in enumerate(events):
        ph = e.get("ph")
        if ph is None or "pid" not in e:
            errors.append(f"event {i} lacks ph or pid: {e}")
            continue
        if ph == "M":
            if e.get("name") == "process_name":
                proc_names.add(e["pid"])
            elif e.get("name") == "thread_name":
                thread_names.add((e["pid"], e.get("tid")))
            continue
        if "tid" not in e or not _num(e.get("ts")):
            errors.append(f"event {i} lacks tid or a numeric ts: {e}")
            continue
        track = (e["pid"], e["tid"])
        used_tracks.add(track)
        used_pids.add(e["pid"])
        if ph == "X":
            if not _num(e.get("dur")) or e["dur"] < 0:
                errors.append(f"slice {i} has a bad dur: {e}")
                continue
            slices[track].append((e["ts"], e["ts"] + e["dur"], i))
        elif ph in ("s", "f", "t"):
            flows[(e.get("cat"), e.get("id"))][ph if ph != "t" else "s"].append((track, e))
    for pid in used_pids - proc_names:
        errors.append(f"process {pid} has no process_name")
    for track in used_tracks - thread_names:
        errors.append(f"thread {track} has no thread_name")
    eps = 1e-6  # microsecond timestamps printed with 3 decimals
    for track, items in slices.items():
        items.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for ts, end, i in items:
            while stack and stack[-1][1] <= ts + eps:
                stack.pop()
            if stack and end > stack[-1][1] + eps:
                errors.append(f"slice {i} on {track} [{ts}, {end}] partially overlaps "
                              f"slice {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}]")
            stack.append((ts, end, i))
        slices[track] = items
    starts_by_track = {t: [x[0] for x in items] for t, items in slices.items()}

    def encloses(track, ts):
        items = slices.get(track, [])
        k = bisect.bisect_right(starts_by_track.get(track, []), ts + eps)
        return any(items[j][0] <= ts + eps and ts <= items[j][1] + eps for j in range(k))

    def next_slice(track, ts):
        k = bisect.bisect_left(starts_by_track.get(track, []), ts - eps)
        return k < len(starts_by_track.get(track, []))

    for key, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            errors.append(f"flow {key} has {len(ends['s'])} starts and {len(ends['f'])} ends")
            continue
        track, e = ends["s"][0]
        if not encloses(track, e["ts"]):
            errors.append(f"flow {key} start at {e['ts']} on {track} binds to no slice")
        track, e = ends["f"][0]
        ok = encloses(track, e["ts"]) if e.get("bp") == "e" else next_slice(track, e["ts"])
        if not ok:
            errors.append(f"flow {key} end at {e['ts']} on {track} binds to no slice")
    return errors
