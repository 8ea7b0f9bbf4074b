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

Run: python3 tests/gpu/bench/gpt_train.py --size small --steps 50 --warmup 20 --json out.json
"""

import argparse
import json
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
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class Tokens(torch.utils.data.Dataset):
    """Synthetic token batches, generated on the CPU like a real dataset's reads."""

    def __init__(self, n, seq, seed):
        self.n, self.seq, self.seed = n, seq, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed + i)
        return torch.randint(0, VOCAB, (self.seq + 1,), generator=g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=50, help="measured steps")
    ap.add_argument("--warmup", type=int, default=20, help="steps run before measuring")
    ap.add_argument("--profiler", action="store_true", help="record the measured steps with "
                    "torch.profiler (CPU and CUDA activities)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    layers, d, heads, seq, batch = SIZES[args.size]
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", 0)
    model = GPT(layers, d, heads, seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    total = args.warmup + args.steps
    loader = torch.utils.data.DataLoader(Tokens(total * batch, seq, args.seed), batch_size=batch,
                                         num_workers=2, pin_memory=True, drop_last=True)

    def step(tokens):
        tokens = tokens.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # the per-step host synchronization a logging loop makes

    times = []
    prof = None
    it = iter(loader)
    for i in range(total):
        if i == args.warmup:
            torch.cuda.synchronize()
            if args.profiler:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
                prof.__enter__()
        t0 = time.perf_counter()
        step(next(it))
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if prof is not None:
        prof.__exit__(None, None, None)
    result = {
        "size": args.size,
        "steps_ms": times,
        "median_ms": statistics.median(times),
        "tokens_per_step": batch * seq,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "profiler": args.profiler,
        "params": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(0),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
