# Flare's Python tracing bootstrap: run once by libflare_pyprof_cpXY.so (pyprof.cc) when the
# interpreter is about to run the main program, in a private namespace (nothing is added to
# sys.modules or to the program's globals). _CONFIG = {c: the C module, traced_api, defaults,
# pid}. Resolves TRACED_PYTHON_API entries and the built-in defaults now or when their module
# is imported, registers their code objects with the C module and turns on the version's
# mechanism (sys.monitoring on 3.12+, the profile hook before). Works on CPython 3.9-3.13.
import sys

_c = _CONFIG["c"]
_INFO, _WARN, _DEBUG = 0, 1, 2
_MONITORING = sys.version_info >= (3, 12)

# (entry, optional): optional entries are quiet when they do not resolve (Megatron, torch APIs
# that moved between versions). An entry "+" suffix traces the method of the subclasses too.
_DEFAULTS = [
    "torch.utils.data.dataloader._BaseDataLoaderIter@__next__",
    "torch.cuda@synchronize",
    "torch.cuda.Event@synchronize",
    "torch.cuda.Event@wait",
    "torch.cuda.Stream@synchronize",
    "torch.cuda.Stream@wait_event",
    "torch.cuda.Stream@wait_stream",
    "torch.autograd@backward",
    "torch.optim.Optimizer@step+",
    "torch.cuda@empty_cache",
    "torch@save",
    "megatron.core.pipeline_parallel.schedules@forward_step",
    "megatron.core.pipeline_parallel.schedules@backward_step",
    "megatron.schedules@forward_step",
    "megatron.schedules@backward_step",
]


def _log(level, text):
    _c._log(level, "flare: " + text)


class _Entry:
    __slots__ = ("name", "left", "path", "optional", "subclasses")

    def __init__(self, name, left, path, optional, subclasses):
        self.name, self.left, self.path = name, left, path
        self.optional, self.subclasses = optional, subclasses


def _parse(raw, optional):
    out = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        subclasses = optional and item.endswith("+")
        name = item[:-1] if subclasses else item
        left, sep, right = name.partition("@")
        parts_l, parts_r = left.split("."), right.split(".")
        if (not sep or "@" in right or not all(p.isidentifier() for p in parts_l)
                or not all(p.isidentifier() for p in parts_r)):
            _log(_WARN, "TRACED_PYTHON_API entry %r is malformed (expected module@function, "
                        "module.Class@method or module@Class.method); ignored" % item)
            continue
        out.append(_Entry(name, left, parts_r, optional, subclasses))
    return out


_entries = []
if _CONFIG["defaults"]:
    _entries += _parse(",".join(_DEFAULTS), True)
_user = _parse(_CONFIG["traced_api"], False)
_user_names = {e.name for e in _user}
_entries = [e for e in _entries if e.name not in _user_names] + _user
_pending = {}  # module-name prefix -> entries that may resolve when it is imported
_tool = None
_E = None


def _watch(entry):
    parts = entry.left.split(".")
    for i in range(1, len(parts) + 1):
        _pending.setdefault(".".join(parts[:i]), []).append(entry)


def _unwatch(entry):
    for key in [k for k, v in _pending.items() if entry in v]:
        _pending[key] = [e for e in _pending[key] if e is not entry]
        if not _pending[key]:
            del _pending[key]


def _code_of(obj):
    for _ in range(64):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
            continue
        func = getattr(obj, "__func__", None)  # bound method
        if func is not None and not isinstance(obj, type):
            obj = func
            continue
        try:
            wrapped = obj.__wrapped__
        except Exception:
            wrapped = None
        if wrapped is not None and wrapped is not obj:
            obj = wrapped
            continue
        break
    code = getattr(obj, "__code__", None)
    return code if type(code) is type(_code_of.__code__) else None


def _class_attr(cls, name):
    for klass in getattr(cls, "__mro__", (cls,)):
        d = getattr(klass, "__dict__", {})
        if name in d:
            return d[name]
    raise AttributeError(name)


def _walk(module, names):
    obj = module
    for i, name in enumerate(names):
        if isinstance(obj, type) and i == len(names) - 1:
            obj = _class_attr(obj, name)
        else:
            obj = getattr(obj, name)
    return obj


def _subclasses(cls):
    seen, todo = [], list(type.__subclasses__(cls))
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.append(k)
            todo.extend(type.__subclasses__(k))
    return seen


def _trace(code, name):
    if _c._is_traced(code):
        return
    _c._register(code, name)
    if _MONITORING and _tool is not None:
        sys.monitoring.set_local_events(
            _tool, code, _E.PY_START | _E.PY_RESUME | _E.PY_RETURN | _E.PY_YIELD)


