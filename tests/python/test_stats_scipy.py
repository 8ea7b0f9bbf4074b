"""Cross-checks the stats library (through the flare-stats JSON tool) against SciPy and NumPy
on random data: W1 against scipy.stats.wasserstein_distance, KDE densities against
scipy.stats.gaussian_kde at the same bandwidth, quantiles against numpy.quantile, sketch
quantiles within the sketch's relative-error bound, and the sketch W1 within its bound."""
import json
import os
import subprocess

import pytest

np = pytest.importorskip("numpy", reason="numpy not installed (deploy/install-deps.sh installs it)")
scipy_stats = pytest.importorskip(
    "scipy.stats", reason="scipy not installed (deploy/install-deps.sh installs it)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FLARE_BUILD_DIR", os.path.join(ROOT, "build"))
TOOL = os.path.join(BUILD, "bin", "flare-stats")


@pytest.fixture(scope="module")
def stats():
    if not os.path.exists(TOOL):
        pytest.fail("flare-stats not found at %s (build it: make -C build flare-stats)" % TOOL)

    def run(request):
        proc = subprocess.run([TOOL], input=json.dumps(request), capture_output=True, text=True,
                              timeout=30)
        out = json.loads(proc.stdout)
        assert proc.returncode == 0, out
        return out
    return run


