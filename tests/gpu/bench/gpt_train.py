#!/usr/bin/env python3
"""A GPT-style PyTorch training loop on one GPU, the workload of Flare's GPU overhead benchmark.

bf16 autocast, causal self-attention (scaled_dot_product_attention), GELU MLP, AdamW, a
DataLoader over synthetic token batches, loss.item() once per step (as training loops log it).
Prints nothing but, with --json FILE, writes the per-step wall times of the measured steps,
peak RSS and the configuration:

  {"size": "small", "steps_ms": [...], "median_ms": ..., "tokens_per_step": ...,
   "max_rss_kib": ..., "profiler": false, "params": ...}

--profiler records the measured steps with torch.profiler (CPU and CUDA activities), the
comparison the issue asks for. Flare is switched on from outside (LD_PRELOAD, FLARE_* env).

Patterns of real jobs, for the acceptance run and the fixture capture (tests/gpu/acceptance.sh,
tests/gpu/capture.sh), each off by default:
  --seconds S        stop the measured steps after S seconds (--steps is then an upper bound)
  --stall-ms M       a host stall of M ms every step between forward and backward, on the rank
                     --stall-rank names (RANK; default 3); --stall-kind gc makes it a real
                     gc.collect() over garbage built to take about that long
  --sync             a stray torch.cuda.synchronize() in the middle of every forward
  --data-ms M        a slow DataLoader: M ms of host work per batch (use with --workers 0)
  --unaligned        the MLP width 4*d+8: GEMMs with a dimension that is not a multiple of
                     128 bytes
  --cuda-graph       the whole step captured once in a CUDA graph and replayed
  --compile          torch.compile(model)

Run: python3 tests/gpu/bench/gpt_train.py --size small --steps 50 --warmup 20 --json out.json
"""

import argparse
import gc
import json
import os
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (layers, hidden, heads, sequence, micro-batch)
SIZES = {
    "tiny": (2, 256, 4, 256, 8),
    "small": (12, 768, 12, 1024, 8),
    "medium": (24, 1024, 16, 1024, 8),
    "large": (24, 2048, 16, 2048, 4),
}
VOCAB = 32768


class Block(nn.Module):
    def __init__(self, d, heads, ffn=None):
        super().__init__()
        ffn = ffn or 4 * d
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn, bias=False)
        self.fc2 = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq, ffn=None, sync=False):
        super().__init__()
        self.sync = sync
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if self.sync and i == len(self.blocks) // 2:
                torch.cuda.synchronize()  # the stray synchronize (--sync)
        return self.head(self.ln(x))


class Tokens(torch.utils.data.Dataset):
    """Synthetic token batches, generated on the CPU like a real dataset's reads."""

    def __init__(self, n, seq, seed, sample_ms=0.0):
        self.n, self.seq, self.seed, self.sample_ms = n, seq, seed, sample_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sample_ms:
            end = time.perf_counter() + self.sample_ms / 1e3
            while time.perf_counter() < end:  # host work (decoding, augmentation), not a sleep
                pass
        g = torch.Generator().manual_seed(self.seed + i)
        return torch.randint(0, VOCAB, (self.seq + 1,), generator=g)


def make_garbage(n):
    """Reference cycles for --stall-kind gc: collected only by the cyclic GC."""
    for _ in range(n):
        a, b = [], []
        a.append(b)
        b.append(a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=50, help="measured steps")
    ap.add_argument("--warmup", type=int, default=20, help="steps run before measuring")
    ap.add_argument("--seconds", type=float, default=0, help="stop measuring after this long")
    ap.add_argument("--profiler", action="store_true", help="record the measured steps with "
                    "torch.profiler (CPU and CUDA activities)")
    ap.add_argument("--stall-ms", type=float, default=0)
    ap.add_argument("--stall-rank", type=int, default=3)
    ap.add_argument("--stall-kind", choices=("sleep", "gc"), default="sleep")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--data-ms", type=float, default=0, help="host work per batch (ms)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--unaligned", action="store_true")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    layers, d, heads, seq, batch = SIZES[args.size]
    rank = int(os.environ.get("RANK", "0"))
    stall = args.stall_ms if rank == args.stall_rank else 0.0
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", 0)
    model = GPT(layers, d, heads, seq, ffn=4 * d + 8 if args.unaligned else None,
                sync=args.sync).to(dev)
    # A captured step needs a capturable optimizer (its step count lives on the GPU).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            **({"capturable": True} if args.cuda_graph else {"fused": True}))
    fwd = torch.compile(model) if args.compile else model
    total = args.warmup + args.steps
    loader = torch.utils.data.DataLoader(
        Tokens(total * batch, seq, args.seed, args.data_ms / batch), batch_size=batch,
        num_workers=args.workers, pin_memory=True, drop_last=True)
    garbage = 0
    if stall and args.stall_kind == "gc":
        # How many reference cycles make a pause of stall_ms (building them plus collecting
        # them), refined a few times since the cost per cycle grows with the count.
        garbage = 20000
        for _ in range(4):
            t0 = time.perf_counter()
            make_garbage(garbage)
            gc.collect()
            took = time.perf_counter() - t0
            garbage = max(1000, int(garbage * (stall / 1e3) / max(took, 1e-6)))

    def host_stall():
        if not stall:
            return
        if args.stall_kind == "gc":
            make_garbage(garbage)
            gc.collect()
        else:
            time.sleep(stall / 1e3)

    def loss_of(tokens):
        # A captured graph must not cache autocast casts across replays.
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not args.cuda_graph):
            logits = fwd(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))

    def step(tokens):
        tokens = tokens.to(dev, non_blocking=True)
        loss = loss_of(tokens)
        host_stall()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # the per-step host synchronization a logging loop makes

    if args.cuda_graph:
        # Whole-step capture (PyTorch's documented recipe): warm up on a side stream, capture
        # forward, backward and the optimizer step once, then each step copies its batch into
        # the static input and replays.
        static = torch.zeros((batch, seq + 1), dtype=torch.long, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_of(static).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = loss_of(static)
            static_loss.backward()
            opt.step()

        def step(tokens):  # noqa: F811 (the captured step replaces the eager one)
            static.copy_(tokens, non_blocking=True)
            host_stall()
            graph.replay()
            return static_loss.item()

    times = []
    prof = None
    it = iter(loader)
    done = 0
    t_start = None
    for i in range(total):
        if i == args.warmup:
            torch.cuda.synchronize()
            t_start = time.perf_counter()
            if args.profiler:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
                prof.__enter__()
        t0 = time.perf_counter()
        try:
            step(next(it))
        except StopIteration:
            break
        done += 1
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            if args.seconds and time.perf_counter() - t_start >= args.seconds:
                break
    if prof is not None:
        prof.__exit__(None, None, None)
    result = {
        "size": args.size,
        "steps_ms": times,
        "median_ms": statistics.median(times) if times else None,
        "total_steps": done,
        "warmup": args.warmup,
        "tokens_per_step": batch * seq,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "profiler": args.profiler,
        "params": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(0),
        "options": {k: getattr(args, k) for k in ("stall_ms", "stall_kind", "sync", "data_ms",
                                                  "workers", "unaligned", "cuda_graph",
                                                  "compile")},
        "stalled": bool(stall),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
