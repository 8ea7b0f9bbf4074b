// The Tracer's poller thread "flare-timing" (tracer_impl.h): every poll_interval it drains the
// threads' rings into one FIFO per (device, stream), finishes each stream's completed heads (no
// head-of-line blocking across streams) with their GPU times mapped to the host clock
// (tracer_clock.cc), returns their events to the pool, hands everything to the sink
// (tracer_emit.cc), moves the watermark and answers drain() once every op taken before it is
// finished.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "src/common/log.h"
#include "src/timing/tracer_impl.h"

namespace flare::timing {
using namespace tracer_internal;

void Tracer::Impl::pollerMain() noexcept {
  pthread_setname_np(pthread_self(), "flare-timing");
  uint64_t pass = 0;
  uint64_t seen_generation = 0;
  for (;;) {
    bool stopping = false;
    bool flush = false;
    uint64_t requested = 0;
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      const int64_t wait_ns = drain_waits_.empty() ? poll_ns_ : std::min(poll_ns_, kDrainPollNs);
      wake_cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns), [&] {
        return stop_ || flush_requested_ || drain_requested_ > seen_generation;
      });
      stopping = stop_;
      flush = flush_requested_;
      flush_requested_ = false;
      requested = drain_requested_;
    }
    ++pass;
    try {
      // Every op pushed before a drain() call is in a ring now: this pass takes it.
      pollOnce(pass);
      if (requested > seen_generation) {
        drain_waits_.push_back(DrainWait{requested, pass});
        seen_generation = requested;
      }
      if (stopping) {
        shutdownPass();
      } else {
        finishDrains();
        const int64_t now_ns = clock_->nowNs();
        if (flush || now_ns - last_flush_ns_ >= opts_.flush_interval_ns) {
          flushSink();
          last_flush_ns_ = now_ns;
        }
      }
      if (create_failed_.load(std::memory_order_relaxed)) {
        FLARE_LOG_WARN_ONCE(kLog,
                            "creating a GPU event failed; ops that needed one are dropped "
                            "and counted in event_errors");
      }
    } catch (...) {
      FLARE_LOG_ERROR_ONCE(kLog, "timing thread: unexpected exception; records may be lost");
    }
    if (stopping) break;
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    poller_exited_ = true;
  }
  done_cv_.notify_all();
}

void Tracer::Impl::pollOnce(uint64_t pass) {
  const int64_t pass_start_ns = clock_->nowNs();
  refreshThreads();
  last_queue_ = nullptr;  // queues may have been erased since the last pass
  taken_this_pass_ = 0;
  in_flight_min_ns_ = INT64_MAX;
  for (size_t i = 0; i < local_threads_.size();) {
    ThreadState* ts = local_threads_[i].get();
    // Read before draining: an op whose call was in flight reaches a later drain, so the
    // watermark stays at or below its issue time; a call that ended has pushed its op (release),
    // and this drain takes it.
    in_flight_min_ns_ =
        std::min(in_flight_min_ns_, ts->in_flight_issue_ns.load(std::memory_order_acquire));
    // Read before draining: once set, the owner pushes nothing more, so this drain is the last.
    const bool exited = ts->exited.load(std::memory_order_acquire);
    ts->ring.drain([&](const PendingOp& op) { accept(op, pass); });
    ts->spans.drain([&](const CompletedSpan& span) {
      try {
        span_out_.push_back(span);
      } catch (...) {
        counters_.spans_dropped.fetch_add(1, std::memory_order_relaxed);
      }
    });
    if (exited) {
      releaseThread(i);
    } else {
      ++i;
    }
  }
  if (taken_this_pass_ > 0) outstanding_[pass] += taken_this_pass_;
  last_queue_ = nullptr;
  // Before this thread's first GPU call (the first ops' events are queried below), not at its
  // start: the application has used CUDA by now, so the call initializes nothing.
  if (taken_this_pass_ > 0 && !entered_timing_thread_) {
    entered_timing_thread_ = true;
    if (!timer_->enterTimingThread()) {
      FLARE_LOG_WARN(kLog,
                     "the timing thread could not enter relaxed stream-capture mode "
                     "(cudaThreadExchangeStreamCaptureMode); a CUDA graph captured in global "
                     "mode (torch.cuda.graph's default) may fail while Flare times ops");
    }
  }
  // After the rings: every op taken refers to a signature interned before it was pushed.
  announceSignatures();
  announceApis();
  emitSpans();
  emitDeepTrace();
  calibrate();
  processQueues();
  observeHeads();
  returnEvents();
  emitOps();
  sendDrops();
  // The watermark: every op issued before it has completed and been handed to the sink — the
  // oldest pending op of each stream bounds it, and the previous pass's start bounds the ops a
  // launching thread may still be pushing into its ring.
  // A timed call still in its vendor call (a slow first launch) holds it back too.
  int64_t watermark = std::min(prev_pass_start_ns_, in_flight_min_ns_);
  for (const auto& [key, queue] : queues_) {
    if (!queue.empty()) watermark = std::min(watermark, queue.front().op.issue_ns);
  }
  sink_->onWatermark(watermark);
  prev_pass_start_ns_ = pass_start_ns;
}

