// Tokens and what they may do: the daemon's one answer to "may this caller read or change
// this job?", shared by the HTTP API (api.cc), the gRPC Query service and ranks' hellos.
//
// The token file (flared --token-file) holds one entry a line, '#' starts a comment:
//   JOB_ID TOKEN        the token of one job: its ranks stream with it; it reads that job's
//                       report, ranks, diagnoses, records, ... and changes it (commands, deep
//                       trace, mode, baseline)
//   * TOKEN             the token of every job not named on a line of its own
//   [operator] TOKEN    an operator: reads everything (job lists, alerts of every job, /metrics,
//                       baselines) and may change every job; it cannot stream as a rank
// A file that names no token is an error (it would silently turn authentication off).
//
// Without a token file nothing is checked: flared then binds its HTTP API on loopback only
// unless --insecure is given (flared_main.cc).
//
// Immutable after loading; thread-safe for reads. Comparisons are constant-time.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace flare::engine {

struct TokenSet {
  std::unordered_map<std::string, std::string> job_tokens;  // job -> token
  std::string default_token;                                // '*': every other job ("" = none)
  std::vector<std::string> operator_tokens;                 // '[operator]'

  // True when any token is configured (then every check below applies).
  bool enabled() const {
    return !job_tokens.empty() || !default_token.empty() || !operator_tokens.empty();
  }
  // True when `token` is the token of `job_id` (its own line, else '*'). Always true when no
  // token is configured.
  bool jobToken(const std::string& job_id, const std::string& token) const;
  // True when `token` is an operator token (false when none is configured).
  bool operatorToken(const std::string& token) const;
  // May `token` read and change `job_id`? Its job token or an operator token; true when
  // authentication is off.
  bool mayAccessJob(const std::string& job_id, const std::string& token) const {
    return !enabled() || operatorToken(token) || jobToken(job_id, token);
  }
  // May `token` read everything (job lists, all alerts, /metrics)? True when authentication is
  // off.
  bool mayReadAll(const std::string& token) const { return !enabled() || operatorToken(token); }
};

// Parses the token file's text (format above). False with a message naming `name`:line on a
// malformed line, a job named twice, or a file that names no token at all.
bool parseTokenFile(const std::string& text, const std::string& name, TokenSet* out,
                    std::string* error);
// Reads and parses `path`.
bool loadTokenFile(const std::string& path, TokenSet* out, std::string* error);

bool constantTimeEquals(const std::string& a, const std::string& b);

}  // namespace flare::engine
