"""The simulated workloads' own account of CPU contention (installed beside sim_train.py and
sim_pytorch_like.py, and imported from here when train.py runs from the source tree): how long
this process's threads waited for a CPU, which tests hold Flare's host-stall findings against
(tests/python/contention.py)."""

import os


def _thread_wait_ns(tid):
    """Cumulative ns thread `tid` of this process waited for a CPU (Linux schedstat, second
    field), or None where it cannot be read."""
    try:
        with open("/proc/self/task/%s/schedstat" % tid) as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def run_queue_wait_ns():
    """(main thread, all threads): cumulative ns this process's threads waited for a CPU (the
    simulated GPU's workers among them), each None where schedstat cannot be read."""
    main = _thread_wait_ns(os.getpid())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    waits = [w for w in (_thread_wait_ns(t) for t in tids) if w is not None]
    return (main, sum(waits) if waits else None)
