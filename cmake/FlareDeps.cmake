# Dependencies: Debian's packages (deploy/install-deps.sh) and the CUDA toolkit.
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(GTest REQUIRED)
# gRPC and SQLite through pkg-config: Debian's gRPC ships no complete CMake package.
find_package(PkgConfig REQUIRED)
pkg_check_modules(FLARE_GRPCPP REQUIRED IMPORTED_TARGET grpc++)
pkg_check_modules(FLARE_SQLITE REQUIRED IMPORTED_TARGET sqlite3)
add_library(flare_grpc INTERFACE)
target_link_libraries(flare_grpc INTERFACE PkgConfig::FLARE_GRPCPP protobuf::libprotobuf)
add_library(flare_sqlite INTERFACE)
target_link_libraries(flare_sqlite INTERFACE PkgConfig::FLARE_SQLITE)

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
