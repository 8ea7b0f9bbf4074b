"""torch.cuda: the device, the current stream, synchronize."""

from torch import _sim


def set_device(device):
    _sim.set_device(device)


def current_stream():
    return _sim.current_stream()


def synchronize():
    _sim.check(_sim.S.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
