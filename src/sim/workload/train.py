#!/usr/bin/env python3
"""The simulated transformer training step in Python, on the simulated CUDA/cuBLAS/NCCL stack.

The same workload as flare-sim-rank (src/sim/workload/workload.cc), called through ctypes so
that real Python frames, a real iterator (the DataLoader) and real `gc` surround the GPU calls.
Started by `flare-sim-train --python`; one process per rank, identity from RANK/WORLD_SIZE.

Symbols are resolved through the process's global scope (dlopen(NULL)), as a C extension's calls
are, so that an LD_PRELOAD'ed library (Flare's hook) sees them.
"""

import argparse
import ctypes
import os
import sys
import time

from sim_schedstat import run_queue_wait_ns  # beside this file (share/flare)

# ---- the libraries -------------------------------------------------------------------------

LIB_DIR = os.environ.get("FLARE_SIM_LIB_DIR", "")
for _name in ("libcuda.so.1", "libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13",
              "libnccl.so.2"):
    ctypes.CDLL(os.path.join(LIB_DIR, _name) if LIB_DIR else _name, mode=ctypes.RTLD_GLOBAL)
_G = ctypes.CDLL(None)  # global scope: LD_PRELOAD first, then the libraries above

c_void_p, c_int, c_size_t, c_float, c_uint64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                                ctypes.c_float, ctypes.c_uint64)


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class UniqueId(ctypes.Structure):
    """ncclUniqueId: passed by value (a bare ctypes array would decay to a pointer)."""
    _fields_ = [("internal", ctypes.c_char * 128)]


