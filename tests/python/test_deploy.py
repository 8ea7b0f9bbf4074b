"""deploy/: the systemd unit, Kubernetes manifests, Prometheus config and rules and the Grafana
dashboard agree with what flared really accepts (flags) and exports (metric names), and a real
Prometheus server scrapes a real flared with the shipped scrape settings."""

import configparser
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")

yaml = pytest.importorskip("yaml", reason="pyyaml missing (deploy/install-deps.sh installs it)")


def flared_bin(build_dir):
    path = os.path.join(build_dir, "bin", "flared")
    if not os.path.exists(path):
        pytest.skip("build/bin/flared not built")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Flared:
    """A real flared on free ports; `extra` flags are appended after the test's own."""

    def __init__(self, build_dir, workdir, extra=()):
        self.log_path = os.path.join(str(workdir), "flared.log")
        ready = os.path.join(str(workdir), "ready")
        args = [flared_bin(build_dir), "--db", os.path.join(str(workdir), "flared.db"),
                *extra, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ready-file", ready]
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if os.path.exists(ready) and open(ready).read().strip():
                self.grpc, self.http = (int(x) for x in open(ready).read().split())
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError("flared %s did not start:\n%s" % (args, open(self.log_path).read()))

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.http, path), timeout=5) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)


@pytest.fixture
def flared(build_dir, tmp_path):
    d = Flared(build_dir, tmp_path)
    yield d
    if d.proc.poll() is None:
        d.proc.kill()


def exported_names(metrics_text):
    """Metric names flared declares (# TYPE lines: present even before a series exists)."""
    return set(re.findall(r"^# TYPE (\S+) ", metrics_text, re.M))


def promql_names(expr):
    return set(re.findall(r"\b(flare_[a-z0-9_]+)", expr))


def rule_exprs():
    rules = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "flare_rules.yml")))
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def dashboard():
    return json.load(open(os.path.join(DEPLOY, "grafana", "flare.json")))


def dashboard_exprs():
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def k8s_docs(name):
    return [d for d in yaml.safe_load_all(open(os.path.join(DEPLOY, "k8s", name))) if d]


def by_kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert found, "no %s" % kind
    return found


def flag_args(args):
    """['--a=1', '--b', '2'] -> {'--a': '1', '--b': '2'}"""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        else:
            out[a] = args[i + 1]
            i += 1
        i += 1
    return out


def run_flared_with(build_dir, tmp_path, flags):
    """Starts flared with the given deploy flags (addresses and paths made local); returns
    whether it came up; proves the flags and values are ones flared accepts."""
    local = dict(flags)
    local.pop("--listen", None)
    local.pop("--http", None)
    local.pop("--db", None)
    if "--token-file" in local:
        tok = tmp_path / "tokens"
        tok.write_text("* test-token\n")
        local["--token-file"] = str(tok)
    extra = [x for k, v in local.items() for x in (k, v)]
    d = Flared(build_dir, tmp_path, extra)
    try:
        assert d.get("/healthz").strip() == "ok"
    finally:
        d.stop()
    assert d.proc.returncode == 0, open(d.log_path).read()


# --- Kubernetes ---------------------------------------------------------------------------


