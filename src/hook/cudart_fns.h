// The one table of real CUDA runtime functions the hook uses (conventions.md #4): the
// interposed entry points the wrappers forward to, and the entry points the timing layer calls
// (never interposed). Each is resolved on first use (real.h).
#pragma once

#include <cuda_runtime_api.h>

#include "src/hook/real.h"

namespace flare::hook {

inline constexpr const char* kCudartLib = "libcudart.so";

struct CudartFns {
  // Interposed: cudart.cc forwards to these.
  RealFn<cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t)> launchKernel{
      "cudaLaunchKernel", kCudartLib};
  RealFn<cudaError_t (*)(const cudaLaunchConfig_t*, const void*, void**)> launchKernelExC{
      "cudaLaunchKernelExC", kCudartLib};
  RealFn<cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t)> launchKernelPtsz{
      "cudaLaunchKernel_ptsz", kCudartLib};
  RealFn<cudaError_t (*)(const cudaLaunchConfig_t*, const void*, void**)> launchKernelExCPtsz{
      "cudaLaunchKernelExC_ptsz", kCudartLib};
  // CUDA 13's nvcc stubs: `<<<>>>` launches through these with the kernel's cudaKernel_t
  // (crt/host_runtime.h, unless __NV_LEGACY_LAUNCH). PyTorch's own kernels come this way.
  RealFn<cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t)>
      launchKernelHandle{"__cudaLaunchKernel", kCudartLib};
  RealFn<cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t)>
      launchKernelHandlePtsz{"__cudaLaunchKernel_ptsz", kCudartLib};
  RealFn<cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t)>
      launchCooperativeKernel{"cudaLaunchCooperativeKernel", kCudartLib};
  RealFn<cudaError_t (*)(cudaGraphExec_t, cudaStream_t)> graphLaunch{"cudaGraphLaunch", kCudartLib};
  RealFn<cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t)> memcpyAsync{
      "cudaMemcpyAsync", kCudartLib};
  RealFn<cudaError_t (*)(void*, int, size_t, cudaStream_t)> memsetAsync{"cudaMemsetAsync",
                                                                        kCudartLib};
  RealFn<cudaError_t (*)()> deviceSynchronize{"cudaDeviceSynchronize", kCudartLib};
  RealFn<cudaError_t (*)(cudaStream_t)> streamSynchronize{"cudaStreamSynchronize", kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t)> eventSynchronize{"cudaEventSynchronize", kCudartLib};
  RealFn<cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned)> streamWaitEvent{
      "cudaStreamWaitEvent", kCudartLib};
  RealFn<cudaError_t (*)(const char**, const void*)> funcGetName{"cudaFuncGetName", kCudartLib};

  // Not interposed: the timing layer's DeviceTimer (device_timer.cc) calls these.
  RealFn<cudaError_t (*)(cudaEvent_t*, unsigned)> eventCreateWithFlags{"cudaEventCreateWithFlags",
                                                                       kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t)> eventDestroy{"cudaEventDestroy", kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t, cudaStream_t)> eventRecord{"cudaEventRecord", kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t, cudaStream_t)> eventRecordPtsz{"cudaEventRecord_ptsz",
                                                                     kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t, cudaStream_t, unsigned int)> eventRecordWithFlags{
      "cudaEventRecordWithFlags", kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t, cudaStream_t, unsigned int)> eventRecordWithFlagsPtsz{
      "cudaEventRecordWithFlags_ptsz", kCudartLib};
  RealFn<cudaError_t (*)(cudaEvent_t)> eventQuery{"cudaEventQuery", kCudartLib};
  RealFn<cudaError_t (*)(float*, cudaEvent_t, cudaEvent_t)> eventElapsed{"cudaEventElapsedTime",
                                                                         kCudartLib};
  RealFn<cudaError_t (*)(cudaStream_t, cudaStreamCaptureStatus*)> isCapturing{
      "cudaStreamIsCapturing", kCudartLib};
  RealFn<cudaError_t (*)(int*)> getDevice{"cudaGetDevice", kCudartLib};
  RealFn<cudaError_t (*)(int)> setDevice{"cudaSetDevice", kCudartLib};
  RealFn<cudaError_t (*)(cudaStream_t*, unsigned)> streamCreateWithFlags{
      "cudaStreamCreateWithFlags", kCudartLib};
  RealFn<cudaError_t (*)(cudaStreamCaptureMode*)> threadExchangeCaptureMode{
      "cudaThreadExchangeStreamCaptureMode", kCudartLib};
};

// Defined in cudart.cc.
extern CudartFns g_cudart;

}  // namespace flare::hook
