"""A stand-in for the parts of PyTorch that Flare meets on a real GPU, over the simulated
CUDA/cuBLAS/NCCL stack (src/sim). Not PyTorch: no tensor math, no data. It keeps PyTorch's module
layout and call structure where Flare's defaults trace it (`torch.utils.data.dataloader.
_BaseDataLoaderIter@__next__`, `torch.autograd@backward`, `torch.optim.Optimizer@step` and its
subclasses, `torch@save`, `torch.cuda@synchronize`) and PyTorch's threads, streams and native
calls where the hook sees them (torch/_sim.py). Put on sys.path only by the PyTorch-like sim
workload (src/sim/workload/pytorch_like.py); never installed as `torch`.
"""

from torch import _sim
from torch._tensor import Tensor, empty, tensor_from_host
from torch.serialization import save
from torch.autograd.grad_mode import no_grad
from torch import autograd, cuda, optim, utils  # noqa: F401  (torch.cuda etc. are attributes)

__all__ = ["Tensor", "empty", "tensor_from_host", "save", "no_grad", "autograd", "cuda", "optim",
           "utils"]