def test_k8s_flared_manifest_is_consistent_and_its_flags_run(build_dir, tmp_path):
    docs = k8s_docs("flared.yaml")
    dep = by_kind(docs, "Deployment")[0]
    svc = by_kind(docs, "Service")[0]
    secret = by_kind(docs, "Secret")[0]
    pvc = by_kind(docs, "PersistentVolumeClaim")[0]
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    flags = flag_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # The ports flared listens on are the container ports, the probes and the scrape annotation.
    assert flags["--listen"].endswith(":%d" % ports["grpc"])
    assert flags["--http"].endswith(":%d" % ports["http"])
    assert not flags["--listen"].startswith("127."), "a pod must listen beyond loopback"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
        assert c[probe]["httpGet"]["port"] in ("http", ports["http"])
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["http"]
    # Service selects the pod and exposes both ports.
    assert all(pod["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items())
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"grpc", "http"}
    # The db lives on the PVC, the token file comes from the Secret.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    db_vol = [n for n, p in mounts.items() if flags["--db"].startswith(p + "/")][0]
    assert vols[db_vol]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    tok_vol = [n for n, p in mounts.items() if flags["--token-file"].startswith(p + "/")][0]
    assert vols[tok_vol]["secret"]["secretName"] == secret["metadata"]["name"]
    assert os.path.basename(flags["--token-file"]) in secret["stringData"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    # Every flag and value in the manifest is accepted by the real daemon.
    run_flared_with(build_dir, tmp_path, flags)


@pytest.mark.parametrize("name", ["flared.yaml", "training-job.yaml"])
def test_k8s_manifests_match_the_kubernetes_api_schema(name):
    """Strict OpenAPI validation (unknown fields rejected) for the oldest Kubernetes the
    manifests claim (1.27: the batch.kubernetes.io/job-name label) and the newest known."""
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate missing (deploy/install-deps.sh)")
    docs = k8s_docs(name)
    assert docs
    for version in ("1.27", kv.latest_version()):
        for doc in docs:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                pytest.fail("%s %s/%s invalid for Kubernetes %s: %s" % (
                    name, doc["kind"], doc["metadata"]["name"], version, e))


def test_k8s_training_job_preloads_the_hook_and_points_at_flared():
    flared_docs = k8s_docs("flared.yaml")
    svc = by_kind(flared_docs, "Service")[0]
    grpc_port = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"][0]
    docs = k8s_docs("training-job.yaml")
    job = by_kind(docs, "Job")[0]
    secret = by_kind(docs, "Secret")[0]
    spec = job["spec"]["template"]["spec"]
    trainer = spec["containers"][0]
    env = {e["name"]: e for e in trainer["env"]}
    preload = env["LD_PRELOAD"]["value"]
    assert os.path.basename(preload) == "libflare_hook.so"
    # The preloaded file is on a volume that an initContainer fills before the trainer starts.
    mount = [m for m in trainer["volumeMounts"] if preload.startswith(m["mountPath"] + "/")][0]
    init = [ic for ic in spec["initContainers"]
            if any(m["name"] == mount["name"] for m in ic["volumeMounts"])]
    assert init, "no initContainer provides %s" % mount["name"]
    assert any(v["name"] == mount["name"] and "emptyDir" in v for v in spec["volumes"])
    host, port = env["FLARE_DAEMON"]["value"].rsplit(":", 1)
    assert host.split(".")[0] == svc["metadata"]["name"] and int(port) == grpc_port
    ref = env["FLARE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert "FLARE_JOB_ID" in env
    # Every FLARE_* variable used is a documented setting.
    documented = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    for name in env:
        if name.startswith("FLARE_"):
            assert "`%s`" % name in documented, name


# --- systemd -------------------------------------------------------------------------------


def read_unit():
    cp = configparser.ConfigParser(strict=False, interpolation=None,
                                   dict_type=dict, allow_no_value=True)
    cp.optionxform = str
    text = open(os.path.join(DEPLOY, "systemd", "flared.service")).read()
    # systemd repeats keys (SystemCallFilter); keep the last, which is enough here.
    cp.read_string(text)
    return cp


def read_env_file():
    env = {}
    for line in open(os.path.join(DEPLOY, "systemd", "flared.env.example")):
        line = line.strip()
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    return env


def test_systemd_unit_and_env_file_start_a_real_flared(build_dir, tmp_path):
    unit = read_unit()
    svc = unit["Service"]
    assert svc["DynamicUser"] == "yes" and svc["StateDirectory"] == "flared"
    assert svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc["EnvironmentFile"].lstrip("-") == "/etc/flare/flared.env"
    env = read_env_file()
    # Expand the ExecStart line as systemd does: ${VAR} as one word, $VAR split on spaces.
    cmd = svc["ExecStart"]
    cmd = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], cmd)
    cmd = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], cmd)
    argv = shlex.split(cmd)
    flags = flag_args(argv[1:])
    assert flags["--db"].startswith("/var/lib/%s/" % svc["StateDirectory"])
    assert flags["--listen"].startswith("127.0.0.1:"), "loopback by default"
    # The token file the env file names is the one LoadCredential provides.
    cred_name, cred_src = svc["LoadCredential"].split(":", 1)
    assert flags["--token-file"] == "/run/credentials/flared.service/" + cred_name
    run_flared_with(build_dir, tmp_path, flags)


def test_systemd_analyze_verify(build_dir, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    text = open(os.path.join(DEPLOY, "systemd", "flared.service")).read()
    unit = tmp_path / "flared.service"
    unit.write_text(text.replace("/usr/local/bin/flared", flared_bin(build_dir)))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=30)
    # Only complaints about this unit count (the host's own units may be odd in a container).
    lines = [l for l in (res.stdout + res.stderr).splitlines() if "flared.service" in l]
    assert not lines, "\n".join(lines)
    # systemd's own hardening score (0 = fully locked down, 10 = exposed): "OK" is below 3.
    res = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                         capture_output=True, text=True, timeout=30)
    m = re.search(r"Overall exposure level for flared.service: ([0-9.]+)", res.stdout)
    if not m:
        pytest.skip("this systemd-analyze has no offline security check: " + res.stderr[-200:])
    assert float(m.group(1)) <= 2.0, res.stdout


