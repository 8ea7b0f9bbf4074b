#include "src/timing/spool_upload.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "src/common/log.h"

namespace flare::timing {
namespace {

constexpr const char* kLog = "exporter";
constexpr uint64_t kMaxMessage = 256u << 20;  // larger: not a message the exporter wrote

// Reads all of `fd` from offset 0.
bool readAll(int fd, std::string* out) {
  out->clear();
  char buf[1 << 16];
  off_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
    off += n;
  }
}

// The next length-delimited message of `data` from `*pos` as bytes; false at the end or on a
// truncated or implausible one (the rest is given up: a crash in the middle of a write).
bool nextDelimited(const std::string& data, size_t* pos, std::string_view* msg) {
  uint64_t len = 0;
  int shift = 0;
  size_t p = *pos;
  for (;;) {
    if (p >= data.size() || shift > 63) return false;
    const auto c = static_cast<unsigned char>(data[p++]);
    len |= static_cast<uint64_t>(c & 0x7f) << shift;
    shift += 7;
    if ((c & 0x80) == 0) break;
  }
  if (len > kMaxMessage || len > data.size() - p) return false;
  *msg = std::string_view(data.data() + p, static_cast<size_t>(len));
  *pos = p + static_cast<size_t>(len);
  return true;
}

void appendDelimited(std::string* out, const google::protobuf::MessageLite& m) {
  uint64_t len = m.ByteSizeLong();
  while (len >= 0x80) {
    out->push_back(static_cast<char>((len & 0x7f) | 0x80));
    len >>= 7;
  }
  out->push_back(static_cast<char>(len));
  m.AppendToString(out);
}

// One upload stream: the writer is the caller, a reader thread collects the daemon's messages.
class UploadStream {
 public:
  // `cancelled` (may be empty) is watched every 50 ms: true cancels the stream, so that every
  // blocking call returns soon.
  UploadStream(std::unique_ptr<TransportStream> t, std::function<bool()> cancelled)
      : t_(std::move(t)) {
    if (cancelled) {
      watcher_ = std::thread([this, cancelled = std::move(cancelled)] {
        std::unique_lock lock(mu_);
        while (!done_) {
          if (cancelled()) {
            t_->cancel();
            return;
          }
          cv_.wait_for(lock, std::chrono::milliseconds(50));
        }
      });
    }
    reader_ = std::thread([this] {
      std::string bytes;
      while (t_->read(&bytes)) {
        flare::v1::DaemonMessage m;
        if (!m.ParseFromString(bytes)) continue;
        std::lock_guard lock(mu_);
        if (m.has_ack() && !acked_) {
          acked_ = true;
          ack_ = m.ack();
        } else if (m.has_rejected()) {
          ++rejected_;
        }
        cv_.notify_all();
      }
      std::lock_guard lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~UploadStream() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
      cv_.notify_all();
    }
    if (watcher_.joinable()) watcher_.join();
    t_->cancel();
    if (reader_.joinable()) reader_.join();
  }
  bool write(const std::string& bytes) { return t_->write(bytes); }
  // Waits for the HelloAck; false on timeout or a stream that ended first.
  bool waitAck(int64_t timeout_ms, flare::v1::HelloAck* ack) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return acked_ || ended_; });
    if (!acked_) return false;
    *ack = ack_;
    return true;
  }
  // Half-closes and waits for the daemon to end the stream; its final status ("" = OK), or a
  // reason when it did not end in time.
  std::string drain(int64_t timeout_ms) {
    t_->writesDone();
    bool ended = false;
    {
      std::unique_lock lock(mu_);
      ended = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return ended_; });
    }
    if (!ended) {
      t_->cancel();
      if (reader_.joinable()) reader_.join();
      t_->finish();
      return "flared did not end the stream in time";
    }
    if (reader_.joinable()) reader_.join();
    return t_->finish();
  }
  uint64_t rejected() {
    std::lock_guard lock(mu_);
    return rejected_;
  }

 private:
  std::unique_ptr<TransportStream> t_;
  std::thread reader_;
  std::thread watcher_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool acked_ = false, ended_ = false, done_ = false;
  flare::v1::HelloAck ack_;
  uint64_t rejected_ = 0;
};

bool endsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

void walk(const std::string& dir, int depth, std::vector<std::string>* found) {
  if (depth > 8) return;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  // Someone else's folder: not ours to read or upload from (and a place to be tricked).
  if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid()) {
    ::close(fd);
    return;
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  std::vector<std::string> subdirs;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type == DT_DIR) {
      subdirs.push_back(dir + "/" + name);
    } else if (e->d_type == DT_REG && name.rfind("pending-", 0) == 0 && endsWith(name, ".pb")) {
      found->push_back(dir + "/" + name);
    }
  }
  ::closedir(d);
  std::sort(subdirs.begin(), subdirs.end());
  for (const auto& s : subdirs) walk(s, depth + 1, found);
}

}  // namespace

std::string spoolMetaPath(const std::string& pending_path) {
  std::string p = pending_path;
  if (endsWith(p, ".pb")) p.resize(p.size() - 3);
  return p + ".meta";
}

