"""torch.no_grad: forward ops record no backward nodes."""

from torch import _sim


class no_grad:
    def __enter__(self):
        self.prev = _sim.grad_enabled()
        _sim.set_grad_enabled(False)

    def __exit__(self, *exc):
        _sim.set_grad_enabled(self.prev)
        return False