# --- Prometheus ----------------------------------------------------------------------------


def promtool():
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool not installed (Debian package prometheus; deploy/install-deps.sh)")
    return path


def test_promtool_checks_config_and_rules():
    tool = promtool()
    for args in (["check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                 ["check", "rules", os.path.join(DEPLOY, "prometheus", "flare_rules.yml")]):
        res = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "SUCCESS" in res.stdout


def test_promtool_rule_unit_tests():
    """Rules fire on the series flared exports: deploy/prometheus/flare_rules_test.yml."""
    tool = promtool()
    res = subprocess.run([tool, "test", "rules", "flare_rules_test.yml"], capture_output=True,
                         text=True, timeout=60, cwd=os.path.join(DEPLOY, "prometheus"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_and_dashboard_use_only_exported_metrics(flared):
    names = exported_names(flared.get("/metrics"))
    assert "flare_alerts_total" in names and "flare_ingest_rejected_total" in names
    used = {}
    for where, expr in rule_exprs() + dashboard_exprs():
        for n in promql_names(expr):
            used.setdefault(n, []).append(where)
    unknown = {n: w for n, w in used.items() if n not in names}
    assert not unknown, "metrics flared does not export: %s" % unknown
    assert len(used) >= 15, sorted(used)


def test_grafana_dashboard_is_well_formed():
    d = dashboard()
    assert d["uid"] and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    grid = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & grid, "panel %r overlaps another" % p["title"]
        grid |= cells
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for topic in ("alerts by team", "rejections", "store", "connected ranks"):
        assert topic in titles


def prom_query(port, query, at=None):
    url = "http://127.0.0.1:%d/api/v1/query?query=%s" % (port, urllib.parse.quote(query))
    if at is not None:
        url += "&time=%.3f" % at
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read().decode())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_real_prometheus_scrapes_real_flared(flared, tmp_path):
    """A real Prometheus server with the shipped scrape job (target rewritten to the test's
    flared, 1 s interval) and the shipped rules scrapes flared: up == 1, flare_ series stored,
    every rule evaluates without error, and the dashboard's queries run."""
    server = shutil.which("prometheus")
    if not server:
        pytest.skip("prometheus server not installed (Debian package prometheus)")
    cfg = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
    job = [j for j in cfg["scrape_configs"] if j["job_name"] == "flared"][0]
    job["static_configs"] = [{"targets": ["127.0.0.1:%d" % flared.http]}]
    job["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    shutil.copy(os.path.join(DEPLOY, "prometheus", "flare_rules.yml"), tmp_path / "flare_rules.yml")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(
        [server, "--config.file=%s" % (tmp_path / "prometheus.yml"),
         "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
         "--web.listen-address=127.0.0.1:%d" % port, "--web.enable-lifecycle"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 15
        up, metric, rules_ok = None, None, False
        while time.time() < deadline:
            assert proc.poll() is None, open(tmp_path / "prometheus.log").read()
            try:
                up = prom_query(port, 'up{job="flared"}')
                metric = prom_query(port, 'flare_store_live_bytes{job="flared"}')
                with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/rules" % port,
                                            timeout=5) as r:
                    groups = json.loads(r.read().decode())["data"]["groups"]
                rules = [rl for g in groups for rl in g["rules"]]
                rules_ok = rules and all(rl.get("lastEvaluation", "").startswith("20")
                                         and not rl["lastEvaluation"].startswith("0001")
                                         for rl in rules)
            except OSError:
                time.sleep(0.2)
                continue
            if up and metric and rules_ok:
                break
            time.sleep(0.2)
        assert up and up[0]["value"][1] == "1", up
        # The stored value is flared's own: compare with its /metrics right now (the db only
        # grows by maintenance, which runs once a minute).
        live = re.search(r"^flare_store_live_bytes (\d+)", flared.get("/metrics"), re.M)
        assert metric and float(metric[0]["value"][1]) == float(live.group(1))
        assert rules_ok, "rules not evaluated"
        assert len(rules) == len(rule_exprs())
        for rl in rules:
            assert rl["health"] == "ok", rl
        # No daemon alert fires on a healthy, idle flared.
        firing = [rl["name"] for rl in rules if rl.get("state") == "firing"]
        assert not firing, firing
        # Every dashboard query is valid PromQL on this server.
        for title, expr in dashboard_exprs():
            q = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
            prom_query(port, q)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_detector_alert_reaches_prometheus_with_the_labels_rules_and_dashboard_use(
        build_dir, flared, tmp_path):
    """A real traced job (8 sim ranks, rank 3 under-clocked) streams to flared through `flare
    run`; flared raises gpu_slow; Prometheus stores it as flare_alerts_total with the labels
    the shipped rule groups by (exported_job, kind, team), and the rule's new-series branch
    fires for it (its 5-minute windows shortened to 4 s so the test stays short)."""
    server = shutil.which("prometheus")
    if not server:
        pytest.skip("prometheus server not installed (Debian package prometheus)")
    if not os.path.exists(os.path.join(build_dir, "lib", "libflare_hook.so")):
        pytest.skip("libflare_hook.so not built")
    # Restart flared with the detectors every second (the fixture's runs every 10 s).
    flared.stop()
    (tmp_path / "d2").mkdir()
    d = Flared(build_dir, tmp_path / "d2", ["--diagnose-interval-s", "1"])
    try:
        cfg = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
        job = [j for j in cfg["scrape_configs"] if j["job_name"] == "flared"][0]
        job["static_configs"] = [{"targets": ["127.0.0.1:%d" % d.http]}]
        job["scrape_interval"] = "1s"
        cfg.pop("rule_files", None)
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        port = free_port()
        proc = subprocess.Popen(
            [server, "--config.file=%s" % (tmp_path / "prometheus.yml"),
             "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % port],
            stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT)
        try:
            # Prometheus scrapes flared for a few seconds before the job (the rule's new-series
            # branch needs the daemon to have been up one window earlier).
            deadline = time.time() + 15
            while time.time() < deadline:
                try:
                    if len(prom_query(port, 'up{job="flared"}[10s]')[0]["values"]) >= 6:
                        break
                except (OSError, IndexError):
                    pass
                time.sleep(0.3)
            env = dict(os.environ, FLARE_OUTPUT_DIR=str(tmp_path / "spool"),
                       FLARE_SIM_CLOCK_FACTOR="3:0.8")
            res = subprocess.run(
                [os.path.join(build_dir, "bin", "flare"), "run", "--daemon",
                 "127.0.0.1:%d" % d.grpc, "--job-id", "slowgpu", "--quiet", "--",
                 os.path.join(build_dir, "bin", "flare-sim-train"), "--ranks", "8", "--steps",
                 "6", "--layers", "4", "--tp", "2", "--quiet"],
                capture_output=True, text=True, timeout=120, env=env)
            assert res.returncode == 0, res.stderr
            want = {"exported_job": "slowgpu", "kind": "gpu_slow", "team": "operations",
                    "job": "flared"}
            deadline = time.time() + 20
            got, rule = [], []
            expr = [e for a, e in rule_exprs() if a == "FlareDiagnosis"][0]
            while time.time() < deadline:
                got = prom_query(port, "flare_alerts_total")
                if got:
                    break
                time.sleep(0.2)
            assert got, open(d.log_path).read()
            # Evaluate the rule 1 s after the series' first sample (query at a past time).
            first = float(prom_query(port, "flare_alerts_total[1h]")[0]["values"][0][0])
            rule = prom_query(port, expr.replace("5m", "4s"), at=first + 1)
            # ...and 6 s later (beyond the 4 s window) it has resolved.
            if time.time() < first + 7:
                time.sleep(first + 7 - time.time())
            assert prom_query(port, expr.replace("5m", "4s"), at=first + 6) == []
            assert [(r["metric"].get("exported_job"), r["metric"]["kind"], r["metric"]["team"],
                     r["metric"]["job"], r["value"][1]) for r in got] == \
                [(want["exported_job"], want["kind"], want["team"], "flared", "1")], got
            # The dashboard's alert panels count it: 1 in the last 24 h, 1 for team operations.
            panels = {t: e.replace("$instance", ".*") for t, e in dashboard_exprs()}
            day = prom_query(port, panels["Alerts (24h)"])
            assert [r["value"][1] for r in day] == ["1"], day
            team = prom_query(port, panels["Alerts by team (cumulative)"])
            assert [(r["metric"]["team"], r["value"][1]) for r in team] == [("operations", "1")]
            # The rule's label set is exactly what Alertmanager routes on.
            assert [{k: r["metric"][k] for k in r["metric"]} for r in rule] == \
                [{"exported_job": "slowgpu", "kind": "gpu_slow", "team": "operations"}], rule
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    finally:
        d.stop()
