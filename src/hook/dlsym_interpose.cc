// The interposed dlsym: a driver launch function looked up on a libcuda handle comes back as
// the hook's wrapper.
//
// Why: Triton's launcher (the C module Triton compiles at run time) does
// `dlsym(dlopen("libcuda.so.1", RTLD_LAZY), "cuLaunchKernelEx")` and calls the driver through
// that pointer, past the interposed cuLaunchKernelEx symbol: torch.compile's kernels had no
// record on the H200 (docs/gpu-runs/2026-11-26-h200). The same holds for any code that takes
// driver entry points by dlsym instead of linking them.
//
// How: `dlsym` below is a few instructions of assembly, so that glibc's dlsym still sees the
// caller's return address: dlsym(RTLD_NEXT, ...) and dlsym(RTLD_DEFAULT, ...) resolve relative
// to the object that called them. The stub asks `flare_dlsym_route` where to go, restores the
// arguments and tail-jumps there with the caller's frame untouched:
//   - to glibc's dlsym for RTLD_DEFAULT, RTLD_NEXT, a name the hook does not wrap (every
//     ordinary lookup: one call and a few compares more), a call made by the hook itself (its
//     own resolution, real.cc, must see the real functions), or when FLARE_DISABLE or
//     FLARE_HOOK_DLSYM=0 turns this off: dlsym then behaves exactly as glibc's;
//   - to `flare_dlsym_substitute` for a wrapped driver name (cuda_driver.h) on any other
//     handle: it calls glibc's dlsym, and when the result is a function of libcuda (the object's
//     file name starts with "libcuda.so"), remembers it as the wrapper's target and returns the
//     wrapper. A failed lookup returns null with glibc's dlerror() message, as before.
// The real dlsym is `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, else "GLIBC_2.2.5" (glibc
// before 2.34 keeps dlsym in libdl), found at the first call; everything here is lock-free and
// allocation-free, and may run before the hook's static constructors.
//
// Only on x86-64 (the GPU machines Flare targets); elsewhere dlsym is not interposed and such
// launches stay unseen.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "src/common/config.h"
#include "src/hook/cuda_driver.h"

#if defined(__x86_64__) && defined(__linux__)

namespace flare::hook {
namespace {

using DlsymFn = void* (*)(void*, const char*);

std::atomic<DlsymFn> g_real_dlsym{nullptr};
std::atomic<int> g_state{0};  // 0: not read yet, 1: interposing, 2: off (glibc's dlsym only)
std::atomic<void*> g_self_base{nullptr};

DlsymFn realDlsym() {
  DlsymFn fn = g_real_dlsym.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) {
    (void)dlerror();  // the failed lookup must not show in the caller's dlerror()
    p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  }
  if (p == nullptr) {
    static const char kMsg[] = "flare: libflare_hook.so cannot find glibc's dlsym; aborting\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    std::abort();
  }
  fn = reinterpret_cast<DlsymFn>(p);
  g_real_dlsym.store(fn, std::memory_order_release);
  return fn;
}

// A declared bool setting (src/common/config.cc), read without allocating or logging: an
// unset or unreadable value means the declared default.
bool boolSetting(const char* name) {
  const char* v = std::getenv(name);
  std::optional<bool> b;
  if (v != nullptr) b = common::parseBool(v);
  if (!b) b = common::parseBool(common::declaredDefault(name));
  return b.value_or(false);
}

bool interposing() {
  int s = g_state.load(std::memory_order_relaxed);
  if (s == 0) {
    s = boolSetting("FLARE_DISABLE") || !boolSetting("FLARE_HOOK_DLSYM") ? 2 : 1;
    g_state.store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

// The load address of the object holding `addr` (nullptr when none).
void* objectBase(const void* addr) {
  Dl_info info;
  return dladdr(addr, &info) != 0 ? info.dli_fbase : nullptr;
}

bool calledByTheHook(void* caller) {
  void* self = g_self_base.load(std::memory_order_relaxed);
  if (self == nullptr) {
    self = objectBase(reinterpret_cast<const void*>(&realDlsym));
    g_self_base.store(self, std::memory_order_relaxed);
  }
  return self != nullptr && objectBase(caller) == self;
}

bool inLibcuda(const void* addr) {
  Dl_info info;
  if (dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  return std::strncmp(base, "libcuda.so", 10) == 0;
}

}  // namespace
}  // namespace flare::hook

// A wrapped driver name on an ordinary handle (the stub jumps here with the caller's arguments).
extern "C" __attribute__((visibility("hidden"), used)) void* flare_dlsym_substitute(
    void* handle, const char* name) {
  using namespace flare::hook;
  void* p = realDlsym()(handle, name);
  if (p == nullptr || !inLibcuda(p)) return p;
  return wrapDriverSymbol(name, p);
}

// Where the stub goes with (handle, name): glibc's dlsym or flare_dlsym_substitute. `caller`
// is the return address of the dlsym call.
extern "C" __attribute__((visibility("hidden"), used)) void* flare_dlsym_route(void* handle,
                                                                               const char* name,
                                                                               void* caller) {
  using namespace flare::hook;
  DlsymFn real = realDlsym();
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || name == nullptr ||
      !isWrappedDriverSymbol(name) || !interposing() || calledByTheHook(caller)) {
    return reinterpret_cast<void*>(real);
  }
  return reinterpret_cast<void*>(&flare_dlsym_substitute);
}

// dlsym(handle, name): keep the arguments, pass the caller's return address (at the top of the
// stack on entry) as the route's third argument, then jump to what the route chose; the
// target returns straight to the caller, and glibc's dlsym reads the same return address the
// caller's own call left. 16-byte stack alignment at the call: entry rsp is 8 mod 16, plus
// two pushes and 8 bytes.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  endbr64
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  movq 16(%rsp), %rdx
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  call flare_dlsym_route
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  jmp *%rax
  .cfi_endproc
  .size dlsym, .-dlsym
)");

#endif  // __x86_64__ && __linux__
