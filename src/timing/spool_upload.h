// Orphaned spool upload: the pending batches a rank process left in its spool when it ended
// while flared was unreachable (exporter.h: DIR/<job>/<rank>/pending-<pid>.pb), sent to flared
// once it is back — by `flare upload --spool DIR` (flare-upload) and, in the background, by the
// next Flare process on the node (GrpcExporter, FLARE_SPOOL_SWEEP).
//
// Beside each pending file the exporter keeps `pending-<pid>.meta` (writeSpoolMeta): the rank
// process's RankHello (identity, pid, start time, token) and its full signature and API-name
// tables, rewritten when the process ends. The uploader says that same hello, so flared answers
// with what it already holds of that very process (HelloAck.resume_after_seq), skips those
// batches, sends the rest marked from_spool with every table in the first one, half-closes and
// waits for flared to end the stream (it has then read everything); only then are both files
// deleted. Exactly once, as for live streams: a second upload of the same file (a crash between
// the end of the stream and the unlink, two uploaders) is answered with a resume point past
// every batch, and flared drops any batch at or below it.
//
// A live process holds an exclusive flock(2) on its pending file for its whole life (the
// kernel drops it when the process dies, however it dies); the uploader takes the same lock
// without waiting and leaves the file alone when it cannot: a running process's spool is never
// touched. Files are opened with O_NOFOLLOW; directories not owned by this user are skipped.
//
// Threading: plain functions; `cancelled` is polled between batches. Uses the Transport from
// transport.h (its streams block; each is cancelled on a deadline).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flare/v1/records.pb.h"
#include "flare/v1/service.pb.h"
#include "src/timing/transport.h"

namespace flare::timing {

struct SpoolUploadOptions {
  std::string token;                 // non-empty: sent instead of the one the process had
  int64_t ack_timeout_ms = 10000;    // for the HelloAck
  int64_t drain_timeout_ms = 60000;  // after the half-close, for flared to end the stream
  std::function<bool()> cancelled;   // polled between batches and files; true: stop
};

struct SpoolUploadResult {
  size_t files_seen = 0;      // pending files found (with their .meta)
  size_t files_uploaded = 0;  // sent whole, then deleted
  size_t files_busy = 0;      // still owned by a live process (locked): left alone
  size_t files_failed = 0;    // kept for a later try (daemon unreachable, refused, ...)
  uint64_t batches_sent = 0;
  uint64_t batches_skipped = 0;     // flared held them already
  std::vector<std::string> errors;  // one line per failed file
};

// `pending-<pid>.pb` -> `pending-<pid>.meta`.
std::string spoolMetaPath(const std::string& pending_path);

// Writes the meta file of `pending_path` atomically (a temporary file renamed over it, mode
// 0600: it holds the token). False with the reason in `error`.
bool writeSpoolMeta(const std::string& pending_path, const flare::v1::RankHello& hello,
                    const flare::v1::RecordBatch& tables, std::string* error);

// Uploads one pending file (its meta beside it); adds to `result`.
void uploadSpoolFile(const std::string& pending_path, Transport& transport,
                     const SpoolUploadOptions& options, SpoolUploadResult* result);

// Every pending file under `root` (any depth below it, symlinks not followed).
SpoolUploadResult uploadOrphanedSpools(const std::string& root, Transport& transport,
                                       const SpoolUploadOptions& options);

}  // namespace flare::timing