bool writeSpoolMeta(const std::string& pending_path, const flare::v1::RankHello& hello,
                    const flare::v1::RecordBatch& tables, std::string* error) {
  std::string bytes;
  appendDelimited(&bytes, hello);
  appendDelimited(&bytes, tables);
  const std::string meta = spoolMetaPath(pending_path);
  const std::string tmp = meta + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = "cannot write " + tmp + ": " + std::strerror(errno);
    return false;
  }
  size_t off = 0;
  bool ok = true;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    off += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), meta.c_str()) != 0) {
    *error = "cannot write " + meta + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

void uploadSpoolFile(const std::string& pending_path, Transport& transport,
                     const SpoolUploadOptions& options, SpoolUploadResult* result) {
  auto fail = [&](const std::string& why) {
    result->files_failed++;
    result->errors.push_back(pending_path + ": " + why);
  };
  const int fd = ::open(pending_path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;  // gone meanwhile (another uploader, its process's own clean-up)
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) return;
  result->files_seen++;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // its process is alive (or another uploader)
    result->files_busy++;
    return;
  }
  if (::fstat(fd, &st) != 0 || st.st_nlink == 0) return;  // uploaded and deleted meanwhile
  const std::string meta_path = spoolMetaPath(pending_path);
  std::string meta_bytes, data;
  {
    const int mfd = ::open(meta_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (mfd < 0) return fail("no " + meta_path + " beside it: the process is unknown");
    const bool ok = readAll(mfd, &meta_bytes);
    ::close(mfd);
    if (!ok) return fail("cannot read " + meta_path);
  }
  flare::v1::RankHello hello;
  flare::v1::RecordBatch tables;
  {
    size_t pos = 0;
    std::string_view m;
    if (!nextDelimited(meta_bytes, &pos, &m) ||
        !hello.ParseFromArray(m.data(), static_cast<int>(m.size())))
      return fail(meta_path + " is unreadable");
    if (nextDelimited(meta_bytes, &pos, &m))
      tables.ParseFromArray(m.data(), static_cast<int>(m.size()));
  }
  if (!readAll(fd, &data)) return fail(std::string("cannot read it: ") + std::strerror(errno));
  std::vector<flare::v1::RecordBatch> batches;
  {
    size_t pos = 0;
    std::string_view m;
    while (nextDelimited(data, &pos, &m)) {
      flare::v1::RecordBatch b;
      if (!b.ParseFromArray(m.data(), static_cast<int>(m.size()))) break;
      batches.push_back(std::move(b));
    }
  }
  if (!options.token.empty()) hello.set_token(options.token);
  if (!batches.empty()) {
    // Every table entry the process defined: the meta's (the whole process), then the file's.
    std::map<uint32_t, flare::v1::Signature> sigs;
    std::map<uint32_t, flare::v1::ApiName> apis;
    for (const auto& s : tables.signatures()) sigs[s.id()] = s;
    for (const auto& a : tables.api_names()) apis[a.id()] = a;
    for (const auto& b : batches) {
      for (const auto& s : b.signatures()) sigs.try_emplace(s.id(), s);
      for (const auto& a : b.api_names()) apis.try_emplace(a.id(), a);
    }
    std::string err;
    auto t = transport.open(&err);
    if (!t) return fail("cannot reach flared: " + err);
    UploadStream stream(std::move(t), options.cancelled);
    flare::v1::RankMessage hm;
    *hm.mutable_hello() = hello;
    std::string bytes;
    hm.SerializeToString(&bytes);
    flare::v1::HelloAck ack;
    if (!stream.write(bytes) || !stream.waitAck(options.ack_timeout_ms, &ack)) {
      return fail("no answer to the hello (flared unreachable?)");
    }
    if (!ack.accepted()) return fail("flared refused the upload: " + ack.error());
    bool first = true;
    uint64_t sent = 0, skipped = 0;
    for (auto& b : batches) {
      if (options.cancelled && options.cancelled()) return fail("cancelled");
      if (b.batch_seq() != 0 && b.batch_seq() <= ack.resume_after_seq()) {
        ++skipped;
        continue;
      }
      if (first) {
        std::map<uint32_t, bool> have, have_api;
        for (const auto& s : b.signatures()) have[s.id()] = true;
        for (const auto& a : b.api_names()) have_api[a.id()] = true;
        for (const auto& [id, s] : sigs)
          if (!have.count(id)) *b.add_signatures() = s;
        for (const auto& [id, a] : apis)
          if (!have_api.count(id)) *b.add_api_names() = a;
        first = false;
      }
      b.set_from_spool(true);
      flare::v1::RankMessage bm;
      *bm.mutable_batch() = std::move(b);
      bm.SerializeToString(&bytes);
      if (!stream.write(bytes)) return fail("the stream broke while uploading");
      ++sent;
    }
    const std::string status = stream.drain(options.drain_timeout_ms);
    if (!status.empty()) return fail("flared ended the upload with " + status);
    result->batches_sent += sent;
    result->batches_skipped += skipped;
    FLARE_LOG_INFO(kLog, "flare: uploaded {} batches of rank {} of job {} (pid {}) from {}{}", sent,
                   hello.rank(), hello.job_id(), hello.pid(), pending_path,
                   skipped > 0 ? fmt::format(" ({} flared already held)", skipped) : "");
  }
  // Everything is in flared (or there was nothing): the files go, under the lock.
  ::unlink(pending_path.c_str());
  ::unlink(meta_path.c_str());
  result->files_uploaded++;
}

SpoolUploadResult uploadOrphanedSpools(const std::string& root, Transport& transport,
                                       const SpoolUploadOptions& options) {
  SpoolUploadResult result;
  std::vector<std::string> found;
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  walk(base, 0, &found);
  for (const auto& path : found) {
    if (options.cancelled && options.cancelled()) break;
    uploadSpoolFile(path, transport, options, &result);
  }
  return result;
}

}  // namespace flare::timing
