"""libflare_hook.so on the simulated stack: the records match what the workload did."""
import collections
import json
import os
import subprocess

import pytest

LAYERS, STEPS, HIDDEN, SEQ, TP = 2, 3, 4096, 2048, 2


@pytest.fixture
def traced(sim_train, build_dir, tmp_path):
    hook = os.path.join(build_dir, "lib", "libflare_hook.so")
    if not os.path.exists(hook):
        pytest.fail("libflare_hook.so not built")

    def run(*extra, ranks=4, env=None):
        out = tmp_path / "spool"
        full_env = {"LD_PRELOAD": hook, "FLARE_OUTPUT_DIR": str(out), "FLARE_JOB_ID": "hooktest"}
        full_env.update(env or {})
        res = sim_train("--ranks", ranks, "--steps", STEPS, "--layers", LAYERS, "--hidden", HIDDEN,
                        "--seq", SEQ, "--tp", TP, *extra, env=full_env)
        assert res.returncode == 0, res.stderr
        exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(out)],
                             capture_output=True, text=True, timeout=60)
        assert exp.returncode == 0, exp.stderr
        # Kernel records only: traced Python spans (kind "span") are test_pyprof.py's subject.
        return [r for r in map(json.loads, exp.stdout.splitlines()) if r["kind"] != "span"], res
    return run


def by_rank(records):
    out = collections.defaultdict(list)
    for r in records:
        out[r["rank"]].append(r)
    return out


@pytest.mark.parametrize("python", [False, True])
def test_records_match_the_workload(traced, python):
    records, _ = traced(*(["--python"] if python else []))
    ranks = by_rank(records)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, recs in ranks.items():
        names = collections.Counter(r["name"] for r in recs)
        # Forward: 4 cublasGemmEx per layer; backward: 4 cublasGemmEx (dgrad) + 4 wgrad, which go
        # through cuBLASLt in the C++ workload and cublasGemmEx in the Python one.
        lt = 0 if python else 4
        assert names["cublasGemmEx"] == (8 + 4 - lt) * LAYERS * STEPS, rank
        assert names["cublasLtMatmul"] == lt * LAYERS * STEPS, rank
        # Tensor-parallel all-reduces: 2 forward + 2 backward per layer; data-parallel: 1 per layer.
        coll = [r for r in recs if r["name"] == "ncclAllReduce"]
        assert len(coll) == 5 * LAYERS * STEPS, rank
        # cuBLAS's own kernel launches are not recorded a second time.
        assert not any(r["name"].startswith("sm90_xmma") for r in recs), rank
        # Kernel names are demangled.
        assert names["flare::sim::layer_norm_kernel(void const*, void*, unsigned long)"] == \
            2 * LAYERS * STEPS
        flash = [r for r in recs if r["name"] == "flash::flash_fwd_kernel(unsigned long)"]
        assert len(flash) == LAYERS * STEPS and all(r["kind"] == "attention" for r in flash)
        assert names["cudaEventSynchronize"] == STEPS  # the per-step loss.item()
        for r in recs:
            assert r["end_ns"] >= r["start_ns"] >= r["issue_ns"] - 50_000, r


