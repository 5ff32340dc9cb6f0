#include "train/plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

extern char** environ;

namespace roformer {

namespace fs = std::filesystem;

namespace {

struct Stage {
  int64_t first_step = 0;
  double tokens_per_step = 0;
  // A batch-size warm-up: (end step within the stage, tokens per step) levels.
  std::vector<std::pair<int64_t, double>> warm_up;
};

// Tokens of a stage's first `n` steps.
double stage_tokens(const Stage& s, int64_t n) {
  double tokens = 0;
  int64_t begin = 0;
  for (const auto& [end, per_step] : s.warm_up) {
    if (n <= begin) return tokens;
    tokens += double(std::min(n, end) - begin) * per_step;
    begin = end;
  }
  return n > begin ? tokens + double(n - begin) * s.tokens_per_step : tokens;
}

// Tokens seen after `step` steps, from the stages' (first step, batch x length).
double tokens_at(const std::vector<Stage>& stages, int64_t step) {
  double tokens = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const int64_t end = i + 1 < stages.size() ? stages[i + 1].first_step : INT64_MAX;
    if (step <= stages[i].first_step) break;
    tokens += stage_tokens(stages[i], std::min(step, end) - stages[i].first_step);
  }
  return tokens;
}

// gnuplot string literal: single quotes, doubled inside.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

void datablock(std::ostringstream& out, const std::string& name,
               const std::vector<PlotPoint>& points, double y_scale) {
  out << "$" << name << " << EOD\n";
  for (const PlotPoint& p : points) out << p.x << " " << p.y * y_scale << "\n";
  out << "EOD\n";
}

}  // namespace

RunCurves read_run_curves(const fs::path& run_dir) {
  const fs::path path = run_dir / "metrics.jsonl";
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw InputError(detail::concat("plot: ", run_dir.string(), " is not a run directory"));
  std::ifstream in(path);
  if (!in)
    throw InputError(detail::concat("plot: ", path.string(),
                                    " does not exist (is this a pretrain or finetune run.dir?)"));
  RunCurves run;
  run.name = fs::absolute(run_dir).lexically_normal().filename().string();
  if (run.name.empty())
    run.name = fs::absolute(run_dir).lexically_normal().parent_path().filename();
  // The last record of each (type, step) wins: a resumed run repeats steps.
  std::map<int64_t, nlohmann::json> train, validation;
  std::map<int64_t, Stage> stages;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      // A run killed mid-write can leave a torn last line; anything else is damage.
      if (in.peek() == EOF) break;
      throw InputError(detail::concat("plot: ", path.string(), ":", line_no,
                                      ": not a JSON record (", e.what(), ")"));
    }
    if (!r.is_object() || !r.contains("type") || !r.contains("global_step")) continue;
    try {
      const std::string type = r.at("type");
      const int64_t step = r.at("global_step");
      if (type == "stage") {
        const double length = double(r.at("max_seq_len").get<int64_t>());
        Stage& stage = stages[step];
        stage = {step, double(r.at("batch_size").get<int64_t>()) * length, {}};
        if (r.contains("batch_warmup"))
          for (const auto& level : r.at("batch_warmup"))
            stage.warm_up.emplace_back(level.at(0).get<int64_t>(),
                                       double(level.at(1).get<int64_t>()) * length);
      } else if (type == "train") {
        train[step] = r;
      } else if (type == "validation") {
        validation[step] = r;
      }
    } catch (const nlohmann::json::exception& e) {
      throw InputError(detail::concat("plot: ", path.string(), ":", line_no,
                                      ": unexpected record (", e.what(), ")"));
    }
  }
  std::vector<Stage> ordered;
  for (const auto& [step, s] : stages) ordered.push_back(s);
  run.x_is_tokens = !ordered.empty();
  auto x_of = [&](int64_t step) {
    return run.x_is_tokens ? tokens_at(ordered, step) : double(step);
  };
  for (size_t i = 1; i < ordered.size(); ++i)
    run.stage_starts.push_back(x_of(ordered[i].first_step));
  auto number = [](const nlohmann::json& r, const char* key, double* out) {
    if (!r.contains(key) || !r[key].is_number()) return false;
    *out = r[key].get<double>();
    return true;
  };
  for (const auto& [step, r] : train) {
    double v;
    if (number(r, "loss", &v)) run.train_loss.push_back({x_of(step), v});
    if (number(r, "mlm_accuracy", &v) || number(r, "accuracy", &v))
      run.train_accuracy.push_back({x_of(step), v});
    if (number(r, "lr", &v)) run.lr.push_back({x_of(step), v});
  }
  for (const auto& [step, r] : validation) {
    double v;
    if (number(r, "loss", &v)) run.validation_loss.push_back({x_of(step), v});
    if (number(r, "mlm_accuracy", &v) || number(r, "accuracy", &v))
      run.validation_accuracy.push_back({x_of(step), v});
  }
  if (run.train_loss.empty() && run.validation_loss.empty())
    throw InputError(
        detail::concat("plot: ", path.string(), " has no train or validation records"));
  return run;
}

