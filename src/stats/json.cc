#include "src/stats/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "src/common/text.h"

namespace flare::stats::json {

namespace {

class Parser {
 public:
  Parser(std::string_view t, std::string* error) : t_(t), error_(error) {}

  std::optional<Value> document() {
    Value v;
    skipSpace();
    if (!value(&v, 0)) return std::nullopt;
    skipSpace();
    if (pos_ != t_.size()) return fail("trailing characters"), std::nullopt;
    return v;
  }

 private:
  bool fail(const char* what) {
    if (error_) *error_ = std::string("JSON: ") + what + " at offset " + std::to_string(pos_);
    return false;
  }
  void skipSpace() {
    while (pos_ < t_.size() &&
           (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return fail("bad literal");
    pos_ += word.size();
    return true;
  }
  bool value(Value* v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    if (pos_ >= t_.size()) return fail("unexpected end");
    const char c = t_[pos_];
    if (c == '{') return objectValue(v, depth);
    if (c == '[') return arrayValue(v, depth);
    if (c == '"') {
      v->type = Value::Type::kString;
      return stringValue(&v->string);
    }
    if (c == 't') {
      v->type = Value::Type::kBool;
      v->boolean = true;
      return literal("true");
    }
    if (c == 'f') {
      v->type = Value::Type::kBool;
      return literal("false");
    }
    if (c == 'n') return literal("null");
    return numberValue(v);
  }
  bool numberValue(Value* v) {
    const size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    const size_t digits = pos_;
    while (pos_ < t_.size() && isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    if (pos_ == digits) return fail("bad number");
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      const size_t frac = pos_;
      while (pos_ < t_.size() && isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      if (pos_ == frac) return fail("bad number");
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      const size_t exp = pos_;
      while (pos_ < t_.size() && isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      if (pos_ == exp) return fail("bad number");
    }
    const std::string text(t_.substr(start, pos_ - start));
    v->type = Value::Type::kNumber;
    v->number = std::strtod(text.c_str(), nullptr);  // overflow gives ±inf, caught by users
    return true;
  }
  static void appendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  bool hex4(uint32_t* cp) {
    if (t_.size() - pos_ < 4) return fail("bad \\u escape");
    uint32_t v = 0;
    const auto r = std::from_chars(t_.data() + pos_, t_.data() + pos_ + 4, v, 16);
    if (r.ec != std::errc() || r.ptr != t_.data() + pos_ + 4) return fail("bad \\u escape");
    pos_ += 4;
    *cp = v;
    return true;
  }
  bool stringValue(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= t_.size()) return fail("unterminated string");
      const char c = t_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= t_.size()) return fail("unterminated string");
      const char e = t_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {
            uint32_t lo = 0;
            if (t_.substr(pos_, 2) != "\\u") return fail("lone surrogate");
            pos_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xdc00 || lo >= 0xe000) return fail("lone surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return fail("lone surrogate");
          }
          appendUtf8(out, cp);
          break;
        }
        default:
          return fail("bad escape");
      }
    }
  }
  bool arrayValue(Value* v, int depth) {
    v->type = Value::Type::kArray;
    ++pos_;
    skipSpace();
    if (pos_ < t_.size() && t_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      skipSpace();
      v->array.emplace_back();
      if (!value(&v->array.back(), depth + 1)) return false;
      skipSpace();
      if (pos_ >= t_.size()) return fail("unterminated array");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  bool objectValue(Value* v, int depth) {
    v->type = Value::Type::kObject;
    ++pos_;
    skipSpace();
    if (pos_ < t_.size() && t_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      skipSpace();
      if (pos_ >= t_.size() || t_[pos_] != '"') return fail("expected a key");
      std::string key;
      if (!stringValue(&key)) return false;
      skipSpace();
      if (pos_ >= t_.size() || t_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      skipSpace();
      v->object.emplace_back(std::move(key), Value());
      if (!value(&v->object.back().second, depth + 1)) return false;
      skipSpace();
      if (pos_ >= t_.size()) return fail("unterminated object");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  std::string_view t_;
  std::string* error_;
  size_t pos_ = 0;
};

}  // namespace

const Value* Value::get(std::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (const auto& [k, v] : object)
    if (k == key) return &v;
  return nullptr;
}

std::optional<Value> parse(std::string_view text, std::string* error) {
  return Parser(text, error).document();
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string quote(std::string_view s) {
  return common::jsonQuote(s);
}

}  // namespace flare::stats::json
