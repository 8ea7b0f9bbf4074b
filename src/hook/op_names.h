// Naming helpers of the wrappers' cold paths: demangling (common's), signature-key hashing, dtype
// names, the attention-by-name rule. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/common/text.h"

namespace flare::hook {

// Demangles a C++ symbol (returns it unchanged when it is not mangled): src/common/text.h's.
using common::demangle;

// Mixes values into a 64-bit key (FNV-1a over the bytes).
uint64_t hashBytes(const void* data, size_t n, uint64_t seed = 1469598103934665603ull);

// Short name of a cudaDataType value ("bf16", "f16", "f32", "e4m3", ...; "other").
const char* cudaDataTypeName(int type);

// Attention kernels are recognized by name (flash, fmha, attention, sdpa).
bool looksLikeAttention(const std::string& name);

// The name of a kernel that no lookup named: "kernel@unknown". Says so once per process and
// `api` (info), with what each lookup answered (`tried`, e.g. "cuFuncGetName: CUresult 400;
// cuKernelGetName: absent"): such a kernel is a plain kernel, no attention FLOPs by name.
std::string unnamedKernel(const char* api, const std::string& tried);

// What a name lookup answered, for unnamedKernel: "absent" (no such entry point, a driver or
// runtime older than 12.3) or "<type> <code>".
std::string lookupResult(bool present, const char* type, int code);

}  // namespace flare::hook
