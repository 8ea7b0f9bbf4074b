// Kernel signatures and the registration API (kernel_registry.h).
#include "src/hook/kernel_registry.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flare/kernels.h"
#include "src/hook/op_names.h"
#include "src/hook/runtime.h"

namespace flare::hook {
namespace {

// Custom kernels declared through flare_register_kernel (include/flare/kernels.h).
struct Registration {
  std::string prefix;
  timing::OpKind kind = timing::OpKind::kKernel;
  flare_amount_fn flops = nullptr;
  flare_amount_fn bytes = nullptr;
  double flops_per_launch = 0, flops_per_block = 0;  // flare_register_kernel_linear
  double bytes_per_launch = 0, bytes_per_block = 0;
};
struct Registry {
  std::mutex mu;
  std::vector<Registration> entries;  // guarded by mu
  std::atomic<uint64_t> generation{1};
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// Applies the longest matching registration to `ks` (cold path).
void applyRegistration(const std::string& name, timing::Signature* sig, KernelSig* ks) {
  std::lock_guard<std::mutex> lock(registry().mu);
  const Registration* best = nullptr;
  for (const auto& r : registry().entries) {
    if (name.compare(0, r.prefix.size(), r.prefix) == 0 &&
        (!best || r.prefix.size() > best->prefix.size())) {
      best = &r;
    }
  }
  if (!best) return;
  sig->kind = best->kind;
  ks->kind = best->kind;
  ks->flops = best->flops;
  ks->bytes = best->bytes;
  ks->flops_per_launch = best->flops_per_launch;
  ks->flops_per_block = best->flops_per_block;
  ks->bytes_per_launch = best->bytes_per_launch;
  ks->bytes_per_block = best->bytes_per_block;
}

// per_launch + per_block * blocks, rounded; 0 when both are 0.
uint64_t linearAmount(double per_launch, double per_block, unsigned gx, unsigned gy, unsigned gz) {
  const double v = per_launch + per_block * (static_cast<double>(gx) * gy * gz);
  return v > 0 ? static_cast<uint64_t>(v + 0.5) : 0;
}

}  // namespace

KernelSig kernelSignature(const void* key, std::string (*name_fn)(const void* key)) {
  thread_local std::unordered_map<const void*, KernelSig> cache;
  const uint64_t gen = registry().generation.load(std::memory_order_acquire);
  auto it = cache.find(key);
  if (it != cache.end() && it->second.generation == gen) return it->second;
  timing::Tracer* t = tracer();
  if (!t) return {};
  timing::Signature sig;
  sig.name = name_fn(key);
  sig.kind = looksLikeAttention(sig.name) ? timing::OpKind::kAttention : timing::OpKind::kKernel;
  KernelSig ks;
  ks.kind = sig.kind;
  applyRegistration(sig.name, &sig, &ks);
  ks.id = t->intern(sig);
  ks.generation = gen;
  cache[key] = ks;
  return ks;
}

timing::OpInfo kernelLaunchInfo(const KernelSig& ks, void** args, unsigned gx, unsigned gy,
                                unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  timing::OpInfo op;
  op.signature_id = ks.id;
  op.kind = ks.kind;
  if (ks.flops) {
    op.flops = ks.flops(args, gx, gy, gz, bx, by, bz);
  } else if (ks.flops_per_launch > 0 || ks.flops_per_block > 0) {
    op.flops = linearAmount(ks.flops_per_launch, ks.flops_per_block, gx, gy, gz);
  }
  if (ks.bytes) {
    op.bytes = ks.bytes(args, gx, gy, gz, bx, by, bz);
  } else if (ks.bytes_per_launch > 0 || ks.bytes_per_block > 0) {
    op.bytes = linearAmount(ks.bytes_per_launch, ks.bytes_per_block, gx, gy, gz);
  }
  return op;
}

namespace {

// Adds or replaces the registration of `r.prefix`; returns flare_register_kernel's codes.
int addRegistration(const char* name_prefix, int kind, Registration r) {
  using timing::OpKind;
  if (!name_prefix || !*name_prefix) return -1;
  switch (kind) {
    case FLARE_KIND_KERNEL:
      r.kind = OpKind::kKernel;
      break;
    case FLARE_KIND_GEMM:
      r.kind = OpKind::kGemm;
      break;
    case FLARE_KIND_ATTENTION:
      r.kind = OpKind::kAttention;
      break;
    default:
      return -1;
  }
  r.prefix = name_prefix;
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& e : reg.entries) {
    if (e.prefix == r.prefix) {
      e = std::move(r);
      reg.generation.fetch_add(1, std::memory_order_acq_rel);
      return 0;
    }
  }
  if (reg.entries.size() >= 256) return -2;
  reg.entries.push_back(std::move(r));
  reg.generation.fetch_add(1, std::memory_order_acq_rel);
  return 0;
}

bool validAmount(double v) {
  return v >= 0 && v < 1e30;
}  // also false for NaN

}  // namespace
}  // namespace flare::hook

extern "C" __attribute__((visibility("default"))) int flare_register_kernel(const char* name_prefix,
                                                                            int kind,
                                                                            flare_amount_fn flops,
                                                                            flare_amount_fn bytes) {
  flare::hook::Registration r;
  r.flops = flops;
  r.bytes = bytes;
  return flare::hook::addRegistration(name_prefix, kind, std::move(r));
}

extern "C" __attribute__((visibility("default"))) int flare_register_kernel_linear(
    const char* name_prefix, int kind, double flops_per_launch, double flops_per_block,
    double bytes_per_launch, double bytes_per_block) {
  using flare::hook::validAmount;
  if (!validAmount(flops_per_launch) || !validAmount(flops_per_block) ||
      !validAmount(bytes_per_launch) || !validAmount(bytes_per_block)) {
    return -1;
  }
  flare::hook::Registration r;
  r.flops_per_launch = flops_per_launch;
  r.flops_per_block = flops_per_block;
  r.bytes_per_launch = bytes_per_launch;
  r.bytes_per_block = bytes_per_block;
  return flare::hook::addRegistration(name_prefix, kind, std::move(r));
}
