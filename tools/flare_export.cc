// flare-export: prints the records of an offline spool (FLARE_OUTPUT_DIR) as JSON lines.
//
//   flare-export --input DIR [--format jsonl] [--steps]
//
// DIR is the spool root (DIR/<job>/<rank>/records-<pid>.pb) or any folder below it. One JSON
// object per record: job, rank, kind, name, dtype, shape, layout, stream, device, thread,
// issue/start/end/duration/issue-latency in ns, flops, bytes, and for collectives the
// communicator hash, sequence number, rank count and peer; the traced Python span a kernel was
// launched under (parent_span, 0: none) and its correlation id; "weight" when a 1-in-N sampled
// launch stands for more than itself (FLARE_SAMPLE_KERNELS). Traced Python spans are lines
// of kind "span": name (API), id, parent, thread, start/end/duration, and gc_* for collections.
// Kernel summaries (FLARE_MODE=summary) are lines of kind "summary": op_kind, name, dtype, shape,
// stream, device, window_start_ns/window_end_ns and clusters [{count, p50_ns, p99_ns, sum_ns}],
// and "sampled_ops" when the counts are estimates from that many timed launches. With --steps,
// the rank's per-step statistics (FLARE_MODE=summary) follow as lines of kind "step" (no name):
// start/end/duration, gpu_busy_ns, inter_ns, minority_ns, gpu_ops, late_ops, and
// run_queue_wait_ns when measured.
// Exit 1 when a file is unreadable (the others are still printed), 2 on bad arguments.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "flare/v1/records.pb.h"
#include "src/common/text.h"
#include "src/records/spool_format.h"

namespace fs = std::filesystem;

