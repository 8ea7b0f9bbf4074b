#include "src/sim/noise.h"

#include <cmath>

#include "src/common/mix.h"

namespace flare::sim {
namespace {

// SplitMix64: a bijective mix with good avalanche, enough for noise.
uint64_t mix(uint64_t x) {
  return common::splitMix64(x);
}

// Domains keep the draws of different quantities independent.
constexpr uint64_t kRank = 1, kStep = 2, kLaunch = 3, kHost = 4, kHiccup = 5, kHiccupSize = 6,
                   kLink = 7, kCollective = 8;

// A standard normal draw from a key (Box-Muller on two uniforms in (0, 1)).
double normalOf(uint64_t key) {
  auto unit = [](uint64_t x) {
    return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  const double u1 = unit(mix(key)), u2 = unit(mix(key ^ 0x5555));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

uint64_t nameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Noise::Noise(const NoiseParams& params, int rank)
    : p_(params),
      rank_key_(mix(params.seed ^ mix(static_cast<uint64_t>(rank) + 1))),
      job_key_(mix(params.seed ^ 0x6a6f62)) {
  rank_factor_ = p_.enabled ? std::exp(p_.rank_cv * normal(kRank, 0, 0)) : 1.0;
}

double Noise::uniform(uint64_t a, uint64_t b, uint64_t c) const {
  const uint64_t x = mix(mix(mix(rank_key_ ^ a) ^ b) ^ c);
  return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
}

double Noise::normal(uint64_t a, uint64_t b, uint64_t c) const {
  // Box-Muller on two independent uniforms.
  const double u1 = uniform(a, b, c), u2 = uniform(a ^ 0x5555, b, c);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double Noise::kernelFactor(std::string_view name, uint64_t n, int64_t step) const {
  if (!p_.enabled) return 1.0;
  const double z_step = normal(kStep, static_cast<uint64_t>(step), 0);
  const double z_launch = normal(kLaunch, nameHash(name), n);
  return rank_factor_ * std::exp(p_.step_cv * z_step + p_.kernel_cv * z_launch);
}

double Noise::hostFactor(int64_t step, uint64_t site) const {
  if (!p_.enabled) return 1.0;
  return std::exp(p_.host_cv * normal(kHost, static_cast<uint64_t>(step), site));
}

int64_t Noise::hiccupNs(uint64_t n) const {
  if (!p_.enabled || p_.hiccup_rate <= 0 || p_.hiccup_us <= 0) return 0;
  if (uniform(kHiccup, n, 0) >= p_.hiccup_rate) return 0;
  return static_cast<int64_t>(-std::log(uniform(kHiccupSize, n, 0)) * p_.hiccup_us * 1000.0);
}

double Noise::linkFactor() const {
  if (!p_.enabled) return 1.0;
  return std::exp(p_.link_cv * normal(kLink, 0, 0));
}

double Noise::collectiveFactor(uint64_t comm, uint64_t seq) const {
  if (!p_.enabled) return 1.0;
  return std::exp(p_.collective_cv * normalOf(mix(mix(job_key_ ^ kCollective) ^ comm) ^ seq));
}

}  // namespace flare::sim
