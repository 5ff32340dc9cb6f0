#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "data/hdf5.h"

namespace roformer {

namespace fs = std::filesystem;

namespace {

// Checkpoints are written often and read rarely: no compression (it would
// cost seconds per save), but Fletcher-32 checksums so corruption is caught.
hdf5::DatasetOptions tensor_options() {
  hdf5::DatasetOptions o;
  o.deflate = 0;
  o.shuffle = false;
  o.fletcher32 = true;
  o.chunk = 1 << 20;
  return o;
}

void check_finite(const Tensor& t, const std::string& name) {
  const float* p = t.data_as<float>();
  const int64_t n = t.numel();
  bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(p[i]);
  if (!finite)
    throw Error("checkpoint: '" + name + "' holds NaN or infinite values; not saving it");
}

void write_tensor(hdf5::Group& group, const std::string& name, const Tensor& tensor) {
  // f32 on the host whatever the tensor's device: one format everywhere.
  const Tensor t = tensor.to(Device::cpu()).to(DType::f32).contiguous();
  check_finite(t, name);
  hdf5::Dataset ds = group.write_dataset<float>(
      name, std::span<const float>(t.data_as<float>(), size_t(t.numel())), tensor_options());
  ds.set_attr_array<int64_t>("shape", std::span<const int64_t>(t.shape()));
}

Tensor read_tensor(const hdf5::Group& group, const std::string& name) {
  const hdf5::Dataset ds = group.open_dataset(name);
  const Shape shape = ds.has_attr("shape") ? ds.attr_array<int64_t>("shape") : Shape{ds.size()};
  if (shape_numel(shape) != ds.size())
    throw InputError(
        detail::concat("'", name, "' has ", ds.size(), " values but shape ", shape_str(shape)));
  Tensor t = Tensor::empty(shape, DType::f32);
  ds.read<float>(t.data_as<float>(), 0, ds.size());
  return t;
}

nlohmann::json loader_json(const data::LoaderState& s) {
  return {{"epoch", s.epoch},
          {"index", s.index},
          {"max_seq_len", s.max_seq_len},
          {"num_sequences", s.num_sequences}};
}

data::LoaderState loader_from_json(const nlohmann::json& j) {
  data::LoaderState s;
  s.epoch = j.at("epoch").get<uint64_t>();
  s.index = j.at("index").get<uint64_t>();
  s.max_seq_len = j.at("max_seq_len").get<int64_t>();
  s.num_sequences = j.at("num_sequences").get<uint64_t>();
  return s;
}

}  // namespace

void save_checkpoint(const fs::path& path, const CheckpointData& data,
                     const std::function<void()>& before_commit) {
  hdf5::AtomicFile file(path.string());
  hdf5::Group& root = file.root();
  root.set_attr("format", "roformer-checkpoint");
  root.set_attr<int64_t>("format_version", kCheckpointFormatVersion);
  root.set_attr("created_by", data.created_by);
  root.set_attr("config", data.config_yaml);
  const TrainingState& s = data.state;
  root.set_attr<int64_t>("global_step", s.global_step);
  root.set_attr<int64_t>("stage", s.stage);
  root.set_attr<int64_t>("step_in_stage", s.step_in_stage);
  root.set_attr<uint64_t>("rng_seed", s.rng_seed);
  root.set_attr<uint64_t>("rng_offset", s.rng_offset);
  root.set_attr("loader_state", loader_json(s.loader).dump());
  root.set_attr<int64_t>("nonfinite_skipped", s.nonfinite_skipped);
  root.set_attr<int64_t>("nonfinite_in_a_row", s.nonfinite_in_a_row);
  root.set_attr<int64_t>("stage_end", s.stage_end ? 1 : 0);
  root.set_attr("stage_results", s.stage_results.empty() ? "[]" : s.stage_results);

  hdf5::Group params = root.create_group("parameters");
  for (const NamedTensor& p : data.parameters) write_tensor(params, p.name, p.tensor);
  if (data.exp_avg.defined()) {
    hdf5::Group optim = root.create_group("optimizer");
    optim.set_attr<int64_t>("step", data.optimizer_step);
    write_tensor(optim, "exp_avg", data.exp_avg);
    write_tensor(optim, "exp_avg_sq", data.exp_avg_sq);
  }
  if (before_commit) before_commit();
  file.commit();
}

CheckpointData load_checkpoint(const fs::path& path, bool with_optimizer) {
  const std::string where = path.string();
  try {
    hdf5::File file = hdf5::File::open(where);
    const hdf5::Group& root = file.root();
    if (!root.has_attr("format") || root.attr_string("format") != "roformer-checkpoint")
      throw InputError("not a roformer checkpoint (no 'format' attribute)");
    const int64_t version = root.attr<int64_t>("format_version");
    if (version != kCheckpointFormatVersion)
      throw InputError(detail::concat("checkpoint format version ", version,
                                      " is not supported (this build reads version ",
                                      kCheckpointFormatVersion, ")"));
    CheckpointData data;
    data.created_by = root.attr_string("created_by");
    data.config_yaml = root.attr_string("config");
    TrainingState& s = data.state;
    s.global_step = root.attr<int64_t>("global_step");
    s.stage = root.attr<int64_t>("stage");
    s.step_in_stage = root.attr<int64_t>("step_in_stage");
    s.rng_seed = root.attr<uint64_t>("rng_seed");
    s.rng_offset = root.attr<uint64_t>("rng_offset");
    s.loader = loader_from_json(nlohmann::json::parse(root.attr_string("loader_state")));
    s.nonfinite_skipped = root.attr<int64_t>("nonfinite_skipped");
    s.nonfinite_in_a_row = root.attr<int64_t>("nonfinite_in_a_row");
    s.stage_end = root.attr<int64_t>("stage_end") != 0;
    s.stage_results = root.attr_string("stage_results");
    const hdf5::Group params = root.open_group("parameters");
    for (const std::string& name : params.children())
      data.parameters.push_back({name, read_tensor(params, name)});
    if (with_optimizer && root.exists("optimizer")) {
      const hdf5::Group optim = root.open_group("optimizer");
      data.optimizer_step = optim.attr<int64_t>("step");
      data.exp_avg = read_tensor(optim, "exp_avg");
      data.exp_avg_sq = read_tensor(optim, "exp_avg_sq");
    }
    return data;
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    throw InputError(where + ": " + msg);
  } catch (const std::exception& e) {
    throw InputError(where + ": unreadable checkpoint: " + e.what());
  }
}

std::string checkpoint_file_name(int64_t global_step, std::optional<int64_t> stage_end) {
  char buf[64];
  if (stage_end) {
    std::snprintf(buf, sizeof buf, "ckpt-%08lld-stage%lld-end.h5", (long long)global_step,
                  (long long)*stage_end);
  } else {
    std::snprintf(buf, sizeof buf, "ckpt-%08lld.h5", (long long)global_step);
  }
  return buf;
}

namespace {
const std::regex& checkpoint_pattern() {
  static const std::regex re(R"(ckpt-(\d{8})(-stage\d+-end)?\.h5)");
  return re;
}
}  // namespace

std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, checkpoint_pattern()))
      found.emplace_back(std::stoll(m[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(path);
  return out;
}

std::optional<fs::path> latest_valid_checkpoint(const fs::path& dir,
                                                std::vector<std::string>* problems) {
  const std::vector<fs::path> all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      load_checkpoint(*it, true);
      return *it;
    } catch (const std::exception& e) {
      if (problems) problems->push_back(e.what());
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const fs::path& dir, int64_t keep_last, bool keep_stage_ends) {
  std::error_code ec;
  // Temporary files of writes that never finished.
  if (fs::is_directory(dir, ec))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().find(".tmp") != std::string::npos &&
          entry.path().filename().string().rfind("ckpt-", 0) == 0)
        fs::remove(entry.path(), ec);
  if (keep_last <= 0) return;
  std::vector<fs::path> candidates;
  for (const fs::path& p : list_checkpoints(dir)) {
    const bool stage_end = p.filename().string().find("-end.h5") != std::string::npos;
    if (!(keep_stage_ends && stage_end)) candidates.push_back(p);
  }
  for (size_t i = 0; i + size_t(keep_last) < candidates.size(); ++i) fs::remove(candidates[i], ec);
}

std::string describe_checkpoint(const fs::path& path) {
  const CheckpointData data = load_checkpoint(path, true);
  std::ostringstream out;
  const TrainingState& s = data.state;
  int64_t total = 0;
  for (const NamedTensor& p : data.parameters) total += p.tensor.numel();
  out << "checkpoint " << path.string() << "\n"
      << "  format version   " << kCheckpointFormatVersion << " (" << data.created_by << ")\n"
      << "  global step      " << s.global_step << "\n"
      << "  stage            " << s.stage << " (step " << s.step_in_stage << " within it"
      << (s.stage_end ? ", saved at the stage's end" : "") << ")\n"
      << "  optimizer step   " << data.optimizer_step
      << (data.exp_avg.defined() ? " (AdamW moments present)" : " (no optimizer state)") << "\n"
      << "  loader cursor    epoch " << s.loader.epoch << ", index " << s.loader.index
      << " (max_seq_len " << s.loader.max_seq_len << ")\n"
      << "  dropout seed     " << s.rng_seed << "\n"
      << "  skipped steps    " << s.nonfinite_skipped << " (non-finite loss or gradient)\n"
      << "  parameters       " << total << " in " << data.parameters.size() << " tensors\n";
  for (const NamedTensor& p : data.parameters)
    out << "    " << p.name << " " << shape_str(p.tensor.shape()) << "\n";
  out << "  config:\n";
  std::istringstream config(data.config_yaml);
  for (std::string line; std::getline(config, line);) out << "    " << line << "\n";
  return out.str();
}

fs::path resolve_checkpoint(const fs::path& path_or_run_dir) {
  std::error_code ec;
  if (fs::is_regular_file(path_or_run_dir, ec)) return path_or_run_dir;
  if (fs::is_directory(path_or_run_dir, ec)) {
    for (const fs::path& dir : {path_or_run_dir / "checkpoints", path_or_run_dir}) {
      std::vector<std::string> problems;
      if (auto found = latest_valid_checkpoint(dir, &problems)) return *found;
    }
    throw InputError("no valid checkpoint in " + path_or_run_dir.string());
  }
  throw InputError("checkpoint not found: " + path_or_run_dir.string());
}

}  // namespace roformer
