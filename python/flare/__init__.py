"""Flare: always-on anomaly diagnosis for distributed training.

- `flare.step()`, `flare.register_kernel(...)`: in a training script (flare/runtime.py).
- `flare.Client(...)`: flared's query API with typed results (flare/client.py).
- The `flare` command line: flare/cli.py.
"""

__version__ = "0.1.0"

from flare.client import (Alert, ApiError, Client, DaemonUnreachable, Diagnosis, FlareError,
                          HangIncident, Job, KernelRow, NotHttp, Rank, Report, UnknownJob, rows)
from flare.runtime import binding, hook_loaded, register_kernel, step

__all__ = [
    "Alert", "ApiError", "Client", "DaemonUnreachable", "Diagnosis", "FlareError",
    "HangIncident", "Job", "KernelRow", "NotHttp", "Rank", "Report", "UnknownJob", "binding",
    "hook_loaded", "register_kernel", "rows", "step",
]
