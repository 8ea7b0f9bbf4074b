// GrpcExporter's re-send window (exporter.h, "Order"): the last resend_bytes of batches written
// to a stream, which a daemon that was killed or wedged may not have read. The next stream sends
// them first (from_spool, those at or below its resume point skipped); a broken stream parks
// them in the spool when the spool is empty. Sender thread only.
#include <deque>
#include <utility>

#include "src/timing/exporter.h"
#include "src/timing/exporter_internal.h"

namespace flare::timing {

// 1. of a stream: the batches that may not have reached the daemon on the previous stream (the
// re-send window), from_spool, but those at or below the daemon's resume point. false: the stream
// broke; what was not written stays in the window for the next one.
bool GrpcExporter::resendWindow(Stream& s, bool* first) {
  bool failed = false;
  // 1. Batches that may not have reached the daemon on the previous stream.
  std::deque<Item> resend = std::move(resend_);
  resend_.clear();
  resend_bytes_ = 0;
  while (!resend.empty() && !failed) {
    Item item = std::move(resend.front());
    resend.pop_front();
    if (item.batch.batch_seq() <= s.resume_after_seq) {  // the daemon has it
      std::lock_guard<std::mutex> lock(mu_);
      stats_.batches_skipped++;
      continue;
    }
    item.batch.set_from_spool(true);
    failed = !sendBatch(s, item.batch, *first);
    *first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed) stats_.batches_resent++;
    }
    remember(std::move(item));
  }
  while (!resend.empty()) {  // the stream broke again: keep them for the next one
    remember(std::move(resend.front()));
    resend.pop_front();
  }
  return !failed;
}

void GrpcExporter::remember(Item&& item) {
  if (resend_limit_ == 0) return;
  resend_bytes_ += item.bytes;
  resend_.push_back(std::move(item));
  while (resend_bytes_ > resend_limit_ && resend_.size() > 1) {
    resend_bytes_ -= resend_.front().bytes;
    resend_.pop_front();
  }
}

// After a broken stream: the re-send window goes to the spool when the spool is empty (it is
// then older than anything else pending); otherwise it stays in memory for the next stream.
void GrpcExporter::parkResend() {
  std::lock_guard<std::mutex> spool_lock(spool_mu_);
  if (resend_.empty() || spool_read_ < spool_write_) return;
  for (Item& item : resend_) {
    item.batch.set_from_spool(true);
    spoolAppend(item.batch);
  }
  resend_.clear();
  resend_bytes_ = 0;
}

}  // namespace flare::timing
