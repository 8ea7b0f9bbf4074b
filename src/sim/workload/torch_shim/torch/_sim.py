"""The native side of the stand-in `torch` (what PyTorch's C++ core does), over the simulated
CUDA/cuBLAS/NCCL stack through ctypes: the per-thread current stream and cuBLAS handle, the
CUDA caching allocator and the pinned-host caching allocator with their own events, the
autograd engine's device thread, and the ops the workload's model calls.

Only the calls Flare meets on a real GPU are reproduced, in the order PyTorch makes them; no
data is computed. The ctypes bindings are the Python sim workload's (`sim_train`, the module
`share/flare/sim_train.py`, importable because the workload script sits beside it).
"""

import ctypes
import os
import queue
import threading

import sim_train as S

c_void_p, c_int, c_size_t, c_float = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_float

cudaEventQuery = S._fn("cudaEventQuery", c_int, c_void_p)
cudaStreamSynchronize = S._fn("cudaStreamSynchronize", c_int, c_void_p)
cudaMallocHost = S._fn("cudaMallocHost", c_int, ctypes.POINTER(c_void_p), c_size_t)
cudaMemcpy = S._fn("cudaMemcpy", c_int, c_void_p, c_void_p, c_size_t, c_int)
ncclBroadcast = S._fn("ncclBroadcast", c_int, c_void_p, c_void_p, c_size_t, c_int, c_int,
                      c_void_p, c_void_p)

MEMCPY_H2D, MEMCPY_D2H = 1, 2
CUDA_ERROR_NOT_READY = 600
check, check_nccl = S.check, S.check_nccl

# ---- device, streams, cuBLAS handles (per thread, as in c10/cuda and ATen) -------------------

_tls = threading.local()
_device = 0


def set_device(device):
    global _device
    _device = device
    check(S.cudaSetDevice(device), "cudaSetDevice")
    _tls.device_set = True


def _ensure_device():
    # The simulated runtime's current device is per thread, like CUDA's: a thread PyTorch
    # starts (the autograd device thread) sets it first.
    if not getattr(_tls, "device_set", False):
        check(S.cudaSetDevice(_device), "cudaSetDevice")
        _tls.device_set = True


def current_stream():
    """The calling thread's current stream: the legacy default stream (None) unless set."""
    return getattr(_tls, "stream", None)


def set_current_stream(stream):
    _tls.stream = stream


def new_stream():
    _ensure_device()
    s = c_void_p()
    check(S.cudaStreamCreateWithFlags(ctypes.byref(s), S.STREAM_NON_BLOCKING), "stream")
    return s


def new_event():
    e = c_void_p()
    check(S.cudaEventCreateWithFlags(ctypes.byref(e), S.EVENT_DISABLE_TIMING), "event")
    return e


def blas_handle():
    """at::cuda::getCurrentCUDABlasHandle(): one cuBLAS handle per thread, set to the current
    stream at every call."""
    _ensure_device()
    h = getattr(_tls, "blas", None)
    if h is None:
        h = c_void_p()
        check(S.cublasCreate(ctypes.byref(h)), "cublasCreate")
        _tls.blas = h
    check(S.cublasSetStream(h, current_stream()), "cublasSetStream")
    return h


# ---- the caching allocators ------------------------------------------------------------------

