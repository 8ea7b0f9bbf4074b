// Python activation of libflare_hook.so: a load-time constructor that, in a CPython 3.9-3.13
// process, loads the pyprof module built for that version (libflare_pyprof_cpXY.so, in
// flare/ beside this library) and hands it the host table below (src/pyprof/pyprof_api.h).
//
// The constructor is the only code of the hook that runs at load time. It is inert in
// processes that are not Python (no Py_GetVersion in the global scope), when FLARE_DISABLE is
// set, and when no module matches the version (one log line; kernels are still traced). It
// touches no CUDA and does not start the Tracer, which stays lazy (first intercepted call).
// Spans closed before the Tracer is up are not recorded; the span stack is kept all along, so
// that kernels launched later still nest under the spans open then.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hook/runtime.h"
#include "src/pyprof/pyprof_api.h"
#include "src/timing/timing.h"

namespace flare::hook {
namespace {

uint32_t hostInternApi(const char* name) {
  return name != nullptr ? timing::internApi(name) : 0;
}

uint64_t hostOpenSpan(uint32_t api_id, const void* key, int64_t start_ns) {
  return timing::openSpan(api_id, key, start_ns);
}

void hostCloseSpan(const void* key, int64_t end_ns, int32_t gc_generation, int64_t collected,
                   int64_t uncollectable) {
  timing::CompletedSpan span;
  if (!timing::closeSpan(key, end_ns, &span)) return;
  span.gc_generation = gc_generation;
  if (gc_generation >= 0) {
    span.gc_collected = collected;
    span.gc_uncollectable = uncollectable;
  }
  if (timing::Tracer* t = activeTracer()) t->pushSpan(span);
}

int64_t hostNowNs() {
  return common::monotonicNs();
}

void hostLog(int level, const char* message) {
  if (message == nullptr) return;
  if (level == kFlarePyprofWarn) {
    FLARE_LOG_WARN("pyprof", "{}", message);
  } else {
    FLARE_LOG_INFO("pyprof", "{}", message);
  }
}

std::string g_traced_api;  // outlives the module's use of host.traced_api
FlarePyprofHost g_host = {};

// The directory of this library (dladdr on one of its own functions).
std::string selfDir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&hostNowNs), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void activatePython() {
  using GetVersion = const char* (*)();
  auto get_version = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "Py_GetVersion"));
  if (get_version == nullptr || dlsym(RTLD_DEFAULT, "PySys_AddAuditHook") == nullptr) return;
  if (common::envBool("FLARE_DISABLE", false)) return;
  const char* version = get_version();  // a static string: safe before Py_Initialize
  int major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%d.%d", &major, &minor) != 2) return;
  if (major != 3 || minor < 9 || minor > 13) {
    FLARE_LOG_WARN("pyprof",
                   "flare: Python {}.{} is not supported by Python tracing (3.9-3.13); "
                   "kernels are still traced",
                   major, minor);
    return;
  }
  const std::string path = selfDir() + "/flare/libflare_pyprof_cp" + std::to_string(major) +
                           std::to_string(minor) + ".so";
  // RTLD_LOCAL: its symbols stay private; its Py* references bind to the interpreter's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    FLARE_LOG_WARN("pyprof",
                   "flare: no Python tracing module for Python {}.{} ({}); Python tracing is "
                   "off, kernels are still traced",
                   major, minor, err ? err : path);
    return;
  }
  auto install = reinterpret_cast<FlarePyprofInstallFn>(dlsym(handle, "flare_pyprof_install"));
  g_traced_api = common::envString("TRACED_PYTHON_API", "");
  g_host.abi = FLARE_PYPROF_ABI;
  g_host.size = sizeof(FlarePyprofHost);
  g_host.traced_api = g_traced_api.c_str();
  g_host.defaults = common::envBool("FLARE_PYTHON_DEFAULTS", true) ? 1 : 0;
  g_host.intern_api = hostInternApi;
  g_host.open_span = hostOpenSpan;
  g_host.close_span = hostCloseSpan;
  g_host.now_ns = hostNowNs;
  g_host.log = hostLog;
  if (install == nullptr || install(&g_host) != 0) {
    FLARE_LOG_WARN("pyprof",
                   "flare: Python tracing could not be installed; kernels are still "
                   "traced");
  }
}

__attribute__((constructor)) void flarePythonConstructor() {
  try {
    activatePython();
  } catch (...) {
    // Never take the process down at load time.
  }
}

}  // namespace
}  // namespace flare::hook