void Tracer::Impl::refreshThreads() {
  const uint64_t version = reg_version_.load(std::memory_order_acquire);
  if (version == local_version_) return;
  std::lock_guard<std::mutex> lock(reg_mu_);
  local_threads_ = threads_;
  local_version_ = version;
}

void Tracer::Impl::accept(const PendingOp& op, uint64_t pass) {
  try {
    if (op.start == nullptr) {  // host span: complete already
      out_.push_back(CompletedOp{.info = op.info,
                                 .stream_id = 0,
                                 .device = op.device,
                                 .thread_id = op.thread_id,
                                 .issue_ns = op.issue_ns,
                                 .start_ns = op.issue_ns,
                                 .end_ns = op.host_end_ns,
                                 .parent_span_id = op.parent_span_id,
                                 .correlation_id = op.correlation_id});
      return;
    }
    const StreamKey key{op.device, op.stream_id};
    if (last_queue_ == nullptr || !(last_key_ == key)) {  // consecutive ops: mostly one stream
      last_queue_ = nullptr;
      cals_.try_emplace(op.device);
      last_queue_ = &queues_[key];
      last_key_ = key;
    }
    if (op.info.kind == OpKind::kGraph) graph_launches_.push_back(op.issue_ns);
    last_queue_->insert(Queued{op, pass});  // the last step that can throw
    ++taken_this_pass_;
  } catch (...) {
    // Out of memory: the op is lost (counted) and its events go back.
    counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
    if (pooled(op.start)) to_free_.push_back(op.start);
    if (pooled(op.end)) to_free_.push_back(op.end);
  }
}

void Tracer::Impl::releaseThread(size_t index) {
  std::shared_ptr<ThreadState> state = std::move(local_threads_[index]);
  local_threads_.erase(local_threads_.begin() + static_cast<std::ptrdiff_t>(index));
  to_free_.insert(to_free_.end(), state->cache, state->cache + state->cache_size);
  state->cache_size = 0;
  std::lock_guard<std::mutex> lock(reg_mu_);
  threads_.erase(std::remove(threads_.begin(), threads_.end(), state), threads_.end());
}