std::string gnuplot_script(const std::vector<RunCurves>& runs, const fs::path& output) {
  const bool tokens =
      std::all_of(runs.begin(), runs.end(), [](const RunCurves& r) { return r.x_is_tokens; });
  const std::string ext = output.extension().string();
  std::ostringstream out;
  out.precision(10);
  if (ext == ".png")
    out << "set terminal pngcairo size 1100,1000 noenhanced font 'sans,10'\n";
  else
    out << "set terminal svg size 1100,1000 dynamic noenhanced font 'sans,11' background "
           "rgb 'white'\n";
  out << "set output " << quoted(output.string()) << "\n";
  const double x_scale = tokens ? 1e-6 : 1.0;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto scaled = [&](std::vector<PlotPoint> p) {
      for (PlotPoint& q : p) q.x *= x_scale;
      return p;
    };
    const std::string n = detail::concat("r", i);
    datablock(out, n + "_loss", scaled(runs[i].train_loss), 1.0);
    datablock(out, n + "_vloss", scaled(runs[i].validation_loss), 1.0);
    datablock(out, n + "_acc", scaled(runs[i].train_accuracy), 100.0);
    datablock(out, n + "_vacc", scaled(runs[i].validation_accuracy), 100.0);
    datablock(out, n + "_lr", scaled(runs[i].lr), 1.0);
  }
  out << "set multiplot layout 3,1 title 'roformer: "
      << (runs.size() == 1 ? runs[0].name : std::to_string(runs.size()) + " runs")
      << " (dashed lines: stage boundaries)'\n"
      << "set grid\nset key outside right top\nset lmargin 12\nset rmargin 26\n"
      << "set xlabel '" << (tokens ? "tokens seen (millions)" : "optimizer step") << "'\n";
  // Stage boundaries as dashed verticals in each run's colour.
  for (size_t i = 0; i < runs.size(); ++i)
    for (double x : runs[i].stage_starts)
      out << "set arrow from " << x * x_scale << ", graph 0 to " << x * x_scale
          << ", graph 1 nohead dashtype 2 linecolor " << i + 1 << "\n";
  auto panel = [&](const std::string& ylabel, const std::string& train, const std::string& val) {
    out << "set ylabel " << quoted(ylabel) << "\n";
    out << "plot ";
    bool first = true;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string n = detail::concat("r", i);
      const std::string label = runs.size() == 1 ? "" : runs[i].name + " ";
      out << (first ? "" : ", ") << "$" << n << "_" << train << " using 1:2 with lines linecolor "
          << i + 1 << " title " << quoted(label + "train");
      first = false;
      if (!val.empty())
        out << ", $" << n << "_" << val << " using 1:2 with linespoints pointtype 7 linecolor "
            << i + 1 << " dashtype 3 title " << quoted(label + "validation");
    }
    out << "\n";
  };
  panel("MLM loss (nats)", "loss", "vloss");
  panel("MLM accuracy (%)", "acc", "vacc");
  panel("learning rate", "lr", "");
  out << "unset multiplot\nset output\n";
  return out.str();
}

void plot_runs(const std::vector<fs::path>& run_dirs, const fs::path& output) {
  const std::string ext = output.extension().string();
  if (ext != ".svg" && ext != ".png")
    throw InputError(detail::concat("plot: --out ", output.string(), " must end in .svg or .png"));
  if (run_dirs.empty()) throw InputError("plot: name at least one run directory");
  std::vector<RunCurves> runs;
  for (const fs::path& dir : run_dirs) runs.push_back(read_run_curves(dir));

  // gnuplot writes a temporary file; it replaces `output` only on success.
  const fs::path tmp = output.string() + ".tmp" + std::to_string(getpid()) + ext;
  const fs::path script = output.string() + ".tmp" + std::to_string(getpid()) + ".gp";
  const fs::path errors = output.string() + ".tmp" + std::to_string(getpid()) + ".err";
  {
    std::ofstream s(script);
    s << gnuplot_script(runs, tmp);
    if (!s.flush())
      throw InputError(detail::concat("plot: cannot write ", script.string(),
                                      " (is the output directory writable?)"));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errors.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::string program = "gnuplot", script_arg = script.string();
  char* argv[] = {program.data(), script_arg.data(), nullptr};
  pid_t pid = 0;
  const int spawn = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (spawn == 0) waitpid(pid, &status, 0);
  std::string message;
  {
    std::ifstream e(errors);
    std::ostringstream text;
    text << e.rdbuf();
    message = text.str();
  }
  std::error_code ec;
  fs::remove(script, ec);
  fs::remove(errors, ec);
  const bool ok = spawn == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                  fs::exists(tmp, ec) && fs::file_size(tmp, ec) > 0;
  if (!ok) {
    fs::remove(tmp, ec);
    if (spawn != 0 || (WIFEXITED(status) && WEXITSTATUS(status) == 127))
      throw InputError(
          "plot: gnuplot was not found; install it (Debian: apt-get install gnuplot-nox, which "
          "scripts/setup.sh does)");
    throw InputError(detail::concat("plot: gnuplot failed drawing ", output.string(), ": ",
                                    message.empty() ? "no output" : message));
  }
  fs::rename(tmp, output, ec);
  if (ec)
    throw InputError(
        detail::concat("plot: cannot move the plot to ", output.string(), ": ", ec.message()));
}

}  // namespace roformer
