#include "src/records/spool_format.h"

#include <errno.h>
#include <fmt/format.h>
#include <stdio.h>

#include <memory>
#include <system_error>
#include <utility>

#include "src/records/collective_blocks.h"

namespace flare::records {

void appendVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    *out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *out += static_cast<char>(value);
}

bool readSpoolFile(const std::string& path, std::vector<flare::v1::RecordBatch>* out,
                   std::string* error) {
  auto fail = [error](std::string message) {
    if (error != nullptr) *error = std::move(message);
    return false;
  };
  try {
    std::unique_ptr<FILE, int (*)(FILE*)> file(fopen(path.c_str(), "rbe"), &fclose);
    if (!file) {
      return fail(fmt::format("{}: {}", path, std::system_category().message(errno)));
    }
    std::string buffer;
    uint64_t offset = 0;
    for (;;) {
      int c = fgetc(file.get());
      if (c == EOF) {
        if (ferror(file.get()))
          return fail(fmt::format("{}: read error at offset {}", path, offset));
        return true;
      }
      uint64_t length = 0;
      int prefix_bytes = 0;
      for (int shift = 0;; shift += 7) {
        ++prefix_bytes;
        length |= static_cast<uint64_t>(c & 0x7f) << shift;
        if ((c & 0x80) == 0) break;
        if (prefix_bytes == 10) {
          return fail(fmt::format("{}: malformed length prefix at offset {}", path, offset));
        }
        c = fgetc(file.get());
        if (c == EOF) {
          return fail(fmt::format("{}: truncated length prefix at offset {}", path, offset));
        }
      }
      if (length > kMaxSpoolBatchBytes) {
        return fail(fmt::format("{}: implausible batch length {} at offset {} (garbage?)", path,
                                length, offset));
      }
      buffer.resize(length);
      const size_t got = length == 0 ? 0 : fread(buffer.data(), 1, length, file.get());
      if (got != length) {
        return fail(fmt::format("{}: truncated batch at offset {}: {} of {} bytes", path, offset,
                                got, length));
      }
      flare::v1::RecordBatch batch;
      if (!batch.ParseFromString(buffer)) {
        return fail(fmt::format("{}: malformed batch at offset {}", path, offset));
      }
      std::string why;
      if (expandCollectiveBlocks(&batch, kMaxSpoolExpandedRecords, &why) != Expand::kOk) {
        return fail(fmt::format("{}: batch at offset {}: {}", path, offset, why));
      }
      out->push_back(std::move(batch));
      offset += static_cast<uint64_t>(prefix_bytes) + length;
    }
  } catch (...) {
    return fail(fmt::format("{}: out of memory while reading", path));
  }
}

}  // namespace flare::records
