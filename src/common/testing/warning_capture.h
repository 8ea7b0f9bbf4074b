// Test helper: collects the warning lines of config.h's sink (setWarningSink) while it lives, so
// that a test can assert on the exact lines a bad setting gives. Used by the tests of
// src/common; not linked into any product.
//
// One capture at a time (the sink is process-wide); lines() and clear() may be called from any
// thread. Warnings are once per (variable, value) per process, so each test uses its own names.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "src/common/config.h"

namespace flare::common::testing {

class WarningCapture {
 public:
  WarningCapture() {
    clear();
    setWarningSink(&capture);
  }
  ~WarningCapture() { setWarningSink(nullptr); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;

  // The lines warned since construction or the last clear(), in order.
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu());
    return captured();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu());
    captured().clear();
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& captured() {
    static std::vector<std::string> v;
    return v;
  }
  static void capture(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu());
    captured().push_back(line);
  }
};

}  // namespace flare::common::testing
