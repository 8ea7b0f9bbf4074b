// The runtime's settings and its sink (sink_setup.h).
#include "src/hook/sink_setup.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "src/common/config.h"
#include "src/common/log.h"
#include "src/hook/launch_sampling.h"
#include "src/hook/step_boundary.h"
#include "src/timing/transport.h"

namespace flare::hook {
namespace {

// The directory of libflare_hook.so, where libflare_exporter.so is built and installed.
std::string hookDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&hookDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Reads a whole (PEM) file; false with the reason in *error.
bool readPemFile(const char* setting, const std::string& path, std::string* out,
                 std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  if (in) buf << in.rdbuf();
  if (!in || buf.str().empty()) {
    *error = std::string(setting) + "=" + path + " cannot be read (" +
             (in ? "empty file" : std::strerror(errno)) + ")";
    return false;
  }
  *out = buf.str();
  return true;
}

}  // namespace

// FLARE_MODE: summary sends compute kernels as per-window KernelSummary messages and each step as
// StepStats (collectives, p2p and sync spans stay raw); raw sends every op. Unset: summary when
// streaming to flared (always-on monitoring), raw for a local spool (offline tracing is for
// timelines, which need every op). Anything else: one warning, the default.
bool summaryMode(bool streaming) {
  const char* fallback = streaming ? "summary" : "raw";
  const std::string mode = common::envString("FLARE_MODE", fallback);
  if (mode == "summary") return true;
  if (mode != "raw") {
    common::logOnce(common::LogLevel::kWarn, "hook", "bad-mode",
                    "flare: FLARE_MODE={} is not raw|summary; using {}", mode, fallback);
    return streaming;
  }
  return false;
}

// FLARE_TIMING: pair (a start and an end event per op) or end (the end event only;
// TracerOptions::end_only). Anything else: one warning, pair. With 1-in-N sampled launches
// (FLARE_SAMPLE_KERNELS, FLARE_SAMPLE_CALLS or FLARE_SAMPLE_STEPS > 1) end is refused (one warning,
// pair): an op's start would be the end of the previous *timed* op on its stream, and the untimed
// kernels between them would be counted in its duration.
bool endOnlyTiming() {
  const std::string timing = common::paramString("FLARE_TIMING");
  if (timing == "end" &&
      (sampleKernelsSetting() > 1 || sampleCallsSetting() > 1 || stepSamplingAsked())) {
    common::logOnce(common::LogLevel::kWarn, "hook", "end-timing-sampled",
                    "flare: FLARE_TIMING=end is not used with FLARE_SAMPLE_KERNELS={} "
                    "FLARE_SAMPLE_CALLS={} FLARE_SAMPLE_STEPS={} FLARE_TIMING_BUDGET_PCT={} (the "
                    "untimed ops would count in the next op's duration); using pair",
                    sampleKernelsSetting(), sampleCallsSetting(), sampleStepsSetting(),
                    timingBudgetPct());
    return false;
  }
  if (timing == "end") return true;
  if (timing != "pair") {
    common::logOnce(common::LogLevel::kWarn, "hook", "bad-timing",
                    "flare: FLARE_TIMING={} is not pair|end; using pair", timing);
  }
  return false;
}

// The batch bounds (FLARE_BATCH_BYTES, FLARE_BATCH_INTERVAL_MS), for the exporter and the spool.
size_t batchBytes() {
  return static_cast<size_t>(common::paramInt("FLARE_BATCH_BYTES", 1 << 10, 64 << 20));
}
int64_t batchIntervalNs() {
  return common::paramInt("FLARE_BATCH_INTERVAL_MS", 10, 3'600'000) * 1'000'000;
}

// FLARE_DAEMON set: the exporter over libflare_exporter.so (dlopened RTLD_LOCAL, see
// src/timing/transport.h); nullptr (one warning) when it cannot be loaded or its TLS settings
// cannot be used: the spool is used (never plaintext when TLS was asked for).
std::unique_ptr<timing::GrpcExporter> makeExporter(const common::Identity& id,
                                                   const std::string& daemon,
                                                   const std::string& dir,
                                                   timing::CommandHandler* handler) {
  std::string lib = common::paramString("FLARE_EXPORTER_LIB");
  if (lib.empty()) lib = hookDirectory() + "/libflare_exporter.so";
  std::string error;
  timing::TransportOptions topts;
  const std::string ca_path = common::paramString("FLARE_TLS_CA");
  const std::string cert_path = common::paramString("FLARE_TLS_CERT");
  const std::string key_path = common::paramString("FLARE_TLS_KEY");
  const std::string server_name = common::paramString("FLARE_TLS_SERVER_NAME");
  std::string ca, cert, key;
  bool tls_ok = true;
  if (!ca_path.empty() || !cert_path.empty() || !key_path.empty() || !server_name.empty()) {
    if (ca_path.empty()) {
      error = "FLARE_TLS_CERT/KEY/SERVER_NAME are set but FLARE_TLS_CA is not";
      tls_ok = false;
    } else if (cert_path.empty() != key_path.empty()) {
      error = "FLARE_TLS_CERT and FLARE_TLS_KEY go together";
      tls_ok = false;
    } else {
      tls_ok = readPemFile("FLARE_TLS_CA", ca_path, &ca, &error) &&
               (cert_path.empty() || (readPemFile("FLARE_TLS_CERT", cert_path, &cert, &error) &&
                                      readPemFile("FLARE_TLS_KEY", key_path, &key, &error)));
    }
    if (!tls_ok) {
      FLARE_LOG_WARN("hook",
                     "flare: TLS to the daemon {} is misconfigured: {}; writing to the spool",
                     daemon, error);
      return nullptr;
    }
    topts.tls = true;
    topts.tls_root_pem = ca.c_str();
    topts.tls_cert_pem = cert.empty() ? nullptr : cert.c_str();
    topts.tls_key_pem = key.empty() ? nullptr : key.c_str();
    topts.tls_server_name = server_name.empty() ? nullptr : server_name.c_str();
  }
  auto transport = timing::loadTransport(lib, daemon, topts, &error);
  if (!transport) {
    FLARE_LOG_WARN("hook", "flare: cannot stream to the daemon {} ({}); writing to the spool",
                   daemon, error);
    return nullptr;
  }
  timing::ExporterOptions o;
  o.identity = id;
  o.mode = summaryMode(true) ? flare::v1::MODE_SUMMARY : flare::v1::MODE_RAW;
  o.token = common::paramString("FLARE_TOKEN");
  o.flare_version = FLARE_VERSION_STRING;
  o.hang_kill = common::paramBool("FLARE_HANG_KILL");
  o.sweep_spool = common::paramBool("FLARE_SPOOL_SWEEP");
  o.spool_dir = dir;
  o.handler = handler;
  o.buffer_bytes = static_cast<size_t>(
      common::paramInt("FLARE_EXPORT_BUFFER_BYTES", 256 << 10, int64_t{1} << 34));
  o.spool_max_bytes =
      static_cast<uint64_t>(common::paramInt("FLARE_SPOOL_MAX_BYTES", 0, int64_t{1} << 50));
  o.resend_bytes =
      static_cast<size_t>(common::paramInt("FLARE_EXPORT_RESEND_BYTES", 0, int64_t{1} << 30));
  o.batch_bytes = batchBytes();
  return std::make_unique<timing::GrpcExporter>(std::move(transport), std::move(o));
}

}  // namespace flare::hook
