// `roformer plot`: training curves of one or more run directories (loss,
// MLM accuracy and learning rate against tokens seen, stage boundaries
// marked) drawn by gnuplot from the runs' metrics.jsonl.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace roformer {

// One curve point: x is tokens seen (or the step for runs without stage
// records), y the value.
struct PlotPoint {
  double x = 0, y = 0;
};

// What plot reads from a run directory's metrics.jsonl. A resumed run logs
// some steps twice; the last record of a step wins.
struct RunCurves {
  std::string name;  // the directory's name
  bool x_is_tokens = true;
  std::vector<PlotPoint> train_loss, train_accuracy, validation_loss, validation_accuracy, lr;
  std::vector<double> stage_starts;  // x of each stage's first step (after the first)
};

// Reads <run_dir>/metrics.jsonl; throws InputError naming the file and line
// of anything it cannot use.
RunCurves read_run_curves(const std::filesystem::path& run_dir);

// The gnuplot program that draws `runs` into `output` (.svg or .png).
std::string gnuplot_script(const std::vector<RunCurves>& runs, const std::filesystem::path& output);

// Reads the runs and writes the plot: to a temporary file first, renamed
// over `output` only when gnuplot succeeded, so a failed plot never destroys
// an earlier one. Throws InputError when gnuplot is missing or fails.
void plot_runs(const std::vector<std::filesystem::path>& run_dirs,
               const std::filesystem::path& output);

}  // namespace roformer
