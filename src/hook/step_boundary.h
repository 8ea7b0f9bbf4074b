// The step boundaries the hook meets as they happen: an explicit step marker (flare_step), or
// the start of a DataLoader `__next__` span that the step rule says starts a step (python.cc) —
// counted only in a process that has called no step marker (the switch to markers, and the
// first DataLoader call they make ignored, are each said once at info). At each one: a deep trace
// counts its steps (deep_trace.h), and step sampling decides whether the step that starts is timed
// (FLARE_SAMPLE_STEPS; src/timing/step_sampling.h).
#pragma once

#include <cstdint>

namespace flare::hook {

enum class StepSource { kMarker, kDataLoader };

// `boundary_ns`: the step's start (CLOCK_MONOTONIC), the time the BatchBuilder sees for the
// same boundary (the marker's or the span's start). Any thread; a mutex once per step.
void onStepBoundary(StepSource source, int64_t boundary_ns);

// Step sampling was asked for: FLARE_SAMPLE_STEPS > 1 or a timing budget (both read once).
bool stepSamplingAsked();

// At exit: where step sampling was asked for (FLARE_SAMPLE_STEPS > 1 or a timing budget) and
// never applied — no step boundary met, or none in summary mode — says so once (a warning).
void stepSamplingAtExit();

// Steps timed before step sampling starts (the warm-up and the first steps stay exact).
constexpr uint32_t kWarmupSteps = 3;

}  // namespace flare::hook
