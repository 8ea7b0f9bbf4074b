"""In-process API for training scripts: the step marker and custom-kernel FLOP registration.

These call the C API of `libflare_hook.so` (include/flare/step.h, include/flare/kernels.h),
which `flare run` preloads. Through the compiled binding `flare._native` when the package was
installed with pip; through ctypes otherwise (e.g. `PYTHONPATH=python`), with the same
behaviour. A script that uses them runs unchanged without Flare: `step()` then returns False
and `register_kernel()` returns False.

    import flare
    for batch in loader:
        flare.step()                      # marks the start of a step
        ...
    # a Triton matmul whose every program computes a 128x128 tile over K:
    flare.register_kernel("matmul_kernel", kind="gemm", flops_per_block=2 * 128 * 128 * K)
"""

import ctypes

try:
    from flare import _native
except ImportError:  # not built: running from a source checkout
    _native = None

KINDS = {"kernel": 1, "gemm": 2, "attention": 3}

_ctypes_fns = {}


def _c_function(name, restype, argtypes):
    """The hook's function `name` from the process's global scope, or None."""
    if name not in _ctypes_fns:
        try:
            fn = getattr(ctypes.CDLL(None), name)
            fn.restype = restype
            fn.argtypes = argtypes
        except AttributeError:
            fn = None
        _ctypes_fns[name] = fn
    return _ctypes_fns[name]


def binding():
    """Which binding is in use: "native" (compiled, pip-installed) or "ctypes"."""
    return "native" if _native is not None else "ctypes"


def hook_loaded():
    """Whether libflare_hook.so is loaded in this process (e.g. by `flare run`)."""
    if _native is not None:
        return _native.hook_loaded()
    return _c_function("flare_step", ctypes.c_int, []) is not None


def step():
    """Marks the start of a training step. True when recorded; False when Flare is not loaded
    or its tracing is off. Cheap (no GPU work, no lock): call it once per step."""
    if _native is not None:
        return _native.step()
    fn = _c_function("flare_step", ctypes.c_int, [])
    return fn is not None and fn() == 0


def _amount(name, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number, not %r" % (name, value))
    if not (0 <= v < 1e30):
        raise ValueError("%s must be a non-negative finite number, not %r" % (name, value))
    return v


def register_kernel(name_prefix, kind="kernel", flops=0, flops_per_block=0, bytes=0,
                    bytes_per_block=0):
    """Declares a custom kernel family so that Flare reports its TFLOPS (or bandwidth).

    `name_prefix` is matched against the start of the demangled kernel name (the longest
    registered prefix wins; also for kernels already seen). One launch performs
    `flops + flops_per_block * blocks` FLOPs, `blocks` being the launch's grid size (likewise
    bytes). `kind` is "kernel", "gemm" or "attention".

    Returns True when registered, False when Flare is not loaded in this process. Raises
    ValueError on a bad argument and RuntimeError when the registry is full (256 entries).
    """
    if not isinstance(name_prefix, str) or not name_prefix:
        raise ValueError("name_prefix must be a non-empty string")
    if "\0" in name_prefix:
        raise ValueError("name_prefix must not contain NUL")
    if kind not in KINDS:
        raise ValueError("kind must be one of %s, not %r" % (", ".join(sorted(KINDS)), kind))
    amounts = (_amount("flops", flops), _amount("flops_per_block", flops_per_block),
               _amount("bytes", bytes), _amount("bytes_per_block", bytes_per_block))
    if _native is not None:
        rc = _native.register_kernel_linear(name_prefix, KINDS[kind], *amounts)
    else:
        fn = _c_function("flare_register_kernel_linear", ctypes.c_int,
                         [ctypes.c_char_p, ctypes.c_int] + [ctypes.c_double] * 4)
        rc = 1 if fn is None else fn(name_prefix.encode(), KINDS[kind], *amounts)
    if rc == 1:
        return False
    if rc == -2:
        raise RuntimeError("Flare's kernel registry is full (256 prefixes)")
    if rc != 0:
        raise ValueError("Flare refused the registration of %r (code %d)" % (name_prefix, rc))
    return True