def _submodule_exists(name):
    try:
        import importlib.util
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def _resolve(entry, module_name, module):
    """True when done with the entry (traced, or reported unresolvable)."""
    rest = entry.left.split(".")[len(module_name.split(".")):] + entry.path
    try:
        obj = _walk(module, rest)
    except Exception:
        if entry.left == module_name or not _submodule_exists(module_name + "." + rest[0]):
            if not entry.optional:
                _log(_WARN, "TRACED_PYTHON_API entry %r cannot be resolved: %s has no %s; "
                            "ignored" % (entry.name, module_name, ".".join(rest)))
            return True
        return False  # a submodule that is not imported yet
    code = _code_of(obj)
    if code is None:
        if not entry.optional:
            _log(_WARN, "TRACED_PYTHON_API entry %r is not a Python function (%s); ignored"
                 % (entry.name, type(obj).__name__))
        return True
    _trace(code, entry.name)
    if entry.subclasses:
        try:
            owner = _walk(module, rest[:-1])
            for sub in _subclasses(owner):
                if rest[-1] in sub.__dict__:
                    sub_code = _code_of(sub.__dict__[rest[-1]])
                    if sub_code is not None:
                        _trace(sub_code, entry.name)
        except Exception:
            pass
    return True


def _on_loaded(name):
    entries = _pending.get(name)
    if not entries:
        return
    module = sys.modules.get(name)
    if module is None:
        return
    for entry in list(entries):
        try:
            done = _resolve(entry, name, module)
        except Exception as e:  # never let tracing break an import
            _log(_WARN, "TRACED_PYTHON_API entry %r: %s: %s; ignored"
                 % (entry.name, type(e).__name__, e))
            done = True
        if done:
            _unwatch(entry)


class _Loader:
    """Wraps a module's loader for the time of its exec_module, then calls _on_loaded."""

    def __init__(self, loader):
        self.__dict__["_flare_loader"] = loader

    def __getattr__(self, name):
        return getattr(self.__dict__["_flare_loader"], name)

    def create_module(self, spec):
        return self._flare_loader.create_module(spec)

    def exec_module(self, module):
        loader = self._flare_loader
        try:
            loader.exec_module(module)
        finally:
            try:
                if getattr(module, "__loader__", None) is self:
                    module.__loader__ = loader
                spec = getattr(module, "__spec__", None)
                if spec is not None and spec.loader is self:
                    spec.loader = loader
            except Exception:
                pass
        try:
            _on_loaded(module.__name__)
        except Exception:
            pass


class _Finder:
    """First on sys.meta_path; acts only for modules that a pending entry names."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _pending or name in self._busy:
            return None
        self._busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            spec.loader = _Loader(loader)
        return spec

    def invalidate_caches(self):
        pass


def _after_fork_in_child():
    # A fork child (a DataLoader worker): the timing layer is off there; so is tracing, and
    # nothing more is resolved (a lock of the parent's other threads may be held forever).
    _c._off()
    _pending.clear()
    try:
        if _MONITORING and _tool is not None:
            sys.monitoring.set_events(_tool, 0)
        elif not _MONITORING:
            sys.setprofile(None)
            import threading
            threading.setprofile(None)
    except Exception:
        pass


def _start():
    global _tool, _E
    if _MONITORING:
        mon = sys.monitoring
        for tool in (4, 3):
            try:
                mon.use_tool_id(tool, "flare")
                _tool = tool
                break
            except ValueError:
                continue
        if _tool is None:
            _log(_WARN, "sys.monitoring tool ids 3 and 4 are both in use; Flare's Python "
                        "tracing steps back (kernels are still traced)")
            _c._off()
            return
        _E = mon.events
        for event in (_E.PY_START, _E.PY_RESUME, _E.PY_THROW):
            mon.register_callback(_tool, event, _c._start)
        for event in (_E.PY_RETURN, _E.PY_YIELD, _E.PY_UNWIND):
            mon.register_callback(_tool, event, _c._stop)
        # Not local events: enabled globally; they fire only when an exception unwinds a frame
        # or is thrown into a generator, and the C side drops untraced code at once.
        mon.set_events(_tool, _E.PY_UNWIND | _E.PY_THROW)
    else:
        import threading
        threading.setprofile(_c._thread_start)
        _c._install_all_threads()
    if _CONFIG["defaults"]:  # garbage collections are one of the defaults
        import gc
        gc.callbacks.append(_c._gc)
    import os
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    for entry in _entries:
        _watch(entry)
    if _user:
        for entry in _user:
            top = entry.left.split(".")[0]
            if top not in sys.modules and not _submodule_exists(top):
                _log(_WARN, "TRACED_PYTHON_API entry %r: module %r is not found on sys.path "
                            "now; it is traced if it is imported later" % (entry.name, top))
    # Modules imported already (longest names first: submodules before their packages).
    for name in sorted(list(_pending), key=lambda n: -n.count(".")):
        if name in sys.modules:
            _on_loaded(name)
    sys.meta_path.insert(0, _Finder())
    # Debug: a Python process that never uses CUDA stays quiet (tests/python/test_hook.py).
    _log(_DEBUG, "Python %d.%d: tracing %d API entries with %s" % (
        sys.version_info[0], sys.version_info[1], len(_entries),
        "sys.monitoring (tool %d)" % _tool if _MONITORING else "the profile hook"))


_start()

# Flare's exit work (drain, flush) as the last Python exit callback, while the interpreter is
# still whole, rather than in the C exit handler after finalization, where a daemon thread
# waking up can crash CPython (pyprof_api.h, before_exit).
import atexit  # noqa: E402

atexit.register(_c._before_exit)
