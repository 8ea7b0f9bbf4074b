// flare-replay: streams a recorded trace (a fixture: one rank's raw-mode spool, its archive, or
// flare-export JSON lines; tools/replay/fixture_reader.h) into flared as N ranks of one job, rank
// identity rewritten and timestamps moved to now, at the recorded pace or faster, optionally with
// one rank perturbed the way real faults do. The model (lockstep collectives, what each
// perturbation changes) is in tools/replay/replay_plan.h; the usage and the fixture layouts in
// tools/README.md.
//
//   flare-replay --fixture PATH [--target HOST:PORT] [--ranks N] [--job ID] [--speed X]
//                [--mode raw|summary] [--slow-gpu R:F] [--slow-link R:F] [--stall R:MS]
//                [--hang R:STEP] [--hold-s S] [--source-rank R] [--dump DIR] [--token T]
//
// The streams are the ranks' own protocol (flare.v1.Ingest/Stream): a hello, batches, and
// answers to the daemon's commands. DumpStacks is answered from the replay's state (a stopped
// rank's main thread is in application code, a waiting rank's in the collective it waits in,
// and every rank's per-communicator progress), so that flared's hang analysis runs as on a real
// hang; SetMode is acknowledged without switching; DeepTrace is skipped and Inspect and Exit are
// refused (there is no process or GPU behind a replayed rank).
//
// At the end one JSON line on stdout: batches and records sent, acks, rejections by reason,
// commands answered. Exit 0 when every stream was accepted and nothing was rejected, 1 otherwise,
// 2 on bad arguments or an unreadable fixture.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flare/v1/protocol.h"
#include "flare/v1/service.grpc.pb.h"
#include "src/common/text.h"
#include "src/records/spool_format.h"

#include "tools/replay/fixture_reader.h"
#include "tools/replay/replay_plan.h"
#include "tools/replay/summary_replay.h"

namespace fs = std::filesystem;
using namespace flare;

namespace {

struct Options {
  std::string fixture;
  std::string target = "127.0.0.1:7070";
  int ranks = 8;
  std::string job = "replay";
  double speed = 1.0;  // 0: as fast as the daemon takes them
  std::string mode = "raw";
  int source_rank = -1;
  std::vector<int> rank_map;  // --rank-map: replayed rank i runs recorded rank rank_map[i]
  double hold_s = 1.0;
  std::string dump;
  std::string token;
  replay::Perturbation perturb;
};

volatile std::sig_atomic_t g_stop = 0;
extern "C" void onStopSignal(int) {
  g_stop = 1;
}

int64_t wallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void usage(const std::string& why) {
  if (!why.empty()) std::fprintf(stderr, "flare-replay: %s\n", why.c_str());
  std::fprintf(
      stderr,
      "usage: flare-replay --fixture PATH [--target HOST:PORT] [--ranks N] [--job ID]\n"
      "  [--speed X] [--mode raw|summary] [--slow-gpu RANK:FACTOR] [--slow-link RANK:FACTOR]\n"
      "  [--stall RANK:MS] [--hang RANK:STEP] [--hold-s S] [--source-rank R]\n"
      "  [--rank-map R0,R1,...] [--dump DIR] [--token T]\n"
      "PATH: a raw-mode spool (FLARE_OUTPUT_DIR or any folder below it) or its archive\n"
      "(.tar.gz, .tgz, .tar.zst, .tar.xz), or flare-export JSON lines (rank<R>.jsonl[.gz], or a\n"
      "folder of them: tests/fixtures/gpu/<fixture>). FACTOR > 1 slows down (durations x\n"
      "FACTOR); MS is a host pause in every step; STEP is 0-based. --rank-map: replayed rank i\n"
      "runs the fixture's recorded rank Ri (as many ranks as entries; for a fixture whose ranks\n"
      "share no collective, e.g. tests/fixtures/gpu/host-stall: 0,0,0,1); without it every\n"
      "replayed rank runs --source-rank (default: the lowest).\n");
  std::exit(2);
}

double number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= 0)) usage(flag + " needs a non-negative number");
  return x;
}

