// The MODE_SUMMARY pieces of the diagnosis under their former name: the kernel-summary index
// (SummaryIndex, indexSummaries, hasSummaries: signals.h) and the summary-mode gpu_slow detector
// (detectSlowGpuFromSummaries: gpu_slow.h). New code includes those two headers.
#pragma once

#include "src/engine/diagnosis/gpu_slow.h"
#include "src/engine/diagnosis/signals.h"
