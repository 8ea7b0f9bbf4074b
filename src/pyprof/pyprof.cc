// libflare_pyprof_cpXY.so: traces the configured Python APIs of one CPython version (built once
// per version against its headers; see CMakeLists.txt). Loaded by libflare_hook.so
// (src/hook/python.cc), whose load-time constructor adds an audit hook (PySys_AddAuditHook,
// documented as callable before Py_Initialize) that loads this module at the first
// "cpython.run_*" event and from then on forwards every audit event to auditHook() below.
//
// Activation: the interpreter raises "cpython.run_file" / "run_module" / "run_command" /
// "run_stdin" / "run_interactivehook" / "run_startup" right before the main program runs, with
// the GIL held and the import system ready: activate() runs then, once, and executes the
// bootstrap (bootstrap.py, embedded) that parses TRACED_PYTHON_API, resolves entries now or
// when their module is imported, and turns the version's mechanism on:
//   3.12+   sys.monitoring, a free tool id (4, else 3), local events PY_START/PY_RESUME/
//           PY_RETURN/PY_YIELD on the traced code objects only; PY_UNWIND and PY_THROW (not
//           local events) globally, filtered here.
//   3.9-11  the C profile hook on every thread (existing ones now, later ones through
//           threading.setprofile), filtered here by a flat hash table of code objects.
// The callbacks below run with the GIL held; the table is written only with the GIL held.
//
// Spans: open on call/resume, close on return/yield/unwind (one span per activation, and per
// resume→yield of a generator). The span stack is the timing layer's (host table).
//
// Ownership: strong references to the traced code objects (kept in g_codes), to the bootstrap's
// namespace and to the callables registered with the interpreter; all live until the process
// ends (never released at finalization, so no callback can see freed state). The one exception
// is each thread's ThreadMark (3.9-3.11), which the interpreter releases with the thread's
// state, and whose release at teardown is the point of it (below).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dirent.h>
#include <frameobject.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "src/pyprof/pyprof_api.h"

#if PY_VERSION_HEX >= 0x030C0000
#define FLARE_PY_MONITORING 1
#else
#define FLARE_PY_MONITORING 0
#endif

