// CudaDeviceTimer: the Tracer's DeviceTimer (src/timing/timing.h) on the real CUDA runtime:
// events through the runtime's table (cudart_fns.h), the device's name, UUID and figures through
// the driver (resolved lazily on the timing thread), the clock-mapping reference on a private
// stream per device. Owned by the runtime (runtime.cc) for the life of the process.
#pragma once

#include <memory>

#include "src/timing/timing.h"

namespace flare::hook {

// The timer, or nullptr when the CUDA runtime's event functions cannot be found (tracing then
// turns off). Any thread; resolves the runtime's functions (real.h).
std::unique_ptr<timing::DeviceTimer> makeCudaDeviceTimer();

}  // namespace flare::hook
