// SplitMix64 (Steele, Lea, Flood 2014): the finalizer, a bijective 64-bit mix with good
// avalanche, and the generator's output for one state. For hash-derived choices (step sampling's
// measured steps, the simulator's noise, timeline ids) and seeding per-thread generators; not
// for anything that must resist an adversary. Header-only; no state.
#pragma once

#include <cstdint>

namespace flare::common {

inline constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;

// SplitMix64's finalizer of `z`.
inline constexpr uint64_t mixBits(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// SplitMix64's output for the state before `x` (the state advanced by the golden gamma, mixed).
inline constexpr uint64_t splitMix64(uint64_t x) {
  return mixBits(x + kGoldenGamma);
}

}  // namespace flare::common