namespace {

#include "src/pyprof/bootstrap_py.inc"  // kBootstrap: the bootstrap's source

const FlarePyprofHost* g_host = nullptr;
bool g_activated = false;  // activation attempted (GIL)
bool g_on = false;         // tracing (GIL); false after a failure or in a fork child
[[maybe_unused]] bool g_installing =
    false;  // our own PyEval_SetProfile calls (their audit events are ours)
uint32_t g_gc_api = 0;
const char kGcKey = 0;            // the span-stack key of garbage collections
PyObject* g_codes = nullptr;      // list: strong refs to the traced code objects
PyObject* g_namespace = nullptr;  // the bootstrap's globals

void log(int level, const std::string& message) {
  if (g_host != nullptr) g_host->log(level, message.c_str());
}

// ---- code object → API id: open addressing, power-of-two capacity, GIL-protected ------------

struct Slot {
  const void* code;
  uint32_t api;
};
Slot* g_table = nullptr;
size_t g_mask = 0;  // capacity - 1
size_t g_used = 0;

inline size_t slotOf(const void* p) {
  return static_cast<size_t>((reinterpret_cast<uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ull);
}

inline uint32_t lookup(const void* code) {
  if (g_table == nullptr) return 0;
  for (size_t i = slotOf(code) & g_mask;; i = (i + 1) & g_mask) {
    if (g_table[i].code == code) return g_table[i].api;
    if (g_table[i].code == nullptr) return 0;
  }
}

bool insert(const void* code, uint32_t api) {
  if (g_table == nullptr || 2 * (g_used + 1) > g_mask + 1) {
    const size_t capacity = g_table == nullptr ? 256 : 2 * (g_mask + 1);
    auto* fresh = static_cast<Slot*>(PyMem_RawCalloc(capacity, sizeof(Slot)));
    if (fresh == nullptr) return false;
    Slot* old = g_table;
    const size_t old_capacity = old == nullptr ? 0 : g_mask + 1;
    g_table = fresh;
    g_mask = capacity - 1;
    g_used = 0;
    for (size_t i = 0; i < old_capacity; ++i) {
      if (old[i].code != nullptr) insert(old[i].code, old[i].api);
    }
    PyMem_RawFree(old);  // readers hold the GIL, as we do: none is inside the old table
  }
  for (size_t i = slotOf(code) & g_mask;; i = (i + 1) & g_mask) {
    if (g_table[i].code == code) {
      g_table[i].api = api;
      return true;
    }
    if (g_table[i].code == nullptr) {
      g_table[i] = Slot{code, api};
      ++g_used;
      return true;
    }
  }
}

inline void openFor(const void* code) {
  const uint32_t api = lookup(code);
  if (api != 0) g_host->open_span(api, code, g_host->now_ns());
}
inline void closeFor(const void* code) {
  if (lookup(code) != 0) g_host->close_span(code, g_host->now_ns(), -1, 0, 0);
}

// ---- 3.12+: sys.monitoring callbacks (code, offset[, value]) -------------------------------

PyObject* monStart(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (g_on && nargs >= 1) openFor(args[0]);
  Py_RETURN_NONE;
}
PyObject* monStop(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (g_on && nargs >= 1) closeFor(args[0]);
  Py_RETURN_NONE;
}

// ---- 3.9-3.11: the profile hook -------------------------------------------------------------

#if !FLARE_PY_MONITORING
int profile(PyObject*, PyFrameObject* frame, int what, PyObject*) {
  if (what != PyTrace_CALL && what != PyTrace_RETURN) return 0;  // C calls, exceptions
  if (!g_on || frame == nullptr) return 0;
#if PY_VERSION_HEX >= 0x030B0000
  PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
  if (what == PyTrace_CALL) {
    openFor(code);
  } else {
    closeFor(code);
  }
  Py_DECREF(code);
#else
  const void* code = frame->f_code;
  if (what == PyTrace_CALL) {
    openFor(code);
  } else {
    closeFor(code);
  }
#endif
  return 0;
}

bool g_stepped_back = false;  // some thread's hook was replaced by another tool (said once)

// ---- exit: Python threads still waiting for the GIL when the interpreter is torn down --------
//
// CPython 3.9-3.12 (gh-110052): a daemon thread waiting for the GIL when Py_FinalizeEx frees
// the interpreter wakes every switch interval and touches the freed memory; it crashes the
// process once that memory is reused, if the process has not exited by then. Such a thread
// should have left earlier: once the runtime is finalizing, a thread that takes the GIL exits at
// once, but the finalizing main thread keeps the GIL to the end unless something makes it let
// go. With the profile hook on (3.9-3.11) the crash became frequent enough to see (3.10, two
// daemon threads beside two busy loops: 5 of 300 exits; 0 of 300 without tracing).
//
// So each thread's profile hook carries a ThreadMark. Py_FinalizeEx, once finalizing, clears
// the state of every other thread (_PyThreadState_DeleteExcept), which releases its mark; the
// first mark released that way lets go of the GIL for a moment, and the waiting threads take
// it in turn and exit, while the interpreter is still whole.

struct ThreadMark {
  PyObject_HEAD unsigned long ident;  // the thread whose profile hook holds it
};
PyObject* g_mark_type = nullptr;  // a heap type (PyType_FromSpec); null if it failed
bool g_released_waiters = false;  // once per process
int g_other_threads = -1;         // other Python threads at the last exit callback (-1: unknown)

int countTasks() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// The finalizing main thread, GIL held: lets go of the GIL until the threads waiting for it
// have exited: as many as there were other Python threads at the exit callback, or, when the
// OS thread count stops falling (threads blocked outside Python stay), 10 ms without a first
// exit or 5 ms after the last; 20 ms at most.
void releaseWaiters() {
  g_released_waiters = true;
  const int before = countTasks();
  if (before < 0) {
    log(kFlarePyprofDebug,
        "flare: /proc/self/task cannot be read: Python threads still waiting for the GIL at "
        "interpreter teardown are not let go first");
    return;
  }
  int now = before;
  PyThreadState* self = PyEval_SaveThread();
  const int64_t start = g_host->now_ns();
  int64_t last_exit = start;
  for (;;) {
    if (g_other_threads >= 0 && before - now >= g_other_threads) break;
    const int64_t t = g_host->now_ns();
    if (t - start > 20'000'000 || t - last_exit > (now < before ? 5'000'000 : 10'000'000)) break;
    usleep(200);
    const int n = countTasks();
    if (n >= 0 && n < now) {
      now = n;
      last_exit = g_host->now_ns();
    }
  }
  PyEval_RestoreThread(self);
  if (before > now) {
    log(kFlarePyprofDebug, "flare: " + std::to_string(before - now) +
                               " Python thread(s) still waiting for the GIL at interpreter "
                               "teardown exited first");
  }
}

void markDealloc(PyObject* self) {
  const unsigned long ident = reinterpret_cast<ThreadMark*>(self)->ident;
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);  // instances of a heap type hold a reference to it
  // Another thread's state cleared while finalizing: only Py_FinalizeEx does that.
  if (!g_released_waiters && ident != PyThread_get_thread_ident() && _Py_IsFinalizing()) {
    releaseWaiters();
  }
}

PyObject* newMark(PyThreadState* ts) {
  if (g_mark_type == nullptr) {
    static PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(markDealloc)},
                                  {0, nullptr}};
    static PyType_Spec spec = {"_flare_pyprof.ThreadMark", sizeof(ThreadMark), 0,
                               Py_TPFLAGS_DEFAULT, slots};
    g_mark_type = PyType_FromSpec(&spec);
    if (g_mark_type == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
  }
  auto* mark = PyObject_New(ThreadMark, reinterpret_cast<PyTypeObject*>(g_mark_type));
  if (mark == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  mark->ident = ts->thread_id;
  return reinterpret_cast<PyObject*>(mark);
}

void setProfileOn(PyThreadState* ts) {
  PyObject* mark = newMark(ts);
  g_installing = true;
  _PyEval_SetProfile(ts, profile, mark);  // holds its own reference
  g_installing = false;
  Py_XDECREF(mark);
  if (PyErr_Occurred()) PyErr_Clear();
}

// threading.setprofile: the first profile event of a thread started by `threading` installs the
// C hook on that thread and is then handled as the C hook would.
PyObject* threadStart(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!g_on) Py_RETURN_NONE;
  setProfileOn(PyThreadState_Get());
  if (nargs >= 2 && PyUnicode_Check(args[1])) {
    const char* event = PyUnicode_AsUTF8(args[1]);
    if (event != nullptr && std::strcmp(event, "call") == 0) {
      profile(nullptr, reinterpret_cast<PyFrameObject*>(args[0]), PyTrace_CALL, nullptr);
    }
    if (event == nullptr) PyErr_Clear();
  }
  Py_RETURN_NONE;
}

