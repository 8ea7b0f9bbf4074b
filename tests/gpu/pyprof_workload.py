"""A small real PyTorch training loop, unchanged for Flare (no import, no decorator): a
DataLoader, forward, loss.backward() (torch.autograd.backward), optimizer.step(), an explicit
torch.cuda.synchronize() per step and one forced gc.collect(). Writes its own counts to argv[1]
for tests/gpu/test_pyprof_gpu.py to compare with the spans Flare recorded."""
import gc
import json
import sys

import torch

STEPS, BATCH = 8, 64


def main(out):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * BATCH, 512),
                                          torch.randn(STEPS * BATCH, 512))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 0
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        steps += 1
    collected = gc.collect()
    with open(out, "w") as f:
        json.dump({"steps": steps, "next_calls": steps + 1, "gc_collected": collected}, f)


if __name__ == "__main__":
    main(sys.argv[1])
