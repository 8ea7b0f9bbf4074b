"""libflare_hook.so's dlsym (src/hook/dlsym_interpose.cc): launches through driver functions taken
by dlsym on a dlopen("libcuda.so.1") handle -- Triton's launcher, torch.compile's kernels -- are
recorded, and dlsym otherwise answers as glibc's does (dlsym_probe, src/hook/testing)."""
import collections
import json
import os
import subprocess

import pytest

# (kernel, FLOPs = 1000 x blocks of its grid) -> launches, as dlsym_probe makes them.
EXPECTED = {
    ("triton_poi_fused_mul_0", 6000): 4,    # cuLaunchKernel, grid 3,2,1
    ("triton_red_fused_sum_1", 10000): 6,   # cuLaunchKernelEx, grid 5,1,2
    ("triton_tem_fused_3", 9000): 2,        # cuLaunchKernel from the dlsym'd cuGetProcAddress_v2
    ("triton_per_fused_2", 7000): 3,        # 4 threads, cuLaunchKernelEx, grid t+1,7,1
    ("triton_per_fused_2", 14000): 3,
    ("triton_per_fused_2", 21000): 3,
    ("triton_per_fused_2", 28000): 3,
}


@pytest.fixture
def dlsym_probe(build_dir, tmp_path):
    """Runs dlsym_probe, preloading the hook unless told not to; returns (lookups, records, proc)
    with lookups {what: (object, dlerror)} from its output."""
    hook = os.path.join(build_dir, "lib", "libflare_hook.so")
    probe = os.path.join(build_dir, "bin", "dlsym_probe")
    if not os.path.exists(probe):
        pytest.fail("dlsym_probe not built")

    runs = []

    def run(preload=True, env=None):
        runs.append(1)
        spool = tmp_path / ("spool-%d" % len(runs))
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith("FLARE_") and k != "LD_PRELOAD"}
        full_env.update({"FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": "dlsym"}, **(env or {}))
        if preload:
            full_env["LD_PRELOAD"] = hook
        proc = subprocess.run([probe], env=full_env, capture_output=True, text=True, timeout=60)
        lookups = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if ":" in parts[0]:
                lookups[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else None)
        records = []
        if spool.exists():
            exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                                  str(spool)], capture_output=True, text=True, timeout=60)
            assert exp.returncode == 0, exp.stderr
            records = [r for r in map(json.loads, exp.stdout.splitlines()) if r["kind"] != "span"]
        return lookups, records, proc
    return run


def test_launches_through_dlsym_on_a_libcuda_handle_are_recorded_exactly(dlsym_probe):
    lookups, records, proc = dlsym_probe()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The launcher got the hook's wrappers, with dlerror() clear as Triton checks it.
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGetProcAddress_v2"):
        assert lookups["handle:" + name] == ("libflare_hook.so", "error=none"), lookups
    assert lookups["procaddress:cuLaunchKernel"][0] == "libflare_hook.so"
    # cuGetProcAddress through it: the signature the caller's CUDA version has.
    assert lookups["procaddress:cuGetProcAddress@11030"] == ("libflare_hook.so",
                                                             "cuGetProcAddress")
    assert lookups["procaddress:cuGetProcAddress@12000"] == ("libflare_hook.so",
                                                             "cuGetProcAddress_v2")
    triton = [r for r in records if r["name"].startswith("triton_")]
    got = collections.Counter((r["name"], r["flops"]) for r in triton)
    assert got == EXPECTED, got
    for r in triton:
        assert r["kind"] == "kernel"
        assert r["duration_ns"] >= 49_000  # the simulator's 50 us per launch
    # Each thread's launches are its own.
    per_thread = {r["thread"] for r in triton if r["name"] == "triton_per_fused_2"}
    assert len(per_thread) == 4


