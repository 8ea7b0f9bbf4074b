#include "tools/replay/fixture_reader.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "src/common/clock.h"
#include "src/records/spool_format.h"
#include "src/timing/batch_builder.h"

namespace fs = std::filesystem;

namespace flare::replay {
namespace {

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string g_unpacked;  // the temporary folder of an unpacked archive
void removeUnpacked() {
  if (!g_unpacked.empty()) {
    std::error_code ec;
    fs::remove_all(g_unpacked, ec);
  }
}

bool unpack(const std::string& archive, std::string* dir, std::string* error) {
  char tmpl[] = "/tmp/flare-replay-XXXXXX";
  if (archive.find('\'') != std::string::npos || mkdtemp(tmpl) == nullptr) {
    *error = "cannot unpack " + archive;
    return false;
  }
  g_unpacked = tmpl;
  std::atexit(removeUnpacked);
  std::string flags = "-xzf";
  if (endsWith(archive, ".zst")) flags = "--zstd -xf";
  if (endsWith(archive, ".xz")) flags = "-xJf";
  const std::string cmd = "tar " + flags + " '" + archive + "' -C '" + g_unpacked + "'";
  if (std::system(cmd.c_str()) != 0) {
    *error = "cannot unpack " + archive + " with tar";
    return false;
  }
  *dir = g_unpacked;
  return true;
}

// "rank3.jsonl.gz" -> 3; -1 when the name is not rank<R>.jsonl[.gz].
int jsonlRank(const std::string& name) {
  if (name.rfind("rank", 0) != 0) return -1;
  const size_t dot = name.find(".jsonl");
  if (dot == std::string::npos || dot == 4) return -1;
  const std::string tail = name.substr(dot);
  if (tail != ".jsonl" && tail != ".jsonl.gz") return -1;
  const std::string digits = name.substr(4, dot - 4);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); })) return -1;
  return std::atoi(digits.c_str());
}

bool readLines(const std::string& path, std::vector<std::string>* lines, std::string* error) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) {
    *error = "cannot open " + path;
    return false;
  }
  std::string line;
  char buf[65536];
  while (gzgets(f, buf, sizeof(buf)) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty()) lines->push_back(std::move(line));
      line.clear();
    }
  }
  if (!line.empty()) lines->push_back(std::move(line));
  int err = 0;
  const char* msg = gzerror(f, &err);
  const bool ok = err == Z_OK || err == Z_STREAM_END;
  if (!ok) *error = path + ": " + (msg ? msg : "read error");
  gzclose(f);
  return ok;
}

// The capture's GPU name: "gpu" in metadata.json of the fixture's folder or the one above.
std::string captureGpuName(const fs::path& file) {
  for (const fs::path& dir : {file.parent_path(), file.parent_path().parent_path()}) {
    std::ifstream in(dir / "metadata.json");
    if (!in) continue;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const size_t key = text.find("\"gpu\"");
    if (key == std::string::npos) return "";
    size_t open = text.find(':', key);
    if (open == std::string::npos) return "";
    open = text.find_first_not_of(" \t\r\n", open + 1);
    if (open == std::string::npos || text[open] != '"') return "";  // null, or not a string
    const size_t close = text.find('"', open + 1);
    return close == std::string::npos ? "" : text.substr(open + 1, close - open - 1);
  }
  return "";
}