// Installs the hook on every thread state of the interpreter (GIL held).
PyObject* installAllThreads(PyObject*, PyObject*) {
  PyInterpreterState* interp = PyThreadState_GetInterpreter(PyThreadState_Get());
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(interp); ts != nullptr;
       ts = PyThreadState_Next(ts)) {
    setProfileOn(ts);
  }
  Py_RETURN_NONE;
}
#endif

// ---- garbage collection: gc.callbacks (phase, info) ------------------------------------------

int64_t infoInt(PyObject* info, const char* key) {
  PyObject* v = PyDict_Check(info) ? PyDict_GetItemString(info, key) : nullptr;  // borrowed
  if (v == nullptr || !PyLong_Check(v)) return -1;
  const long long n = PyLong_AsLongLong(v);
  if (n == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  return n;
}

PyObject* gcCallback(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!g_on || nargs < 2 || !PyUnicode_Check(args[0])) Py_RETURN_NONE;
  const char* phase = PyUnicode_AsUTF8(args[0]);
  if (phase == nullptr) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  const int64_t now = g_host->now_ns();
  if (std::strcmp(phase, "start") == 0) {
    g_host->open_span(g_gc_api, &kGcKey, now);
  } else if (std::strcmp(phase, "stop") == 0) {
    g_host->close_span(&kGcKey, now, static_cast<int32_t>(infoInt(args[1], "generation")),
                       infoInt(args[1], "collected"), infoInt(args[1], "uncollectable"));
  }
  Py_RETURN_NONE;
}