def test_w1_matches_scipy(stats):
    rng = np.random.default_rng(1)
    cases = [
        (rng.normal(0, 1, 500), rng.normal(0.3, 1.5, 321)),
        (rng.lognormal(10, 1, 2000), rng.lognormal(10.2, 0.7, 1500)),
        (rng.integers(0, 5, 100).astype(float), rng.integers(0, 7, 80).astype(float)),  # ties
        (rng.normal(0, 1, 1), rng.normal(5, 1, 3)),
    ]
    for a, b in cases:
        got = stats({"op": "w1", "a": a.tolist(), "b": b.tolist()})["w1"]
        want = scipy_stats.wasserstein_distance(a, b)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_kde_matches_scipy_at_the_same_bandwidth(stats):
    rng = np.random.default_rng(2)
    for n, rule in [(50, "silverman"), (3000, "silverman"), (3000, "scott")]:
        x = np.concatenate([rng.normal(9, 0.2, n * 2 // 3), rng.normal(11, 0.1, n - n * 2 // 3)])
        at = np.linspace(x.min() - 0.5, x.max() + 0.5, 41)
        out = stats({"op": "kde", "values": x.tolist(), "rule": rule, "at": at.tolist()})
        h = out["bandwidth"]
        sigma = np.std(x, ddof=1)
        if rule == "scott":
            expected_h = 1.06 * sigma * n ** -0.2
        else:
            iqr = np.subtract(*np.quantile(x, [0.75, 0.25]))
            expected_h = 0.9 * min(sigma, iqr / 1.34) * n ** -0.2
        assert h == pytest.approx(expected_h, rel=1e-12)
        # gaussian_kde's bandwidth is bw_method × the sample's σ (ddof=1).
        kde = scipy_stats.gaussian_kde(x, bw_method=h / sigma)
        assert np.sqrt(kde.covariance[0, 0]) == pytest.approx(h, rel=1e-12)
        assert np.allclose(out["at"], kde(at), rtol=1e-9, atol=1e-12)
        # The grid (exact for n = 50, binned for n = 3000) against SciPy at the grid points.
        grid = out["grid"]
        xs = grid["lo"] + grid["step"] * np.arange(len(grid["density"]))
        want = kde(xs)
        assert grid["binned"] == (n > 64)
        assert np.max(np.abs(np.array(grid["density"]) - want)) < 1e-3 * want.max()


def test_cluster_quantiles_match_numpy(stats):
    rng = np.random.default_rng(3)
    a = rng.lognormal(np.log(2e4), 0.05, 700)
    b = rng.lognormal(np.log(2e5), 0.05, 300)
    x = np.concatenate([a, b])
    rng.shuffle(x)
    out = stats({"op": "cluster", "durations": x.tolist()})
    assert len(out["clusters"]) == 2
    for cluster, part in zip(out["clusters"], [a, b]):
        assert cluster["count"] == len(part)
        assert cluster["p50"] == pytest.approx(np.quantile(part, 0.5), rel=1e-12)
        assert cluster["p99"] == pytest.approx(np.quantile(part, 0.99), rel=1e-12)
        assert cluster["sum"] == pytest.approx(part.sum(), rel=1e-12)
    q = [0, 0.01, 0.25, 0.5, 0.9, 0.99, 1]
    got = stats({"op": "quantile", "values": x.tolist(), "q": q})["quantiles"]
    assert np.allclose(got, np.quantile(x, q), rtol=1e-12)


def test_sketch_quantiles_within_relative_error(stats):
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.lognormal(np.log(3e4), 1.3, 20000),    # issue latencies, ns
                        rng.uniform(-2000, -2, 300),                  # clock-map error
                        np.zeros(50), rng.uniform(0, 1, 50)])         # zero bucket (≤ 1 ns)
    q = [0.0, 0.001, 0.01, 0.015, 0.02, 0.05, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]
    for alpha in (0.01, 0.005):
        out = stats({"op": "sketch", "values": x.tolist(), "q": q, "alpha": alpha})
        assert out["count"] == len(x)
        assert out["min"] == x.min() and out["max"] == x.max()
        assert out["sum"] == pytest.approx(x.sum(), rel=1e-9)
        want = np.quantile(x, q, method="lower")
        for got, w in zip(out["quantiles"], want):
            tol = 1.0 if abs(w) <= 1.0 else alpha * abs(w) * (1 + 1e-9)
            assert abs(got - w) <= tol, (got, w)
        assert out["bytes"] < 4096  # kilobytes, not megabytes


def test_sketch_and_summary_w1_close_to_exact(stats):
    rng = np.random.default_rng(5)
    a = rng.lognormal(np.log(3e4), 1.0, 5000)
    b = rng.lognormal(np.log(2e4), 0.6, 4000) - 10
    exact = scipy_stats.wasserstein_distance(a, b)
    out = stats({"op": "sketch_w1", "a": a.tolist(), "b": b.tolist()})
    assert abs(out["w1"] - exact) <= out["bound"]
    # Summaries of two ranks' kernel durations: the rebuilt-mixture W1 is close to the exact one.
    fast = np.concatenate([rng.lognormal(np.log(1e5), 0.03, 900), rng.lognormal(np.log(4e5), 0.03, 100)])
    slow = fast * 1.08
    sa = stats({"op": "cluster", "durations": fast.tolist()})["clusters"]
    sb = stats({"op": "cluster", "durations": slow.tolist()})["clusters"]
    got = stats({"op": "summary_w1", "a": sa, "b": sb})["w1"]
    assert got == pytest.approx(scipy_stats.wasserstein_distance(fast, slow), rel=0.05)


def test_outlier_scores_and_fences_match_scipy(stats):
    rng = np.random.default_rng(6)
    members = [rng.lognormal(np.log(1e5), 0.05, 200) for _ in range(15)]
    members[11] = members[11] * 1.2  # one slow rank
    out = stats({"op": "outliers", "members": [m.tolist() for m in members], "alpha": 1.5})
    n = len(members)
    scores = np.array([np.mean([scipy_stats.wasserstein_distance(members[i], members[j])
                                for j in range(n) if j != i]) for i in range(n)])
    assert np.allclose(out["scores"], scores, rtol=1e-9)
    q1, q3 = np.quantile(scores, [0.25, 0.75])
    assert out["fences"]["upper"] == pytest.approx(q3 + 1.5 * (q3 - q1), rel=1e-12)
    assert out["fences"]["lower"] == pytest.approx(q1 - 1.5 * (q3 - q1), rel=1e-12)
    assert out["high"] == [int(i) for i in np.nonzero(scores > q3 + 1.5 * (q3 - q1))[0]] == [11]


def test_tool_reports_bad_input(stats):
    proc = subprocess.run([TOOL], input="{not json", capture_output=True, text=True, timeout=10)
    assert proc.returncode == 2 and "offset" in json.loads(proc.stdout)["error"]
    proc = subprocess.run([TOOL], input='{"op":"w1","a":"x","b":[1]}', capture_output=True, text=True,
                          timeout=10)
    assert proc.returncode == 2 and "array" in json.loads(proc.stdout)["error"]


def test_sign_test_matches_scipy_binomtest(stats):
    rng = np.random.default_rng(7)
    for n, shift in [(10, 0.0), (10, 3.0), (25, 0.4), (7, -1.0)]:
        d = rng.normal(shift, 1, n)
        d[0] = 0.0  # zeros are dropped
        got = stats({"op": "signtest", "differences": d.tolist()})
        nz = d[d != 0]
        want = scipy_stats.binomtest(int((nz > 0).sum()), len(nz), 0.5, alternative="greater")
        assert got["n"] == len(nz) and got["positive"] == int((nz > 0).sum())
        assert got["p_value"] == pytest.approx(want.pvalue, rel=1e-9)


def test_wilcoxon_matches_scipy_exact_and_approximate(stats):
    rng = np.random.default_rng(8)
    for n, shift in [(10, 0.0), (12, 0.8), (30, 0.3), (50, -0.2)]:
        d = rng.normal(shift, 1, n)  # continuous: no ties, no zeros
        got = stats({"op": "wilcoxon", "differences": d.tolist()})
        want = scipy_stats.wilcoxon(d, alternative="greater", method="exact")
        assert got["exact"] and got["w_plus"] == pytest.approx(want.statistic)
        assert got["p_value"] == pytest.approx(want.pvalue, rel=1e-9)
    # Beyond the exact range: the normal approximation with continuity correction.
    d = rng.normal(0.1, 1, 400)
    got = stats({"op": "wilcoxon", "differences": d.tolist()})
    want = scipy_stats.wilcoxon(d, alternative="greater", method="approx", correction=True)
    assert not got["exact"]
    assert got["p_value"] == pytest.approx(want.pvalue, rel=1e-6)


def test_excess_over_peers_matches_numpy(stats):
    rng = np.random.default_rng(9)
    x = rng.normal(30, 1, (8, 12))
    x[4] += 1.5
    got = stats({"op": "excess", "members": x.tolist(), "member": 4})["excess"]
    want = x[4] - np.median(np.delete(x, 4, axis=0), axis=0)
    assert got == pytest.approx(want.tolist(), rel=1e-12)
