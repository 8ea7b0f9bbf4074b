// flare-upload: sends the pending batches that ended rank processes left in a spool folder to
// flared, each exactly once, and deletes what flared now holds (spool_upload.h). Run by
// `flare upload --spool DIR` and by the deploy files' timer; a Flare process streaming to flared
// does the same in the background (FLARE_SPOOL_SWEEP).
//
//   flare-upload --spool DIR --daemon HOST:PORT [--token T] [--exporter-lib PATH]
// TLS as for ranks: FLARE_TLS_CA, FLARE_TLS_CERT, FLARE_TLS_KEY, FLARE_TLS_SERVER_NAME.
// Exit status: 0 when nothing is left to upload (busy files of live processes aside), 1 when a
// file could not be uploaded (kept for a later run), 2 on bad arguments.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "src/timing/spool_upload.h"
#include "src/timing/transport.h"

namespace {

std::string here() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&here), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string p = info.dli_fname;
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

bool readFile(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  if (in) b << in.rdbuf();
  *out = b.str();
  return in && !out->empty();
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string spool, daemon = env("FLARE_DAEMON"), token = env("FLARE_TOKEN"), lib;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flare-upload: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--spool") {
      spool = value();
    } else if (a == "--daemon") {
      daemon = value();
    } else if (a == "--token") {
      token = value();
    } else if (a == "--exporter-lib") {
      lib = value();
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: flare-upload --spool DIR --daemon HOST:PORT [--token T] [--exporter-lib PATH]\n"
          "Uploads the pending batches ended processes left under DIR to flared, exactly once,\n"
          "and deletes them once flared holds them. --token replaces the processes' own tokens\n"
          "(default: theirs). Spools of live processes are left alone.\n");
      return 0;
    } else {
      std::fprintf(stderr, "flare-upload: unexpected argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (spool.empty() || daemon.empty()) {
    std::fprintf(stderr, "flare-upload: --spool DIR and --daemon HOST:PORT are needed\n");
    return 2;
  }
  if (lib.empty()) lib = env("FLARE_EXPORTER_LIB");
  if (lib.empty()) {
    // Next to this program's lib/ folder (build tree, installed package), else the loader's path.
    const std::string sibling = here() + "/../lib/libflare_exporter.so";
    lib = std::ifstream(sibling).good() ? sibling : "libflare_exporter.so";
  }
  flare::timing::TransportOptions topts;
  std::string ca, cert, key;
  const std::string server_name = env("FLARE_TLS_SERVER_NAME");
  if (!env("FLARE_TLS_CA").empty()) {
    if (!readFile(env("FLARE_TLS_CA").c_str(), &ca) ||
        (!env("FLARE_TLS_CERT").empty() && (!readFile(env("FLARE_TLS_CERT").c_str(), &cert) ||
                                            !readFile(env("FLARE_TLS_KEY").c_str(), &key)))) {
      std::fprintf(stderr, "flare-upload: FLARE_TLS_CA/CERT/KEY cannot be read\n");
      return 2;
    }
    topts.tls = true;
    topts.tls_root_pem = ca.c_str();
    topts.tls_cert_pem = cert.empty() ? nullptr : cert.c_str();
    topts.tls_key_pem = key.empty() ? nullptr : key.c_str();
    topts.tls_server_name = server_name.empty() ? nullptr : server_name.c_str();
  }
  std::string error;
  auto transport = flare::timing::loadTransport(lib, daemon, topts, &error);
  if (!transport) {
    std::fprintf(stderr, "flare-upload: cannot load the transport %s: %s\n", lib.c_str(),
                 error.c_str());
    return 1;
  }
  flare::timing::SpoolUploadOptions o;
  o.token = token;
  const auto r = flare::timing::uploadOrphanedSpools(spool, *transport, o);
  std::printf(
      "%zu uploaded (%llu batches sent, %llu already held), %zu left to live processes, "
      "%zu failed\n",
      r.files_uploaded, static_cast<unsigned long long>(r.batches_sent),
      static_cast<unsigned long long>(r.batches_skipped), r.files_busy, r.files_failed);
  for (const auto& e : r.errors) std::fprintf(stderr, "flare-upload: %s\n", e.c_str());
  return r.files_failed > 0 ? 1 : 0;
}
