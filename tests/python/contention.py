"""The workloads' own account of CPU contention, which healthy-job tests hold Flare's host-stall
findings against.

The simulated ranks share this machine's CPUs with their simulated GPUs, flared and whatever
else runs: on a loaded 2-core machine one rank can really be starved, its GPU runs dry, and the
stall detector is right to name it (as `cpu_contention` where the rank's run-queue wait shows
it, as `issue_stall` where the starvation reached the issuing thread another way, e.g. through
a simulated GPU's worker thread). Such a finding is accepted only where the workload itself
measured that rank's threads waiting for a CPU (Linux schedstat) more than the other ranks' by
at least the stall detector's floor; everything else on a healthy job is a false alarm."""

import statistics

HOST_KINDS = ("issue_stall", "cpu_contention")
# DiagnoseOptions::stall_paired_min_share: the least share of the step a stall must cost.
STALL_FLOOR = 0.025


def starved_ranks(waits, share=STALL_FLOOR):
    """`waits`: {rank: (main thread's wait ns, all threads' wait ns, seconds measured)}, a wait
    None where it was not read. The ranks whose main thread or whose threads together waited
    for a CPU more than the other ranks' median by at least `share` of their time."""
    starved = set()
    for rank, (main, every, seconds) in waits.items():
        others = [w for r, w in waits.items() if r != rank]
        for i, mine in enumerate((main, every)):
            theirs = [w[i] for w in others]
            if mine is None or not theirs or None in theirs:
                continue
            if mine - statistics.median(theirs) >= share * seconds * 1e9:
                starved.add(rank)
    return starved


def unexplained(found, starved):
    """The diagnoses `found` that measured contention does not explain: a host finding is
    explained when every rank it names was starved."""
    return [d for d in found
            if not (d["kind"] in HOST_KINDS and d.get("ranks") and
                    all(r in starved for r in d["ranks"]))]


def sim_waits(sim_json):
    """`waits` for starved_ranks from flare-sim-train's --json: per rank, the steps after the
    first (the warm-up, which the detectors leave out too)."""
    waits = {}
    for r in sim_json["ranks"]:
        main, every = r.get("run_queue_ms", [])[1:], r.get("run_queue_all_ms", [])[1:]
        seconds = sum(r["step_ms"][1:]) / 1e3
        waits[r["rank"]] = (None if not main or min(main) < 0 else sum(main) * 1e6,
                            None if not every or min(every) < 0 else sum(every) * 1e6, seconds)
    return waits