// flare-export's lines of one rank -> the batches the rank's encoder would have sent.
bool fromJsonLines(const std::vector<std::string>& lines, int rank, const std::string& gpu,
                   std::vector<v1::RecordBatch>* out, std::string* error) {
  timing::BatchBuilderOptions opt;
  opt.clock_map = [] { return common::ClockMap(0, 0); };  // the lines are on the epoch clock
  // The lines carry no run-queue wait, and their thread ids are not this process's.
  opt.run_queue_wait = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  timing::BatchBuilder builder(rank, opt, [&](v1::RecordBatch&& b) {
    // Closed when the newest of its records was recorded (the builder stamps the wall clock).
    int64_t newest = 0;
    for (const auto& k : b.kernels()) newest = std::max(newest, k.end_ns());
    for (const auto& s : b.spans()) newest = std::max(newest, s.end_ns());
    b.set_created_ns(newest);
    out->push_back(std::move(b));
  });
  if (!gpu.empty()) {
    timing::DeviceDescription d;
    d.name = gpu;
    builder.setDevice(d);
  }
  using SigKey = std::tuple<int, std::string, std::string, std::vector<int64_t>, std::string>;
  std::map<SigKey, uint32_t> sigs;
  std::map<std::string, uint32_t> apis;
  std::vector<std::pair<std::string, JsonField>> fields;
  size_t n = 0;
  for (const std::string& line : lines) {
    ++n;
    fields.clear();
    if (!parseJsonLine(line, &fields)) {
      *error = "line " + std::to_string(n) + " is not a JSON object";
      return false;
    }
    std::map<std::string, const JsonField*> f;
    for (const auto& [k, v] : fields) f[k] = &v;
    auto str = [&](const char* k) { return f.count(k) ? f[k]->s : std::string(); };
    auto num = [&](const char* k) -> long long { return f.count(k) ? f[k]->i : 0; };
    const std::string kind = str("kind");
    if (kind == "summary") {
      *error = "line " + std::to_string(n) + ": a summary-mode record (fixtures are raw mode)";
      return false;
    }
    if (kind == "span") {
      const std::string name = str("name");
      auto [it, added] = apis.try_emplace(name, static_cast<uint32_t>(apis.size() + 1));
      if (added) builder.addApiName(it->second, name);
      timing::CompletedSpan s;
      s.id = static_cast<uint64_t>(num("id"));
      s.api_id = it->second;
      s.thread_id = static_cast<uint32_t>(num("thread"));
      s.parent_id = static_cast<uint64_t>(num("parent"));
      s.start_ns = num("start_ns");
      s.end_ns = num("end_ns");
      if (f.count("gc_generation")) {
        s.gc_generation = static_cast<int32_t>(num("gc_generation"));
        s.gc_collected = num("gc_collected");
        s.gc_uncollectable = num("gc_uncollectable");
      }
      builder.addSpans({&s, 1});
      continue;
    }
    std::string upper = "OP_KIND_" + kind;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    v1::OpKind pk = v1::OP_KIND_UNSPECIFIED;
    if (!v1::OpKind_Parse(upper, &pk) || pk == v1::OP_KIND_UNSPECIFIED) {
      *error = "line " + std::to_string(n) + ": unknown kind '" + kind + "'";
      return false;
    }
    timing::Signature sig;
    sig.name = str("name");
    sig.kind = static_cast<timing::OpKind>(0);
    switch (pk) {
      case v1::OP_KIND_GEMM:
        sig.kind = timing::OpKind::kGemm;
        break;
      case v1::OP_KIND_ATTENTION:
        sig.kind = timing::OpKind::kAttention;
        break;
      case v1::OP_KIND_COLLECTIVE:
        sig.kind = timing::OpKind::kCollective;
        break;
      case v1::OP_KIND_P2P:
        sig.kind = timing::OpKind::kP2P;
        break;
      case v1::OP_KIND_MEMCPY:
        sig.kind = timing::OpKind::kMemcpy;
        break;
      case v1::OP_KIND_MEMSET:
        sig.kind = timing::OpKind::kMemset;
        break;
      case v1::OP_KIND_GRAPH:
        sig.kind = timing::OpKind::kGraph;
        break;
      case v1::OP_KIND_SYNC:
        sig.kind = timing::OpKind::kSync;
        break;
      default:
        sig.kind = timing::OpKind::kKernel;
        break;
    }
    sig.dtype = str("dtype") == "unspecified" ? "" : str("dtype");
    if (f.count("shape")) sig.shape.assign(f["shape"]->ints.begin(), f["shape"]->ints.end());
    sig.layout = str("layout");
    SigKey key{static_cast<int>(sig.kind), sig.name, sig.dtype, sig.shape, sig.layout};
    auto [it, added] = sigs.try_emplace(key, static_cast<uint32_t>(sigs.size() + 1));
    if (added) builder.addSignature(it->second, sig);
    timing::CompletedOp op;
    op.info.signature_id = it->second;
    op.info.kind = sig.kind;
    op.info.flops = static_cast<uint64_t>(num("flops"));
    op.info.bytes = static_cast<uint64_t>(num("bytes"));
    if (f.count("comm_hash")) {
      op.info.comm_hash = std::strtoull(str("comm_hash").c_str(), nullptr, 16);
      op.info.seq = static_cast<uint64_t>(num("seq"));
      op.info.nranks = static_cast<uint32_t>(num("nranks"));
      if (f.count("peer")) op.info.peer = static_cast<int32_t>(num("peer"));
    }
    op.stream_id = static_cast<uint64_t>(num("stream"));
    op.device = static_cast<int32_t>(num("device"));
    op.thread_id = static_cast<uint32_t>(num("thread"));
    op.issue_ns = num("issue_ns");
    op.start_ns = num("start_ns");
    op.end_ns = num("end_ns");
    op.parent_span_id = static_cast<uint64_t>(num("parent_span"));
    op.correlation_id = static_cast<uint64_t>(num("correlation"));
    builder.addOps({&op, 1});
  }
  builder.finish();
  return true;
}

}  // namespace

