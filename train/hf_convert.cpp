#include "train/hf_convert.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/file_checks.h"
#include "core/file_write.h"
#include "layers/roformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/safetensors.h"

namespace roformer {

namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Tensors transformers keeps that our model recomputes or ties.
bool ignorable(const std::string& name) {
  return ends_with(name, "embed_positions.weight") || ends_with(name, "position_ids") ||
         name == "cls.predictions.decoder.weight" || name == "cls.predictions.decoder.bias";
}

std::string read_text(const fs::path& p) {
  reject_directory(p, "file");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw InputError("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void require_file(const fs::path& dir, const char* name) {
  if (!fs::is_regular_file(dir / name))
    throw InputError(detail::concat(dir.string(), ": not a Hugging Face RoFormer folder: ", name,
                                    " is missing (expected config.json, model.safetensors and "
                                    "vocab.txt)"));
}

void copy_atomically(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw InputError(detail::concat("cannot read '", from.string(), "'"));
  write_file_atomically(to, "file", [&](std::ostream& out) {
    // By blocks through write(), which sets the stream's error state on a
    // failed write (a stream-buffer iterator would not: a short copy would pass).
    std::vector<char> block(size_t(1) << 16);
    while (in && out) {
      in.read(block.data(), std::streamsize(block.size()));
      if (in.gcount() > 0) out.write(block.data(), in.gcount());
    }
    if (in.bad()) throw Error(detail::concat("cannot read '", from.string(), "'"));
  });
}

}  // namespace

HfFolder read_hf_folder(const fs::path& dir, bool require_mlm_head) {
  if (!fs::is_directory(dir)) throw InputError(dir.string() + ": no such folder");
  require_file(dir, "config.json");
  require_file(dir, "model.safetensors");
  require_file(dir, "vocab.txt");
  HfFolder out;
  const fs::path config_path = dir / "config.json";
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(read_text(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(config_path.string() + ": not valid JSON: " + e.what());
  }
  out.config = from_hf_config_json(cj, config_path.string());
  out.vocab = dir / "vocab.txt";
  if (fs::is_regular_file(dir / "tokenizer_config.json")) {
    try {
      const auto tj = nlohmann::json::parse(read_text(dir / "tokenizer_config.json"));
      if (tj.contains("do_lower_case") && tj["do_lower_case"].is_boolean())
        out.lowercase = tj["do_lower_case"].get<bool>();
      if (tj.contains("tokenizer_class") && tj["tokenizer_class"].is_string() &&
          tj["tokenizer_class"].get<std::string>().starts_with("RoFormerTokenizer"))
        out.pre_tokenizer = data::PreTokenizer::jieba;
    } catch (const nlohmann::json::exception&) {
      // tokenizer_config.json is optional; a broken one only costs the default.
    }
  }

  const SafetensorsFile file(dir / "model.safetensors");
  const std::string where = file.path().string();
  // A base-model file (RoFormerModel.save_pretrained) has no "roformer." prefix.
  bool prefixed = false;
  for (const auto& e : file.entries()) prefixed |= starts_with(e.name, "roformer.");
  auto ours = [&](const std::string& name) {
    return prefixed || starts_with(name, "cls.") || starts_with(name, "classifier.")
               ? name
               : "roformer." + name;
  };

  const RoFormerForMaskedLM model(out.config, 0);  // the names and shapes we expect
  std::map<std::string, Shape> expected;
  for (const auto& p : model.named_parameters())
    if (require_mlm_head || starts_with(p.name, "roformer.")) expected[p.name] = p.tensor.shape();

  std::vector<std::string> problems, unexpected;
  std::map<std::string, const SafetensorsEntry*> found;
  for (const auto& e : file.entries()) {
    const std::string name = ours(e.name);
    if (expected.count(name)) {
      found[name] = &e;
    } else if (ignorable(name) || (!require_mlm_head && !starts_with(name, "roformer."))) {
      out.ignored.push_back(e.name);
    } else {
      unexpected.push_back(e.name);
    }
  }
  // transformers may keep only the tied decoder bias.
  if (require_mlm_head && !found.count("cls.predictions.bias"))
    if (const SafetensorsEntry* e = file.find("cls.predictions.decoder.bias"))
      found["cls.predictions.bias"] = e;
  std::vector<std::string> missing;
  for (const auto& [name, shape] : expected) {
    auto it = found.find(name);
    if (it == found.end()) {
      missing.push_back(name);
      continue;
    }
    const SafetensorsEntry& e = *it->second;
    if (e.shape != shape)
      problems.push_back(detail::concat("'", e.name, "' has shape ", shape_str(e.shape),
                                        ", config.json implies ", shape_str(shape)));
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
      problems.push_back(detail::concat("'", e.name, "' has dtype ", e.dtype,
                                        " (only F32, F16 and BF16 are supported)"));
  }
  for (const auto& n : missing) problems.push_back("missing tensor '" + n + "'");
  for (const auto& n : unexpected) problems.push_back("unexpected tensor '" + n + "'");
  if (!problems.empty()) {
    std::string msg =
        detail::concat(where, ": does not match ", config_path.string(), " (", problems.size(),
                       " problem", problems.size() == 1 ? "" : "s", "):");
    for (const auto& p : problems) msg += "\n  " + p;
    throw InputError(msg);
  }
  for (const auto& p : model.named_parameters())
    if (expected.count(p.name))
      out.parameters.push_back({p.name, file.read_f32(found.at(p.name)->name)});
  return out;
}

void convert_from_hf(const fs::path& dir, const fs::path& out_checkpoint) {
  const HfFolder hf = read_hf_folder(dir, true);
  for (const auto& n : hf.ignored) spdlog::info("ignoring '{}' (recomputed or tied)", n);
  // Our model must be able to load it (it was read against its own names).
  RoFormerForMaskedLM check(hf.config, 0);
  check.load_state_dict(hf.parameters);

  fs::path out = out_checkpoint;
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  const fs::path vocab_out = (out.has_parent_path() ? out.parent_path() : fs::path(".")) /
                             (out.stem().string() + ".vocab.txt");

  Config config;
  config.model = hf.config;
  config.run.name = out.stem().string();
  config.run.dir = (out.has_parent_path() ? out.parent_path() : fs::path(".")).string();
  config.data.vocab = fs::absolute(vocab_out).lexically_normal().string();
  config.data.lowercase = hf.lowercase;
  config.data.pre_tokenizer = hf.pre_tokenizer;
  // A config needs a stage; the checkpoint records it as finished.
  StageConfig stage;
  stage.max_seq_len = std::min<int64_t>(128, hf.config.max_position_embeddings);
  stage.batch_size = stage.micro_batch_size = 1;
  stage.steps = 1;
  config.stages.push_back(stage);

  CheckpointData data;
  data.parameters = hf.parameters;
  data.state.stage = 1;
  data.config_yaml = to_yaml(config);
  data.created_by = "roformer convert --from-hf " + dir.string();
  parse_config_string(data.config_yaml, out.string());  // what load_checkpoint users will do

  copy_atomically(hf.vocab, vocab_out);
  try {
    save_checkpoint(out, data);
  } catch (...) {
    fs::remove(vocab_out);
    throw;
  }
}

void convert_to_hf(const fs::path& checkpoint, const fs::path& dir) {
  const fs::path path = resolve_checkpoint(checkpoint);
  const CheckpointData data = load_checkpoint(path, false);
  const Config config = parse_config_string(data.config_yaml, path.string());
  if (auto why = hf_incompatibility(config.model))
    spdlog::warn(
        "transformers cannot run this model as ours does ({}); config.json keeps our "
        "extra keys so `roformer convert --from-hf` restores it",
        *why);
  if (config.data.vocab.empty() || !fs::is_regular_file(config.data.vocab))
    throw InputError(detail::concat(path.string(),
                                    ": the vocabulary its config names (data.vocab: \"",
                                    config.data.vocab, "\") is not a file"));

  std::map<std::string, Tensor> by_name;
  for (const auto& p : data.parameters) by_name[p.name] = p.tensor;
  const bool classifier = by_name.count("classifier.out_proj.weight") > 0;
  nlohmann::json cj = to_hf_config_json(config.model);
  StateDict tensors = data.parameters;
  if (by_name.count("cls.predictions.bias") &&
      by_name.count("roformer.embeddings.word_embeddings.weight")) {
    // transformers ties these; safetensors stores each tensor once, so copies.
    tensors.push_back({"cls.predictions.decoder.weight",
                       by_name.at("roformer.embeddings.word_embeddings.weight").clone()});
    tensors.push_back({"cls.predictions.decoder.bias", by_name.at("cls.predictions.bias").clone()});
  }
  if (classifier) {
    cj["architectures"] = nlohmann::json::array({"RoFormerForSequenceClassification"});
    if (config.finetune) {
      nlohmann::json id2label, label2id;
      for (size_t i = 0; i < config.finetune->labels.size(); ++i) {
        id2label[std::to_string(i)] = config.finetune->labels[i];
        label2id[config.finetune->labels[i]] = i;
      }
      if (!config.finetune->labels.empty()) {
        cj["id2label"] = id2label;
        cj["label2id"] = label2id;
      }
      cj["roformer_task"] = enum_name(config.finetune->task);
    }
  }

  const fs::path tmp = dir.string() + ".tmp-convert";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    std::ofstream(tmp / "config.json") << cj.dump(2) << "\n";
    std::ofstream(tmp / "tokenizer_config.json")
        << nlohmann::json{{"do_lower_case", config.data.lowercase},
                          // transformers' RoFormerTokenizer: jieba words, then WordPiece
                          {"tokenizer_class", config.data.pre_tokenizer == data::PreTokenizer::jieba
                                                  ? "RoFormerTokenizer"
                                                  : "BertTokenizer"}}
               .dump(2)
        << "\n";
    write_safetensors(tmp / "model.safetensors", tensors, {{"format", "pt"}});
    fs::copy_file(config.data.vocab, tmp / "vocab.txt");
  } catch (...) {
    fs::remove_all(tmp);
    throw;
  }
  if (!fs::exists(dir)) {
    if (dir.has_parent_path()) fs::create_directories(dir.parent_path());
    fs::rename(tmp, dir);
  } else {
    for (const char* f : {"config.json", "tokenizer_config.json", "model.safetensors", "vocab.txt"})
      fs::rename(tmp / f, dir / f);
    fs::remove_all(tmp);
  }
}

}  // namespace roformer