void Tracer::Impl::processQueues() {
  const int64_t pass_ns = opts_.head_observer != nullptr ? clock_->nowNs() : 0;
  for (auto it = queues_.begin(); it != queues_.end();) {
    OpQueue& queue = it->second;
    DeviceCal& cal = cals_[it->first.device];
    while (!queue.empty()) {
      const Queued& head = queue.front();
      const DeviceTimer::Status status = timer_->queryEvent(head.op.end->handle);
      if (status == DeviceTimer::Status::kNotReady) break;  // next stream: no head-of-line
      if (status == DeviceTimer::Status::kReady && cal.ref == nullptr && !cal.broken) {
        break;  // waiting for this device's first reference
      }
      bool emitted = false;
      if (status == DeviceTimer::Status::kReady && cal.ref != nullptr) {
        int64_t start_ns = 0;
        int64_t end_ns = 0;
        const bool chained = head.op.start == &g_chained_start;
        if (timer_->elapsedNs(cal.ref, head.op.end->handle, &end_ns) &&
            (chained || timer_->elapsedNs(cal.ref, head.op.start->handle, &start_ns))) {
          int64_t end_host = cal.ref_host_ns + end_ns;
          // An end-only op started when the op before it on the stream ended, or, if the stream
          // was idle by then, when it was issued (its launch latency counts in its duration).
          int64_t start_host = cal.ref_host_ns + start_ns;
          if (chained) {
            const int64_t latency = std::max<int64_t>(cal.launch_latency_ns, 0);
            start_host =
                std::min(std::max(queue.last_end_ns, head.op.issue_ns + latency), end_host);
          } else if (opts_.end_only && queue.last_end_ns < head.op.issue_ns &&
                     start_host >= head.op.issue_ns) {
            // Issued on an idle stream and timed by its own start event: a latency sample. A
            // floor-like estimate (down fast, up slowly): a sample may also hold a wait for
            // another stream's work.
            const int64_t sample = std::min<int64_t>(start_host - head.op.issue_ns, 1'000'000);
            int64_t& est = cal.launch_latency_ns;
            est = est < 0 ? sample : est + (sample - est) / (sample < est ? 4 : 64);
          }
          if (opts_.correct_event_gap && !opts_.end_only) {
            correctEventGap(it->first.device, head.op, queue, cal, &start_host, &end_host);
          }
          out_.push_back(CompletedOp{.info = head.op.info,
                                     .stream_id = head.op.stream_id,
                                     .device = head.op.device,
                                     .thread_id = head.op.thread_id,
                                     .issue_ns = head.op.issue_ns,
                                     .start_ns = start_host,
                                     .end_ns = end_host,
                                     .parent_span_id = head.op.parent_span_id,
                                     .correlation_id = head.op.correlation_id});
          queue.last_end_ns = end_host;
          emitted = true;
        }
      }
      if (!emitted) {
        counters_.event_errors.fetch_add(1, std::memory_order_relaxed);
        queue.last_end_ns = INT64_MIN;  // the next end-only op starts from its issue time
        queue.prev_pair_end_ns = INT64_MIN;
      }
      finish(head.op, head.pass);
      queue.popFront();
      queue.last_done_ns = pass_ns;
      if (out_.size() >= kEmitBatch) emitOps();
    }
    // Empty queues are kept (with their storage) unless streams come and go by the hundred.
    if (queue.empty() && queues_.size() > kMaxIdleQueues) {
      it = queues_.erase(it);
    } else {
      ++it;
    }
  }
}

// A reading of the gap: this op's start event was queued right behind the end event of the op
// before it on the stream (the same thread, nothing of that thread untimed between them, issued
// before that op started on the GPU, so the stream was busy). Both times are mapped through the
// same reference: their difference is GPU time.
void Tracer::Impl::correctEventGap(int device, const PendingOp& op, OpQueue& queue, DeviceCal& cal,
                                   int64_t* start, int64_t* end) {
  // Through the same reference too: a new one maps times with a different offset. A mapped
  // time may be late by up to the reference's bracket (ref_width_ns), so "issued before that op
  // started" must hold by more than that: otherwise the stream may have gone idle and the start
  // event waited for its submission.
  if (queue.prev_pair_end_ns != INT64_MIN && queue.prev_pair_thread == op.thread_id &&
      queue.prev_pair_ref == cal.ref && (op.info.flags & kOpAfterUntimed) == 0 &&
      op.issue_ns + cal.ref_width_ns < queue.prev_pair_start_ns) {
    const int64_t gap = *start - queue.prev_pair_end_ns;
    if (gap >= 0 && gap <= kMaxGapReadingNs) {
      cal.gap_window[static_cast<size_t>(cal.gap_readings++)] = gap;
      if (cal.gap_readings == kGapWindow) {
        cal.gap_readings = 0;
        const auto mid = cal.gap_window.begin() + kGapWindow / 2;
        std::nth_element(cal.gap_window.begin(), mid, cal.gap_window.end());
        cal.gap_measured = true;
        if (!cal.gap_logged && *mid > 0) {
          cal.gap_logged = true;
          FLARE_LOG_INFO(kLog,
                         "device {}: two CUDA events queued back to back run {} ns apart (median "
                         "of {} readings); durations timed by a pair of events are {} ns "
                         "shorter for it (FLARE_EVENT_GAP_CORRECTION=0: not corrected)",
                         device, *mid, kGapWindow, 2 * *mid);
        }
        cal.event_gap_ns = *mid;
        event_gap_ns_.store(*mid, std::memory_order_relaxed);
      }
    }
  }
  queue.prev_pair_start_ns = *start;
  queue.prev_pair_end_ns = *end;
  queue.prev_pair_thread = op.thread_id;
  queue.prev_pair_ref = cal.ref;
  // A reading holds the op and two gaps; whatever the estimate, at least a quarter of the
  // reading stays (3/8 off each side at most).
  const int64_t shift = std::min(cal.event_gap_ns, (*end - *start) * 3 / 8);
  if (shift > 0) {
    *start += shift;
    *end -= shift;
  }
}