bool parseJsonLine(const std::string& line, std::vector<std::pair<std::string, JsonField>>* out) {
  size_t i = 0;
  const size_t n = line.size();
  auto ws = [&] {
    while (i < n && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
  };
  auto parseString = [&](std::string* s) -> bool {
    if (i >= n || line[i] != '"') return false;
    ++i;
    while (i < n && line[i] != '"') {
      char c = line[i++];
      if (c == '\\') {
        if (i >= n) return false;
        const char e = line[i++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case 'b':
            c = '\b';
            break;
          case 'f':
            c = '\f';
            break;
          case 'u': {
            if (i + 4 > n) return false;
            const unsigned code =
                static_cast<unsigned>(std::strtoul(line.substr(i, 4).c_str(), nullptr, 16));
            i += 4;
            if (code < 0x80) {
              c = static_cast<char>(code);
            } else if (code < 0x800) {
              s->push_back(static_cast<char>(0xc0 | (code >> 6)));
              c = static_cast<char>(0x80 | (code & 0x3f));
            } else {
              s->push_back(static_cast<char>(0xe0 | (code >> 12)));
              s->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
              c = static_cast<char>(0x80 | (code & 0x3f));
            }
            break;
          }
          default:
            c = e;  // \" \\ \/
        }
      }
      s->push_back(c);
    }
    if (i >= n) return false;
    ++i;
    return true;
  };
  // Skips any value (nested objects and arrays included).
  auto skipValue = [&]() -> bool {
    int depth = 0;
    do {
      ws();
      if (i >= n) return false;
      const char c = line[i];
      if (c == '"') {
        std::string unused;
        if (!parseString(&unused)) return false;
      } else if (c == '{' || c == '[') {
        ++depth;
        ++i;
      } else if (c == '}' || c == ']') {
        --depth;
        ++i;
      } else {
        ++i;
      }
    } while (depth > 0);
    return true;
  };
  auto parseNumber = [&](JsonField* v) -> bool {
    const size_t from = i;
    while (i < n && (std::isdigit(static_cast<unsigned char>(line[i])) || line[i] == '-' ||
                     line[i] == '+' || line[i] == '.' || line[i] == 'e' || line[i] == 'E'))
      ++i;
    const std::string text = line.substr(from, i - from);
    if (text.empty()) return false;
    if (text.find_first_of(".eE") == std::string::npos) {
      v->type = JsonField::kInt;
      v->i = std::strtoll(text.c_str(), nullptr, 10);
      v->d = static_cast<double>(v->i);
    } else {
      v->type = JsonField::kDouble;
      v->d = std::strtod(text.c_str(), nullptr);
      v->i = static_cast<long long>(v->d);
    }
    return true;
  };
  ws();
  if (i >= n || line[i] != '{') return false;
  ++i;
  ws();
  if (i < n && line[i] == '}') return true;
  while (true) {
    ws();
    std::string key;
    if (!parseString(&key)) return false;
    ws();
    if (i >= n || line[i] != ':') return false;
    ++i;
    ws();
    if (i >= n) return false;
    JsonField v;
    const char c = line[i];
    if (c == '"') {
      v.type = JsonField::kString;
      if (!parseString(&v.s)) return false;
    } else if (c == '[') {
      // An array of integers; anything else in it makes it kOther (skipped).
      const size_t from = i;
      ++i;
      v.type = JsonField::kIntArray;
      ws();
      if (i < n && line[i] == ']') {
        ++i;
      } else {
        while (true) {
          ws();
          JsonField x;
          if (i < n && (line[i] == '-' || std::isdigit(static_cast<unsigned char>(line[i]))) &&
              parseNumber(&x) && x.type == JsonField::kInt) {
            v.ints.push_back(x.i);
          } else {
            i = from;
            v = JsonField{};
            v.type = JsonField::kOther;
            if (!skipValue()) return false;
            break;
          }
          ws();
          if (i < n && line[i] == ',') {
            ++i;
            continue;
          }
          if (i < n && line[i] == ']') {
            ++i;
            break;
          }
          return false;
        }
      }
    } else if (c == '{') {
      v.type = JsonField::kOther;
      if (!skipValue()) return false;
    } else if (line.compare(i, 4, "true") == 0 || line.compare(i, 5, "false") == 0) {
      v.type = JsonField::kBool;
      v.i = line[i] == 't';
      i += line[i] == 't' ? 4 : 5;
    } else if (line.compare(i, 4, "null") == 0) {
      v.type = JsonField::kNull;
      i += 4;
    } else if (!parseNumber(&v)) {
      return false;
    }
    out->emplace_back(std::move(key), std::move(v));
    ws();
    if (i < n && line[i] == ',') {
      ++i;
      continue;
    }
    if (i < n && line[i] == '}') return true;
    return false;
  }
}

bool readFixture(const std::string& path, int source_rank, std::vector<v1::RecordBatch>* out,
                 FixtureSource* source, std::string* error) {
  std::string dir = path;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const int r = jsonlRank(fs::path(path).filename().string());
    if (endsWith(path, ".jsonl") || endsWith(path, ".jsonl.gz")) {
      std::vector<std::string> lines;
      if (!readLines(path, &lines, error)) return false;
      source->file = path;
      source->rank = r < 0 ? 0 : r;
      source->format = "jsonl";
      return fromJsonLines(lines, source->rank, captureGpuName(path), out, error);
    }
    if (!unpack(path, &dir, error)) return false;
  } else if (!fs::is_directory(path, ec)) {
    *error = path + " is neither a fixture folder nor a fixture file";
    return false;
  }
  // A folder: spool files by rank, else JSON lines by rank.
  std::map<int, std::vector<fs::path>> spools, jsonl;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    if (!it->is_regular_file(ec)) continue;
    const std::string name = p.filename().string();
    if (p.extension() == ".pb" && name.rfind("records-", 0) == 0) {
      const std::string rank = p.parent_path().filename().string();
      char* end = nullptr;
      const long r = std::strtol(rank.c_str(), &end, 10);
      spools[rank.empty() || *end != '\0' ? 0 : static_cast<int>(r)].push_back(p);
    } else if (const int r = jsonlRank(name); r >= 0) {
      jsonl[r].push_back(p);
    }
  }
  auto& by_rank = spools.empty() ? jsonl : spools;
  if (by_rank.empty()) {
    *error =
        "no spool file (<job>/<rank>/records-<pid>.pb) and no rank<R>.jsonl[.gz] under " + path;
    return false;
  }
  auto it = source_rank < 0 ? by_rank.begin() : by_rank.find(source_rank);
  if (it == by_rank.end()) {
    *error = "the fixture has no rank " + std::to_string(source_rank);
    return false;
  }
  // Several files for one rank (a restarted process, two captures): the largest.
  fs::path best = it->second.front();
  for (const auto& p : it->second) {
    if (fs::file_size(p, ec) > fs::file_size(best, ec)) best = p;
  }
  source->file = best.string();
  source->rank = it->first;
  if (spools.empty()) {
    source->format = "jsonl";
    std::vector<std::string> lines;
    if (!readLines(best.string(), &lines, error)) return false;
    return fromJsonLines(lines, it->first, captureGpuName(best), out, error);
  }
  source->format = "spool";
  std::string read_error;
  if (!records::readSpoolFile(best.string(), out, &read_error)) {
    std::fprintf(stderr, "flare-replay: %s: %s (replaying the complete batches)\n", best.c_str(),
                 read_error.c_str());
  }
  if (out->empty()) {
    *error = best.string() + " holds no batch";
    return false;
  }
  return true;
}

}  // namespace flare::replay
