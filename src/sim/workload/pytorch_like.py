#!/usr/bin/env python3
"""A PyTorch-like training job on the simulated stack: the patterns of a real PyTorch loop that
Flare has to survive, which the other sim workloads do not have.

Started by `flare-sim-train --pytorch-like` (one process per rank, identity from RANK and
WORLD_SIZE). It imports a stand-in `torch` (share/flare/torch_shim, src/sim/workload/torch_shim)
whose module layout matches PyTorch's where Flare's default traced APIs name it, so that nothing
but LD_PRELOAD is needed, as on a real GPU:

- steps come from the DataLoader only: `torch.utils.data.dataloader._BaseDataLoaderIter.__next__`
  (no flare_step marker, unless `--markers-from N` adds them from step N on); pin_memory=True;
  a batch takes `--data-ms` (0.5) of host time, as from a prefetching DataLoader (a healthy job:
  the GPU waits little for input);
- seconds of set-up before the loop (model built and copied to the device: one cudaMemcpyAsync
  + cudaStreamSynchronize per parameter; DDP's broadcast of the parameters; then `--setup-ms` of
  host time, e.g. dataset preparation) during which the GPU idles;
- each step: the batch's host->device copy from pinned memory (the pinned-host caching allocator
  records an event on the stream and queries its older ones), the forward on the main thread on
  the legacy default stream, `loss.backward()` (traced `torch.autograd@backward`) whose kernels
  are launched by the autograd engine's device thread ("pt_autograd_0", its own cuBLAS handle)
  while the main thread waits, DDP's per-layer gradient all-reduce on its own stream from that
  thread (the caching allocator records an event per bucket freed after use on that stream and
  queries them at the next allocation), AdamW's `step` (traced), and `loss.item()` (a 4-byte
  device->host copy and a stream synchronize);
- an evaluation pause (`--eval-at`: two no-grad forward passes of a batch twice as large, whose
  new GEMM shapes are cold mid-run, held in memory or with `--eval-loader 1` read through a
  validation DataLoader, and `--eval-ms` of host time) and a
  checkpoint (`--save-at`: `torch.save` of the parameters, a synchronous device->host copy each,
  then `--save-ms` of host time) after a step of the loop;
- cold starts: unless set, FLARE_SIM_FIRST_LAUNCH_MS=2 (every kernel's first launch) and
  FLARE_SIM_COLD_GEMM_MS=5 (every GEMM shape's first call: 20-80x its warm duration here);
- FLARE_SIM_HOST_STALL as in the other workloads (in the middle of the forward pass).

Each step prints `FLARE_SIM_STEP {...}` for the launcher; with `--stats-dir DIR` each rank writes
DIR/pytorch-like-RANK.json: its steps, run time, evaluation and checkpoint steps, and the
allocators' event records and queries.
"""

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
# The real stack's cold starts (lazy module loading, cuBLAS heuristics), unless the caller chose;
# read by the simulated libraries at their first launch.
os.environ.setdefault("FLARE_SIM_FIRST_LAUNCH_MS", "2")
os.environ.setdefault("FLARE_SIM_COLD_GEMM_MS", "5")
sys.path.insert(0, os.path.join(HERE, "torch_shim"))

import torch  # noqa: E402  (the stand-in, torch_shim/torch)
from torch import _sim  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from sim_schedstat import run_queue_wait_ns  # noqa: E402  (beside this file, share/flare)

S = _sim.S  # the ctypes bindings of sim_train.py

# ATen-like kernel names (mangled, as cudaFuncGetName returns them).
LAYER_NORM = "_ZN2at6native28vectorized_layer_norm_kernelEv"
LAYER_NORM_BWD = "_ZN2at6native28layer_norm_grad_input_kernelEv"
FLASH_FWD = "_ZN5flash16flash_fwd_kernelILi128ELi64ELb1EEEvNS_16Flash_fwd_paramsE"
FLASH_BWD = "_ZN5flash16flash_bwd_kernelILi128ELi64ELb1EEEvNS_16Flash_bwd_paramsE"
GELU = "_ZN2at6native25GeluCUDAKernelImpl_kernelEv"
GELU_BWD = "_ZN2at6native33GeluBackwardCUDAKernelImpl_kernelEv"
ADD = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIN3c108BFloat16EEE"
       "St5arrayIPcLm3EEEEviT0_T1_")
