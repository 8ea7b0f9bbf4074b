// What cuda_driver.cc offers the dlsym interposer (dlsym_interpose.cc): the driver entry points
// the hook wraps, by name, and the substitution of a real entry point by its wrapper.
//
// Both are called on whichever thread calls dlsym; both are thread-safe, allocate nothing and
// make no dl* call (so they leave dlerror() as the real dlsym left it).
#pragma once

namespace flare::hook {

// True for the driver symbols the hook wraps: cuLaunchKernel, cuLaunchKernelEx (and their
// _ptsz variants), cuGetProcAddress and cuGetProcAddress_v2. `name` is not null.
bool isWrappedDriverSymbol(const char* name);

// The hook's wrapper for the driver symbol `name`, whose real address is `real` (a libcuda
// function): the wrapper will forward to `real`. Returns `real` itself when the hook does not
// wrap `name`, or when `real` already is the wrapper.
void* wrapDriverSymbol(const char* name, void* real);

}  // namespace flare::hook
