// CudaDeviceTimer (device_timer.h).
#include "src/hook/device_timer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>

#include "src/hook/cudart_fns.h"
#include "src/hook/real.h"

namespace flare::hook {
namespace {

// Driver calls that describe a device (they create no context). Resolved lazily, on the timing
// thread, the first time an op completes.
struct DeviceQueryFns {
  RealFn<CUresult (*)(CUdevice*, int)> get{"cuDeviceGet", "libcuda.so"};
  RealFn<CUresult (*)(char*, int, CUdevice)> name{"cuDeviceGetName", "libcuda.so"};
  RealFn<CUresult (*)(CUuuid*, CUdevice)> uuid{"cuDeviceGetUuid_v2", "libcuda.so"};
  RealFn<CUresult (*)(size_t*, CUdevice)> totalMem{"cuDeviceTotalMem_v2", "libcuda.so"};
  RealFn<CUresult (*)(int*, CUdevice_attribute, CUdevice)> attribute{"cuDeviceGetAttribute",
                                                                     "libcuda.so"};
};
DeviceQueryFns g_device_query;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string uuidText(const CUuuid& u) {
  static const char* hex = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

// DeviceTimer on the real CUDA runtime.
class CudaDeviceTimer final : public timing::DeviceTimer {
 public:
  bool ready() {
    return g_cudart.eventCreateWithFlags.get() && g_cudart.eventDestroy.get() &&
           g_cudart.eventRecord.get() && g_cudart.eventQuery.get() && g_cudart.eventElapsed.get() &&
           g_cudart.isCapturing.get() && g_cudart.getDevice.get();
  }
  bool createEvent(void** event) override {
    cudaEvent_t e = nullptr;
    if (g_cudart.eventCreateWithFlags.get()(&e, cudaEventDefault) != cudaSuccess) return false;
    *event = e;
    return true;
  }
  void destroyEvent(void* event) override {
    g_cudart.eventDestroy.get()(static_cast<cudaEvent_t>(event));
  }
  bool recordEvent(void* event, void* stream) override {
    return g_cudart.eventRecord.get()(static_cast<cudaEvent_t>(event),
                                      static_cast<cudaStream_t>(stream)) == cudaSuccess;
  }
  Status queryEvent(void* event) override {
    cudaError_t e = g_cudart.eventQuery.get()(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return Status::kReady;
    if (e == cudaErrorNotReady) return Status::kNotReady;
    return Status::kError;
  }
  bool elapsedNs(void* from, void* to, int64_t* ns) override {
    float ms = 0;
    if (g_cudart.eventElapsed.get()(&ms, static_cast<cudaEvent_t>(from),
                                    static_cast<cudaEvent_t>(to)) != cudaSuccess) {
      return false;
    }
    *ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    return true;
  }
  bool enterTimingThread() override {
    auto exchange = g_cudart.threadExchangeCaptureMode.get();
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    return exchange != nullptr && exchange(&mode) == cudaSuccess;
  }
  bool isCapturing(void* stream) override {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    if (g_cudart.isCapturing.get()(static_cast<cudaStream_t>(stream), &s) != cudaSuccess) {
      // Querying a legacy-stream capture state while another stream captures in global mode
      // is itself an error: treat as capturing, record nothing.
      return true;
    }
    return s != cudaStreamCaptureStatusNone;
  }
  uint64_t streamId(void* stream) override {
    auto v = reinterpret_cast<uintptr_t>(stream);
    return v == reinterpret_cast<uintptr_t>(cudaStreamLegacy) ? 0 : v;
  }
  int currentDevice() override {
    int d = 0;
    g_cudart.getDevice.get()(&d);
    return d;
  }
  // Timing thread, once: the driver's name, UUID and figures of `device`.
  bool describeDevice(int device, timing::DeviceDescription* out) override {
    auto get = g_device_query.get.get();
    auto name = g_device_query.name.get();
    CUdevice dev = 0;
    char text[256] = {};
    if (!get || !name || get(&dev, device) != CUDA_SUCCESS ||
        name(text, sizeof(text) - 1, dev) != CUDA_SUCCESS) {
      return false;
    }
    out->index = device;
    out->name = text;
    CUuuid u{};
    if (auto f = g_device_query.uuid.get(); f && f(&u, dev) == CUDA_SUCCESS)
      out->uuid = uuidText(u);
    size_t bytes = 0;
    if (auto f = g_device_query.totalMem.get(); f && f(&bytes, dev) == CUDA_SUCCESS)
      out->memory_bytes = bytes;
    auto attr = [&](CUdevice_attribute a) {
      int v = 0;
      auto f = g_device_query.attribute.get();
      return f && f(&v, a, dev) == CUDA_SUCCESS && v > 0 ? static_cast<uint32_t>(v) : 0u;
    };
    out->sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    out->clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    out->cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    out->cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%08x:%02x:%02x.0", attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                  attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    out->pci_bus_id = bus;
    return true;
  }
  // Poller thread only: a private non-blocking stream per device carries the reference.
  bool recordReference(int device, void** event) override {
    auto set = g_cudart.setDevice.get();
    auto create = g_cudart.streamCreateWithFlags.get();
    if (!set || !create || device < 0 || device >= kMaxDevices) return false;
    int previous = currentDevice();
    if (previous != device && set(device) != cudaSuccess) return false;
    bool ok = true;
    if (!ref_streams_[device]) {
      ok = create(&ref_streams_[device], cudaStreamNonBlocking) == cudaSuccess;
    }
    ok = ok && createEvent(event);
    if (ok && !recordEvent(*event, ref_streams_[device])) {
      destroyEvent(*event);
      ok = false;
    }
    if (previous != device) set(previous);
    return ok;
  }

 private:
  static constexpr int kMaxDevices = 64;
  cudaStream_t ref_streams_[kMaxDevices] = {};
};

}  // namespace

std::unique_ptr<timing::DeviceTimer> makeCudaDeviceTimer() {
  auto timer = std::make_unique<CudaDeviceTimer>();
  if (!timer->ready()) return nullptr;
  return timer;
}

}  // namespace flare::hook
