"""torch.autograd.graph._engine_run_backward: Variable._execution_engine.run_backward."""

from torch import _sim


def _engine_run_backward(tensors, nodes):
    _sim.execution_engine.run_backward(nodes)
