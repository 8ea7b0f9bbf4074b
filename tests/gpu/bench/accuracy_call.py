"""The one function tests/gpu/bench/accuracy.py calls every measured operation through, so that
Flare traces each call as a Python span (TRACED_PYTHON_API="accuracy_call@call"): the ops whose
launch falls inside the i-th span are the i-th call's, with no guess from shapes or names.
It lives in its own module because an entry of TRACED_PYTHON_API is resolved when its module is
imported, and __main__ is already loaded, without the function, when tracing starts."""


def call(fn):
    return fn()