// ---- called by the bootstrap -----------------------------------------------------------------

// _register(code, api_name): trace `code` under `api_name`.
PyObject* registerCode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyCode_Check(args[0]) || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_register(code, name)");
    return nullptr;
  }
  // Off (a fork child): the registry's mutex may have been held by another thread at fork.
  if (!g_on) return PyBool_FromLong(0);
  const char* name = PyUnicode_AsUTF8(args[1]);
  if (name == nullptr) return nullptr;
  const uint32_t api = g_host->intern_api(name);
  if (api == 0) return PyBool_FromLong(0);
  if (lookup(args[0]) == 0 && PyList_Append(g_codes, args[0]) != 0) return nullptr;
  if (!insert(args[0], api)) return PyErr_NoMemory();
  return PyBool_FromLong(1);
}

PyObject* logLine(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs == 2 && PyLong_Check(args[0]) && PyUnicode_Check(args[1])) {
    const char* text = PyUnicode_AsUTF8(args[1]);
    if (text != nullptr) log(static_cast<int>(PyLong_AsLong(args[0])), text);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  Py_RETURN_NONE;
}

// _off(): a forked child (DataLoader worker) or a failed activation: callbacks do nothing more.
PyObject* turnOff(PyObject*, PyObject*) {
  g_on = false;
  Py_RETURN_NONE;
}

PyObject* isTraced(PyObject*, PyObject* code) {
  return PyBool_FromLong(lookup(code) != 0);
}

// _before_exit(): the bootstrap registers it with atexit (the last Python exit callback to
// run): Flare's exit work while the interpreter is whole, the GIL released so that daemon
// threads keep running meanwhile.
PyObject* beforeExit(PyObject*, PyObject*) {
#if !FLARE_PY_MONITORING
  int others = 0;
  PyThreadState* self = PyThreadState_Get();
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(self));
       ts != nullptr; ts = PyThreadState_Next(ts)) {
    if (ts != self) ++others;
  }
  g_other_threads = others;