// "R:X" -> (R, X)
std::pair<int, double> rankValue(const std::string& flag, const std::string& v) {
  const size_t colon = v.find(':');
  if (colon == std::string::npos) usage(flag + " is RANK:VALUE, not '" + v + "'");
  const double r = number(flag, v.substr(0, colon));
  const double x = number(flag, v.substr(colon + 1));
  if (r != static_cast<int>(r)) usage(flag + ": the rank is an integer");
  return {static_cast<int>(r), x};
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("");
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--fixture") {
      o.fixture = v;
    } else if (k == "--target") {
      o.target = v;
    } else if (k == "--job") {
      o.job = v;
    } else if (k == "--mode") {
      o.mode = v;
    } else if (k == "--dump") {
      o.dump = v;
    } else if (k == "--token") {
      o.token = v;
    } else if (k == "--ranks") {
      o.ranks = static_cast<int>(number(k, v));
    } else if (k == "--source-rank") {
      o.source_rank = static_cast<int>(number(k, v));
    } else if (k == "--rank-map") {
      o.rank_map.clear();
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        const double r = number(k, v.substr(at, comma - at));
        if (r != static_cast<int>(r)) usage(k + ": ranks are integers");
        o.rank_map.push_back(static_cast<int>(r));
        at = comma + 1;
      }
    } else if (k == "--speed") {
      o.speed = number(k, v);
    } else if (k == "--hold-s") {
      o.hold_s = number(k, v);
    } else if (k == "--slow-gpu") {
      std::tie(o.perturb.slow_gpu_rank, o.perturb.gpu_factor) = rankValue(k, v);
    } else if (k == "--slow-link") {
      std::tie(o.perturb.slow_link_rank, o.perturb.link_factor) = rankValue(k, v);
    } else if (k == "--stall") {
      double ms = 0;
      std::tie(o.perturb.stall_rank, ms) = rankValue(k, v);
      o.perturb.stall_ns = static_cast<int64_t>(ms * 1e6);
    } else if (k == "--hang") {
      double step = 0;
      std::tie(o.perturb.hang_rank, step) = rankValue(k, v);
      o.perturb.hang_step = static_cast<int>(step);
    } else {
      usage("unknown flag " + k);
    }
  }
  if (o.fixture.empty()) usage("--fixture is required");
  if (o.mode != "raw" && o.mode != "summary") usage("--mode is raw or summary");
  if (o.ranks < 1 || o.ranks > 4096) usage("--ranks must be in [1, 4096]");
  return o;
}

// ---- the streams ---------------------------------------------------------------------------

struct Counters {
  std::atomic<uint64_t> batches{0}, records{0}, acks{0}, refused{0}, commands{0}, errors{0};
  std::mutex mu;
  std::map<std::string, uint64_t> rejected;  // by reason
};

class RankStream {
 public:
  RankStream(v1::Ingest::Stub* stub, const Options& o, int rank, const replay::RankPlan* plan,
             const v1::DeviceInfo* device, Counters* counters)
      : o_(o), rank_(rank), plan_(plan), counters_(counters) {
    stream_ = stub->Stream(&ctx_);
    v1::RankMessage hello;
    v1::RankHello* h = hello.mutable_hello();
    h->set_protocol_version(v1::kProtocolVersion);
    h->set_job_id(o.job);
    h->set_rank(rank);
    h->set_world_size(o.ranks);
    h->set_local_rank(rank % 8);
    h->set_local_world_size(std::min(8, o.ranks));
    h->set_host("replay-host" + std::to_string(rank / 8));
    h->set_pid(200000 + rank);
    h->set_token(o.token);
    h->set_start_time_unix_ns(wallNs());
    h->set_mode(o.mode == "summary" ? v1::MODE_SUMMARY : v1::MODE_RAW);
    h->set_identity_source("local");
    if (device != nullptr) {
      *h->mutable_device() = *device;
      if (!device->uuid().empty())
        h->mutable_device()->set_uuid(device->uuid() + "-r" + std::to_string(rank));
    }
    h->mutable_versions()->set_flare("flare-replay");
    write(hello);
    reader_ = std::thread([this] { readLoop(); });
  }

  bool write(const v1::RankMessage& m) {
    std::lock_guard lock(write_mu_);
    if (closed_) return false;
    if (!stream_->Write(m)) {
      counters_->errors++;
      closed_ = true;
      return false;
    }
    return true;
  }

  bool sendBatch(v1::RecordBatch batch, int64_t offset) {
    replay::shiftTimes(&batch, offset);
    const uint64_t records = static_cast<uint64_t>(batch.kernels_size() + batch.spans_size() +
                                                   batch.summaries_size() + batch.steps_size());
    v1::RankMessage m;
    *m.mutable_batch() = std::move(batch);
    if (!write(m)) return false;
    counters_->batches++;
    counters_->records += records;
    return true;
  }

