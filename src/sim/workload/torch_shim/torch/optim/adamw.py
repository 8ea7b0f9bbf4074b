"""torch.optim.AdamW with foreach=True: one multi_tensor_apply launch per chunk of parameters
(and a step-count increment kernel)."""

from torch import _sim
from torch.optim.optimizer import Optimizer

_ADAM = "_ZN2at6native37multi_tensor_apply_kernel_AdamFunctorEv"
_STEP = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEE"
         "viT0_T1_")


class AdamW(Optimizer):
    def __init__(self, params, lr=1e-3, chunk_bytes=1 << 30):
        super().__init__(params, {"lr": lr})
        self.chunk_bytes = chunk_bytes

    def step(self, closure=None):
        params = self.param_groups[0]["params"]
        _sim.kernel(_STEP, _sim.S.COST_BYTES)(8 * len(params))
        total = sum(p.nbytes for p in params)
        adam = _sim.kernel(_ADAM, _sim.S.COST_BYTES)
        while total > 0:  # weights, grads, two moments: read and written
            chunk = min(total, self.chunk_bytes)
            adam(chunk * 8)
            total -= chunk
