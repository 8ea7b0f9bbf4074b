#include "src/engine/auth.h"

#include <fstream>
#include <sstream>

namespace flare::engine {

bool constantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool TokenSet::jobToken(const std::string& job_id, const std::string& token) const {
  if (!enabled()) return true;
  const auto it = job_tokens.find(job_id);
  const std::string& want = it != job_tokens.end() ? it->second : default_token;
  if (want.empty() || token.empty()) return false;
  return constantTimeEquals(want, token);
}

bool TokenSet::operatorToken(const std::string& token) const {
  if (token.empty()) return false;
  bool found = false;
  for (const std::string& t : operator_tokens) found |= constantTimeEquals(t, token);
  return found;
}

bool parseTokenFile(const std::string& text, const std::string& name, TokenSet* out,
                    std::string* error) {
  TokenSet set;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string who, token, extra;
    if (!(ls >> who)) continue;
    const std::string where = name + ":" + std::to_string(n) + ": ";
    if (!(ls >> token) || (ls >> extra)) {
      *error = where + "expected 'JOB_ID TOKEN', '* TOKEN' or '[operator] TOKEN'";
      return false;
    }
    if (who == "[operator]") {
      set.operator_tokens.push_back(token);
    } else if (who == "*") {
      if (!set.default_token.empty()) {
        *error = where + "a second '*' line";
        return false;
      }
      set.default_token = token;
    } else if (!set.job_tokens.emplace(who, token).second) {
      *error = where + "job " + who + " is named twice";
      return false;
    }
  }
  if (!set.enabled()) {
    *error = name +
             ": names no token (only comments or blank lines); remove --token-file to run "
             "without authentication";
    return false;
  }
  *out = std::move(set);
  return true;
}

bool loadTokenFile(const std::string& path, TokenSet* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read --token-file " + path;
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  return parseTokenFile(text.str(), path, out, error);
}

}  // namespace flare::engine
