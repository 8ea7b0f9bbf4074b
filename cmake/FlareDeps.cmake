# Dependencies: Debian's packages (deploy/install-deps.sh) and the CUDA toolkit.
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(GTest REQUIRED)

# The CUDA toolkit: only headers and (for real-GPU builds) the libraries. No GPU is needed.
set(FLARE_CUDA_INCLUDE_DIR ${FLARE_CUDA_HOME}/include)
foreach(hdr cuda.h cuda_runtime_api.h cublas_v2.h cublasLt.h nccl.h)
  if(NOT EXISTS ${FLARE_CUDA_INCLUDE_DIR}/${hdr})
    message(FATAL_ERROR "CUDA header ${hdr} not found under ${FLARE_CUDA_INCLUDE_DIR}; "
                        "set -DFLARE_CUDA_HOME=/path/to/cuda (or CUDA_HOME)")
  endif()
endforeach()
add_library(flare_cuda_headers INTERFACE)
target_include_directories(flare_cuda_headers SYSTEM INTERFACE ${FLARE_CUDA_INCLUDE_DIR})
message(STATUS "Flare: CUDA headers from ${FLARE_CUDA_INCLUDE_DIR}")
