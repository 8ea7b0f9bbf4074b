"""Run under LD_PRELOAD=libflare_hook.so on a GPU: a bf16 matmul timed independently with
torch.cuda.Event, and a single-rank NCCL all-reduce. Writes the independent timings as JSON."""
import json
import os
import sys

import torch
import torch.distributed as dist


def main(out_path):
    dev = torch.device("cuda", 0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b  # warm-up (cuBLAS heuristics, workspace)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(10):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.ones(64 << 20, device=dev, dtype=torch.float32)  # 256 MiB
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump({"matmul_ms": sorted(ms)[len(ms) // 2], "m": 8192, "n": 8192, "k": 8192,
                   "allreduce_bytes": t.numel() * 4}, f)


if __name__ == "__main__":
    main(sys.argv[1])
