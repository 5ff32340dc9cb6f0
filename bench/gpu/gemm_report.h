// The products of one training step, measured one by one (mlm_step_bench
// --gemm-report): which cuBLASLt problems the step issues and how often,
// each re-run on fresh random operands with every algorithm cuBLASLt's
// heuristic offers for it, so the report says how fast the algorithm the
// library runs is (rank 0, core/cuda/gemm.cpp) against the fastest it could
// have picked. bench/gpu/gemm_peer_torch.py times the same problems in
// PyTorch beside it. CUDA builds only.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "core/device.h"

namespace roformer::bench {

// Runs `step` once under a recording of its products, then re-runs each
// distinct product (up to `candidates` algorithms, `repeats` timed runs each)
// on `device`. One JSON object per problem: its shape and settings, calls a
// step, every candidate's median ms, and the heuristic's and the best
// candidate's ms and TFLOP/s.
nlohmann::json gemm_report(const std::function<void()>& step, Device device, int candidates,
                           int repeats);

// The report as a table, with the step's products in total (calls x ms) by
// the heuristic's picks and by the best candidates.
void print_gemm_report(const nlohmann::json& report);

}  // namespace roformer::bench