def test_other_lookups_answer_as_glibc_does(dlsym_probe):
    """RTLD_NEXT and RTLD_DEFAULT resolve from the program that called dlsym, not from the hook;
    symbols the hook does not wrap, and missing ones (with their dlerror), are untouched."""
    hooked, _, proc = dlsym_probe()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain, records, proc = dlsym_probe(preload=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert records == []
    # Without the hook: glibc's answers.
    assert plain["handle:cuLaunchKernel"] == ("libcuda.so.1", "error=none")
    assert plain["next:cudaLaunchKernel"] == ("libcudart.so.13", "error=none")
    assert plain["next:cuLaunchKernel"] == ("libcuda.so.1", "error=none")
    # Under the hook, the next definition after the program is the preloaded hook's; had the
    # lookup been made from the hook, it would be the runtime's and the driver's.
    assert hooked["next:cudaLaunchKernel"] == ("libflare_hook.so", "error=none")
    assert hooked["next:cuLaunchKernel"] == ("libflare_hook.so", "error=none")
    assert hooked["default:cudaLaunchKernel"] == ("libflare_hook.so", "error=none")
    assert hooked["default:cuLaunchKernel"] == ("libflare_hook.so", "error=none")
    for key in ("handle:cuModuleGetFunction", "handle:cuNoSuchFunction"):
        assert hooked[key] == plain[key], key
    assert plain["handle:cuNoSuchFunction"] == ("null", "error=set")


@pytest.mark.parametrize("env", [{"FLARE_DISABLE": "1"}, {"FLARE_HOOK_DLSYM": "0"}])
def test_turned_off_dlsym_is_glibcs(dlsym_probe, env):
    lookups, records, proc = dlsym_probe(env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain, _, _ = dlsym_probe(preload=False)
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGetProcAddress_v2"):
        assert lookups["handle:" + name] == ("libcuda.so.1", "error=none"), lookups
    assert {k: v for k, v in lookups.items() if k.startswith("handle:")} == \
        {k: v for k, v in plain.items() if k.startswith("handle:")}
    # The launches through those pointers went past the hook, as before it took dlsym. (The
    # simulated driver's cuGetProcAddress hands out what the global scope holds, the hook's
    # wrapper under LD_PRELOAD, so triton_tem_fused_3 is left out here.)
    direct = ("triton_poi_fused_mul_0", "triton_red_fused_sum_1", "triton_per_fused_2")
    assert not [r for r in records if r["name"] in direct]


# The same from a Python process, through ctypes (its _ctypes module calls dlsym on the handle,
# as Triton's compiled launcher does from its own extension module).
CTYPES_LAUNCHER = r"""
import ctypes, sys
rt = ctypes.CDLL("libcudart.so.13")
assert rt.cudaFree(None) == 0                 # the runtime is up first, as in PyTorch
cuda = ctypes.CDLL("libcuda.so.1")
launch = cuda.cuLaunchKernel                  # dlsym(handle, "cuLaunchKernel")
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuModuleLoadData(ctypes.byref(mod), b"jit-image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"triton_poi_fused_ctypes_0") == 0
assert cuda.flareSimRegisterKernelCost(b"triton_poi_fused_ctypes_0", 3, 0) == 0  # ns, param 0
ns = ctypes.c_uint64(50000)
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
for _ in range(5):
    assert launch(fn, 4, 1, 1, 128, 1, 1, 0, None, params, None) == 0
assert cuda.cuCtxSynchronize() == 0
print("ok")
"""


def test_launches_through_ctypes_in_a_python_process_are_recorded(build_dir, tmp_path):
    hook = os.path.join(build_dir, "lib", "libflare_hook.so")
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(LD_PRELOAD=hook, FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="ctypes",
               LD_LIBRARY_PATH=os.path.join(build_dir, "lib", "sim"))
    proc = subprocess.run(["python3", "-c", CTYPES_LAUNCHER], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    kernels = [r for r in map(json.loads, exp.stdout.splitlines())
               if r["name"] == "triton_poi_fused_ctypes_0"]
    assert len(kernels) == 5, exp.stdout
    assert all(r["kind"] == "kernel" and r["duration_ns"] >= 49_000 for r in kernels)
