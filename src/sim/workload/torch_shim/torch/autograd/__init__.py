"""torch.autograd.backward: hands the graph to the engine (torch/_sim.py), whose device thread
launches the backward kernels while this thread waits: the span Flare traces
(`torch.autograd@backward`) is open on this thread, the kernels come from another."""

from torch.autograd import grad_mode  # noqa: F401
from torch.autograd.graph import _engine_run_backward


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    nodes = []
    for t in tensors:
        nodes.extend(t.grad_fn or [])
    _engine_run_backward(tensors, nodes)
