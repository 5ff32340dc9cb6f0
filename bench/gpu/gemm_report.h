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
#include <vector>

#include "core/cuda/gemm.h"
#include "core/device.h"

namespace roformer::bench {

// Runs `step` once under a recording of its products, then re-runs each
// distinct product (up to `candidates` algorithms, `repeats` timed runs each)
// on `device` with fresh random operands at the recorded operands' offsets
// past a 256-byte boundary: one gemm_report_row per problem, heaviest
// (calls x FLOPs) first; a problem that throws gets its row with the error.
nlohmann::json gemm_report(const std::function<void()>& step, Device device, int candidates,
                           int repeats);

// One problem's row (what the report and bench/gpu/gemm_peer_torch.py read):
// g's shapes, strides, transposes, dtypes, epilogue and accumulation, its
// operands' offsets past a 256-byte boundary (from g's pointers), calls a
// step, and the timed candidates with the chosen's (rank 0) and the best's
// ms and TFLOP/s; an "error" where none was timed.
nlohmann::json gemm_report_row(const cuda::GemmArgs& g, int64_t calls,
                               const std::vector<cuda::GemmCandidate>& timed);

// The report as a table, with the step's products in total (calls x ms) by
// the heuristic's picks and by the best candidates.
void print_gemm_report(const nlohmann::json& report);

}  // namespace roformer::bench
