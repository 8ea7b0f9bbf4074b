// The protocol version of Flare's wire schema (proto/flare/v1/*.proto), for C++ code.
//
// A rank sends kProtocolVersion in RankHello.protocol_version; the daemon refuses versions it
// cannot read. proto/README.md says when to bump it (never for new fields).
#pragma once

#include <cstdint>

#include "flare/v1/common.pb.h"

namespace flare::v1 {

inline constexpr uint32_t kProtocolVersion = 1;

static_assert(kProtocolVersion == static_cast<uint32_t>(PROTOCOL_VERSION_CURRENT),
              "bump ProtocolVersion in common.proto and kProtocolVersion together");

}  // namespace flare::v1
