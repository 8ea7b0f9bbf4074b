// flared end to end: the real binary on free loopback ports with a temp database, real gRPC
// clients (the generated stubs) as ranks of two jobs, /metrics and the JSON API over HTTP, a
// command round trip, tokens, job isolation, malformed bytes, and kill -9 + restart losing
// nothing that was persisted.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "flare/v1/service.grpc.pb.h"
#include "src/engine/test_util.h"

namespace flare::engine {
namespace {

using testing::addKernel;
using testing::gemmSig;
using testing::makeHello;
namespace fs = std::filesystem;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string httpRequest(int port, const std::string& method, const std::string& path,
                        const std::string& body = "", const std::string& extra_headers = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\n" + extra_headers +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// The operator token of FlaredTest's token file: reads everything.
constexpr const char* kOperatorHeader = "X-Flare-Token: tokOp\r\n";

std::string httpBody(int port, const std::string& path) {
  const std::string r = httpRequest(port, "GET", path, "", kOperatorHeader);
  const size_t p = r.find("\r\n\r\n");
  return p == std::string::npos ? "" : r.substr(p + 4);
}

// The value of one sample line of /metrics ("name{labels}"), -1 if absent.
double metric(const std::string& text, const std::string& series) {
  const size_t p = text.find("\n" + series + " ");
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + series.size() + 2));
}

class Flared {
 public:
  Flared(const fs::path& dir, std::vector<std::string> extra) : dir_(dir) {
    const fs::path ready = dir / "ready";
    fs::remove(ready);
    std::vector<std::string> args = {FLARED_PATH,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--http",
                                     "127.0.0.1:0",
                                     "--db",
                                     (dir / "flared.db").string(),
                                     "--ready-file",
                                     ready.string(),
                                     "--persist-interval-ms",
                                     "100"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& s : args) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 1000 && !fs::exists(ready); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream(ready) >> grpc_port >> http_port;
  }
  ~Flared() { stop(SIGKILL); }
  int stop(int sig) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(grpc_port); }
  int grpc_port = 0;
  int http_port = 0;

 private:
  fs::path dir_;
  pid_t pid_ = -1;
};

struct Rank {
  explicit Rank(const std::string& target) {
    channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    stub = v1::Ingest::NewStub(channel);
    stream = stub->Stream(&ctx);
  }
  v1::HelloAck hello(const v1::RankHello& h) {
    v1::RankMessage m;
    *m.mutable_hello() = h;
    stream->Write(m);
    v1::DaemonMessage d;
    EXPECT_TRUE(stream->Read(&d));
    return d.ack();
  }
  bool send(const v1::RecordBatch& b) {
    v1::RankMessage m;
    *m.mutable_batch() = b;
    return stream->Write(m);
  }
  grpc::Status finish() {
    stream->WritesDone();
    v1::DaemonMessage d;
    while (stream->Read(&d)) {
    }
    return stream->Finish();
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Ingest::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RankMessage, v1::DaemonMessage>> stream;
};

v1::RecordBatch gemmBatch(int rank, uint64_t seq, int n, int64_t dur) {
  v1::RecordBatch b;
  b.set_rank(rank);
  b.set_batch_seq(seq);
  *b.add_signatures() = gemmSig(1, 1024, 1024, 1024);
  const int64_t t = nowNs() - 1000000000;
  for (int i = 0; i < n; ++i) addKernel(&b, 1, t + i * 100000, dur);
  return b;
}

class FlaredTest : public ::testing::Test {
 protected:
  FlaredTest() {
    dir_ = fs::temp_directory_path() / ("flared_it_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tokens") << "# job token\njobA tokA\njobB tokB\n[operator] tokOp\n";
  }
  ~FlaredTest() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FlaredTest, RanksStreamQueryRestartAndIsolation) {
  auto d = std::make_unique<Flared>(
      dir_, std::vector<std::string>{"--token-file", (dir_ / "tokens").string()});
  ASSERT_GT(d->grpc_port, 0);
  ASSERT_GT(d->http_port, 0);
  EXPECT_EQ(httpBody(d->http_port, "/healthz"), "ok\n");

  // Four ranks of job A, 50 GEMMs of 2 ms each per rank.
  constexpr int kRanks = 4, kPer = 50;
  constexpr int64_t kDur = 2000000;
  {
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.push_back(std::make_unique<Rank>(d->target()));
      const auto ack = ranks.back()->hello(makeHello("jobA", r, kRanks, "tokA"));
      ASSERT_TRUE(ack.accepted()) << ack.error();
      EXPECT_GT(ack.session_id(), 0u);
      ASSERT_TRUE(ranks.back()->send(gemmBatch(r, 1, kPer, kDur)));
    }
    for (auto& r : ranks) EXPECT_TRUE(r->finish().ok());
  }

