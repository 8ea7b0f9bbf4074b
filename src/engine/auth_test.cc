// Tokens (auth.h) and the HTTP API's scopes (QueryApi::http): the token file's format and its
// errors, a job's token reading and changing only its job, an operator token everything, 401
// without a token and 403 with one that may not. No transport: requests go to QueryApi::http.
#include "src/engine/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "src/common/clock.h"
#include "src/engine/api.h"
#include "src/engine/ingest.h"

namespace flare::engine {
namespace {

using ::testing::HasSubstr;

TEST(TokenFileTest, ParsesJobsDefaultAndOperators) {
  TokenSet t;
  std::string err;
  ASSERT_TRUE(
      parseTokenFile("# comment\njobA tokA  # trailing\n\n* tokAny\n[operator] tokOp\n"
                     "[operator] tokOp2\n",
                     "tokens", &t, &err))
      << err;
  EXPECT_TRUE(t.enabled());
  EXPECT_TRUE(t.jobToken("jobA", "tokA"));
  EXPECT_FALSE(t.jobToken("jobA", "tokAny"));  // its own line wins over '*'
  EXPECT_TRUE(t.jobToken("jobB", "tokAny"));
  EXPECT_FALSE(t.jobToken("jobB", "tokA"));
  EXPECT_FALSE(t.jobToken("jobB", ""));
  EXPECT_TRUE(t.operatorToken("tokOp"));
  EXPECT_TRUE(t.operatorToken("tokOp2"));
  EXPECT_FALSE(t.operatorToken("tokA"));
  EXPECT_FALSE(t.operatorToken(""));
  EXPECT_TRUE(t.mayAccessJob("jobA", "tokOp"));
  EXPECT_TRUE(t.mayReadAll("tokOp"));
  EXPECT_FALSE(t.mayReadAll("tokA"));
}

TEST(TokenFileTest, AFileWithNoTokenIsAnError) {
  TokenSet t;
  std::string err;
  EXPECT_FALSE(
      parseTokenFile("# only comments\n\n   \n# jobA tokA\n", "/etc/flare/tokens", &t, &err));
  EXPECT_THAT(err, HasSubstr("/etc/flare/tokens"));
  EXPECT_THAT(err, HasSubstr("names no token"));
  EXPECT_FALSE(parseTokenFile("", "f", &t, &err));
}

TEST(TokenFileTest, MalformedLinesAndDuplicatesNameTheLine) {
  TokenSet t;
  std::string err;
  EXPECT_FALSE(parseTokenFile("jobA tokA\njobB\n", "f", &t, &err));
  EXPECT_THAT(err, HasSubstr("f:2:"));
  EXPECT_FALSE(parseTokenFile("jobA a b\n", "f", &t, &err));
  EXPECT_THAT(err, HasSubstr("f:1:"));
  EXPECT_FALSE(parseTokenFile("jobA a\njobA b\n", "f", &t, &err));
  EXPECT_THAT(err, HasSubstr("named twice"));
  EXPECT_FALSE(parseTokenFile("* a\n* b\n", "f", &t, &err));
}

TEST(TokenFileTest, WithoutTokensEverythingIsOpen) {
  TokenSet t;
  EXPECT_FALSE(t.enabled());
  EXPECT_TRUE(t.jobToken("x", ""));
  EXPECT_TRUE(t.mayAccessJob("x", ""));
  EXPECT_TRUE(t.mayReadAll(""));
}

class HttpScopesTest : public ::testing::Test {
 protected:
  HttpScopesTest()
      : ingest_(IngestConfig{}, nullptr, clock_),
        api_(ingest_, nullptr, [] { return std::string("flare_up 1\n"); }) {
    TokenSet t;
    std::string err;
    EXPECT_TRUE(parseTokenFile("jobA tokA\njobB tokB\n[operator] tokOp\n", "t", &t, &err));
    api_.setTokens(t);
  }
  int status(const std::string& method, const std::string& path, const std::string& token,
             std::map<std::string, std::string> query = {}, bool bearer = false) {
    HttpRequest r;
    r.method = method;
    r.path = path;
    r.query = std::move(query);
    if (!token.empty()) {
      if (bearer) {
        r.headers["authorization"] = "Bearer " + token;
      } else {
        r.headers["x-flare-token"] = token;
      }
    }
    if (method == "POST") r.body = "{}";
    return api_.http(r).status;
  }
  common::FakeClock clock_;
  Ingest ingest_;
  QueryApi api_;
};

TEST_F(HttpScopesTest, HealthzIsOpenEverythingElseNeedsAToken) {
  EXPECT_EQ(status("GET", "/healthz", ""), 200);
  EXPECT_EQ(status("GET", "/metrics", ""), 401);
  EXPECT_EQ(status("GET", "/api/v1/jobs", ""), 401);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/report", ""), 401);
  EXPECT_EQ(status("POST", "/api/v1/jobs/jobA/baseline", ""), 401);
  EXPECT_EQ(status("DELETE", "/api/v1/jobs/jobA/baseline", ""), 401);
  EXPECT_EQ(status("POST", "/api/v1/jobs/jobA/commands", ""), 401);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/commands/1", ""), 401);
  EXPECT_EQ(status("GET", "/api/v1/alerts", ""), 401);
}

TEST_F(HttpScopesTest, AJobTokenReachesItsJobOnly) {
  // Its own job: past the check (unknown job: 404, not 401/403).
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/report", "tokA"), 404);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/report", "tokA", {}, /*bearer=*/true), 404);
  EXPECT_EQ(status("POST", "/api/v1/jobs/jobA/commands", "tokA"), 400);  // no kind
  // Another job, reads and writes alike.
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobB/report", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobB/ranks", "tokA"), 403);
  EXPECT_EQ(status("POST", "/api/v1/jobs/jobB/commands", "tokA"), 403);
  EXPECT_EQ(status("DELETE", "/api/v1/jobs/jobB/baseline", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobB/commands/1", "tokA"), 403);
  // A series of its job compared with another job's baseline reads that job too.
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/series", "tokA", {{"baseline", "jobB"}}), 403);
  // Everything-wide reads are the operator's.
  EXPECT_EQ(status("GET", "/metrics", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/jobs", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/baselines", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/alerts", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/alerts", "tokA", {{"job", "jobA"}}), 200);
  EXPECT_EQ(status("GET", "/api/v1/alerts", "tokA", {{"job", "jobB"}}), 403);
  // Paths that only look like a job's.
  EXPECT_EQ(status("GET", "/api/v1/jobs//jobA/report", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/x/y/diagnoses", "tokA"), 403);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobA/report", "wrong"), 403);
}

TEST_F(HttpScopesTest, AnOperatorTokenReadsAndChangesEverything) {
  EXPECT_EQ(status("GET", "/metrics", "tokOp"), 200);
  EXPECT_EQ(status("GET", "/api/v1/jobs", "tokOp"), 200);
  EXPECT_EQ(status("GET", "/api/v1/alerts", "tokOp"), 200);
  EXPECT_EQ(status("GET", "/api/v1/jobs/jobB/report", "tokOp"), 404);     // unknown job
  EXPECT_EQ(status("POST", "/api/v1/jobs/jobB/commands", "tokOp"), 400);  // no kind
  EXPECT_EQ(status("GET", "/metrics", "tokOp", {}, /*bearer=*/true), 200);
}

TEST(HttpScopesOpenTest, WithoutTokensNothingIsChecked) {
  common::FakeClock clock;
  Ingest ingest(IngestConfig{}, nullptr, clock);
  QueryApi api(ingest, nullptr, [] { return std::string(); });
  HttpRequest r;
  r.method = "GET";
  r.path = "/api/v1/jobs";
  EXPECT_EQ(api.http(r).status, 200);
  r.path = "/metrics";
  EXPECT_EQ(api.http(r).status, 200);
}

}  // namespace
}  // namespace flare::engine
