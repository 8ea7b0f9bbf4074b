// The C interface between libflare_hook.so and the per-version Python tracing module
// (libflare_pyprof_cpXY.so). The hook dlopens the module that matches the interpreter it was
// preloaded into and calls flare_pyprof_install() with a table of its own functions, so the
// module links neither the timing code nor libpython (it uses the interpreter's symbols, which
// the process already has).
//
// Threading: the hook adds an audit hook at load time (before the interpreter is initialized)
// and calls install() from it once, with the GIL held, when the main program is about to run. Every
// table function may be called from any thread; open/close act on the calling thread's span stack.
// Ownership: the table is static in the hook and outlives the module.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLARE_PYPROF_ABI 1

enum FlarePyprofLog { kFlarePyprofInfo = 0, kFlarePyprofWarn = 1, kFlarePyprofDebug = 2 };

typedef struct FlarePyprofHost {
  uint32_t abi;   // FLARE_PYPROF_ABI
  uint32_t size;  // sizeof(FlarePyprofHost)
  // Settings, read and validated by the hook (src/common/config.cc).
  const char* traced_api;  // TRACED_PYTHON_API ("" when unset)
  int defaults;            // FLARE_PYTHON_DEFAULTS
  // Cold path: id of a traced API's name (timing::internApi).
  uint32_t (*intern_api)(const char* qualified_name);
  // Hot path: open a span on the calling thread's stack (timing::openSpan); returns its id.
  uint64_t (*open_span)(uint32_t api_id, const void* key, int64_t start_ns);
  // Hot path: close the innermost span keyed by `key` and hand it to the tracer (when it is
  // up); gc_generation < 0 for spans that are not garbage collections.
  void (*close_span)(const void* key, int64_t end_ns, int32_t gc_generation, int64_t collected,
                     int64_t uncollectable);
  // The clock of the spans and kernels (CLOCK_MONOTONIC, ns).
  int64_t (*now_ns)(void);
  // One log line through Flare's logging (subsystem "pyprof").
  void (*log)(int level, const char* message);
  // Flare's exit work (drain the tracer, flush the exporter), run from a Python atexit callback
  // on the main thread with the GIL released, while the interpreter is still whole: done there,
  // the process's own exit handler has nothing left to wait for after Py_FinalizeEx (a daemon
  // thread waking in that window crashes CPython <= 3.12; a long exit drain widened it).
  void (*before_exit)(void);
} FlarePyprofHost;

// Exported by each libflare_pyprof_cpXY.so. Called with the GIL held from the hook's audit hook,
// at the first "cpython.run_*" event. Returns the module's audit function
// (int (*)(const char* event, PyObject* args, void* user_data)), to which the hook forwards
// every later audit event and this one, or null when Python tracing cannot run here.
typedef void* (*FlarePyprofInstallFn)(const FlarePyprofHost* host);

#ifdef __cplusplus
}
#endif
