// The CUDA runtime's registration entry points that nvcc-generated host code calls (they have
// no public header). The sim workloads and tests call them the same way to declare kernels.
#pragma once

#include <cuda_runtime_api.h>

extern "C" void** __cudaRegisterFatBinary(void* fat_cubin);
extern "C" void __cudaRegisterFatBinaryEnd(void** handle);
extern "C" void __cudaRegisterFunction(void** handle, const char* host_fun, char* device_fun,
                                       const char* device_name, int thread_limit, uint3* tid,
                                       uint3* bid, dim3* bdim, dim3* gdim, int* wsize);