def _fn(name, restype, *argtypes):
    f = getattr(_G, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


cudaSetDevice = _fn("cudaSetDevice", c_int, c_int)
cudaStreamCreateWithFlags = _fn("cudaStreamCreateWithFlags", c_int, ctypes.POINTER(c_void_p),
                                ctypes.c_uint)
cudaEventCreateWithFlags = _fn("cudaEventCreateWithFlags", c_int, ctypes.POINTER(c_void_p),
                               ctypes.c_uint)
cudaEventRecord = _fn("cudaEventRecord", c_int, c_void_p, c_void_p)
cudaStreamWaitEvent = _fn("cudaStreamWaitEvent", c_int, c_void_p, c_void_p, ctypes.c_uint)
cudaEventSynchronize = _fn("cudaEventSynchronize", c_int, c_void_p)
cudaEventElapsedTime = _fn("cudaEventElapsedTime", c_int, ctypes.POINTER(c_float), c_void_p,
                           c_void_p)
cudaLaunchKernel = _fn("cudaLaunchKernel", c_int, c_void_p, Dim3, Dim3,
                       ctypes.POINTER(c_void_p), c_size_t, c_void_p)
cudaGetErrorString = _fn("cudaGetErrorString", ctypes.c_char_p, c_int)
cudaMemcpyAsync = _fn("cudaMemcpyAsync", c_int, c_void_p, c_void_p, c_size_t, c_int, c_void_p)
cudaMalloc = _fn("cudaMalloc", c_int, ctypes.POINTER(c_void_p), c_size_t)
registerFatBinary = _fn("__cudaRegisterFatBinary", ctypes.POINTER(c_void_p), c_void_p)
registerFunction = _fn("__cudaRegisterFunction", None, ctypes.POINTER(c_void_p), c_void_p,
                       c_void_p, ctypes.c_char_p, c_int, c_void_p, c_void_p, c_void_p, c_void_p,
                       c_void_p)
flareSimRegisterKernelCost = _fn("flareSimRegisterKernelCost", c_int, ctypes.c_char_p, c_int,
                                 c_int)
flareSimSetStep = _fn("flareSimSetStep", None, ctypes.c_int64)
flareSimHangStep = _fn("flareSimHangStep", ctypes.c_int64, ctypes.c_char_p)
flareSimStep = _fn("flareSimStep", ctypes.c_int64)
flareSimHostFactor = _fn("flareSimHostFactor", ctypes.c_double, ctypes.c_int64, c_int)
flareSimRankEntry = _fn("flareSimRankEntry", c_int, ctypes.c_char_p, c_int, c_int, c_int,
                        ctypes.c_char_p, c_size_t)
cublasCreate = _fn("cublasCreate_v2", c_int, ctypes.POINTER(c_void_p))
cublasSetStream = _fn("cublasSetStream_v2", c_int, c_void_p, c_void_p)
cublasGemmEx = _fn("cublasGemmEx", c_int, c_void_p, c_int, c_int, c_int, c_int, c_int, c_void_p,
                   c_void_p, c_int, c_int, c_void_p, c_int, c_int, c_void_p, c_void_p, c_int,
                   c_int, c_int, c_int)
ncclGetUniqueId = _fn("ncclGetUniqueId", c_int, ctypes.c_char_p)
ncclCommInitRank = _fn("ncclCommInitRank", c_int, ctypes.POINTER(c_void_p), c_int, UniqueId,
                       c_int)
ncclAllReduce = _fn("ncclAllReduce", c_int, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p,
                    c_void_p)
ncclGetErrorString = _fn("ncclGetErrorString", ctypes.c_char_p, c_int)
cudaDeviceSynchronize = _fn("cudaDeviceSynchronize", c_int)

CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T = 14, 68, 0, 1
NCCL_BF16, NCCL_SUM = 9, 0
COST_FLOPS, COST_BYTES = 1, 2
EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING, MEMCPY_H2D = 2, 1, 1


class SimError(RuntimeError):
    pass


def check(err, what):
    if err != 0:
        raise SimError("%s: %s" % (what, cudaGetErrorString(err).decode()))


def check_nccl(err, what):
    if err != 0:
        raise SimError("%s: %s" % (what, ncclGetErrorString(err).decode()))


def init_comm(key, nranks, rank):
    """A communicator of `nranks` ranks named `key`: rank 0 writes the NCCL unique id to
    $FLARE_SIM_RDZV_DIR/KEY.id (default /tmp), the others wait up to 120 s for it."""
    path = os.path.join(os.environ.get("FLARE_SIM_RDZV_DIR", "/tmp"), key + ".id")
    uid = ctypes.create_string_buffer(128)
    if rank == 0:
        check_nccl(ncclGetUniqueId(uid), "ncclGetUniqueId")
        tmp = "%s.tmp.%d" % (path, os.getpid())
        with open(tmp, "wb") as f:
            f.write(uid.raw)
        os.rename(tmp, path)
    else:
        deadline = time.time() + 120
        while True:
            try:
                with open(path, "rb") as f:
                    data = f.read()
                if len(data) == 128:
                    ctypes.memmove(uid, data, 128)
                    break
            except FileNotFoundError:
                pass
            if time.time() > deadline:
                raise SimError("timed out waiting for communicator id " + path)
            time.sleep(0.001)
    comm = c_void_p()
    check_nccl(ncclCommInitRank(ctypes.byref(comm), nranks,
                                UniqueId.from_buffer_copy(uid.raw), rank),
               "ncclCommInitRank")
    return comm


# ---- kernels ---------------------------------------------------------------------------------

class Kernel:
    """A named kernel registered the way nvcc's host code registers one."""
    _handle = None
    _image = ctypes.create_string_buffer(b"flare-sim-python-workload")

    def __init__(self, name, cost):
        if Kernel._handle is None:
            Kernel._handle = registerFatBinary(ctypes.cast(Kernel._image, c_void_p))
        self.name = name
        self._stub = ctypes.create_string_buffer(1)  # its address is the kernel's identity
        registerFunction(Kernel._handle, ctypes.addressof(self._stub), None, name.encode(), -1,
                         None, None, None, None, None)
        flareSimRegisterKernelCost(name.encode(), cost, 0)

    def __call__(self, amount, stream):
        value = c_uint64(int(amount))
        args = (c_void_p * 1)(ctypes.cast(ctypes.pointer(value), c_void_p))
        grid = Dim3(int(amount) // 4096 % 65535 + 1, 1, 1)
        check(cudaLaunchKernel(ctypes.addressof(self._stub), grid, Dim3(256, 1, 1), args, 0,
                               stream), self.name)


# ---- the data loader -------------------------------------------------------------------------

class SyntheticLoader:
    """A DataLoader-like iterable: each __next__ waits `data_ms` on the host for a batch."""

    def __init__(self, steps, data_ms, batch_tokens):
        self.steps, self.data_ms, self.batch_tokens = steps, data_ms, batch_tokens

    def __iter__(self):
        return _LoaderIter(self)


class _LoaderIter:
    def __init__(self, loader):
        self.loader, self.i = loader, 0
        self.batch = ctypes.create_string_buffer(loader.batch_tokens * 8)

    def __iter__(self):
        return self

    def __next__(self):
        # When this call began: a step is the interval between two calls, as Flare measures it
        # (the traced __next__ spans are its step boundaries).
        self.entered = time.perf_counter()
        if self.i >= self.loader.steps:
            raise StopIteration
        # The batch's host time varies from step to step (the sim's host jitter, FLARE_SIM_SEED).
        time.sleep(self.loader.data_ms * flareSimHostFactor(self.i, 0) / 1000.0)
        self.i += 1
        return self.batch


# ---- the model -------------------------------------------------------------------------------

class Model:
    def __init__(self, args, rank, world):
        self.args, self.rank = args, rank
        tp = max(1, min(args.tp, world))
        while world % tp:
            tp -= 1
        self.tp, self.dp = tp, world // tp
        check(cudaSetDevice(rank % 8), "cudaSetDevice")
        self.compute, self.tp_stream, self.dp_stream = (self._stream() for _ in range(3))
        self.blas = c_void_p()
        check(cublasCreate(ctypes.byref(self.blas)), "cublasCreate")
        check(cublasSetStream(self.blas, self.compute), "cublasSetStream")
        self.ev_fwd, self.ev_tp, self.ev_dp, self.ev_step = (
            self._event(EVENT_DISABLE_TIMING) for _ in range(4))
        self.gemm_a, self.gemm_b = self._event(0), self._event(0)
        self.tp_comm = self._comm("tp%d" % (rank // tp), tp, rank % tp) if tp > 1 else None
        self.dp_comm = self._comm("dp%d" % (rank % tp), self.dp, rank // tp) if self.dp > 1 \
            else None
        self.dev_batch = c_void_p()
        check(cudaMalloc(ctypes.byref(self.dev_batch), args.seq * args.micro_batch * 8),
              "cudaMalloc")
        k = Kernel
        self.layer_norm = k("_ZN5flare3sim17layer_norm_kernelEPKvPvm", COST_BYTES)
        self.flash_fwd = k("_ZN5flash16flash_fwd_kernelEm", COST_FLOPS)
        self.flash_bwd = k("_ZN5flash16flash_bwd_kernelEm", COST_FLOPS)
        self.gelu = k("_ZN5flare3sim11gelu_kernelEm", COST_BYTES)
        self.gelu_bwd = k("_ZN5flare3sim15gelu_bwd_kernelEm", COST_BYTES)
        self.residual = k("_ZN5flare3sim19residual_add_kernelEm", COST_BYTES)
        self.ln_bwd = k("_ZN5flare3sim21layer_norm_bwd_kernelEm", COST_BYTES)
        self.loss_kernel = k("_ZN5flare3sim18cross_entropy_lossEm", COST_BYTES)
        self.adam = k("_ZN5flare3sim23multi_tensor_apply_adamEm", COST_BYTES)
        h, T = args.hidden, args.seq * args.micro_batch
        self.h, self.T, self.h_tp, self.ffn_tp = h, T, h // tp, 4 * h // tp
        self.act_bytes = T * h * 2
        self.layer_param_bytes = 12 * h * h // tp * 2
        self.attn_flops = 2 * args.micro_batch * args.seq * args.seq * self.h_tp
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.inject_sync = _inject_sync_fn()

    def _stream(self):
        s = c_void_p()
        check(cudaStreamCreateWithFlags(ctypes.byref(s), STREAM_NON_BLOCKING), "stream")
        return s

    def _event(self, flags):
        e = c_void_p()
        check(cudaEventCreateWithFlags(ctypes.byref(e), flags), "event")
        return e

    def _comm(self, key, nranks, rank):
        return init_comm(key, nranks, rank)

    def gemm(self, m, n, k, ta, tb):
        check(cublasGemmEx(self.blas, CUBLAS_OP_T if ta else CUBLAS_OP_N,
                           CUBLAS_OP_T if tb else CUBLAS_OP_N, m, n, k, ctypes.byref(self.alpha),
                           None, CUDA_R_16BF, k if ta else m, None, CUDA_R_16BF, n if tb else k,
                           ctypes.byref(self.beta), None, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, -1),
              "cublasGemmEx")

    def tp_all_reduce(self):
        if self.tp_comm is None:
            return
        check(cudaEventRecord(self.ev_fwd, self.compute), "record")
        check(cudaStreamWaitEvent(self.tp_stream, self.ev_fwd, 0), "wait")
        check_nccl(ncclAllReduce(None, None, self.act_bytes // 2, NCCL_BF16, NCCL_SUM,
                                 self.tp_comm, self.tp_stream), "ncclAllReduce(tp)")
        check(cudaEventRecord(self.ev_tp, self.tp_stream), "record")
        check(cudaStreamWaitEvent(self.compute, self.ev_tp, 0), "wait")

    def forward_layer(self, layer, step, stall):
        c, h, h_tp, T = self.compute, self.h, self.h_tp, self.T
        if self.inject_sync is not None:
            self.inject_sync()
        self.layer_norm(self.act_bytes * 2, c)
        if layer == 0:
            check(cudaEventRecord(self.gemm_a, c), "record")
        self.gemm(3 * h_tp, T, h, True, False)
        if layer == 0:
            check(cudaEventRecord(self.gemm_b, c), "record")
        self.flash_fwd(self.attn_flops, c)
        self.gemm(h, T, h_tp, True, False)
        self.tp_all_reduce()
        self.residual(self.act_bytes * 3, c)
        if (layer == self.args.layers // 2 and stall and step % stall[1] == 0
                and stall[2] <= step <= stall[3]):
            host_stall(stall[0])
        self.layer_norm(self.act_bytes * 2, c)
        self.gemm(self.ffn_tp, T, h, True, False)
        self.gelu(T * self.ffn_tp * 4, c)
        self.gemm(h, T, self.ffn_tp, True, False)
        self.tp_all_reduce()
        self.residual(self.act_bytes * 3, c)

    def forward(self, batch, step, stall):
        check(cudaMemcpyAsync(self.dev_batch, batch, len(batch), MEMCPY_H2D, self.compute),
              "cudaMemcpyAsync")
        for layer in range(self.args.layers):
            self.forward_layer(layer, step, stall)
        self.loss_kernel(self.act_bytes * 8, self.compute)

    def backward_layer(self):
        c, h, h_tp, T, f = self.compute, self.h, self.h_tp, self.T, self.ffn_tp
        self.gemm(f, T, h, False, False)
        self.gemm(h, f, T, False, True)
        self.gelu_bwd(T * f * 6, c)
        self.gemm(h, T, f, False, False)
        self.gemm(f, h, T, False, True)
        self.tp_all_reduce()
        self.ln_bwd(self.act_bytes * 4, c)
        self.gemm(h_tp, T, h, False, False)
        self.gemm(h, h_tp, T, False, True)
        self.flash_bwd(self.attn_flops * 5 // 2, c)
        self.gemm(h, T, 3 * h_tp, False, False)
        self.gemm(3 * h_tp, h, T, False, True)
        self.tp_all_reduce()
        self.ln_bwd(self.act_bytes * 4, c)
        if self.dp_comm is not None:
            check(cudaEventRecord(self.ev_fwd, c), "record")
            check(cudaStreamWaitEvent(self.dp_stream, self.ev_fwd, 0), "wait")
            check_nccl(ncclAllReduce(None, None, self.layer_param_bytes // 2, NCCL_BF16, NCCL_SUM,
                                     self.dp_comm, self.dp_stream), "ncclAllReduce(dp)")

    def backward(self):
        for _ in reversed(range(self.args.layers)):
            self.backward_layer()

    def optimizer_step(self):
        if self.dp_comm is not None:
            check(cudaEventRecord(self.ev_dp, self.dp_stream), "record")
            check(cudaStreamWaitEvent(self.compute, self.ev_dp, 0), "wait")
        self.adam(self.layer_param_bytes * self.args.layers * 8, self.compute)

    def synchronize_step(self):
        """Like loss.item(): wait for the step's last kernel."""
        check(cudaEventRecord(self.ev_step, self.compute), "record")
        check(cudaEventSynchronize(self.ev_step), "cudaEventSynchronize")

    def gemm_ms(self):
        ms = c_float()
        check(cudaEventElapsedTime(ctypes.byref(ms), self.gemm_a, self.gemm_b), "elapsed")
        return ms.value


def injected_sync():
    """FLARE_SIM_INJECT_SYNC=1: a needless torch.cuda.synchronize()-like call in each layer's
    forward. Called through the module `sim_train` (this file imported once more under its own
    name), so that TRACED_PYTHON_API="sim_train@injected_sync" can name it."""
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def rank_entry(var, min_fields, max_fields, bare_is_every_rank=False):
    """This rank's entry of the per-rank fault list in `var` (RANKS:FIELD[:FIELD...],..., RANKS
    being N, A-B or *), read by the simulator's one reader (src/common/rank_list.h, through
    flareSimRankEntry): its fields, or None when no entry names this rank. With
    `bare_is_every_rank`, a value without ':' is one field for every rank (the legacy form)."""
    buf = ctypes.create_string_buffer(4096)
    n = flareSimRankEntry(var.encode(), min_fields, max_fields, int(bare_is_every_rank), buf,
                          len(buf))
    if n < 0:
        return None
    return buf.value.decode().split(":") if n > 0 else []


def _inject_sync_fn():
    """FLARE_SIM_INJECT_SYNC=RANKS:1,... (or a bare 1: every rank)."""
    e = rank_entry("FLARE_SIM_INJECT_SYNC", 1, 1, True)
    if not e or e[0] in ("", "0"):
        return None
    import sim_train  # this script as a module (its directory is sys.path[0])
    return sim_train.injected_sync


def host_stall(ms):
    """The injected GC-like pause (FLARE_SIM_HOST_STALL) inside the forward pass."""
    time.sleep(ms / 1000.0)


def parse_host_stall(rank):
    """FLARE_SIM_HOST_STALL=RANKS:MS[:EVERY[:FIRST-LAST]]: (ms, every, first, last) for this rank
    (the simulator's RANK), or None; FIRST-LAST limits it to those steps (a burst), as the C++
    workload reads it. `rank` is kept for callers; the reader takes the process's own rank."""
    e = rank_entry("FLARE_SIM_HOST_STALL", 1, 3)
    if e is None:
        return None
    try:
        ms = float(e[0])
        every = int(e[1]) if len(e) > 1 else 1
        first, last = 0, sys.maxsize
        if len(e) > 2:
            a, b = e[2].split("-")
            first, last = int(a), int(b)
        if ms <= 0 or every <= 0 or first < 0 or last < first:
            raise ValueError
    except ValueError:
        sys.stderr.write("flare-sim: FLARE_SIM_HOST_STALL entry for rank %d is not "
                         "RANKS:MS[:EVERY[:FIRST-LAST]]; ignored\n" % rank)
        return None
    return (ms, every, first, last)


def parse_crash_step(rank):
    """FLARE_SIM_CRASH=RANKS:STEP: the step this rank aborts at, or -1."""
    e = rank_entry("FLARE_SIM_CRASH", 1, 1)
    if e is None or not e[0].isdigit():
        return -1
    return int(e[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--data-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = Model(args, rank, world)
    stall = parse_host_stall(rank)
    crash_step = parse_crash_step(rank)
    skip_step = flareSimHangStep(b"skip")
    # The loader's class comes from this file imported as the module `sim_train` (like
    # injected_sync), so that TRACED_PYTHON_API="sim_train@_LoaderIter.__next__" can name it.
    import sim_train  # noqa: E402  (this script's directory is sys.path[0])
    loader = sim_train.SyntheticLoader(args.steps, args.data_ms, args.seq * args.micro_batch)
    step = 0
    # Flare's explicit step marker (include/flare/step.h), when the hook is preloaded.
    mark_step = getattr(_G, "flare_step", None)
    # A step's time is from its DataLoader call to the next one (the one that raises
    # StopIteration ends the last step): the same instants as Flare's step boundaries, so that
    # host scheduling between the step's end and the next call (this print, on a loaded
    # machine) counts in both or in neither. Each step's line is printed at the next call.
    it = iter(loader)
    pending = None  # (step, gemm_ms, its DataLoader call's time) of the step printed next

    # Each step's run-queue wait (ms; -1 where schedstat cannot be read): its main thread's, and
    # all its threads' together, from one step's line to the next, as flare-sim-rank reports.
    waited = [run_queue_wait_ns()]

    def report(entered):
        now = run_queue_wait_ns()
        ms = [-1.0 if a is None or b is None else (a - b) / 1e6 for a, b in zip(now, waited[0])]
        waited[0] = now
        print('FLARE_SIM_STEP {"rank":%d,"step":%d,"step_ms":%.3f,"gemm_ms":%.4f,'
              '"run_queue_ms":%.4f,"run_queue_all_ms":%.4f}'
              % (rank, pending[0], (entered - pending[2]) * 1000, pending[1], ms[0], ms[1]),
              flush=True)

    for batch in it:
        if pending is not None:
            report(it.entered)
        started = it.entered
        flareSimSetStep(step)
        if mark_step is not None:
            mark_step()
        if step == crash_step:
            sys.stderr.write("flare-sim: rank %d crashing at step %d (FLARE_SIM_CRASH)\n"
                             % (rank, step))
            sys.stderr.flush()
            os.abort()
        if step == skip_step:
            sys.stderr.write("flare-sim: rank %d stuck before step %d's collectives "
                             "(FLARE_SIM_HANG skip)\n" % (rank, step))
            sys.stderr.flush()
            while True:
                time.sleep(1)
        model.forward(batch, step, stall)
        model.backward()
        model.optimizer_step()
        model.synchronize_step()
        pending = (step, model.gemm_ms(), started)
        step += 1
    if pending is not None:
        report(it.entered)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SimError as e:
        sys.stderr.write("flare-sim (python) rank %s: %s\n" % (os.environ.get("RANK", "0"), e))
        sys.exit(1)