  // Ends the stream and waits for the daemon's side to close.
  void finish() {
    {
      std::lock_guard lock(write_mu_);
      if (!closed_) stream_->WritesDone();
      closed_ = true;
    }
    reader_.join();
    const grpc::Status s = stream_->Finish();
    if (!s.ok()) {
      counters_->errors++;
      std::fprintf(stderr, "flare-replay: rank %d: stream ended: %s\n", rank_,
                   s.error_message().c_str());
    }
  }

  void cancel() { ctx_.TryCancel(); }

 private:
  void readLoop() {
    v1::DaemonMessage msg;
    while (stream_->Read(&msg)) {
      if (msg.has_ack()) {
        (msg.ack().accepted() ? counters_->acks : counters_->refused)++;
        if (!msg.ack().accepted()) {
          std::fprintf(stderr, "flare-replay: rank %d refused: %s\n", rank_,
                       msg.ack().error().c_str());
        }
      } else if (msg.has_rejected()) {
        std::lock_guard lock(counters_->mu);
        if (counters_->rejected[msg.rejected().reason()]++ == 0) {
          std::fprintf(stderr, "flare-replay: rank %d: batch %llu rejected (%s): %s\n", rank_,
                       static_cast<unsigned long long>(msg.rejected().batch_seq()),
                       msg.rejected().reason().c_str(), msg.rejected().error().c_str());
        }
      } else if (msg.has_command()) {
        answer(msg.command());
      }
    }
  }

  void answer(const v1::Command& cmd) {
    v1::RankMessage reply;
    v1::CommandResult* r = reply.mutable_command_result();
    r->set_command_id(cmd.id());
    if (cmd.has_set_mode()) {
      r->set_ok(true);  // acknowledged; the replay keeps its --mode
    } else if (cmd.has_dump_stacks()) {
      r->set_ok(true);
      v1::StackDump* d = r->mutable_stacks();
      d->set_captured_ns(wallNs());
      v1::ThreadStack* t = d->add_threads();
      t->set_thread_id(static_cast<uint64_t>(200000 + rank_));
      t->set_name("MainThread");
      t->set_main_thread(true);
      // A rank waiting in a collective: inside NCCL; the rank that stopped on its own: in
      // application code; a rank that ran to the end of the fixture: no frame (unknown).
      const bool stopped = plan_->stopped_at_ns != std::numeric_limits<int64_t>::max();
      if (stopped && !plan_->waiting_in.empty()) {
        v1::NativeFrame* f = t->add_native_frames();
        f->set_symbol(plan_->waiting_in);  // "ncclAllReduce"
        f->set_module("libnccl.so.2");
      } else if (stopped) {
        v1::PythonFrame* f = t->add_python_frames();
        f->set_function("replayed_step (stopped mid-step)");
        f->set_file("flare-replay");
      }
      for (const auto& p : plan_->progress) *d->add_collectives() = p;
    } else if (cmd.has_deep_trace()) {
      r->set_ok(true);
      r->mutable_deep_trace()->set_state(v1::DeepTraceResult::STATE_SKIPPED);
      r->mutable_deep_trace()->set_steps_requested(cmd.deep_trace().steps());
      r->mutable_deep_trace()->set_reason("flare-replay: a replayed rank has no GPU to trace");
    } else {
      r->set_ok(false);
      r->set_error("flare-replay: a replayed rank has no process or GPU behind it");
    }
    counters_->commands++;
    write(reply);
  }

  const Options& o_;
  const int rank_;
  const replay::RankPlan* plan_;
  Counters* counters_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RankMessage, v1::DaemonMessage>> stream_;
  std::mutex write_mu_;
  bool closed_ = false;
  std::thread reader_;
};