// The hang watchdog's view: the head of every stream with pending ops, every head_interval_ns.
void Tracer::Impl::observeHeads() {
  if (opts_.head_observer == nullptr) return;
  const int64_t now_ns = clock_->nowNs();
  if (last_heads_ns_ != INT64_MIN && now_ns - last_heads_ns_ < opts_.head_interval_ns) return;
  last_heads_ns_ = now_ns;
  heads_out_.clear();
  for (const auto& [key, queue] : queues_) {
    if (queue.empty()) continue;
    const PendingOp& op = queue.front().op;
    // Non-blocking; one query per stream with pending work, every head_interval_ns.
    const bool started =
        !pooled(op.start) || timer_->queryEvent(op.start->handle) != DeviceTimer::Status::kNotReady;
    heads_out_.push_back(StreamHead{.device = key.device,
                                    .stream_id = key.stream_id,
                                    .info = op.info,
                                    .issue_ns = op.issue_ns,
                                    .since_ns = std::max(op.issue_ns, queue.last_done_ns),
                                    .key = reinterpret_cast<uintptr_t>(op.end),
                                    .pending = queue.size(),
                                    .started = started});
  }
  opts_.head_observer->onHeads(now_ns, heads_out_);
}

void Tracer::Impl::finish(const PendingOp& op, uint64_t pass) {
  if (pooled(op.start)) to_free_.push_back(op.start);
  if (pooled(op.end)) to_free_.push_back(op.end);
  auto it = outstanding_.find(pass);
  if (it != outstanding_.end() && --it->second == 0) outstanding_.erase(it);
}

// The pool mutex is held only for appends of runs of pointers. try_lock first: if a launching
// thread holds it, the events wait for the next pass rather than the poller sleeping on the
// mutex (which would make that thread's unlock a futex wake).
void Tracer::Impl::returnEvents() {
  if (to_free_.empty()) return;
  std::unique_lock<std::mutex> lock(pool_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (++return_deferred_ < kReturnTries) return;
    lock.lock();
  }
  return_deferred_ = 0;
  for (size_t begin = 0; begin < to_free_.size();) {
    const int device = to_free_[begin]->device;
    size_t end = begin + 1;
    while (end < to_free_.size() && to_free_[end]->device == device) ++end;
    std::vector<Event*>& list = freeList(device);
    list.insert(list.end(), to_free_.begin() + static_cast<std::ptrdiff_t>(begin),
                to_free_.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
  lock.unlock();
  to_free_.clear();
}

void Tracer::Impl::finishDrains() {
  const uint64_t oldest =
      outstanding_.empty() ? std::numeric_limits<uint64_t>::max() : outstanding_.begin()->first;
  uint64_t satisfied = 0;
  while (!drain_waits_.empty() && drain_waits_.front().pass < oldest) {
    satisfied = drain_waits_.front().generation;
    drain_waits_.pop_front();
  }
  if (satisfied == 0) return;
  flushSink();
  last_flush_ns_ = clock_->nowNs();
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    drain_done_ = std::max(drain_done_, satisfied);
  }
  done_cv_.notify_all();
}

// Last pass, from the destructor: what is still queued is not waited for. Drains that the
// pass completed are answered; the others see poller_exited_.
void Tracer::Impl::shutdownPass() {
  finishDrains();
  uint64_t stuck = 0;
  for (auto& [key, queue] : queues_) stuck += queue.size();
  queues_.clear();
  outstanding_.clear();
  if (stuck > 0) {
    counters_.unfinished.fetch_add(stuck, std::memory_order_relaxed);
    FLARE_LOG_WARN(kLog, "{} ops had not completed when timing stopped; counted as unfinished",
                   stuck);
  }
  emitOps();
  sendDrops();
  sayUnmeasuredGaps();
  sink_->finish();
}

void Tracer::Impl::sayUnmeasuredGaps() {
  if (!opts_.correct_event_gap || opts_.end_only) return;
  for (auto& [device, cal] : cals_) {
    if (cal.gap_logged || cal.gap_measured) continue;
    cal.gap_logged = true;
    FLARE_LOG_INFO(kLog,
                   "device {}: the event-pair gap was never measured ({} of the {} readings it "
                   "takes: too few ops queued back to back on a busy stream); its durations "
                   "were not corrected",
                   device, cal.gap_readings, kGapWindow);
  }
}

}  // namespace flare::timing
