// Python activation of libflare_hook.so. A load-time constructor checks for a CPython 3.9-3.13
// interpreter in the global scope (Py_GetVersion, PySys_AddAuditHook: nothing is linked) and
// adds an audit hook (documented as callable before Py_Initialize). When the interpreter raises
// its first "cpython.run_*" event (the main program is about to run; GIL held), that hook loads
// the module built for this version (flare/libflare_pyprof_cpXY.so beside this library) and
// hands it the host table below (src/pyprof/pyprof_api.h); later events go to the module.
//
// The constructor is inert in processes that are not Python and when FLARE_DISABLE is set; it
// allocates nothing, logs nothing and touches no C++ static (it may run before them). A version
// with no module gives one log line at activation; kernels are still traced. The Tracer stays
// lazy (first intercepted CUDA call): spans closed before it is up are not recorded, but the
// span stack is kept all along, so kernels launched later still nest under the spans open then.
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "src/common/clock.h"
#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hook/deep_trace.h"
#include "src/hook/runtime.h"
#include "src/hook/step_boundary.h"
#include "src/pyprof/pyprof_api.h"
#include "src/records/step_stats.h"
#include "src/timing/timing.h"

namespace flare::hook {
namespace {

// What each interned API means to the step rule (records::stepCallKind), by API id (ids count
// from 1 as pyprof interns them; APIs past the table are kOther here). A deep trace counts steps
// by the rule, from DataLoader `__next__` spans, when the job sets no explicit step markers.
constexpr size_t kStepKindIds = 256;
std::array<std::atomic<uint8_t>, kStepKindIds> g_step_kind{};
std::mutex g_step_rule_mu;
records::StepBoundaryRule g_step_rule;  // guarded by g_step_rule_mu

uint32_t hostInternApi(const char* name) {
  if (name == nullptr) return 0;
  const uint32_t id = timing::internApi(name);
  if (id < kStepKindIds) {
    g_step_kind[id].store(static_cast<uint8_t>(records::stepCallKind(name)),
                          std::memory_order_relaxed);
  }
  return id;
}

uint64_t hostOpenSpan(uint32_t api_id, const void* key, int64_t start_ns) {
  if (api_id < kStepKindIds) {
    const auto kind =
        static_cast<records::StepCallKind>(g_step_kind[api_id].load(std::memory_order_relaxed));
    if (kind != records::StepCallKind::kOther) [[unlikely]] {
      bool starts_step = false;
      {
        std::lock_guard<std::mutex> lock(g_step_rule_mu);
        starts_step = g_step_rule.add(kind, start_ns);
      }
      if (starts_step) onStepBoundary(StepSource::kDataLoader, start_ns);
    }
  }
  return timing::openSpan(api_id, key, start_ns);
}

}  // namespace

void stepRuleNoteGraphLaunch(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(g_step_rule_mu);
  g_step_rule.add(records::StepCallKind::kTraining, now_ns);
}

namespace {

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
  } else if (level == kFlarePyprofDebug) {
    FLARE_LOG_DEBUG("pyprof", "{}", message);
  } else {
    FLARE_LOG_INFO("pyprof", "{}", message);
  }
}

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

using AuditFn = int (*)(const char* event, void* args, void* user_data);

// Load-time state: plain data only (the constructor may run before this library's C++ static
// initializers, so nothing here has one).
int g_major = 0;
int g_minor = 0;
bool g_started = false;            // activation attempted (GIL held: no race)
AuditFn g_module_audit = nullptr;  // the module's audit hook, once it is loaded
FlarePyprofHost g_host = {};

// Runs with the GIL held when the interpreter is about to run the main program: loads the
// module for this version and hands it the host table. Every C++ static is initialized by now.
void loadModule() {
  if (common::paramBool("FLARE_DISABLE")) return;
  const std::string path = selfDir() + "/flare/libflare_pyprof_cp" + std::to_string(g_major) +
                           std::to_string(g_minor) + ".so";
  // RTLD_LOCAL: its symbols stay private; its Py* references bind to the interpreter's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    FLARE_LOG_WARN("pyprof",
                   "flare: no Python tracing module for Python {}.{} ({}); Python tracing is "
                   "off, kernels are still traced",
                   g_major, g_minor, err ? err : path);
    return;
  }
  auto install = reinterpret_cast<FlarePyprofInstallFn>(dlsym(handle, "flare_pyprof_install"));
  static std::string* traced_api = new std::string(common::paramString("TRACED_PYTHON_API"));
  g_host.abi = FLARE_PYPROF_ABI;
  g_host.size = sizeof(FlarePyprofHost);
  g_host.traced_api = traced_api->c_str();
  g_host.defaults = common::paramBool("FLARE_PYTHON_DEFAULTS") ? 1 : 0;
  g_host.intern_api = hostInternApi;
  g_host.open_span = hostOpenSpan;
  g_host.close_span = hostCloseSpan;
  g_host.now_ns = hostNowNs;
  g_host.log = hostLog;
  g_host.before_exit = finishAtExit;
  void* audit = install != nullptr ? install(&g_host) : nullptr;
  if (audit == nullptr) {
    FLARE_LOG_WARN("pyprof",
                   "flare: Python tracing could not be installed; kernels are still "
                   "traced");
    return;
  }
  g_module_audit = reinterpret_cast<AuditFn>(audit);
}

// The audit hook added before Py_Initialize. Until the main program is about to run it only
// compares one prefix; from then on it forwards to the module's hook (or does nothing).
int auditHook(const char* event, void* args, void* user_data) {
  if (g_module_audit != nullptr) return g_module_audit(event, args, user_data);
  if (g_started || std::strncmp(event, "cpython.run_", 12) != 0) return 0;
  g_started = true;
  try {
    loadModule();
  } catch (...) {
    return 0;
  }
  return g_module_audit != nullptr ? g_module_audit(event, args, user_data) : 0;
}

bool rawEnvTrue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  for (const char* t : {"1", "true", "yes", "on", "TRUE", "True", "YES", "ON"}) {
    if (std::strcmp(v, t) == 0) return true;
  }
  return false;
}

// Load time: only dlsym, getenv, sscanf and PySys_AddAuditHook (documented as callable before
// Py_Initialize). No allocation, no logging, no C++ statics.
__attribute__((constructor)) void flarePythonConstructor() {
  using GetVersion = const char* (*)();
  using AddAuditHook = int (*)(AuditFn, void*);
  auto get_version = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "Py_GetVersion"));
  auto add_hook = reinterpret_cast<AddAuditHook>(dlsym(RTLD_DEFAULT, "PySys_AddAuditHook"));
  if (get_version == nullptr || add_hook == nullptr) return;  // not a Python process
  if (rawEnvTrue("FLARE_DISABLE")) return;
  const char* version = get_version();  // a static string
  if (version == nullptr || std::sscanf(version, "%d.%d", &g_major, &g_minor) != 2) return;
  if (g_major != 3 || g_minor < 9 || g_minor > 13) return;  // no module for it (README)
  add_hook(auditHook, nullptr);
}

}  // namespace
}  // namespace flare::hook
