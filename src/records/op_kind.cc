#include "src/records/op_kind.h"

#include "src/stats/perf_model.h"

namespace flare::records {

bool computesFlops(flare::v1::OpKind kind) {
  return kind == flare::v1::OP_KIND_GEMM || kind == flare::v1::OP_KIND_ATTENTION ||
         kind == flare::v1::OP_KIND_CUSTOM;
}

bool isCollective(flare::v1::OpKind kind) {
  return kind == flare::v1::OP_KIND_COLLECTIVE || kind == flare::v1::OP_KIND_P2P;
}

double busBandwidthFactor(flare::v1::CollectiveKind kind, int nranks) {
  if (nranks < 1) return 1.0;
  using stats::Collective;
  Collective c = Collective::kSendRecv;  // broadcast, reduce, send/recv, group, unspecified: 1
  switch (kind) {
    case flare::v1::COLLECTIVE_KIND_ALL_REDUCE:
      c = Collective::kAllReduce;
      break;
    case flare::v1::COLLECTIVE_KIND_ALL_GATHER:
      c = Collective::kAllGather;
      break;
    case flare::v1::COLLECTIVE_KIND_REDUCE_SCATTER:
      c = Collective::kReduceScatter;
      break;
    case flare::v1::COLLECTIVE_KIND_ALL_TO_ALL:
      c = Collective::kAllToAll;
      break;
    default:
      break;
  }
  return stats::busBandwidthFactor(c, nranks);
}

}  // namespace flare::records