#endif
  if (g_host != nullptr &&
      g_host->size >= offsetof(FlarePyprofHost, before_exit) + sizeof(g_host->before_exit) &&
      g_host->before_exit != nullptr) {
    Py_BEGIN_ALLOW_THREADS g_host->before_exit();
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-function-type"
#endif
PyMethodDef kMethods[] = {
    {"_start", reinterpret_cast<PyCFunction>(monStart), METH_FASTCALL, nullptr},
    {"_stop", reinterpret_cast<PyCFunction>(monStop), METH_FASTCALL, nullptr},
    {"_gc", reinterpret_cast<PyCFunction>(gcCallback), METH_FASTCALL, nullptr},
    {"_register", reinterpret_cast<PyCFunction>(registerCode), METH_FASTCALL, nullptr},
    {"_log", reinterpret_cast<PyCFunction>(logLine), METH_FASTCALL, nullptr},
    {"_off", turnOff, METH_NOARGS, nullptr},
    {"_is_traced", isTraced, METH_O, nullptr},
#if !FLARE_PY_MONITORING
    {"_thread_start", reinterpret_cast<PyCFunction>(threadStart), METH_FASTCALL, nullptr},
    {"_install_all_threads", installAllThreads, METH_NOARGS, nullptr},
#endif
    {"_before_exit", beforeExit, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "_flare_pyprof",
                       nullptr,
                       -1,
                       kMethods,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

void logPythonError(const char* what) {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  std::string text = "?";
  if (value != nullptr) {
    PyObject* s = PyObject_Str(value);
    if (s != nullptr) {
      const char* u = PyUnicode_AsUTF8(s);
      if (u != nullptr) text = u;
      Py_DECREF(s);
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  log(kFlarePyprofWarn, std::string("flare: Python tracing is off: ") + what + ": " + text);
}

void activate() {
  g_activated = true;
  PyObject *module = nullptr, *ns = nullptr, *code = nullptr, *result = nullptr;
  g_codes = PyList_New(0);
  g_gc_api = g_host->intern_api("gc@collect");
  module = PyModule_Create(&kModule);
  ns = PyDict_New();
  if (g_codes == nullptr || module == nullptr || ns == nullptr) goto fail;
  if (PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) != 0) goto fail;
  if (PyDict_SetItemString(ns, "__name__", PyUnicode_FromString("_flare_bootstrap")) != 0) {
    goto fail;
  }
  {
    PyObject* cfg = Py_BuildValue("{s:O,s:s,s:i,s:i}", "c", module, "traced_api",
                                  g_host->traced_api ? g_host->traced_api : "", "defaults",
                                  g_host->defaults, "pid", static_cast<int>(getpid()));
    if (cfg == nullptr || PyDict_SetItemString(ns, "_CONFIG", cfg) != 0) {
      Py_XDECREF(cfg);
      goto fail;
    }
    Py_DECREF(cfg);
  }
  code = Py_CompileString(kBootstrap, "<flare pyprof bootstrap>", Py_file_input);
  if (code == nullptr) goto fail;
  g_on = true;  // the bootstrap may register code and install hooks
  result = PyEval_EvalCode(code, ns, ns);
  if (result == nullptr) goto fail;
  Py_DECREF(result);
  Py_DECREF(code);
  g_namespace = ns;  // kept: the finder, the fork handler and the callbacks live there
  // `module` stays referenced by the bootstrap's namespace and the registered callbacks.
  Py_DECREF(module);
  return;
fail:
  g_on = false;
  logPythonError("activation failed");
  Py_XDECREF(code);
  Py_XDECREF(ns);
  Py_XDECREF(module);
}

int auditHook(const char* event, PyObject*, void*) {
  if (!g_activated) {
    if (std::strncmp(event, "cpython.run_", 12) == 0) {
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);  // leave the interpreter's error state as it was
      activate();
      PyErr_Restore(type, value, tb);
    }
    return 0;
  }
#if !FLARE_PY_MONITORING
  if (!g_on || g_installing || (!g_stepped_back && event[0] != 's')) return 0;
  PyThreadState* ts = PyThreadState_Get();
  if (std::strcmp(event, "sys.setprofile") == 0) {
    // Raised before the change: if our hook is the one being replaced, another tool takes the
    // thread over (there is one profile function per thread). It keeps it; we step back.
    if (ts->c_profilefunc == profile) {
      if (!g_stepped_back) {
        log(kFlarePyprofWarn,
            "flare: another tool (cProfile, torch.profiler, a debugger) set a profile function; "
            "Flare's Python tracing steps back on that thread while it is in place");
      }
      g_stepped_back = true;
    }
  } else if (g_stepped_back && ts->c_profilefunc == nullptr) {
    setProfileOn(ts);  // the other tool is done with this thread: trace it again
  }
#endif
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* flare_pyprof_install(
    const FlarePyprofHost* host) {
  if (host == nullptr || host->abi != FLARE_PYPROF_ABI || host->size < sizeof(FlarePyprofHost)) {
    return nullptr;
  }
  g_host = host;
  char want[16];
  std::snprintf(want, sizeof(want), "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
  const char* version = Py_GetVersion();
  if (version == nullptr || std::strncmp(version, want, std::strlen(want)) != 0) {
    log(kFlarePyprofWarn, std::string("flare: Python tracing is off: module built for ") + want +
                              " loaded into " + (version ? version : "?"));
    return nullptr;
  }
#ifdef Py_GIL_DISABLED
  log(kFlarePyprofWarn, "flare: Python tracing is off: free-threaded CPython is not supported");
  return nullptr;
#else
  // A free-threaded interpreter of the same version has another ABI ("t" in sys.abiflags):
  // this module, built against the default headers, must not run in it.
  PyObject* flags = PySys_GetObject("abiflags");  // borrowed; the interpreter is initialized
  const char* text = flags != nullptr && PyUnicode_Check(flags) ? PyUnicode_AsUTF8(flags) : "";
  if (text == nullptr) {
    PyErr_Clear();
    text = "";
  }
  if (std::strchr(text, 't') != nullptr) {
    log(kFlarePyprofWarn, "flare: Python tracing is off: free-threaded CPython is not supported");
    return nullptr;
  }
  return reinterpret_cast<void*>(&auditHook);
#endif
}