def test_gemm_shapes_flops_and_durations(traced):
    # The exact cost model (no simulator noise, src/sim/noise.h, and no command gap: before the
    # hook has measured the gap, an event pair reads an op two gaps long; test_event_gap.py):
    # durations are checked against it.
    records, _ = traced(env={"FLARE_SIM_NOISE": "0", "FLARE_SIM_COMMAND_GAP_US": "0"})
    h_tp = HIDDEN // TP
    qkv = [r for r in records if r["name"] == "cublasGemmEx" and r["shape"] == [3 * h_tp, SEQ, HIDDEN, 1]]
    assert len(qkv) == 4 * LAYERS * STEPS  # every rank, every layer, every step
    # The simulator's cost model (gemm_model.h): 3 us + flops / (400 TF * 0.75 * waves).
    flops = 2 * 3 * h_tp * SEQ * HIDDEN
    tiles = -(-3 * h_tp // 128) * -(-SEQ // 128)
    waves = -(-tiles // 132)
    expected = 3e3 + flops / (400e12 * 0.75 * tiles / (waves * 132)) * 1e9
    for r in qkv:
        assert r["kind"] == "gemm" and r["dtype"] == "bf16" and r["layout"].startswith("tn")
        assert r["flops"] == flops
        # Events bracket the GEMM: never shorter than the kernel; longer only when the GPU was
        # idle and waited for the host between the start event and the launch.
        assert r["duration_ns"] >= expected * 0.999
    exact = [r for r in qkv if r["duration_ns"] == pytest.approx(expected, rel=0.001)]
    assert len(exact) >= len(qkv) // 2


def test_cublaslt_shapes_come_from_descriptors_created_per_call(traced):
    # The C++ workload creates and destroys its cuBLASLt layouts around every matmul, as PyTorch
    # does; the hook reads them from its shadow of the Create/Set calls.
    records, _ = traced()
    h, T = HIDDEN, SEQ  # micro-batch 1
    h_tp, ffn_tp = h // TP, 4 * h // TP
    expected = {(h, ffn_tp, T), (ffn_tp, h, T), (h, h_tp, T), (3 * h_tp, h, T)}
    lt = [r for r in records if r["name"] == "cublasLtMatmul"]
    assert lt
    seen = set()
    for r in lt:
        m, n, k, batch = r["shape"]
        seen.add((m, n, k))
        assert batch == 1 and r["dtype"] == "bf16" and r["kind"] == "gemm"
        assert r["layout"] == f"nt lda={m} ldb={n} ldc={m} out=bf16", r["layout"]
        assert r["flops"] == 2 * m * n * k
    assert seen == expected


def test_collectives_carry_communicator_identity_and_sequence(traced):
    records, _ = traced()
    coll = [r for r in records if r["kind"] == "collective"]
    comms = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in coll:
        comms[r["comm_hash"]][r["rank"]].append(r)
    # Two TP communicators {0,1},{2,3} and two DP communicators {0,2},{1,3}.
    assert len(comms) == 4
    for members in comms.values():
        assert len(members) == 2
        seqs = [sorted(x["seq"] for x in recs) for recs in members.values()]
        assert seqs[0] == seqs[1] == list(range(1, len(seqs[0]) + 1))
        for recs in members.values():
            assert all(x["nranks"] == 2 for x in recs)
    tp_bytes = SEQ * HIDDEN * 2
    assert any(r["bytes"] == tp_bytes for r in coll)


def test_grouped_all_to_all_is_one_record_with_all_its_bytes(probe):
    proc, records = probe("alltoall", 4)
    assert proc.returncode == 0, proc.stderr
    groups = [r for r in records if r["name"] == "ncclGroup"]
    assert len(groups) == 4 * 2  # one per rank per iteration, never one per send/recv
    for r in groups:
        assert r["kind"] == "p2p"
        assert r["bytes"] == 2 * 3 * (1 << 20) * 4  # 3 sends + 3 receives of 4 MiB
        assert r["layout"].startswith("send=3 recv=3")
        assert r["nranks"] == 4
    assert not any(r["name"] in ("ncclSend", "ncclRecv") for r in records)
    for rank in range(4):
        assert sorted(r["seq"] for r in groups if r["rank"] == rank) == [1, 2]
    assert len({r["comm_hash"] for r in groups}) == 1


def test_launches_through_cuGetProcAddress_are_seen(probe):
    proc, records = probe("procaddress")
    assert proc.returncode == 0, proc.stderr
    triton = [r for r in records if r["name"] == "triton_poi_fused_add_0"]
    assert len(triton) == 5
    for r in triton:
        assert r["duration_ns"] >= 99_000  # float ms from cudaEventElapsedTime


def test_kernels_launched_as_cuda13_nvcc_stubs_launch_them_are_recorded(probe):
    """CUDA 13's nvcc compiles `<<<>>>` to __cudaGetKernel + __cudaLaunchKernel(handle): every
    PyTorch kernel of a CUDA 13 build arrives that way (the H200 run of 2026-11-26 recorded no
    plain kernel at all before the hook took it)."""
    proc, records = probe("stub13")
    assert proc.returncode == 0, proc.stderr
    kernels = [r for r in records if r["kind"] == "kernel"]
    assert [r["name"] for r in kernels] == ["probe_kernel(unsigned long long)"] * 4, records
    for r in kernels:
        assert r["duration_ns"] >= 99_000


def test_launches_through_the_runtimes_driver_entry_points_are_recorded(probe):
    """CUTLASS's cluster launches (FlashAttention on Hopper among them) call cuLaunchKernelEx
    through cudaGetDriverEntryPoint, which the runtime resolves inside itself."""
    proc, records = probe("entrypoint")
    assert proc.returncode == 0, proc.stderr
    cluster = [r for r in records if r["name"] == "cutlass_sm90_cluster_kernel"]
    assert len(cluster) == 3, records
    assert all(r["duration_ns"] >= 99_000 for r in cluster)


def test_a_librarys_kernel_launched_as_a_function_is_named(probe):
    """cuDNN's generated SDPA kernels come from a library (cuLibraryGetKernel: a CUkernel,
    launched as a CUfunction), which cuFuncGetName does not name: the H200 run of 2026-11-28
    recorded them as kernel@unknown, a plain kernel. cuKernelGetName names them, and the name
    makes them attention."""
    proc, records = probe("library")
    assert proc.returncode == 0, proc.stderr
    name = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_kernel0_0"
    assert [(r["name"], r["kind"]) for r in records] == [(name, "attention")] * 4, records
    assert all(r["duration_ns"] >= 99_000 for r in records)
    assert "has no name" not in proc.stderr


def test_a_kernel_no_lookup_names_is_said_once_with_what_each_lookup_answered(probe):
    proc, records = probe("procaddress", env={"FLARE_SIM_NAMELESS_KERNELS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert [r["name"] for r in records] == ["kernel@unknown"] * 5, records
    lines = [line for line in proc.stderr.splitlines() if "has no name" in line]
    assert len(lines) == 1, proc.stderr
    assert "through the driver API" in lines[0]
    assert "cuFuncGetName: CUresult 801; cuKernelGetName: CUresult 801" in lines[0]  # not supported


def test_nothing_is_recorded_inside_a_capture(probe):
    proc, records = probe("capture")
    assert proc.returncode == 0, proc.stderr
    kernels = [r for r in records if r["name"].startswith("probe_kernel(")]
    graphs = [r for r in records if r["kind"] == "graph"]
    assert len(kernels) == 1  # only the ordinary launch after the graphs
    assert len(graphs) == 2
    for g in graphs:
        assert g["duration_ns"] >= 3 * 199_000  # the whole graph, timed as one unit


def test_a_global_mode_capture_survives_the_timing_thread(probe, build_dir):
    """torch.cuda.graph captures in global mode, where another thread's event query breaks the
    capture; the hook's timing thread queries in relaxed mode (H200, 2026-11-27: PyTorch's
    whole-step capture failed under the hook with cudaErrorStreamCaptureInvalidated)."""
    bare = subprocess.run([os.path.join(build_dir, "bin", "hook_probe"), "capture-global"],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert bare.returncode == 0, bare.stderr  # the scenario itself is a valid capture
    proc, records = probe("capture-global")
    assert proc.returncode == 0, proc.stderr
    kernels = [r for r in records if r["name"].startswith("probe_kernel(")]
    assert len(kernels) == 4  # the busy stream's, timed while the capture went on
    assert len([r for r in records if r["kind"] == "graph"]) == 1


def test_a_hung_stream_does_not_hold_back_other_streams(probe):
    proc, records = probe("hung", env={"FLARE_SIM_HANG": "0:compute:0", "RANK": "0"})
    assert proc.returncode == 0, proc.stderr
    kernels = [r for r in records if r["name"].startswith("probe_kernel(")]
    assert len(kernels) == 5  # the healthy stream's five; the stuck one never completed


def test_forked_children_stay_quiet_and_healthy(probe):
    proc, records = probe("fork")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("child ok") == 1
    assert len([r for r in records if r["name"].startswith("probe_kernel(")]) == 6
    assert len({r["thread"] for r in records}) == 1  # nothing from the child


def test_custom_kernel_registration_sets_kind_and_flops(probe):
    proc, records = probe("custom")
    assert proc.returncode == 0, proc.stderr
    kernels = [r for r in records if r["name"].startswith("probe_kernel(")]
    assert len(kernels) == 3
    for r in kernels:
        assert r["kind"] == "attention"
        assert r["flops"] == 100_000 * 1000 * 1  # the registered formula, grid of 1 block


@pytest.mark.parametrize("cmd", [["/bin/true"], ["python3", "-c", "print('hello')"]])
def test_processes_without_cuda_stay_quiet(build_dir, tmp_path, cmd):
    env = dict(os.environ, LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(tmp_path / "spool"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert not (tmp_path / "spool").exists()


def test_a_program_built_by_nvcc_is_recorded_kernel_by_kernel(build_dir, tmp_path):
    """tests/gpu/bench/launch_cost.cu, built by the CUDA toolkit's nvcc and run on the simulated
    runtime under the hook: its `<<<>>>` launches (CUDA 13: __cudaGetKernel, __cudaLaunchKernel)
    and async memsets are each one record, counted against what the program did."""
    nvcc = os.environ.get("NVCC") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("no nvcc (CUDA toolkit) on this machine")
    exe = tmp_path / "launch_cost"
    src = os.path.join(os.path.dirname(__file__), "..", "gpu", "bench", "launch_cost.cu")
    subprocess.run([nvcc, "-O2", "-std=c++17", "-cudart", "shared", "-arch=sm_90", src, "-o",
                    str(exe)], check=True, capture_output=True, timeout=300)
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLARE_")}
    env.update(LD_LIBRARY_PATH=os.path.join(build_dir, "lib", "sim"),
               LD_PRELOAD=os.path.join(build_dir, "lib", "libflare_hook.so"),
               FLARE_OUTPUT_DIR=str(spool), FLARE_JOB_ID="nvcc", FLARE_MODE="raw")
    batch, reps = 16, 3
    proc = subprocess.run([str(exe), str(batch), str(reps)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"] == "no error"
    # The polled variant's second thread took at least the last batch's pairs once they ended.
    assert out["pairs_polled"] >= batch // 2
    exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input", str(spool)],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    counts = collections.Counter(r["name"] for r in map(json.loads, exp.stdout.splitlines()))
    # (reps + 1 warm-up) batches of `batch` launches, then three times of batch/2 launches
    # between records (alone, after the hook's two queries, with the poller thread).
    assert counts["empty_kernel(int*)"] == (reps + 1) * (batch + 3 * (batch // 2))
    assert counts["Memset"] == (reps + 1) * batch


def test_end_only_timing_gives_the_durations_of_two_event_timing(sim_train, build_dir, tmp_path):
    """FLARE_TIMING=end (one CUDA event per op; the start is the end of the op before it on a
    busy stream, the issue time plus the launch latency on an idle one, and a start event after
    a cross-stream wait) against the default pair of events, on the simulated 2-rank TP job:
    the same records, and each signature's median duration the same within 1%."""
    medians = {}
    for timing in ("pair", "end"):
        spool = tmp_path / timing
        res = sim_train("--ranks", 2, "--steps", 4, "--layers", 2, "--hidden", 2048, "--seq",
                        1024, "--tp", 2, env={
                            "LD_PRELOAD": os.path.join(build_dir, "lib", "libflare_hook.so"),
                            "FLARE_OUTPUT_DIR": str(spool), "FLARE_JOB_ID": "timing",
                            "FLARE_TIMING": timing,
                            # Two runs: the simulator's per-run draws (a collective's jitter is
                            # keyed by its communicator, named per run) are not the timing's.
                            "FLARE_SIM_NOISE": "0",
                            # No command gap: the pair's is measured and taken off, an end-only
                            # op's is not (from the end event before it, it reads two gaps long;
                            # 2.6 us at the simulator's default), as on the H200: not this test's
                            # subject.
                            "FLARE_SIM_COMMAND_GAP_US": "0"})
        assert res.returncode == 0, res.stderr
        exp = subprocess.run([os.path.join(build_dir, "bin", "flare-export"), "--input",
                              str(spool)], capture_output=True, text=True, timeout=60)
        assert exp.returncode == 0, exp.stderr
        durations = collections.defaultdict(list)
        for r in map(json.loads, exp.stdout.splitlines()):
            if r["kind"] not in ("span", "sync"):
                durations[(r["rank"], r["kind"], r["name"])].append(r["duration_ns"])
        medians[timing] = {k: (len(v), sorted(v)[len(v) // 2]) for k, v in durations.items()}
    assert medians["end"].keys() == medians["pair"].keys()
    for key, (count, med) in medians["pair"].items():
        end_count, end_med = medians["end"][key]
        assert end_count == count, key
        assert abs(end_med - med) <= 0.01 * med + 50, (key, med, end_med)
