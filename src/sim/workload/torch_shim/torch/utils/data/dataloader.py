"""torch.utils.data.DataLoader with num_workers=0: `_BaseDataLoaderIter.__next__` (what Flare
traces as the step boundary) fetches the batch in `_next_data` and, with pin_memory=True, copies
it into a block of the pinned-host caching allocator."""

import ctypes


class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class DataLoader:
    def __init__(self, dataset, batch_size=1, pin_memory=False, drop_last=True):
        self.dataset, self.batch_size = dataset, batch_size
        self.pin_memory, self.drop_last = pin_memory, drop_last

    def __len__(self):
        return len(self.dataset) // self.batch_size

    def __iter__(self):
        return _SingleProcessDataLoaderIter(self)


class _BaseDataLoaderIter:
    def __init__(self, loader):
        self._loader = loader
        self._index = 0
        self._num_yielded = 0

    def _next_index(self):
        if self._index >= len(self._loader):
            raise StopIteration
        i = self._index
        self._index += 1
        return i

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        return data

    def __iter__(self):
        return self


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def _next_data(self):
        index = self._next_index()
        samples = [self._loader.dataset[index * self._loader.batch_size + i]
                   for i in range(self._loader.batch_size)]
        data = b"".join(samples)  # default_collate
        if self._loader.pin_memory:
            return _pin(data)
        from torch._tensor import tensor_from_host
        return tensor_from_host(data)


def _pin(data):
    from torch import _sim
    from torch._tensor import Tensor
    ptr, size = _sim.host_allocator.allocate(len(data))
    ctypes.memmove(ptr, data, len(data))
    t = Tensor(ptr, len(data), device="cpu", pinned=True)
    t.block_size = size
    return t