namespace {

// "OP_KIND_GEMM" -> "gemm": an enum value's name without its prefix, in lower case.
// The signature a record refers to; an empty one when its table entry never came.
const flare::v1::Signature& signatureOf(const std::map<uint32_t, flare::v1::Signature>& sigs,
                                        uint32_t id) {
  static const flare::v1::Signature kEmpty;
  const auto it = sigs.find(id);
  return it == sigs.end() ? kEmpty : it->second;
}

std::string shapeJson(const flare::v1::Signature& s) {
  std::string shape = "[";
  for (int i = 0; i < s.shape_size(); ++i) shape += (i ? "," : "") + std::to_string(s.shape(i));
  return shape + "]";
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, format = "jsonl";
  bool steps = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--input" || a == "--format") && i + 1 < argc) {
      (a == "--input" ? input : format) = argv[++i];
    } else if (a == "--steps") {
      steps = true;
    } else {
      std::fprintf(stderr, "usage: flare-export --input DIR [--format jsonl] [--steps]\n");
      return 2;
    }
  }
  if (input.empty() || format != "jsonl") {
    std::fprintf(stderr, "flare-export: --input DIR is required and --format must be jsonl\n");
    return 2;
  }
  std::error_code ec;
  if (!fs::is_directory(input, ec)) {
    std::fprintf(stderr, "flare-export: %s is not a directory\n", input.c_str());
    return 2;
  }
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(input, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().extension() == ".pb") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  int status = 0;
  for (const auto& path : files) {
    // DIR/<job>/<rank>/records-<pid>.pb
    const std::string job = path.parent_path().parent_path().filename().string();
    std::vector<flare::v1::RecordBatch> batches;
    std::string error;
    if (!flare::records::readSpoolFile(path.string(), &batches, &error)) {
      std::fprintf(stderr, "flare-export: %s: %s\n", path.c_str(), error.c_str());
      status = 1;
    }
    std::map<uint32_t, flare::v1::Signature> sigs;
    std::map<uint32_t, std::string> apis;
    for (const auto& b : batches) {
      for (const auto& s : b.signatures()) sigs[s.id()] = s;
      for (const auto& a : b.api_names()) apis[a.id()] = a.qualified_name();
      for (const auto& sp : b.spans()) {
        const auto it = apis.find(sp.api_id());
        std::printf(
            "{\"job\":%s,\"rank\":%d,\"kind\":\"span\",\"name\":%s,\"id\":%llu,"
            "\"parent\":%llu,\"thread\":%llu,\"start_ns\":%lld,\"end_ns\":%lld,"
            "\"duration_ns\":%lld",
            flare::common::jsonQuote(job).c_str(), b.rank(),
            flare::common::jsonQuote(it == apis.end() ? std::string("?") : it->second).c_str(),
            static_cast<unsigned long long>(sp.id()),
            static_cast<unsigned long long>(sp.parent_span_id()),
            static_cast<unsigned long long>(sp.thread_id()), static_cast<long long>(sp.start_ns()),
            static_cast<long long>(sp.end_ns()),
            static_cast<long long>(sp.end_ns() - sp.start_ns()));
        if (sp.has_gc()) {
          std::printf(",\"gc_generation\":%d,\"gc_collected\":%lld,\"gc_uncollectable\":%lld",
                      sp.gc().generation(), static_cast<long long>(sp.gc().collected()),
                      static_cast<long long>(sp.gc().uncollectable()));
        }
        std::printf("}\n");
      }
      if (steps) {
        for (const auto& st : b.step_stats()) {
          std::printf(
              "{\"job\":%s,\"rank\":%d,\"kind\":\"step\",\"start_ns\":%lld,\"end_ns\":%lld,"
              "\"duration_ns\":%lld,\"gpu_busy_ns\":%lld,\"inter_ns\":%lld,\"minority_ns\":%lld,"
              "\"gpu_ops\":%llu,\"late_ops\":%llu",
              flare::common::jsonQuote(job).c_str(), b.rank(),
              static_cast<long long>(st.start_ns()), static_cast<long long>(st.end_ns()),
              static_cast<long long>(st.end_ns() - st.start_ns()),
              static_cast<long long>(st.gpu_busy_ns()), static_cast<long long>(st.inter_ns()),
              static_cast<long long>(st.minority_ns()),
              static_cast<unsigned long long>(st.gpu_ops()),
              static_cast<unsigned long long>(st.late_ops()));
          if (st.has_run_queue_wait_ns())
            std::printf(",\"run_queue_wait_ns\":%lld",
                        static_cast<long long>(st.run_queue_wait_ns()));
          std::printf("}\n");
        }
      }
      for (const auto& k : b.kernels()) {
        const auto& s = signatureOf(sigs, k.signature_id());
        const std::string shape = shapeJson(s);
        std::printf(
            "{\"job\":%s,\"rank\":%d,\"kind\":\"%s\",\"name\":%s,\"dtype\":\"%s\",\"shape\":%s,"
            "\"layout\":%s,\"stream\":%llu,\"device\":%d,\"thread\":%llu,\"issue_ns\":%lld,"
            "\"start_ns\":%lld,\"end_ns\":%lld,\"duration_ns\":%lld,\"issue_latency_ns\":%lld,"
            "\"flops\":%llu,\"bytes\":%llu",
            flare::common::jsonQuote(job).c_str(), b.rank(),
            flare::common::enumLabel(flare::v1::OpKind_Name(s.kind()), "OP_KIND_").c_str(),
            flare::common::jsonQuote(s.name()).c_str(),
            flare::common::enumLabel(flare::v1::DType_Name(s.dtype()), "DTYPE_").c_str(),
            shape.c_str(), flare::common::jsonQuote(s.layout()).c_str(),
            static_cast<unsigned long long>(k.stream_id()), k.device(),
            static_cast<unsigned long long>(k.thread_id()), static_cast<long long>(k.issue_ns()),
            static_cast<long long>(k.start_ns()), static_cast<long long>(k.end_ns()),
            static_cast<long long>(k.end_ns() - k.start_ns()),
            static_cast<long long>(k.issue_latency_ns()),
            static_cast<unsigned long long>(k.flops()), static_cast<unsigned long long>(k.bytes()));
        std::printf(",\"parent_span\":%llu,\"correlation\":%llu",
                    static_cast<unsigned long long>(k.parent_span_id()),
                    static_cast<unsigned long long>(k.correlation_id()));
        // A 1-in-N sampled launch (FLARE_SAMPLE_KERNELS): the launches it stands for.
        if (k.weight() > 1) std::printf(",\"weight\":%u", k.weight());
        if (k.has_collective()) {
          const auto& c = k.collective();
          std::printf(",\"comm_hash\":\"%016llx\",\"seq\":%llu,\"nranks\":%d",
                      static_cast<unsigned long long>(c.comm_hash()),
                      static_cast<unsigned long long>(c.seq()), c.nranks());
          if (c.has_peer()) std::printf(",\"peer\":%d", c.peer());
        }
        std::printf("}\n");
      }
      for (const auto& ks : b.summaries()) {
        const auto& s = signatureOf(sigs, ks.signature_id());
        const std::string shape = shapeJson(s);
        std::printf(
            "{\"job\":%s,\"rank\":%d,\"kind\":\"summary\",\"op_kind\":\"%s\",\"name\":%s,"
            "\"dtype\":\"%s\",\"shape\":%s,\"stream\":%llu,\"device\":%d,"
            "\"window_start_ns\":%lld,\"window_end_ns\":%lld,\"clusters\":[",
            flare::common::jsonQuote(job).c_str(), b.rank(),
            flare::common::enumLabel(flare::v1::OpKind_Name(s.kind()), "OP_KIND_").c_str(),
            flare::common::jsonQuote(s.name()).c_str(),
            flare::common::enumLabel(flare::v1::DType_Name(s.dtype()), "DTYPE_").c_str(),
            shape.c_str(), static_cast<unsigned long long>(ks.stream_id()), ks.device(),
            static_cast<long long>(ks.window_start_ns()),
            static_cast<long long>(ks.window_end_ns()));
        for (int i = 0; i < ks.clusters_size(); ++i) {
          const auto& c = ks.clusters(i);
          std::printf("%s{\"count\":%llu,\"p50_ns\":%lld,\"p99_ns\":%lld,\"sum_ns\":%lld}",
                      i ? "," : "", static_cast<unsigned long long>(c.count()),
                      static_cast<long long>(c.p50_ns()), static_cast<long long>(c.p99_ns()),
                      static_cast<long long>(c.sum_ns()));
        }
        std::printf("]");
        // Sampled launches: the counts above are estimates from this many timed ones.
        if (ks.sampled_ops() > 0) {
          std::printf(",\"sampled_ops\":%llu", static_cast<unsigned long long>(ks.sampled_ops()));
        }
        std::printf("}\n");
      }
    }
  }
  return status;
}
