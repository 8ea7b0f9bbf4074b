// Reads a fixture for flare-replay: one rank's raw-mode records as flare.v1.RecordBatch
// messages, in the order the rank sent them. Three layouts are read:
//
//   - a spool (FLARE_OUTPUT_DIR, or any folder below it: <job>/<rank>/records-<pid>.pb), as the
//     hook writes it; tests/fixtures/sim/ holds such spools;
//   - an archive of one (.tar.gz, .tgz, .tar.xz, .tar.zst; unpacked with tar(1) into a temporary
//     folder, removed at exit);
//   - flare-export's JSON lines, one file per rank (rank<R>.jsonl or rank<R>.jsonl.gz, or a
//     folder of them): the layout tests/gpu/capture.sh writes under tests/fixtures/gpu/
//     (tests/fixtures/gpu/README.md). The lines are turned back into batches by the rank's own
//     encoder (BatchBuilder, raw mode), so signatures, collective kinds and libraries come out as
//     the hook would have sent them; the GPU's name comes from the capture's metadata.json
//     ("gpu"), the other device fields and the drop counters are not in the lines.
//
// Not thread-safe (one call at a time, from main).
#pragma once

#include <string>
#include <vector>

#include "flare/v1/records.pb.h"

namespace flare::replay {

struct FixtureSource {
  std::string file;    // the file the batches were read from
  int rank = 0;        // the recorded rank
  std::string format;  // "spool" or "jsonl"
};

// `source_rank` < 0: the lowest rank the fixture holds. Returns false with `error` set when
// nothing can be read; a truncated spool file (a killed process) still gives its complete
// batches, with a warning on stderr.
bool readFixture(const std::string& path, int source_rank, std::vector<flare::v1::RecordBatch>* out,
                 FixtureSource* source, std::string* error);

// One flare-export JSON line turned into the fields the reader uses (exposed for its test):
// strings, integers (exact, int64), doubles, booleans and arrays of integers; nested objects and
// arrays of objects are skipped. false on malformed JSON.
struct JsonField {
  enum Type { kString, kInt, kDouble, kBool, kNull, kIntArray, kOther } type = kNull;
  std::string s;
  long long i = 0;
  double d = 0;
  std::vector<long long> ints;
};
bool parseJsonLine(const std::string& line, std::vector<std::pair<std::string, JsonField>>* out);

}  // namespace flare::replay
