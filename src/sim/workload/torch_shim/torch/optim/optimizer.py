"""torch.optim.optimizer.Optimizer."""


class Optimizer:
    def __init__(self, params, defaults):
        self.param_groups = [{"params": list(params), **defaults}]

    def zero_grad(self, set_to_none=True):
        """set_to_none (the default): no kernel."""

    def step(self, closure=None):
        raise NotImplementedError
