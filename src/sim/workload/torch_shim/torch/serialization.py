"""torch.save: every CUDA tensor of the object is copied to the host (a synchronous cudaMemcpy
per storage), then pickled and written: host time with little GPU work. The simulated device
memory is host memory and the workload's parameters are mostly untouched pages: at most 1 MiB
of each is copied, so that a checkpoint costs no real memory."""

import ctypes
import pickle

_COPY_CAP = 1 << 20


def _tensors(obj):
    from torch._tensor import Tensor
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def save(obj, f):
    from torch import _sim
    blobs = []
    for t in _tensors(obj):
        if t.is_cuda:
            n = min(t.nbytes, _COPY_CAP)
            host = ctypes.create_string_buffer(n)
            _sim.check(_sim.cudaMemcpy(ctypes.addressof(host), t.ptr, n,
                                       _sim.MEMCPY_D2H), "cudaMemcpy")
            blobs.append(host.raw)
    data = pickle.dumps(blobs)
    if hasattr(f, "write"):
        f.write(data)
    else:
        with open(f, "wb") as out:
            out.write(data)