class CachingAllocator:
    """CUDACachingAllocator's event traffic: a block freed after use on another stream
    (record_stream) gets one cudaEventRecord per such stream and returns to the pool once
    cudaEventQuery says they all completed; every malloc first processes the outstanding
    events."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool = {}          # size -> [ptr]
        self._outstanding = []   # (ptr, size, [events])
        self._events = []        # free events
        self.records = self.queries = 0

    def _event(self):
        return self._events.pop() if self._events else new_event()

    def _process_events(self):
        still = []
        for ptr, size, events in self._outstanding:
            pending = []
            for e in events:
                self.queries += 1
                err = cudaEventQuery(e)
                if err == CUDA_ERROR_NOT_READY:
                    pending.append(e)
                else:
                    check(err, "cudaEventQuery")
                    self._events.append(e)
            if pending:
                still.append((ptr, size, pending))
            else:
                self._pool.setdefault(size, []).append(ptr)
        self._outstanding = still

    def malloc(self, size):
        _ensure_device()
        with self._lock:
            self._process_events()
            free = self._pool.get(size)
            if free:
                return free.pop()
        p = c_void_p()
        check(S.cudaMalloc(ctypes.byref(p), size), "cudaMalloc")
        return p.value

    def free(self, ptr, size, used_on=()):
        with self._lock:
            events = []
            for stream in used_on:
                e = self._event()
                self.records += 1
                check(S.cudaEventRecord(e, stream), "cudaEventRecord")
                events.append(e)
            if events:
                self._outstanding.append((ptr, size, events))
            else:
                self._pool.setdefault(size, []).append(ptr)


class CachingHostAllocator:
    """The pinned-memory allocator behind DataLoader(pin_memory=True): a copy from a pinned block
    records an event on the copy's stream; the block is reused once cudaEventQuery says the copy
    completed (every allocation processes the outstanding events first)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free = []          # (ptr, size)
        self._outstanding = []   # (ptr, size, event)
        self._events = []
        self.records = self.queries = 0

    def allocate(self, size):
        with self._lock:
            still = []
            for ptr, sz, e in self._outstanding:
                self.queries += 1
                err = cudaEventQuery(e)
                if err == CUDA_ERROR_NOT_READY:
                    still.append((ptr, sz, e))
                else:
                    check(err, "cudaEventQuery")
                    self._events.append(e)
                    self._free.append((ptr, sz))
            self._outstanding = still
            for i, (ptr, sz) in enumerate(self._free):
                if sz >= size:
                    del self._free[i]
                    return ptr, sz
        p = c_void_p()
        check(cudaMallocHost(ctypes.byref(p), size), "cudaMallocHost")
        return p.value, size

    def record_and_free(self, ptr, size, stream):
        """CachingHostAllocator_recordEvent after the copy, then the tensor's release."""
        with self._lock:
            e = self._events.pop() if self._events else new_event()
            self.records += 1
            check(S.cudaEventRecord(e, stream), "cudaEventRecord")
            self._outstanding.append((ptr, size, e))


device_allocator = CachingAllocator()
host_allocator = CachingHostAllocator()

# ---- the autograd engine ---------------------------------------------------------------------


class GraphTask:
    def __init__(self, nodes, stream):
        self.nodes, self.stream = nodes, stream
        self.done = threading.Event()
        self.error = None
        self.final_callbacks = []


class Engine:
    """torch::autograd::Engine: backward runs on a device thread started on the first backward
    (one per device; "pt_autograd_0"), on the stream of the forward ops; the calling thread waits
    for the graph task. Final callbacks (DDP's finalize_backward) run on the device thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self._thread = None
        self._current = None

    def run_backward(self, nodes):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._device_thread, name="pt_autograd_0",
                                                daemon=True)
                self._thread.start()
        task = GraphTask(nodes, current_stream())
        self._queue.put(task)
        task.done.wait()
        if task.error is not None:
            raise task.error

    def queue_callback(self, fn):
        self._current.final_callbacks.append(fn)

    def _device_thread(self):
        _ensure_device()
        while True:
            task = self._queue.get()
            self._current = task
            set_current_stream(task.stream)
            try:
                for node in reversed(task.nodes):
                    node()
                for fn in task.final_callbacks:
                    fn()
            except BaseException as e:  # noqa: B902 - handed to the waiting thread
                task.error = e
            finally:
                self._current = None
                task.done.set()


execution_engine = Engine()
_grad_enabled = threading.local()


def grad_enabled():
    return getattr(_grad_enabled, "on", True)


def set_grad_enabled(on):
    _grad_enabled.on = on


# ---- ops -------------------------------------------------------------------------------------

_alpha, _beta = ctypes.c_float(1.0), ctypes.c_float(0.0)


def gemm(m, n, k, ta=False, tb=False):
    """at::cuda::blas::gemm on the calling thread's handle and current stream (bf16)."""
    check(S.cublasGemmEx(blas_handle(), S.CUBLAS_OP_T if ta else S.CUBLAS_OP_N,
                         S.CUBLAS_OP_T if tb else S.CUBLAS_OP_N, m, n, k, ctypes.byref(_alpha),
                         None, S.CUDA_R_16BF, k if ta else m, None, S.CUDA_R_16BF,
                         n if tb else k, ctypes.byref(_beta), None, S.CUDA_R_16BF, m,
                         S.CUBLAS_COMPUTE_32F, -1), "cublasGemmEx")


_kernels = {}


def kernel(name, cost):
    """A kernel of ATen's (registered once, launched with cudaLaunchKernel on the current
    stream): kernel(name, cost)(amount)."""
    k = _kernels.get(name)
    if k is None:
        k = _kernels[name] = S.Kernel(name, cost)
    stream = current_stream

    def launch(amount):
        _ensure_device()
        k(amount, stream())
    return launch


def memcpy_async(dst, src, size, kind, stream):
    check(S.cudaMemcpyAsync(dst, src, size, kind, stream), "cudaMemcpyAsync")


def stream_synchronize(stream):
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize")


def record(event, stream):
    check(S.cudaEventRecord(event, stream), "cudaEventRecord")


def wait(stream, event):
    check(S.cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")


def rank_and_world():
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