// --dump: each rank's batches as a spool (DIR/<job>/<rank>/records-<pid>.pb), what flare-export
// and flare-diagnose read.
bool dumpSpool(const std::string& dir, const std::string& job, int rank,
               const std::vector<v1::RecordBatch>& batches, int64_t offset) {
  const fs::path folder = fs::path(dir) / job / std::to_string(rank);
  std::error_code ec;
  fs::create_directories(folder, ec);
  std::FILE* f =
      std::fopen((folder / ("records-" + std::to_string(200000 + rank) + ".pb")).c_str(), "wb");
  if (f == nullptr) return false;
  for (v1::RecordBatch b : batches) {
    replay::shiftTimes(&b, offset);
    std::string bytes;
    records::appendVarint(&bytes, b.ByteSizeLong());
    b.AppendToString(&bytes);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
  }
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // SIGTERM/SIGINT: stop sending, close the streams, report and clean up (an unpacked archive).
  std::signal(SIGTERM, onStopSignal);
  std::signal(SIGINT, onStopSignal);
  if (!o.rank_map.empty()) o.ranks = static_cast<int>(o.rank_map.size());
  // One plan per recorded rank replayed; replayed rank r takes its rank r from its source's
  // plan. The recorded ranks ran together on one host clock, so their times stay aligned.
  std::vector<int> sources = o.rank_map.empty() ? std::vector<int>{o.source_rank} : o.rank_map;
  std::sort(sources.begin(), sources.end());
  sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
  std::vector<v1::RecordBatch> recorded;
  replay::FixtureSource source;
  std::string error;
  replay::Plan plan;
  std::map<int, replay::Plan> plans;
  for (int src : sources) {
    std::vector<v1::RecordBatch> batches_of_src;
    replay::FixtureSource src_info;
    if (!replay::readFixture(o.fixture, src, &batches_of_src, &src_info, &error)) {
      std::fprintf(stderr, "flare-replay: %s\n", error.c_str());
      return 2;
    }
    if (sources.size() > 1) {
      // Each recorded rank is planned on its own: multi-rank collectives (one rank's wait for
      // another) are not coordinated across sources. Said once, not replayed silently wrong.
      static bool warned = false;
      for (const auto& batch : batches_of_src) {
        for (const auto& k : batch.kernels()) {
          if (!warned && k.has_collective() && k.collective().nranks() > 1) {
            std::fprintf(stderr,
                         "flare-replay: warning: --rank-map over a fixture with collectives "
                         "(%d-rank communicator): each recorded rank is replayed on its own, "
                         "so their waits on each other are not modelled\n",
                         k.collective().nranks());
            warned = true;
          }
        }
      }
    }
    replay::PlanOptions popt;
    popt.ranks = o.ranks;
    popt.perturb = o.perturb;
    replay::Plan p;
    if (!replay::makePlan(batches_of_src, popt, &p, &error)) {
      std::fprintf(stderr, "flare-replay: %s\n", error.c_str());
      return 2;
    }
    if (plans.empty()) {
      recorded = std::move(batches_of_src);
      source = src_info;
    }
    plans.emplace(src, std::move(p));
  }
  if (o.rank_map.empty()) {
    plan = std::move(plans.begin()->second);
  } else {
    plan = plans.begin()->second;  // copied: its ranks are replaced from each source's below
    for (int r = 0; r < o.ranks; ++r) {
      const replay::Plan& from = plans.at(o.rank_map[static_cast<size_t>(r)]);
      plan.ranks[static_cast<size_t>(r)] = from.ranks[static_cast<size_t>(r)];
      plan.t0_ns = std::min(plan.t0_ns, from.t0_ns);
      plan.tend_ns = std::max(plan.tend_ns, from.tend_ns);
      plan.steps = std::min(plan.steps, from.steps);
    }
  }
  const v1::DeviceInfo* device = nullptr;
  for (const auto& b : recorded) {
    if (b.has_device()) {
      device = &b.device();
      break;
    }
  }
  // What each rank sends: the plan's raw batches, or their summary-mode encoding.
  std::vector<std::vector<v1::RecordBatch>> batches(o.ranks);
  std::vector<std::vector<int64_t>> due(o.ranks);
  for (int r = 0; r < o.ranks; ++r) {
    replay::RankPlan& rp = plan.ranks[r];
    if (o.mode == "summary") {
      const bool finished = rp.stopped_at_ns == std::numeric_limits<int64_t>::max();
      replay::SummaryBatches s =
          replay::toSummary(r, rp.batches, rp.due_ns, finished, 1'000'000'000);
      batches[r] = std::move(s.batches);
      due[r] = std::move(s.due_ns);
    } else {
      batches[r] = std::move(rp.batches);
      due[r] = std::move(rp.due_ns);
    }
  }
  // Fixture clock -> wall clock: the recorded end is stamped when it is sent, so nothing comes
  // from the future (but for a perturbed rank's delays, by at most those times 1 - 1/speed);
  // at --speed 1 every record is stamped when it would have happened.
  const int64_t start = wallNs();
  const double speed = o.speed;
  const int64_t span = plan.tend_ns - plan.t0_ns;
  const int64_t offset =
      speed > 0 ? start + static_cast<int64_t>(static_cast<double>(span) / speed) - plan.tend_ns
                : start - plan.tend_ns;
  if (!o.dump.empty()) {
    for (int r = 0; r < o.ranks; ++r) {
      if (!dumpSpool(o.dump, o.job, r, batches[r], offset)) {
        std::fprintf(stderr, "flare-replay: cannot write %s\n", o.dump.c_str());
        return 2;
      }
    }
  }
  std::fprintf(
      stderr,
      "flare-replay: %s (rank %d, %s): %zu batches, %zu steps, %.2f s recorded; %d ranks as job "
      "%s, %s mode, speed %g\n",
      source.file.c_str(), source.rank, source.format.c_str(), recorded.size(), plan.steps,
      static_cast<double>(span) / 1e9, o.ranks, o.job.c_str(), o.mode.c_str(), speed);

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "flare-replay: cannot connect to %s\n", o.target.c_str());
    return 1;
  }
  auto stub = v1::Ingest::NewStub(channel);
  Counters counters;
  std::vector<std::unique_ptr<RankStream>> streams;
  for (int r = 0; r < o.ranks; ++r) {
    streams.push_back(
        std::make_unique<RankStream>(stub.get(), o, r, &plan.ranks[r], device, &counters));
  }
  // Every hello answered before the first batch (a batch before the ack would be refused).
  for (int i = 0; i < 1000 && counters.acks + counters.refused < static_cast<uint64_t>(o.ranks);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));

  // Send in due order across ranks, paced on the fixture's clock.
  std::vector<size_t> next(o.ranks, 0);
  const int64_t paced_start = wallNs();
  while (true) {
    int best = -1;
    for (int r = 0; r < o.ranks; ++r) {
      if (next[r] < batches[r].size() && (best < 0 || due[r][next[r]] < due[best][next[best]]))
        best = r;
    }
    if (best < 0) break;
    if (speed > 0) {
      const int64_t at =
          paced_start +
          static_cast<int64_t>(static_cast<double>(due[best][next[best]] - plan.t0_ns) / speed);
      // In slices, so that a SIGTERM/SIGINT ends the replay promptly.
      for (int64_t wait = at - wallNs(); wait > 0 && !g_stop; wait = at - wallNs())
        std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(wait, 50'000'000)));
    }
    if (g_stop) break;
    streams[best]->sendBatch(std::move(batches[best][next[best]]), offset);
    ++next[best];
  }
  // Keep the streams open: the daemon may still ask (a hang's stack dumps) or read.
  const auto hold_until = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(o.hold_s * 1000));
  while (std::chrono::steady_clock::now() < hold_until && !g_stop)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto& s : streams) s->finish();

  uint64_t rejected = 0;
  std::string by_reason;
  for (const auto& [reason, count] : counters.rejected) {
    rejected += count;
    by_reason +=
        (by_reason.empty() ? "" : ",") + common::jsonQuote(reason) + ":" + std::to_string(count);
  }
  std::printf(
      "{\"job\":%s,\"ranks\":%d,\"mode\":\"%s\",\"steps\":%zu,\"batches\":%llu,\"records\":%llu,"
      "\"accepted\":%llu,\"refused\":%llu,\"rejected\":{%s},\"commands\":%llu,"
      "\"stream_errors\":%llu,\"offset_ns\":%lld}\n",
      common::jsonQuote(o.job).c_str(), o.ranks, o.mode.c_str(), plan.steps,
      static_cast<unsigned long long>(counters.batches.load()),
      static_cast<unsigned long long>(counters.records.load()),
      static_cast<unsigned long long>(counters.acks.load()),
      static_cast<unsigned long long>(counters.refused.load()), by_reason.c_str(),
      static_cast<unsigned long long>(counters.commands.load()),
      static_cast<unsigned long long>(counters.errors.load()), static_cast<long long>(offset));
  const bool ok =
      counters.acks == static_cast<uint64_t>(o.ranks) && rejected == 0 && counters.errors == 0;
  return ok ? 0 : 1;
}
