"""torch.Tensor, reduced to what the PyTorch-like sim workload does with one: a device or host
buffer that can be copied to the device (`.cuda`), read back (`.item`) and differentiated
(`.backward`: the nodes its forward recorded)."""

import ctypes

from torch import _sim


class Tensor:
    def __init__(self, ptr, nbytes, device="cuda", pinned=False, grad_fn=None):
        self.ptr, self.nbytes, self.device, self.pinned = ptr, nbytes, device, pinned
        self.grad_fn = grad_fn  # a list of backward nodes (callables), oldest first
        self._used_on = []
        self.block_size = nbytes  # pinned: the host allocator's block

    @property
    def is_cuda(self):
        return self.device == "cuda"

    def cuda(self, non_blocking=False):
        """Host -> device: a cudaMemcpyAsync on the current stream; from pinned memory the host
        allocator records an event on that stream (it reuses the block once the copy is done);
        a blocking copy synchronizes the stream."""
        stream = _sim.current_stream()
        out = Tensor(_sim.device_allocator.malloc(self.nbytes), self.nbytes)
        _sim.memcpy_async(out.ptr, self.ptr, self.nbytes, _sim.MEMCPY_H2D, stream)
        if self.pinned:
            _sim.host_allocator.record_and_free(self.ptr, self.block_size, stream)
            self.ptr = None
        if not (non_blocking and self.pinned):
            _sim.stream_synchronize(stream)
        return out

    def copy_(self, src):
        """Host -> device into this tensor (its first src.nbytes): from pageable memory the host
        waits for the copy (cudaMemcpyAsync, then cudaStreamSynchronize)."""
        stream = _sim.current_stream()
        _sim.memcpy_async(self.ptr, src.ptr, min(src.nbytes, self.nbytes), _sim.MEMCPY_H2D,
                          stream)
        if not src.pinned:
            _sim.stream_synchronize(stream)
        return self

    def item(self):
        """_local_scalar_dense: a 4-byte device -> host copy on the current stream, then
        cudaStreamSynchronize of that stream (the host waits for every queued kernel)."""
        stream = _sim.current_stream()
        value = ctypes.c_float()
        _sim.memcpy_async(ctypes.addressof(value), self.ptr, 4, _sim.MEMCPY_D2H, stream)
        _sim.stream_synchronize(stream)
        return value.value

    def backward(self):
        from torch import autograd
        autograd.backward(self)

    def record_stream(self, stream):
        self._used_on.append(stream)

    def release(self):
        """The last reference dropped: the block goes back to the caching allocator."""
        if self.device == "cuda" and self.ptr is not None:
            _sim.device_allocator.free(self.ptr, self.nbytes, self._used_on)
            self.ptr = None


def empty(nbytes, device="cuda"):
    return Tensor(_sim.device_allocator.malloc(max(nbytes, 4)), max(nbytes, 4), device)


def tensor_from_host(data):
    """torch.tensor(bytes) on the host (pageable memory)."""
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    t = Tensor(ctypes.addressof(buf), len(data), device="cpu")
    t._keep = buf
    return t
