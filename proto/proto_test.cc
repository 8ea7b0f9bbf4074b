// Round-trips every message type through the wire format, and checks that garbage is refused.
#include <gtest/gtest.h>

#include <string>

#include "flare/v1/commands.pb.h"
#include "flare/v1/common.pb.h"
#include "flare/v1/hello.pb.h"
#include "flare/v1/protocol.h"
#include "flare/v1/records.pb.h"
#include "flare/v1/service.pb.h"

namespace flare::v1 {
namespace {

constexpr int64_t kT0 = 1'750'000'000'000'000'000;  // 2025, in Unix ns

RecordBatch makeBatch() {
  RecordBatch b;
  b.set_rank(3);
  b.set_batch_seq(17);
  b.set_created_ns(kT0 + 999);

  Signature* gemm = b.add_signatures();
  gemm->set_id(1);
  gemm->set_name("sm90_xmma_gemm_bf16bf16_bf16f32");
  gemm->set_kind(OP_KIND_GEMM);
  gemm->set_dtype(DTYPE_BF16);
  for (int64_t d : {1, 4096, 4096, 8192}) gemm->add_shape(d);
  gemm->set_layout("tn,lda=8192,ldb=8192,ldc=4096");
  gemm->set_flops_per_call(2ull * 4096 * 4096 * 8192);
  gemm->set_out_dtype(DTYPE_F32);
  gemm->set_library("cublasLt");

  Signature* ar = b.add_signatures();
  ar->set_id(2);
  ar->set_name("ncclAllReduce");
  ar->set_kind(OP_KIND_COLLECTIVE);
  ar->set_dtype(DTYPE_F32);
  ar->add_shape(1 << 20);
  ar->set_collective(COLLECTIVE_KIND_ALL_REDUCE);
  ar->set_bytes_per_call(4u << 20);

  ApiName* api = b.add_api_names();
  api->set_id(1);
  api->set_qualified_name("torch.cuda@synchronize");

  KernelRecord* k = b.add_kernels();
  k->set_signature_id(1);
  k->set_stream_id(0x7f00deadbeef);
  k->set_device(3);
  k->set_issue_ns(kT0);
  k->set_start_ns(kT0 + 5000);
  k->set_end_ns(kT0 + 905000);
  k->set_issue_latency_ns(5000);
  k->set_parent_span_id(9);
  k->set_correlation_id(123456);
  k->set_thread_id(4711);

  KernelRecord* c = b.add_kernels();
  c->set_signature_id(2);
  c->set_issue_latency_ns(-20);  // clock-map error can make it negative
  CollectiveInfo* ci = c->mutable_collective();
  ci->set_comm_hash(0xabcdef0123456789ull);
  ci->set_seq(42);
  ci->set_nranks(8);
  ci->set_rank_in_comm(3);
  ci->set_count(1 << 20);
  ci->set_peer(0);  // explicit presence: rank 0 is not "unset"
  ci->set_op(REDUCE_OP_SUM);

  ApiSpan* span = b.add_spans();
  span->set_id(9);
  span->set_api_id(1);
  span->set_thread_id(4711);
  span->set_start_ns(kT0 - 100);
  span->set_end_ns(kT0 + 1'000'000);
  GcInfo* gc = span->mutable_gc();
  gc->set_generation(2);
  gc->set_collected(1234);
  gc->set_uncollectable(1);

  KernelSummary* s = b.add_summaries();
  s->set_signature_id(1);
  s->set_stream_id(7);
  s->set_window_start_ns(kT0);
  s->set_window_end_ns(kT0 + 60'000'000'000);
  s->set_device(3);
  for (int64_t i = 1; i <= 2; ++i) {
    KernelSummary::Cluster* cl = s->add_clusters();
    cl->set_count(static_cast<uint64_t>(100 * i));
    cl->set_p50_ns(900'000 * i);
    cl->set_p99_ns(950'000 * i);
    cl->set_sum_ns(90'000'000 * i * i);
  }

  StepMarker* step = b.add_steps();
  step->set_step(100);
  step->set_start_ns(kT0);
  step->set_end_ns(kT0 + 1'500'000'000);
  step->set_samples(512);

  DropCounters* d = b.mutable_drops();
  d->set_ring_full(1);
  d->set_events_exhausted(2);
  d->set_unmatched(3);
  d->set_spans_dropped(4);
  d->set_spool_dropped(5);
  d->set_send_failed(6);
  d->set_disabled_calls(7);
  d->set_log_once_suppressed(8);
  return b;
}

template <typename M>
M roundTrip(const M& in) {
  std::string wire;
  EXPECT_TRUE(in.SerializeToString(&wire));
  M out;
  EXPECT_TRUE(out.ParseFromString(wire));
  EXPECT_EQ(out.SerializeAsString(), wire);
  return out;
}

TEST(ProtoTest, ProtocolVersion) {
  EXPECT_EQ(kProtocolVersion, 1u);
  EXPECT_EQ(static_cast<int>(PROTOCOL_VERSION_CURRENT), 1);
}

TEST(ProtoTest, RecordBatchRoundTrip) {
  RecordBatch in = makeBatch();
  RecordBatch out = roundTrip(in);
  EXPECT_EQ(out.DebugString(), in.DebugString());
  EXPECT_EQ(out.rank(), 3);
  ASSERT_EQ(out.signatures_size(), 2);
  EXPECT_EQ(out.signatures(0).shape_size(), 4);
  EXPECT_EQ(out.signatures(0).flops_per_call(), 2ull * 4096 * 4096 * 8192);
  EXPECT_EQ(out.signatures(1).collective(), COLLECTIVE_KIND_ALL_REDUCE);
  ASSERT_EQ(out.kernels_size(), 2);
  EXPECT_EQ(out.kernels(0).end_ns(), kT0 + 905000);
  EXPECT_FALSE(out.kernels(0).has_collective());
  EXPECT_EQ(out.kernels(1).issue_latency_ns(), -20);
  EXPECT_TRUE(out.kernels(1).collective().has_peer());
  EXPECT_EQ(out.kernels(1).collective().peer(), 0);
  EXPECT_FALSE(out.kernels(1).collective().has_root());
  EXPECT_EQ(out.spans(0).gc().collected(), 1234);
  EXPECT_EQ(out.summaries(0).clusters(1).p99_ns(), 1'900'000);
  EXPECT_EQ(out.steps(0).samples(), 512u);
  EXPECT_EQ(out.drops().log_once_suppressed(), 8u);
  EXPECT_EQ(out.api_names(0).qualified_name(), "torch.cuda@synchronize");
}

TEST(ProtoTest, HelloRoundTrip) {
  RankMessage in;
  RankHello* h = in.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_job_id("job-1");
  h->set_rank(5);
  h->set_local_rank(1);
  h->set_world_size(16);
  h->set_local_world_size(8);
  h->set_host("node7");
  h->set_pid(4242);
  h->set_token("secret");
  h->set_start_time_unix_ns(kT0);
  h->set_mode(MODE_SUMMARY);
  h->set_identity_source("torchrun");
  DeviceInfo* dev = h->mutable_device();
  dev->set_index(1);
  dev->set_name("NVIDIA H100 80GB HBM3");
  dev->set_uuid("GPU-0000");
  dev->set_sm_count(132);
  dev->set_memory_bytes(80ull << 30);
  dev->set_clock_khz(1980000);
  Versions* v = h->mutable_versions();
  v->set_cuda_runtime("12.4");
  v->set_cuda_driver("12.4");
  v->set_nccl("2.21.5");
  v->set_python("3.11.9");
  v->set_torch("2.4.0");
  v->set_flare("0.1.0");
  RankMessage out = roundTrip(in);
  ASSERT_EQ(out.msg_case(), RankMessage::kHello);
  EXPECT_EQ(out.hello().DebugString(), in.hello().DebugString());

  DaemonMessage ack;
  ack.mutable_ack()->set_protocol_version(kProtocolVersion);
  ack.mutable_ack()->set_accepted(true);
  ack.mutable_ack()->set_mode(MODE_RAW);
  ack.mutable_ack()->set_session_id(99);
  DaemonMessage ack_out = roundTrip(ack);
  ASSERT_EQ(ack_out.msg_case(), DaemonMessage::kAck);
  EXPECT_EQ(ack_out.ack().mode(), MODE_RAW);
}

TEST(ProtoTest, CommandsRoundTrip) {
  DaemonMessage msgs[4];
  msgs[0].mutable_command()->mutable_set_mode()->set_mode(MODE_RAW);
  msgs[1].mutable_command()->mutable_dump_stacks()->set_native(true);
  msgs[2].mutable_command()->mutable_deep_trace()->set_steps(5);
  msgs[3].mutable_command()->mutable_inspect()->set_deadline_ms(30000);
  const Command::KindCase kinds[] = {Command::kSetMode, Command::kDumpStacks, Command::kDeepTrace,
                                     Command::kInspect};
  for (int i = 0; i < 4; ++i) {
    msgs[i].mutable_command()->set_id(static_cast<uint64_t>(i) + 1);
    DaemonMessage out = roundTrip(msgs[i]);
    ASSERT_EQ(out.msg_case(), DaemonMessage::kCommand);
    EXPECT_EQ(out.command().kind_case(), kinds[i]);
    EXPECT_EQ(out.command().id(), static_cast<uint64_t>(i) + 1);
  }

  RankMessage result;
  CommandResult* r = result.mutable_command_result();
  r->set_command_id(2);
  r->set_ok(true);
  ThreadStack* t = r->mutable_stacks()->add_threads();
  r->mutable_stacks()->set_captured_ns(kT0);
  t->set_thread_id(4711);
  t->set_name("MainThread");
  PythonFrame* pf = t->add_python_frames();
  pf->set_function("all_reduce");
  pf->set_file("torch/distributed/distributed_c10d.py");
  pf->set_line(2050);
  NativeFrame* nf = t->add_native_frames();
  nf->set_pc(0x7f0012345678);
  nf->set_symbol("ncclAllReduce");
  nf->set_module("libnccl.so.2");
  nf->set_offset(0x1234);
  RankMessage out = roundTrip(result);
  ASSERT_EQ(out.msg_case(), RankMessage::kCommandResult);
  ASSERT_EQ(out.command_result().payload_case(), CommandResult::kStacks);
  EXPECT_EQ(out.command_result().stacks().threads(0).python_frames(0).line(), 2050);

  CommandResult inspect;
  inspect.set_command_id(4);
  inspect.set_ok(false);
  inspect.set_error("cuda-gdb not found");
  ConnectionStep* cs = inspect.mutable_inspect()->add_connections();
  cs->set_channel(1);
  cs->set_peer(6);
  cs->set_step(1000);
  cs->set_send(true);
  inspect.mutable_inspect()->set_timed_out(true);
  CommandResult inspect_out = roundTrip(inspect);
  EXPECT_EQ(inspect_out.payload_case(), CommandResult::kInspect);
  EXPECT_EQ(inspect_out.inspect().connections(0).peer(), 6);
}

TEST(ProtoTest, BatchInsideRankMessage) {
  RankMessage in;
  *in.mutable_batch() = makeBatch();
  RankMessage out = roundTrip(in);
  ASSERT_EQ(out.msg_case(), RankMessage::kBatch);
  EXPECT_EQ(out.batch().DebugString(), makeBatch().DebugString());
}

TEST(ProtoTest, QueryMessagesRoundTrip) {
  ListJobsResponse jobs;
  JobInfo* j = jobs.add_jobs();
  j->set_job_id("job-1");
  j->set_world_size(16);
  j->set_ranks_connected(15);
  EXPECT_EQ(roundTrip(jobs).jobs(0).ranks_connected(), 15);

  GetReportResponse report;
  report.set_job_id("job-1");
  SignatureReport* s = report.add_signatures();
  *s->mutable_signature() = makeBatch().signatures(0);
  s->set_count(1000);
  s->set_time_share(0.25);
  s->set_tflops(612.5);
  EXPECT_EQ(roundTrip(report).signatures(0).tflops(), 612.5);
}

TEST(ProtoTest, GarbageIsRefused) {
  const std::string garbage[] = {
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),  // overlong varint key
      std::string("\x0a\x64", 2),          // field 1, length 100, no bytes follow
      std::string("\x1a\x05\x08\x01", 4),  // a truncated nested Signature
      std::string("\x0f", 1),              // wire type 7 does not exist
      std::string("\x0c", 1),              // end-group with no start
  };
  for (const std::string& g : garbage) {
    RecordBatch b;
    EXPECT_FALSE(b.ParseFromString(g)) << "parsed " << testing::PrintToString(g);
    RankMessage m;
    EXPECT_FALSE(m.ParseFromString(g));
  }
  // A valid batch cut short fails too.
  std::string wire = makeBatch().SerializeAsString();
  RecordBatch b;
  EXPECT_FALSE(b.ParseFromString(wire.substr(0, wire.size() / 2)));
  // Unknown fields from a newer peer are kept, not an error.
  std::string newer = wire + std::string("\xa0\x06\x01", 3);  // field 100, varint 1
  ASSERT_TRUE(b.ParseFromString(newer));
  EXPECT_EQ(b.rank(), 3);
  EXPECT_EQ(b.SerializeAsString(), newer);
}

}  // namespace
}  // namespace flare::v1