  // Wrong token: refused with an ack that says why, then UNAUTHENTICATED.
  {
    Rank bad(d->target());
    const auto ack = bad.hello(makeHello("jobA", 0, kRanks, "tokB"));
    EXPECT_FALSE(ack.accepted());
    EXPECT_THAT(ack.error(), ::testing::HasSubstr("token"));
    EXPECT_EQ(bad.stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Job B's stream claiming another rank is cut off with PERMISSION_DENIED; nothing lands.
  {
    Rank b(d->target());
    ASSERT_TRUE(b.hello(makeHello("jobB", 0, 2, "tokB")).accepted());
    b.send(gemmBatch(1, 1, 10, kDur));
    v1::DaemonMessage m;
    while (b.stream->Read(&m)) {
    }
    EXPECT_EQ(b.stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // Bytes that are no RankMessage: INVALID_ARGUMENT and counted.
  {
    auto ch = grpc::CreateChannel(d->target(), grpc::InsecureChannelCredentials());
    grpc::GenericStub generic(ch);
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(&ctx, "/flare.v1.Ingest/Stream", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    const std::string junk = "\x0a\xff\xff\xff\xff\x0f";
    grpc::Slice slice(junk);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    grpc::Status st;
    call->Finish(&st, reinterpret_cast<void*>(3));
    while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(3)) {
    }
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }

  const std::string metrics = httpBody(d->http_port, "/metrics");
  EXPECT_EQ(metric(metrics, "flare_ingest_records_total{type=\"kernel\"}"), kRanks * kPer);
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"unauthenticated\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"rank_mismatch\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"malformed\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_hellos_accepted_total"), kRanks + 1);
  EXPECT_THAT(metrics, ::testing::HasSubstr("# TYPE flare_ingest_rejected_total counter"));

  // JSON API: the jobs and job A's report; job B has nothing.
  const std::string jobs = httpBody(d->http_port, "/api/v1/jobs?include_finished=1");
  EXPECT_THAT(jobs, ::testing::HasSubstr("\"jobId\":\"jobA\""));
  EXPECT_THAT(jobs, ::testing::HasSubstr("\"jobId\":\"jobB\""));
  const std::string report = httpBody(d->http_port, "/api/v1/jobs/jobA/report");
  EXPECT_THAT(report, ::testing::HasSubstr("\"count\":\"" + std::to_string(kRanks * kPer) + "\""));
  EXPECT_THAT(report,
              ::testing::HasSubstr("\"totalNs\":\"" + std::to_string(kRanks * kPer * kDur) + "\""));
  EXPECT_THAT(httpBody(d->http_port, "/api/v1/jobs/jobB/report"),
              ::testing::Not(::testing::HasSubstr("count")));
  EXPECT_THAT(httpRequest(d->http_port, "GET", "/api/v1/jobs/nope/report", "", kOperatorHeader),
              ::testing::HasSubstr("404"));

  // The gRPC Query service answers the same report.
  {
    auto q =
        v1::Query::NewStub(grpc::CreateChannel(d->target(), grpc::InsecureChannelCredentials()));
    v1::GetReportRequest req;
    req.set_job_id("jobA");
    v1::GetReportResponse resp;
    {  // job B's token may not read job A
      grpc::ClientContext ctx;
      ctx.AddMetadata("x-flare-token", "tokB");
      EXPECT_EQ(q->GetReport(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    }
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-flare-token", "tokA");
    ASSERT_TRUE(q->GetReport(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.signatures_size(), 1);
    EXPECT_EQ(resp.signatures(0).count(), static_cast<uint64_t>(kRanks * kPer));
    const double tflops = 2.0 * 1024 * 1024 * 1024 / (kDur * 1e-9) / 1e12;
    EXPECT_NEAR(resp.signatures(0).tflops(), tflops, 1e-9);
  }

  // A command down a live stream and its result back, through the HTTP API with the token.
  {
    Rank r(d->target());
    ASSERT_TRUE(r.hello(makeHello("jobA", 2, kRanks, "tokA")).accepted());
    const std::string body = R"({"ranks":[2],"command":{"dumpStacks":{"native":false}}})";
    EXPECT_THAT(httpRequest(d->http_port, "POST", "/api/v1/jobs/jobA/commands", body),
                ::testing::HasSubstr("401"));
    const std::string resp = httpRequest(d->http_port, "POST", "/api/v1/jobs/jobA/commands", body,
                                         "X-Flare-Token: tokA\r\n");
    EXPECT_THAT(resp, ::testing::HasSubstr("\"delivered\":1"));
    v1::DaemonMessage m;
    ASSERT_TRUE(r.stream->Read(&m));
    ASSERT_TRUE(m.has_command());
    EXPECT_TRUE(m.command().has_dump_stacks());
    v1::RankMessage res;
    res.mutable_command_result()->set_command_id(m.command().id());
    res.mutable_command_result()->set_ok(true);
    res.mutable_command_result()->mutable_stacks()->add_threads()->set_name("MainThread");
    ASSERT_TRUE(r.stream->Write(res));
    std::string results;
    for (int i = 0; i < 200 && results.find("MainThread") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      results =
          httpBody(d->http_port, "/api/v1/jobs/jobA/commands/" + std::to_string(m.command().id()));
    }
    EXPECT_THAT(results, ::testing::HasSubstr("MainThread"));
    EXPECT_TRUE(r.finish().ok());
  }

  // kill -9 after the state was persisted (every 100 ms): nothing is lost.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  d->stop(SIGKILL);
  d = std::make_unique<Flared>(
      dir_, std::vector<std::string>{"--token-file", (dir_ / "tokens").string()});
  ASSERT_GT(d->http_port, 0);
  EXPECT_EQ(httpBody(d->http_port, "/api/v1/jobs/jobA/report"), report);
  const std::string ranks = httpBody(d->http_port, "/api/v1/jobs/jobA/ranks");
  size_t hosts = 0;
  for (size_t p = ranks.find("\"host\""); p != std::string::npos; p = ranks.find("\"host\"", p + 1))
    ++hosts;
  EXPECT_EQ(hosts, static_cast<size_t>(kRanks)) << ranks;
  // The ranks reconnect, are told what the daemon holds of them, and carry on.
  {
    Rank r(d->target());
    const auto ack = r.hello(makeHello("jobA", 0, kRanks, "tokA"));
    ASSERT_TRUE(ack.accepted());
    EXPECT_EQ(ack.resume_after_seq(), 1u);
    ASSERT_TRUE(r.send(gemmBatch(0, 2, 10, kDur)));
    EXPECT_TRUE(r.finish().ok());
  }
  EXPECT_THAT(httpBody(d->http_port, "/api/v1/jobs/jobA/report"),
              ::testing::HasSubstr("\"count\":\"" + std::to_string(kRanks * kPer + 10) + "\""));
  // SIGTERM: a clean exit.
  const int status = d->stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(FlaredTest, OversizedMessagesAndTooManyRanksAreRefusedAndCounted) {
  Flared d(dir_, {"--max-message-bytes", "4096", "--max-ranks-per-job", "2"});
  ASSERT_GT(d.grpc_port, 0);
  {
    Rank r(d.target());
    ASSERT_TRUE(r.hello(makeHello("job", 0, 2)).accepted());
    ASSERT_TRUE(r.send(gemmBatch(0, 1, 200, 1000)));  // ~10 KB: over 4096, under gRPC's 8192
    v1::DaemonMessage m;
    while (r.stream->Read(&m)) {
    }
    EXPECT_EQ(r.stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  {
    Rank r(d.target());
    const auto ack = r.hello(makeHello("job", 0, 3));  // world_size over --max-ranks-per-job
    EXPECT_FALSE(ack.accepted());
    EXPECT_EQ(r.stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const std::string metrics = httpBody(d.http_port, "/metrics");
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"oversized\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"too_many_ranks\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_records_total{type=\"kernel\"}"), 0);
}

// The first real-GPU run: one out-of-range step statistic cost its batch with the signature
// tables, and every later batch of the rank was refused as unknown_signature. Now the statistic
// alone is dropped, the rank is told (BatchRejected, batch_kept), its later records are accepted,
// `flare status` (the ranks API) shows the refusal, and the detectors say it (data_refused,
// routed to infrastructure).
TEST_F(FlaredTest, ABadStepStatisticCostsOnlyItselfAndIsReported) {
  Flared d(dir_, {"--diagnose-interval-s", "1"});
  ASSERT_GT(d.grpc_port, 0);
  Rank r(d.target());
  ASSERT_TRUE(r.hello(makeHello("job", 0, 1)).accepted());
  v1::RecordBatch b = gemmBatch(0, 1, 20, 1000);
  v1::StepStats* st = b.add_step_stats();
  st->set_start_ns(nowNs() - 2'000'000'000);
  st->set_end_ns(st->start_ns() + 12'225'376);
  st->set_inter_ns(501'576'868);  // the GPU run's step 0
  ASSERT_TRUE(r.send(b));
  v1::DaemonMessage m;
  ASSERT_TRUE(r.stream->Read(&m));
  ASSERT_TRUE(m.has_rejected());
  EXPECT_EQ(m.rejected().batch_seq(), 1u);
  EXPECT_EQ(m.rejected().reason(), "bad_record");
  EXPECT_TRUE(m.rejected().batch_kept());
  EXPECT_EQ(m.rejected().items_dropped(), 1u);
  v1::RecordBatch next = gemmBatch(0, 2, 20, 1000);
  next.clear_signatures();  // sent once per stream: the daemon kept it
  ASSERT_TRUE(r.send(next));
  std::string metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = httpBody(d.http_port, "/metrics");
    if (metric(metrics, "flare_ingest_records_total{type=\"kernel\"}") == 40) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(metric(metrics, "flare_ingest_records_total{type=\"kernel\"}"), 40);
  EXPECT_EQ(metric(metrics, "flare_ingest_items_dropped_total{reason=\"bad_record\"}"), 1);
  EXPECT_EQ(metric(metrics, "flare_ingest_items_dropped_total{reason=\"unknown_signature\"}"), 0);
  EXPECT_EQ(metric(metrics, "flare_ingest_rejected_total{reason=\"bad_record\"}"), 0);
  const std::string ranks = httpBody(d.http_port, "/api/v1/jobs/job/ranks");
  EXPECT_THAT(ranks, ::testing::HasSubstr("\"refusals\""));
  EXPECT_THAT(ranks, ::testing::HasSubstr("\"reason\":\"bad_record\""));
  EXPECT_THAT(ranks, ::testing::HasSubstr("inter_ns 501576868"));
  std::string diagnoses;
  for (int i = 0; i < 100; ++i) {
    diagnoses = httpBody(d.http_port, "/api/v1/jobs/job/diagnoses");
    if (diagnoses.find("data_refused") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(diagnoses, ::testing::HasSubstr("\"data_refused\""));
  EXPECT_THAT(diagnoses, ::testing::HasSubstr("infrastructure"));
  r.finish();
}

TEST_F(FlaredTest, TlsWhenGivenCertAndKey) {
  const fs::path key = dir_ / "key.pem", cert = dir_ / "cert.pem";
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      key.string() + " -out " + cert.string() + " >/dev/null 2>&1";
  if (system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a test certificate";
  Flared d(dir_, {"--tls-cert", cert.string(), "--tls-key", key.string()});
  ASSERT_GT(d.grpc_port, 0);
  std::ifstream in(cert);
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  auto tls = v1::Query::NewStub(
      grpc::CreateChannel("localhost:" + std::to_string(d.grpc_port), grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsResponse resp;
  EXPECT_TRUE(tls->ListJobs(&ctx, v1::ListJobsRequest(), &resp).ok());
  // HTTP is HTTPS with the same certificate.
  if (system("command -v curl >/dev/null 2>&1") == 0) {
    FILE* p = popen(("curl -s --max-time 10 --cacert " + cert.string() +
                     " https://localhost:" + std::to_string(d.http_port) + "/healthz")
                        .c_str(),
                    "r");
    ASSERT_NE(p, nullptr);
    char buf[64] = {0};
    const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
    pclose(p);
    EXPECT_EQ(std::string(buf, n), "ok\n");
  }
  // Plaintext is refused on the TLS port.
  auto plain =
      v1::Query::NewStub(grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  EXPECT_FALSE(plain->ListJobs(&ctx2, v1::ListJobsRequest(), &resp).ok());
}

// Runs flared with `args` (its output merged), returns the exit status and the output.
// `then`: shell text after it (e.g. to stop it after a while).
std::pair<int, std::string> runFlared(const std::string& args, const std::string& then = "") {
  FILE* p = popen((std::string(FLARED_PATH) + " " + args + " 2>&1" + then).c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  return {pclose(p), out};
}

TEST_F(FlaredTest, WritesAndReadsNeedTheRightToken) {
  Flared d(dir_, {"--token-file", (dir_ / "tokens").string()});
  ASSERT_GT(d.http_port, 0);
  for (const char* method : {"POST", "DELETE"}) {
    EXPECT_THAT(httpRequest(d.http_port, method, "/api/v1/jobs/jobA/baseline"),
                ::testing::StartsWith("HTTP/1.1 401"));
    EXPECT_THAT(httpRequest(d.http_port, method, "/api/v1/jobs/jobA/baseline", "",
                            "X-Flare-Token: tokB\r\n"),
                ::testing::StartsWith("HTTP/1.1 403"));
    // The right token gets past the check (job A has no data: 404).
    EXPECT_THAT(httpRequest(d.http_port, method, "/api/v1/jobs/jobA/baseline", "",
                            "X-Flare-Token: tokA\r\n"),
                ::testing::StartsWith("HTTP/1.1 404"));
  }
  EXPECT_THAT(httpRequest(d.http_port, "POST", "/api/v1/jobs/jobA/commands",
                          R"({"command":{"deepTrace":{"steps":2}}})", "X-Flare-Token: tokB\r\n"),
              ::testing::StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(
      httpRequest(d.http_port, "GET", "/api/v1/jobs/jobA/report", "", "X-Flare-Token: tokB\r\n"),
      ::testing::StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(httpRequest(d.http_port, "GET", "/metrics"), ::testing::StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(httpRequest(d.http_port, "GET", "/metrics", "", "Authorization: Bearer tokOp\r\n"),
              ::testing::StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(httpRequest(d.http_port, "GET", "/healthz"), ::testing::StartsWith("HTTP/1.1 200"));
}

// The issue's probe against the real daemon: 100 clients trickling a byte every 200 ms do not
// hold up /healthz and /metrics (median of 7 probes each; http_server_test.cc has the details).
TEST_F(FlaredTest, SlowClientsDoNotStallProbes) {
  Flared d(dir_, {"--token-file", (dir_ / "tokens").string()});
  ASSERT_GT(d.http_port, 0);
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(d.http_port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done) {
      for (int fd : slow) send(fd, "G", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const char* path : {"/healthz", "/metrics"}) {
    std::vector<double> ms;
    for (int i = 0; i < 7; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string got = httpRequest(d.http_port, "GET", path, "", kOperatorHeader);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_THAT(got, ::testing::StartsWith("HTTP/1.1 200")) << path;
    }
    std::sort(ms.begin(), ms.end());
    EXPECT_LT(ms[ms.size() / 2], 100.0) << path << ": median of 7 probes";
  }
  EXPECT_GE(metric(httpBody(d.http_port, "/metrics"), "flare_http_connections"), 100);
  done = true;
  trickle.join();
  for (int fd : slow) close(fd);
}

TEST_F(FlaredTest, GrpcPortIsExclusiveHellosHaveADeadlineStreamsPerPeerAreBounded) {
  Flared d(dir_, {"--hello-timeout-ms", "300", "--max-streams-per-peer", "3"});
  ASSERT_GT(d.grpc_port, 0);
  // A second daemon on the same port fails to start, saying why (SO_REUSEPORT would have let
  // the kernel split the ranks between the two).
  auto [status, out] = runFlared("--listen " + d.target() + " --http 127.0.0.1:0 --db " +
                                 (dir_ / "second.db").string());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("cannot listen on " + d.target()));
  EXPECT_THAT(out, ::testing::HasSubstr("another flared"));
  // A stream that never says hello is ended, well before the old "forever".
  {
    Rank idle(d.target());
    const auto t0 = std::chrono::steady_clock::now();
    v1::DaemonMessage m;
    EXPECT_FALSE(idle.stream->Read(&m));
    EXPECT_EQ(idle.stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  }
  // The client can see the idle stream's status before the server has let go of its slot; the
  // limit below counts from once it has (its close is counted after the release).
  auto closed = [&] {
    const std::string m = httpBody(d.http_port, "/metrics");
    const double opened = metric(m, "flare_grpc_streams_total{event=\"opened\"}");
    return opened >= 1 && metric(m, "flare_grpc_streams_total{event=\"closed\"}") >= opened;
  };
  for (int i = 0; i < 200 && !closed(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(closed()) << "the idle stream was never released";
  // Three streams from this address are served; a fourth is refused while they are open.
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<Rank>(d.target()));
    ASSERT_TRUE(ranks.back()->hello(makeHello("jobP", r, 4)).accepted());
  }
  {
    Rank extra(d.target());
    v1::DaemonMessage m;
    EXPECT_FALSE(extra.stream->Read(&m));
    const grpc::Status st = extra.stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("--max-streams-per-peer"));
  }
  // An accepted stream keeps going past the hello deadline.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_TRUE(ranks[0]->send(gemmBatch(0, 1, 5, 1000000)));
  EXPECT_TRUE(ranks[0]->finish().ok());
  ranks.erase(ranks.begin());
  // Once one is gone, another is admitted.
  bool admitted = false;
  for (int i = 0; i < 50 && !admitted; ++i) {
    Rank again(d.target());
    v1::RankMessage hm;
    *hm.mutable_hello() = makeHello("jobP", 3, 4);
    again.stream->Write(hm);
    v1::DaemonMessage m;
    admitted = again.stream->Read(&m) && m.ack().accepted();
    if (admitted) {
      again.finish();
    } else {
      again.stream->Finish();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  EXPECT_TRUE(admitted);
  for (auto& r : ranks) EXPECT_TRUE(r->finish().ok());
  const std::string metrics = httpBody(d.http_port, "/metrics");
  EXPECT_GE(metric(metrics, "flare_grpc_streams_refused_total{reason=\"hello_timeout\"}"), 1);
  EXPECT_GE(metric(metrics, "flare_grpc_streams_refused_total{reason=\"peer_limit\"}"), 1);
}

TEST_F(FlaredTest, UnsafeConfigurationsAreRefusedAtStart) {
  const std::string db = " --db " + (dir_ / "x.db").string();
  // A token file that names no token would turn authentication off: an error.
  std::ofstream(dir_ / "empty-tokens") << "# jobA tokA\n\n";
  auto [status, out] = runFlared("--listen 127.0.0.1:0 --http 127.0.0.1:0 --token-file " +
                                 (dir_ / "empty-tokens").string() + db);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("names no token"));
  // A non-loopback address without tokens: refused, saying how to go on.
  std::tie(status, out) = runFlared("--listen 127.0.0.1:0 --http 0.0.0.0:0" + db);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("--http 0.0.0.0:0 is not a loopback address"));
  EXPECT_THAT(out, ::testing::HasSubstr("--insecure"));
  std::tie(status, out) = runFlared("--listen 0.0.0.0:0 --http off" + db);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << out;
  // With --insecure 1 it serves, and says so loudly.
  std::tie(status, out) =
      runFlared("--listen 127.0.0.1:0 --http 0.0.0.0:0 --insecure 1 --diagnose-interval-s 0" + db,
                " & P=$!; sleep 3; kill $P; wait $P");
  EXPECT_THAT(out, ::testing::HasSubstr("INSECURE: --http 0.0.0.0:0 without --token-file"));
}

TEST_F(FlaredTest, HelpDocumentsEveryFlag) {
  const std::string cmd = std::string(FLARED_PATH) + " --help";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0);
  for (const char* f : {"--listen", "--http", "--db", "--token-file", "--tls-cert", "--tls-key",
                        "--max-message-bytes", "--rank-rate-limit", "--raw-retention-s",
                        "--db-max-bytes", "--insecure"}) {
    EXPECT_THAT(out, ::testing::HasSubstr(f));
  }
  EXPECT_NE(system((std::string(FLARED_PATH) + " --no-such-flag 2>/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace flare::engine
