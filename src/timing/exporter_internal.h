// GrpcExporter's private parts shared by its files (exporter.cc, exporter_stream.cc,
// exporter_spool.cc, exporter_resend.cc): one stream's state and the log subsystem. Not for use
// outside the exporter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "src/timing/exporter.h"
#include "src/timing/transport.h"

namespace flare::timing {

inline constexpr char kExportLog[] = "export";

// One stream: the transport's stream, its reader thread and what the reader saw. The fields
// other than `t` and `reader` are guarded by the exporter's mu_.
struct GrpcExporter::Stream {
  std::unique_ptr<TransportStream> t;
  std::thread reader;
  bool broken = false;  // the reader returned (stream ended or failed)
  bool acked = false;
  bool accepted = false;
  std::string ack_error;
  uint64_t resume_after_seq = 0;  // HelloAck: the daemon holds batches up to this one
  bool hang_reports = false;      // HelloAck: the daemon reads RankMessage.hang_report
  // A BatchRejected came: the next batch carries every signature and API name again, so that
  // no table entry the daemon refused or lost can make later records unknown to it.
  bool resend_tables = false;
};

}  // namespace flare::timing
