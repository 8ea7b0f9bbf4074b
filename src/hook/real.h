// Resolution of the real vendor functions behind the interposed ones.
//
// realSymbol() first asks dlsym(RTLD_NEXT), which finds libraries in the global scope loaded
// after the hook. A library loaded later by dlopen with RTLD_LOCAL (PyTorch loads NCCL and
// cuBLAS from its wheel directories this way) is not in that scope, so the fallback walks the
// loaded objects (dl_iterate_phdr), and asks each one whose file name starts with `lib_prefix`
// for the symbol through a RTLD_NOLOAD handle. The hook itself is never returned.
//
// Thread-safe; may take the dynamic loader's lock: call it on a cold path only (the tables
// below cache results).
#pragma once

#include <atomic>

namespace flare::hook {

// The real address of `name`, or nullptr when no loaded library defines it.
void* realSymbol(const char* name, const char* lib_prefix);

// A lazily resolved real function: `get()` resolves on first use and caches (also a miss is
// retried, so that a library dlopened later is found then).
template <typename Fn>
class RealFn {
 public:
  constexpr RealFn(const char* name, const char* lib) : name_(name), lib_(lib) {}
  Fn get() {
    void* p = ptr_.load(std::memory_order_acquire);
    if (!p) {
      p = realSymbol(name_, lib_);
      if (p) ptr_.store(p, std::memory_order_release);
    }
    return reinterpret_cast<Fn>(p);
  }
  void set(void* p) { ptr_.store(p, std::memory_order_release); }

 private:
  const char* name_;
  const char* lib_;
  std::atomic<void*> ptr_{nullptr};
};

}  // namespace flare::hook
