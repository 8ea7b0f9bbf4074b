/* flare._native: the Python binding of Flare's in-process C API (include/flare/step.h,
 * include/flare/kernels.h), built by `pip install ./python`.
 *
 * The functions live in libflare_hook.so, which `flare run` preloads; this module never links
 * it. Each call looks the symbol up in the process's global scope (dlsym(RTLD_DEFAULT), once,
 * then cached) so that the same training script runs unchanged without Flare: the calls then
 * return False / do nothing. Thread-safe: the cached pointers are written once with the same
 * value by whichever thread gets there first; the hook's functions are thread-safe.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

typedef int (*step_fn)(void);
typedef int (*register_linear_fn)(const char*, int, double, double, double, double);

static void* lookup(const char* name) { return dlsym(RTLD_DEFAULT, name); }

static PyObject* native_step(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  static step_fn fn = NULL;
  if (!fn) fn = (step_fn)lookup("flare_step");
  if (!fn) Py_RETURN_FALSE;
  if (fn() == 0) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

static PyObject* native_hook_loaded(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  if (lookup("flare_step")) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

/* register_kernel_linear(prefix, kind, flops_per_launch, flops_per_block, bytes_per_launch,
 * bytes_per_block) -> int: the hook's return code, or 1 when the hook is not loaded. */
static PyObject* native_register_kernel_linear(PyObject* self, PyObject* args) {
  (void)self;
  const char* prefix = NULL;
  int kind = 0;
  double fl = 0, fb = 0, bl = 0, bb = 0;
  if (!PyArg_ParseTuple(args, "sidddd", &prefix, &kind, &fl, &fb, &bl, &bb)) return NULL;
  static register_linear_fn fn = NULL;
  if (!fn) fn = (register_linear_fn)lookup("flare_register_kernel_linear");
  if (!fn) return PyLong_FromLong(1);
  return PyLong_FromLong(fn(prefix, kind, fl, fb, bl, bb));
}

static PyMethodDef kMethods[] = {
    {"step", native_step, METH_NOARGS,
     "step() -> bool: record a step marker; False when Flare is not loaded or tracing is off."},
    {"hook_loaded", native_hook_loaded, METH_NOARGS,
     "hook_loaded() -> bool: whether libflare_hook.so is in the process."},
    {"register_kernel_linear", native_register_kernel_linear, METH_VARARGS,
     "register_kernel_linear(prefix, kind, flops_per_launch, flops_per_block, bytes_per_launch, "
     "bytes_per_block) -> int: 0 registered, -1 bad argument, -2 registry full, 1 no hook."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "flare._native",
    "Binding of Flare's in-process C API (step marker, custom-kernel registration).", -1,
    kMethods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&kModule); }
