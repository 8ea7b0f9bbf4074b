// flared: the central Flare daemon. Parses flags, opens the store, rebuilds state from it,
// starts the gRPC and HTTP adapters, and runs the persistence/maintenance loop on the main
// thread until SIGINT/SIGTERM. See src/engine/README.md and docs/configuration.md.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/json_util.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/common/log.h"
#include "src/common/text.h"
#include "src/engine/analyzer.h"
#include "src/engine/api.h"
#include "src/engine/auth.h"
#include "src/engine/deep_trace_trigger.h"
#include "src/engine/grpc_server.h"
#include "src/engine/hang_monitor.h"
#include "src/engine/http_server.h"
#include "src/engine/ingest.h"
#include "src/engine/metrics.h"
#include "src/engine/sqlite_store.h"
#include "src/engine/webhook.h"
#ifdef FLARE_WITH_PG
#include "src/engine/pg_store.h"
#endif

namespace {

using namespace flare::engine;

std::atomic<bool> g_stop{false};
void onSignal(int) {
  g_stop = true;
}

struct Flag {
  const char* name;
  const char* value_name;
  const char* help;
  std::string value;  // default, replaced when given
};

// Every flag, its default and its help (--help prints this table; docs/configuration.md
// documents the same list).
std::map<std::string, Flag> defaultFlags() {
  std::map<std::string, Flag> f;
  auto add = [&](const char* name, const char* vn, const char* def, const char* help) {
    f[name] = Flag{name, vn, help, def};
  };
  add("listen", "HOST:PORT", "127.0.0.1:7070",
      "gRPC address of the Ingest and Query services (port 0: any free port)");
  add("http", "HOST:PORT", "127.0.0.1:9464",
      "HTTP address of /metrics, /healthz and the JSON API; 'off' disables it");
  add("db", "PATH", "flared.db",
      "SQLite database file (created; WAL mode), or a PostgreSQL URI postgresql://... (shared "
      "history; when built with libpq)");
  add("token-file", "PATH", "",
      "lines 'job_id token'; job_id '*' sets the token of every other job. Without it every rank "
      "is accepted");
  add("tls-cert", "PATH", "",
      "PEM certificate chain: serve gRPC and HTTP over TLS (HTTPS; needs --tls-key)");
  add("tls-key", "PATH", "", "PEM private key for --tls-cert");
  add("tls-client-ca", "PATH", "",
      "PEM root(s): with TLS, ranks must present a client certificate verified by it (gRPC; HTTP "
      "clients authenticate with tokens)");
  add("max-message-bytes", "N", "8388608",
      "largest message a rank may send (bigger: rejected, counted as oversized)");
  add("max-batch-items", "N", "200000",
      "most records+summaries+spans+steps+table entries in one batch");
  add("max-jobs", "N", "4096", "most jobs the daemon keeps");
  add("max-ranks-per-job", "N", "65536", "most ranks of one job");
  add("max-signatures-per-rank", "N", "65536", "most signatures one rank stream may define");
  add("rank-rate-limit", "RECORDS_PER_S", "2000000",
      "per-rank token bucket on records (2 s burst); 0: unlimited");
  add("store-raw", "0|1", "1", "keep raw kernel records in the store (timelines)");
  add("summary-window-s", "S", "60",
      "ranks' summaries are folded into stored rows per rank, signature, stream and window of this "
      "length");
  add("raw-retention-s", "S", "3600",
      "raw records older than this are folded into 1-minute summaries");
  add("summary-retention-s", "S", "2592000",
      "window summaries and alerts older than this are deleted");
  add("db-max-bytes", "N", "10737418240",
      "size cap of the live database; oldest raw records, then summaries, are evicted");
  add("persist-interval-ms", "MS", "1000",
      "how often job/rank/aggregate state is written to the store");
  add("maintain-interval-s", "S", "60", "how often retention and the size cap run");
  add("diagnose-interval-s", "S", "10",
      "how often the detectors run over each job's last 2 minutes of records (0: off)");
  add("fold-after-s", "S", "10",
      "summary-mode ranks' kernel summaries and step sketches older than this are folded into "
      "10-second buckets in the detectors' window (bounds the daemon's memory per rank; 0: never)");
  add("hang-timeout-s", "S", "300",
      "a connected rank with no new records this long opens a hang incident (0: only ranks' "
      "watchdog reports open incidents)");
  add("hang-answer-timeout-s", "S", "10", "how long a hang incident waits for ranks' answers");
  add("device-peak", "SPEC", "",
      "one more peak-table entry, taking precedence over the built-in ones: "
      "NAME:bf16=T,fp16=T,fp8=T,tf32=T,fp32=T,mem_gbps=G,sms=N,match=WORDS (un-optimized GEMMs)");
  add("samples-per-step", "N", "0",
      "the job batch size, for flare_job_samples_per_second (0: from step markers, when ranks "
      "report it)");
  add("webhook-url", "URL", "",
      "post each new (deduplicated) diagnosis as JSON to this http:// URL (none: off)");
  add("webhook-timeout-ms", "MS", "3000", "per webhook attempt: connect, send, status line");
  add("webhook-attempts", "N", "4",
      "attempts per diagnosis; retries back off from 500 ms, doubling (then counted as failed)");
  add("webhook-queue", "N", "1000", "diagnoses waiting for the webhook; beyond: dropped, counted");
  add("deep-trace-steps", "N", "3",
      "when a detector raises a new alert naming one rank, deep-trace (CUPTI) that rank and a "
      "healthy peer for N steps; 0: off");
  add("deep-trace-interval-s", "S", "600", "at most one automatic deep trace per job this often");
  add("hang-kill", "0|1", "1",
      "after a conclusive hang diagnosis (stored, alert posted), send Exit to the ranks that "
      "opted in with FLARE_HANG_KILL=1 (0: never, whatever the ranks set)");
  add("http-max-connections", "N", "256",
      "HTTP connections served at once (each on its own thread); beyond: 503 at once");
  add("http-header-timeout-ms", "MS", "10000",
      "an HTTP client must send its request line and headers within this");
  add("http-idle-timeout-ms", "MS", "5000", "longest gap between an HTTP client's bytes");
  add("http-request-timeout-ms", "MS", "30000",
      "a whole HTTP exchange (request, handler, answer) must end within this");
  add("hello-timeout-ms", "MS", "10000",
      "a rank stream must send an accepted hello within this, or it is ended");
  add("max-streams-per-peer", "N", "4096",
      "rank streams open at once from one IP address; beyond: refused (0: no bound)");
  add("insecure", "0|1", "0",
      "1: serve a non-loopback --listen/--http address without --token-file (anyone who reaches "
      "it reads every job and changes baselines and ranks; warned once a minute)");
  add("ready-file", "PATH", "", "write 'GRPC_PORT HTTP_PORT' here once listening (tests, scripts)");
  return f;
}

void usage(const std::map<std::string, Flag>& flags) {
  std::printf(
      "usage: flared [--flag=value | --flag value]...\n"
      "The central Flare daemon: ingests rank streams over gRPC, keeps per-job state in SQLite,\n"
      "serves Prometheus metrics and a query API. Environment: FLARE_LOG_LEVEL.\n\n");
  for (const auto& [name, f] : flags) {
    std::printf("  --%s %s\n      %s (default: %s)\n", name.c_str(), f.value_name, f.help,
                f.value.empty() ? "none" : f.value.c_str());
  }
}

// True when `address` (HOST:PORT, [V6]:PORT or unix:PATH) is reachable only from this host.
bool loopbackAddress(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return true;
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The detectors' windows are many per-rank vectors that grow, fold and shrink every few
  // seconds. With glibc's defaults the larger ones are mmap'd and the heap's top is returned to
  // the kernel, so each regrowth faults in freshly zeroed pages: a quarter of the daemon's CPU
  // at 10,000 ranks (perf, docs/benchmarks.md). Keep freed memory for reuse instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  auto flags = defaultFlags();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(flags);
      return 0;
    }
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "flared: unexpected argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
    a = a.substr(2);
    std::string value;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
      a.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "flared: --%s needs a value\n", a.c_str());
      return 2;
    }
    auto it = flags.find(a);
    if (it == flags.end()) {
      std::fprintf(stderr, "flared: unknown flag --%s (see --help)\n", a.c_str());
      return 2;
    }
    it->second.value = value;
  }
  auto str = [&](const char* n) { return flags[n].value; };
  bool bad = false;
  auto num = [&](const char* n) -> uint64_t {
    uint64_t v = 0;
    if (!parseU64(flags[n].value, &v)) {
      std::fprintf(stderr, "flared: --%s must be a non-negative integer, got '%s'\n", n,
                   flags[n].value.c_str());
      bad = true;
    }
    return v;
  };

  IngestConfig cfg;
  cfg.max_message_bytes = num("max-message-bytes");
  cfg.max_batch_items = num("max-batch-items");
  cfg.max_jobs = num("max-jobs");
  cfg.max_ranks_per_job = num("max-ranks-per-job");
  cfg.max_signatures_per_rank = num("max-signatures-per-rank");
  cfg.rank_rate_limit = static_cast<double>(num("rank-rate-limit"));
  cfg.store_raw = num("store-raw") != 0;
  cfg.summary_window_ns =
      static_cast<int64_t>(std::max<uint64_t>(num("summary-window-s"), 1)) * 1000000000LL;
  RetentionPolicy retention;
  retention.raw_window_ns = static_cast<int64_t>(num("raw-retention-s")) * 1000000000LL;
  retention.summary_window_ns = static_cast<int64_t>(num("summary-retention-s")) * 1000000000LL;
  retention.max_bytes = static_cast<int64_t>(num("db-max-bytes"));
  const auto persist_ms = static_cast<int64_t>(num("persist-interval-ms"));
  const auto maintain_s = static_cast<int64_t>(num("maintain-interval-s"));
  if (bad) return 2;
  if (cfg.max_message_bytes == 0 || cfg.max_message_bytes > (1u << 30)) {
    std::fprintf(stderr, "flared: --max-message-bytes must be in [1, 2^30]\n");
    return 2;
  }
  std::string error;
  TokenSet tokens;
  if (!str("token-file").empty()) {
    if (!loadTokenFile(str("token-file"), &tokens, &error)) {
      std::fprintf(stderr, "flared: %s\n", error.c_str());
      return 2;
    }
    cfg.job_tokens = tokens.job_tokens;
    cfg.default_token = tokens.default_token;
  }
  const bool insecure = num("insecure") != 0;
  if (bad) return 2;
  // Without tokens, whoever reaches a port reads every job and changes baselines and ranks:
  // only loopback, unless the operator says --insecure (warned about once a minute below).
  std::vector<std::string> exposed;
  for (const char* f : {"listen", "http"}) {
    const std::string& a = str(f);
    if (!(std::string(f) == "http" && (a.empty() || a == "off")) && !loopbackAddress(a))
      exposed.push_back("--" + std::string(f) + " " + a);
  }
  if (!tokens.enabled() && !exposed.empty() && !insecure) {
    std::fprintf(stderr,
                 "flared: %s is not a loopback address and no --token-file is given: anyone who "
                 "reaches it could read every job and change baselines and ranks. Give "
                 "--token-file (deploy/README.md), bind 127.0.0.1, or accept the risk with "
                 "--insecure 1\n",
                 exposed.front().c_str());
    return 2;
  }
  const bool warn_insecure = !tokens.enabled() && !exposed.empty();
  if (str("tls-cert").empty() != str("tls-key").empty()) {
    std::fprintf(stderr, "flared: --tls-cert and --tls-key go together\n");
    return 2;
  }
  if (!str("tls-client-ca").empty() && str("tls-cert").empty()) {
    std::fprintf(stderr, "flared: --tls-client-ca needs --tls-cert and --tls-key\n");
    return 2;
  }

  // Undecodable rank messages are counted (flare_ingest_rejected_total{reason="malformed"})
  // and answered with a status; protobuf's own error line per bad string would let a client
  // flood the log, so its log handler is off.
  google::protobuf::SetLogHandler(nullptr);

  SqliteStore::Options so;
  so.path = str("db");
  std::unique_ptr<Store> store;
  const bool pg = so.path.rfind("postgresql://", 0) == 0 || so.path.rfind("postgres://", 0) == 0;
  if (pg) {
#ifdef FLARE_WITH_PG
    store = PgStore::open({so.path}, &error);
#else
    error = "this flared was built without libpq: --db postgresql://... is not available";
#endif
  } else {
    store = SqliteStore::open(so, &error);
  }
  if (!store) {
    std::fprintf(stderr, "flared: %s\n", error.c_str());
    return 1;
  }
  RealtimeClock wall;
  // The webhook (webhook.h): every new diagnosis, posted off the analyzer's thread.
  std::unique_ptr<Webhook> webhook;
  if (!str("webhook-url").empty()) {
    WebhookOptions wo;
    wo.url = str("webhook-url");
    wo.timeout_ms = static_cast<int64_t>(num("webhook-timeout-ms"));
    wo.max_attempts = static_cast<int>(std::min<uint64_t>(num("webhook-attempts"), 100));
    wo.max_queue = num("webhook-queue");
    if (bad) return 2;
    webhook = Webhook::start(wo, &error);
    if (!webhook) {
      std::fprintf(stderr, "flared: %s\n", error.c_str());
      return 2;
    }
  }
  // The detectors: fed every accepted batch, run every --diagnose-interval-s.
  Ingest* ingest_ptr = nullptr;  // set once the Ingest exists (before any batch arrives)
  AnalyzerOptions ao;
  ao.samples_per_step = num("samples-per-step");
  ao.fold_after_ns = static_cast<int64_t>(num("fold-after-s")) * 1000000000LL;
  // The per-device peak table of the un-optimized GEMM detector, with --device-peak on top.
  flare::stats::PeakTable peaks = flare::stats::PeakTable::builtin();
  if (!str("device-peak").empty()) {
    auto entry = flare::stats::parseDevicePeak(str("device-peak"), &error);
    if (!entry) {
      std::fprintf(stderr, "flared: --device-peak: %s\n", error.c_str());
      return 2;
    }
    peaks.add(*entry);
  }
  ao.diagnose.peaks = &peaks;
  if (bad) return 2;
  ao.rank_meta = [&ingest_ptr](const std::string& job, int32_t rank) {
    RankMeta meta;
    if (ingest_ptr == nullptr) return meta;
    flare::v1::ListRanksRequest req;
    req.set_job_id(job);
    req.set_rank(rank);  // one rank: asking for all of them per new rank was O(ranks²)
    flare::v1::ListRanksResponse out;
    if (ingest_ptr->ranks(req, &out) != Code::kOk) return meta;
    for (const auto& r : out.ranks()) {
      if (r.rank() == rank) {
        meta.host = r.host();
        meta.device_name = r.device_name();
        meta.device_uuid = r.device_uuid();
      }
    }
    flare::v1::ListJobsRequest jr;
    jr.set_include_finished(true);
    const flare::v1::ListJobsResponse jobs = ingest_ptr->listJobs(jr);
    for (const auto& j : jobs.jobs()) {
      if (j.job_id() == job) meta.world_size = j.world_size();
    }
    return meta;
  };
  if (webhook) {
    ao.on_alert = [&webhook](const flare::v1::Alert& a, const Diagnosis& d) {
      const HttpResponse alert = jsonResponse(a);
      std::string body = alert.body;
      while (!body.empty() && body.back() == '\n') body.pop_back();
      webhook->post("{\"alert\":" + body + ",\"diagnosis\":" + diagnosisToJson(d) + "}");
    };
  }
  Analyzer analyzer(store.get(), std::move(ao));
  const auto diagnose_s = static_cast<int64_t>(num("diagnose-interval-s"));
  if (diagnose_s > 0) {
    cfg.on_batch = [&analyzer](const std::string& job, int32_t rank,
                               const flare::v1::RecordBatch& b) { analyzer.onBatch(job, rank, b); };
    cfg.on_refused = [&analyzer](const std::string& job, int32_t rank, const char* reason,
                                 uint64_t batches, uint64_t items, const std::string& why,
                                 int64_t now_ns) {
      analyzer.onRefused(job, rank, reason, batches, items, why, now_ns);
    };
  }
  // A rank's watchdog report wakes the hang monitor at once.
  std::atomic<HangMonitor*> hang_monitor{nullptr};
  cfg.on_hang_report = [&hang_monitor] {
    if (HangMonitor* h = hang_monitor.load()) h->notify();
  };
  Ingest ingest(cfg, store.get(), wall);
  ingest.loadFromStore();
  ingest_ptr = &ingest;
  // Hang incidents (hang_monitor.h): ranks' watchdog reports or silent ranks -> DumpStacks/
  // Inspect -> analysis -> alert.
  HangMonitorOptions hmo;
  hmo.hang_timeout_ns = static_cast<int64_t>(num("hang-timeout-s")) * 1'000'000'000;
  hmo.answer_timeout_ns = static_cast<int64_t>(num("hang-answer-timeout-s")) * 1'000'000'000;
  hmo.poll_interval_ns = std::clamp<int64_t>(hmo.hang_timeout_ns / 8, 50'000'000, 1'000'000'000);
  if (hmo.hang_timeout_ns <= 0) hmo.poll_interval_ns = 1'000'000'000;
  hmo.kill_after_diagnosis = num("hang-kill") != 0;
  HangMonitor hangs(ingest, store.get(), wall, hmo);
  hangs.start();
  hang_monitor.store(&hangs);
  // Deep trace on alert (deep_trace_trigger.h): the named rank and a healthy peer.
  DeepTraceTriggerOptions dto;
  dto.steps = static_cast<uint32_t>(std::min<uint64_t>(num("deep-trace-steps"), 1000));
  dto.min_interval_ns = static_cast<int64_t>(num("deep-trace-interval-s")) * 1'000'000'000;
  DeepTraceTrigger deep_trace(
      dto,
      [&ingest](const std::string& job) {
        flare::v1::ListRanksRequest r;
        r.set_job_id(job);
        flare::v1::ListRanksResponse out;
        std::vector<int32_t> ranks;
        if (ingest.ranks(r, &out) != Code::kOk) return ranks;
        for (const auto& rk : out.ranks()) {
          if (rk.connected()) ranks.push_back(rk.rank());
        }
        return ranks;
      },
      [&ingest](const flare::v1::SendCommandRequest& req) {
        flare::v1::SendCommandResponse resp;
        std::string err;
        ingest.sendCommandTrusted(req, &resp, &err);
      });

  GrpcServer* grpc_ptr = nullptr;
  HttpServer* http_ptr = nullptr;
  auto metrics = [&] {
    PromWriter w;
    ingest.writeMetrics(w);
    store->writeMetrics(w);
    analyzer.writeMetrics(w);
    hangs.writeMetrics(w);
    if (webhook) {
      webhook->writeMetrics(w);
    } else {
      Webhook::writeMetricsOf(w, 0, 0, 0, 0, 0);
    }
    w.family("flare_deep_traces_triggered_total", "counter",
             "Deep traces flared asked for on its own (a new alert naming one rank), and those "
             "suppressed by --deep-trace-interval-s.");
    w.sample("flare_deep_traces_triggered_total", deep_trace.triggered(), {{"result", "sent"}});
    w.sample("flare_deep_traces_triggered_total", deep_trace.suppressed(),
             {{"result", "rate_limited"}});
    if (grpc_ptr) grpc_ptr->writeMetrics(w);
    if (http_ptr) {
      w.family("flare_http_requests_total", "counter",
               "HTTP connections served (all), of which malformed (bad) or cut off by a timeout "
               "(timeout); connections refused over --http-max-connections (busy).");
      w.sample("flare_http_requests_total", http_ptr->requests(), {{"result", "all"}});
      w.sample("flare_http_requests_total", http_ptr->badRequests(), {{"result", "bad"}});
      w.sample("flare_http_requests_total", http_ptr->timeouts(), {{"result", "timeout"}});
      w.sample("flare_http_requests_total", http_ptr->busyRefused(), {{"result", "busy"}});
      w.family("flare_http_connections", "gauge", "HTTP connections being served now.");
      w.sample("flare_http_connections", static_cast<double>(http_ptr->connections()));
    }
    return w.take();
  };
  QueryApi api(ingest, store.get(), metrics);
  api.setTokens(tokens);
  api.setReportEnricher([&analyzer](flare::v1::GetReportResponse* r) { analyzer.enrichReport(r); });
  api.setAnalysis(&analyzer, &hangs, &wall);

  GrpcOptions go;
  go.listen = str("listen");
  go.tls_cert_file = str("tls-cert");
  go.tls_key_file = str("tls-key");
  go.tls_client_ca_file = str("tls-client-ca");
  go.max_message_bytes = cfg.max_message_bytes;
  go.hello_timeout_ms = static_cast<int64_t>(std::max<uint64_t>(num("hello-timeout-ms"), 1));
  go.max_streams_per_peer = num("max-streams-per-peer");
  if (bad) return 2;
  GrpcServer grpc(ingest, api, go);
  if (!grpc.start(&error)) {
    std::fprintf(stderr, "flared: %s\n", error.c_str());
    return 1;
  }
  grpc_ptr = &grpc;
  HttpServerOptions hso;
  hso.max_connections = std::max<uint64_t>(num("http-max-connections"), 1);
  hso.header_timeout_ms =
      static_cast<int64_t>(std::max<uint64_t>(num("http-header-timeout-ms"), 1));
  hso.idle_timeout_ms = static_cast<int64_t>(std::max<uint64_t>(num("http-idle-timeout-ms"), 1));
  hso.request_timeout_ms =
      static_cast<int64_t>(std::max<uint64_t>(num("http-request-timeout-ms"), 1));
  // HTTPS with the gRPC port's certificate. HTTP clients (Prometheus, the CLI, operators)
  // authenticate with tokens; --tls-client-ca is for ranks, on the gRPC port only.
  hso.tls_cert_file = str("tls-cert");
  hso.tls_key_file = str("tls-key");
  if (bad) return 2;
  HttpServer http([&](const HttpRequest& r) { return api.http(r); }, hso);
  if (str("http") != "off" && !str("http").empty()) {
    if (!http.start(str("http"), &error)) {
      std::fprintf(stderr, "flared: %s\n", error.c_str());
      return 1;
    }
    http_ptr = &http;
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  FLARE_LOG_INFO("engine", "flared: gRPC on port {}{}, HTTP on port {}{}, db {}", grpc.port(),
                 go.tls_cert_file.empty() ? "" : " (TLS)", http.port(),
                 hso.tls_cert_file.empty() ? "" : " (TLS)",
                 pg ? std::string("PostgreSQL") : so.path);  // a URI may hold a password
  if (!str("ready-file").empty()) {
    const std::string tmp = str("ready-file") + ".tmp";
    std::ofstream(tmp) << grpc.port() << " " << http.port() << "\n";
    std::rename(tmp.c_str(), str("ready-file").c_str());
  }

  const auto persist_every = std::chrono::milliseconds(std::max<int64_t>(persist_ms, 10));
  const auto maintain_every = std::chrono::seconds(std::max<int64_t>(maintain_s, 1));
  auto next_persist = std::chrono::steady_clock::now() + persist_every;
  auto next_maintain = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  auto next_insecure_warning = std::chrono::steady_clock::now();
  // The detectors run on their own thread, so that a long analysis (thousands of ranks) never
  // delays checkpoints and retention on this one. The next run starts --diagnose-interval-s after
  // the last one ended, or three times its duration when that is longer: the analysis takes at
  // most about a quarter of a core whatever the jobs' size, and ingest keeps the rest.
  std::thread analysis;
  if (diagnose_s > 0) {
    analysis = std::thread([&] {
      const auto interval = std::chrono::seconds(diagnose_s);
      auto next = std::chrono::steady_clock::now() + interval;
      auto next_hand_over = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      bool said = false;
      while (!g_stop) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const auto now = std::chrono::steady_clock::now();
        if (now >= next_hand_over) {  // arriving records join the analysed window each second
          analyzer.handOver();
          next_hand_over = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        }
        if (now < next) continue;
        const auto t0 = std::chrono::steady_clock::now();
        deep_trace.onAlerts(analyzer.run(wall.nowNs()), wall.nowNs());
        const auto t1 = std::chrono::steady_clock::now();
        const auto took = t1 - t0;
        next = t1 + std::max<std::chrono::steady_clock::duration>(interval, 3 * took);
        if (3 * took > interval && !said) {
          said = true;
          FLARE_LOG_WARN("engine",
                         "a detector run took {:.1f} s; runs are spaced by 3x their duration "
                         "instead of --diagnose-interval-s {} while that lasts (said once)",
                         std::chrono::duration<double>(took).count(), diagnose_s);
        }
      }
    });
  }
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_persist) {
      ingest.persist();
      next_persist = now + persist_every;
    }
    if (warn_insecure && now >= next_insecure_warning) {
      FLARE_LOG_WARN("engine",
                     "INSECURE: {} without --token-file (--insecure 1): anyone who reaches it "
                     "reads every job and may change baselines and send commands (said once a "
                     "minute)",
                     exposed.front());
      next_insecure_warning = now + std::chrono::minutes(1);
    }
    if (now >= next_maintain) {
      const MaintenanceResult m = store->maintain(wall.nowNs(), retention);
      if (m.evicted > 0) {
        FLARE_LOG_WARN("engine", "store over --db-max-bytes: evicted {} rows", m.evicted);
      }
      next_maintain = std::chrono::steady_clock::now() + maintain_every;
    }
  }
  FLARE_LOG_INFO("engine", "flared: shutting down");
  hangs.stop();
  http.stop();
  grpc.shutdown();
  if (analysis.joinable()) analysis.join();
  if (diagnose_s > 0) analyzer.run(wall.nowNs());  // what arrived since the last run
  if (webhook) webhook->drain(2 * static_cast<int64_t>(num("webhook-timeout-ms")));
  ingest.persist(/*final=*/true);
  store->flush();
  return 0;
}