LOSS = "_ZN2at6native38nll_loss_forward_reduce_cuda_kernel_2dEv"
LOSS_BWD = "_ZN2at6native39nll_loss_backward_reduce_cuda_kernel_2dEv"
BF16 = 2


class TokenDataset(Dataset):
    """A tokenized dataset read from host memory: each sample takes `data_ms` of host time."""

    def __init__(self, samples, sample_bytes, data_ms):
        self.samples, self.sample_bytes, self.data_ms = samples, sample_bytes, data_ms

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        # Each sample's host time varies (the sim's host jitter, per FLARE_SIM_SEED and rank).
        time.sleep(self.data_ms * S.flareSimHostFactor(i, 1) / 1000.0)
        return bytes([i % 251]) * self.sample_bytes


class Layer:
    """One transformer layer (bf16): forward on the calling thread, backward as an autograd node
    the engine runs on its device thread."""

    def __init__(self, model, index):
        self.model, self.index = model, index
        h = model.h
        self.params = [model.param(n) for n in (3 * h * h, h * h, 4 * h * h, 4 * h * h)]
        self.param_bytes = sum(p.nbytes for p in self.params)

    def forward(self, tape, stall, mb):
        m, h = self.model, self.model.h
        T, act, attn = m.seq * mb, m.seq * mb * m.h * BF16, 4 * mb * m.seq * m.seq * m.h
        m.ln(act * 2)
        _sim.gemm(3 * h, T, h, True, False)
        m.flash_fwd(attn)
        _sim.gemm(h, T, h, True, False)
        m.add(act * 3)
        if stall is not None and self.index == len(m.layers) // 2:
            S.host_stall(stall)
        m.ln(act * 2)
        _sim.gemm(4 * h, T, h, True, False)
        m.gelu(T * 4 * h * 4)
        _sim.gemm(h, T, 4 * h, True, False)
        m.add(act * 3)
        if tape is not None:
            tape.append(self.backward)

    def backward(self):
        m, h, T, f = self.model, self.model.h, self.model.T, 4 * self.model.h
        _sim.gemm(f, T, h, False, False)
        _sim.gemm(h, f, T, False, True)
        m.gelu_bwd(T * f * 6)
        _sim.gemm(h, T, f, False, False)
        _sim.gemm(f, h, T, False, True)
        m.ln_bwd(m.act * 4)
        _sim.gemm(h, T, h, False, False)
        _sim.gemm(h, h, T, False, True)
        m.flash_bwd(m.attn_flops * 5 // 2)
        _sim.gemm(h, T, 3 * h, False, False)
        _sim.gemm(3 * h, h, T, False, True)
        m.ln_bwd(m.act * 4)
        if m.ddp is not None:
            m.ddp.grad_ready(self)


class Model:
    def __init__(self, args):
        self.h, self.seq, self.mb = args.hidden, args.seq, args.micro_batch
        self.T = args.seq * args.micro_batch
        self.act = self.T * self.h * BF16
        self.attn_flops = 4 * args.micro_batch * args.seq * args.seq * self.h
        self.ln = _sim.kernel(LAYER_NORM, S.COST_BYTES)
        self.ln_bwd = _sim.kernel(LAYER_NORM_BWD, S.COST_BYTES)
        self.flash_fwd = _sim.kernel(FLASH_FWD, S.COST_FLOPS)
        self.flash_bwd = _sim.kernel(FLASH_BWD, S.COST_FLOPS)
        self.gelu = _sim.kernel(GELU, S.COST_BYTES)
        self.gelu_bwd = _sim.kernel(GELU_BWD, S.COST_BYTES)
        self.add = _sim.kernel(ADD, S.COST_BYTES)
        self.loss_fwd = _sim.kernel(LOSS, S.COST_BYTES)
        self.loss_bwd = _sim.kernel(LOSS_BWD, S.COST_BYTES)
        self.ddp = None
        self.layers = [Layer(self, i) for i in range(args.layers)]

    @staticmethod
    def param(elements):
        """A bf16 parameter initialized on the host and copied to the device (model.cuda():
        a pageable copy, so the host waits for it). The simulated device memory is host memory:
        only the first 64 KiB are written."""
        p = torch.empty(elements * BF16)
        init = torch.tensor_from_host(b"\x01" * min(p.nbytes, 65536))
        p.copy_(init)
        return p

    def parameters(self):
        return [p for layer in self.layers for p in layer.params]

    def __call__(self, x, stall=None, micro_batch=None):
        tape = [] if _sim.grad_enabled() else None
        mb = micro_batch or self.mb
        for layer in self.layers:
            layer.forward(tape, stall, mb)
        self.loss_fwd(self.seq * mb * self.h * BF16 * 8)
        loss = torch.empty(4)
        if tape is not None:
            tape.append(lambda: self.loss_bwd(self.act * 8))
            loss.grad_fn = tape
        return loss


class DistributedDataParallel:
    """torch.nn.parallel.DistributedDataParallel's device traffic: the parameters broadcast from
    rank 0 at construction (set-up); in backward, each layer's gradient bucket all-reduced on the
    process group's stream as soon as that layer's backward has run (on the autograd device
    thread), the bucket freed after use on that stream (record_stream), and a final callback that
    makes the current stream wait for the all-reduces."""

    def __init__(self, model, rank, world):
        self.model, self.world = model, world
        self.stream = _sim.new_stream()
        self.comm = self._init_comm(rank, world)
        self.ev_ready, self.ev_done = _sim.new_event(), _sim.new_event()
        self._queued = False
        cur = _sim.current_stream()
        _sim.record(self.ev_ready, cur)
        _sim.wait(self.stream, self.ev_ready)
        for p in model.parameters():  # _sync_module_states
            S.check_nccl(_sim.ncclBroadcast(p.ptr, p.ptr, p.nbytes // BF16, S.NCCL_BF16, 0,
                                            self.comm, self.stream), "ncclBroadcast")
        _sim.stream_synchronize(self.stream)
        model.ddp = self

    @staticmethod
    def _init_comm(rank, world):
        return S.init_comm("pytorch-like", world, rank)

    def grad_ready(self, layer):
        """Called on the autograd device thread after `layer`'s backward."""
        if not self._queued:
            _sim.execution_engine.queue_callback(self._finalize)
            self._queued = True
        bucket = torch.empty(layer.param_bytes)
        cur = _sim.current_stream()
        _sim.record(self.ev_ready, cur)
        _sim.wait(self.stream, self.ev_ready)
        S.check_nccl(S.ncclAllReduce(None, None, layer.param_bytes // BF16, S.NCCL_BF16,
                                     S.NCCL_SUM, self.comm, self.stream), "ncclAllReduce")
        bucket.record_stream(self.stream)
        bucket.release()

    def _finalize(self):
        self._queued = False
        _sim.record(self.ev_done, self.stream)
        _sim.wait(_sim.current_stream(), self.ev_done)


def evaluate(model, batches, eval_ms, micro_batch):
    """model.eval(); with torch.no_grad(): a few forward passes of a larger batch (no activations
    kept), each loss read back; then the metrics on the host. The larger batch makes GEMM shapes
    the loop never ran: their first calls are cold, mid-run, and seen only a few times."""
    with torch.no_grad():
        for b in batches:
            x = b.cuda()
            model(x, micro_batch=micro_batch).item()
            x.release()
    time.sleep(eval_ms / 1000.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--data-ms", type=float, default=0.5)
    p.add_argument("--setup-ms", type=float, default=1500.0)
    p.add_argument("--eval-at", type=int, default=-1, help="default: a third into the loop")
    p.add_argument("--eval-ms", type=float, default=300.0)
    p.add_argument("--eval-micro-batch", type=int, default=0, help="default: 2x --micro-batch")
    p.add_argument("--eval-loader", type=int, default=0,
                   help="1: evaluate over a validation DataLoader (default: batches in memory)")
    p.add_argument("--save-at", type=int, default=-1, help="default: two thirds into the loop")
    p.add_argument("--save-ms", type=float, default=300.0)
    p.add_argument("--markers-from", type=int, default=-1,
                   help="from this step on, also call flare_step() at each step's start (a "
                   "job that adds explicit markers mid-run; default: never)")
    p.add_argument("--stats-dir", default="")
    args = p.parse_args(argv)
    eval_at = args.eval_at if args.eval_at >= 0 else args.steps // 3
    save_at = args.save_at if args.save_at >= 0 else 2 * args.steps // 3
    rank, world = _sim.rank_and_world()
    torch.cuda.set_device(rank % 8)
    stall = S.parse_host_stall(rank)
    stall_ms = stall[0] if stall else None
    stall_every = stall[1] if stall else 1

    # ---- set-up: model, DDP, data; the GPU idles through the host part ----
    model = Model(args)
    if world > 1:
        DistributedDataParallel(model, rank, world)
    optimizer = torch.optim.AdamW(model.parameters())
    sample_bytes = args.seq * 8
    loader = DataLoader(TokenDataset(args.steps * args.micro_batch, sample_bytes, args.data_ms),
                        batch_size=args.micro_batch, pin_memory=True)
    eval_mb = args.eval_micro_batch or 2 * args.micro_batch
    if args.eval_loader:
        # Evaluation over a validation DataLoader: its iterator's __next__ is the same traced
        # function as the training loader's.
        val = DataLoader(TokenDataset(2 * eval_mb, sample_bytes, args.data_ms),
                         batch_size=eval_mb, pin_memory=False)
    else:
        val = [torch.tensor_from_host(b"\x02" * sample_bytes * eval_mb) for _ in range(2)]
    torch.cuda.synchronize()
    time.sleep(args.setup_ms / 1000.0)

    # ---- the loop: steps from the DataLoader only ----
    steps, losses = 0, 0.0
    t0 = time.perf_counter()
    loop_started, waited_before = time.monotonic(), run_queue_wait_ns()
    marker = None
    if args.markers_from >= 0:
        try:  # the preloaded hook's marker (include/flare/step.h); none without Flare
            marker = ctypes.CDLL(None).flare_step
        except AttributeError:
            marker = None
    for step, batch in enumerate(loader):
        S.flareSimSetStep(step)
        if marker is not None and step >= args.markers_from:
            marker()
        x = batch.cuda(non_blocking=True)
        loss = model(x, stall_ms if stall and step % stall_every == 0
                     and stall[2] <= step <= stall[3] else None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses += loss.item()
        loss.release()
        x.release()
        now = time.perf_counter()
        print('FLARE_SIM_STEP {"rank":%d,"step":%d,"step_ms":%.3f,"gemm_ms":0}'
              % (rank, step, (now - t0) * 1000), flush=True)
        steps += 1
        if step == eval_at:
            evaluate(model, val, args.eval_ms, eval_mb)
        if step == save_at:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": model.parameters()}, os.path.join(d, "checkpoint.pt"))
                time.sleep(args.save_ms / 1000.0)
        t0 = time.perf_counter()
    torch.cuda.synchronize()
    loop_seconds, waited_after = time.monotonic() - loop_started, run_queue_wait_ns()
    if args.stats_dir:
        # Run-queue wait over the loop (ns; None where schedstat cannot be read): the main
        # thread's, and all threads' together (the simulated GPU's workers too).
        waited = {k: (None if a is None or b is None else a - b)
                  for k, a, b in zip(("main", "all"), waited_after, waited_before)}
        stats = {"rank": rank, "world": world, "steps": steps, "eval_at": eval_at,
                 "seconds": time.monotonic() - STARTED,
                 "loop_seconds": loop_seconds, "run_queue_wait_ns": waited,
                 "save_at": save_at,
                 "host_event_records": _sim.host_allocator.records,
                 "host_event_queries": _sim.host_allocator.queries,
                 "device_event_records": _sim.device_allocator.records,
                 "device_event_queries": _sim.device_allocator.queries}
        with open(os.path.join(args.stats_dir, "pytorch-like-%d.json" % rank), "w") as f:
            json.dump(stats, f)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except S.SimError as e:
        sys.stderr.write("flare-sim (pytorch-like) rank %s: %s\n"
                         % (os.environ.get("RANK", "0"), e))
        sys.exit(1)
