#include "train/convert_check.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "layers/roformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_convert.h"
#include "train/safetensors.h"

namespace roformer {
namespace {

// The encoder's tensors (and the head's when `head`): what the model loads.
StateDict loadable(const StateDict& parameters, bool head) {
  StateDict out;
  for (const NamedTensor& p : parameters)
    if (p.name.rfind("roformer.", 0) == 0 || (head && p.name.rfind("cls.predictions.", 0) == 0))
      out.push_back(p);
  return out;
}

double rel_diff(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
  RF_CHECK(a.size() == b.size(), "check_conversion: ", got.desc(), " vs ", want.desc());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

struct ProbeOutputs {
  Tensor hidden, logits;
};

ProbeOutputs run_probe(const ConvertedModel& m, bool head, Device device) {
  RoFormerForMaskedLM model(m.config, 1);
  model.load_state_dict(loadable(m.parameters, head), /*strict=*/head);
  model.to(device);
  const int64_t B = 2, S = std::min<int64_t>(16, m.config.max_position_embeddings);
  std::vector<int32_t> ids(size_t(B * S));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t(1 + (int64_t(i) * 7919) % std::max<int64_t>(1, m.config.vocab_size - 1));
  const Tensor t_ids = Tensor::from_vector(ids, {B, S}, device);
  const Tensor types = Tensor::zeros({B, S}, DType::i32, device);
  const Tensor mask = Tensor::ones({B, S}, DType::i32, device);
  NoGradGuard no_grad;
  DropoutContext ctx{0, 0};
  ProbeOutputs out;
  out.hidden = model.roformer().forward(t_ids, types, mask, false, ctx).to(Device::cpu());
  if (head) out.logits = model.mlm_logits(t_ids, types, mask).to(Device::cpu());
  return out;
}

}  // namespace

bool has_mlm_head(const StateDict& parameters) {
  return std::any_of(parameters.begin(), parameters.end(),
                     [](const NamedTensor& p) { return p.name.rfind("cls.predictions.", 0) == 0; });
}

ConvertedModel model_of_checkpoint(const std::filesystem::path& checkpoint) {
  const std::filesystem::path path = resolve_checkpoint(checkpoint);
  CheckpointData data = load_checkpoint(path, false);
  return {parse_config_string(data.config_yaml, path.string()).model, std::move(data.parameters),
          path.string()};
}

ConvertedModel model_of_hf_folder(const std::filesystem::path& dir, bool mlm_head) {
  HfFolder folder = read_hf_folder(dir, mlm_head);
  ConvertedModel m{folder.config, std::move(folder.parameters), dir.string()};
  // read_hf_folder keeps the encoder (and the MLM head): a fine-tuned export's
  // classifier comes from the file itself.
  const SafetensorsFile file(dir / "model.safetensors");
  for (const SafetensorsEntry& e : file.entries())
    if (e.name.rfind("classifier.", 0) == 0)
      m.parameters.push_back({e.name, file.read_f32(e.name)});
  return m;
}

ConversionCheck check_conversion(const ConvertedModel& source, const ConvertedModel& written,
                                 Device device, double tolerance) {
  const bool head = has_mlm_head(source.parameters) && has_mlm_head(written.parameters);
  const ProbeOutputs want = run_probe(source, head, Device::cpu());
  const ProbeOutputs got = run_probe(written, head, device);
  ConversionCheck check;
  check.hidden_rel_diff = rel_diff(got.hidden, want.hidden);
  if (head) check.logits_rel_diff = rel_diff(got.logits, want.logits);
  const std::string sides =
      detail::concat(" (", written.where, " written from ", source.where, ": do not use it)");
  if (!(check.hidden_rel_diff <= tolerance) || !(check.logits_rel_diff <= tolerance))
    throw Error(detail::concat(
        "convert: the written model on ", device.str(),
        " does not reproduce its source: hidden states differ by ", check.hidden_rel_diff,
        head ? detail::concat(", MLM logits by ", check.logits_rel_diff) : std::string(),
        " (relative; limit ", tolerance, ")", sides));
  // A fine-tuned model's classifier: the same tensors, bit for bit.
  for (const NamedTensor& p : source.parameters) {
    if (p.name.rfind("classifier.", 0) != 0) continue;
    const auto it = std::find_if(written.parameters.begin(), written.parameters.end(),
                                 [&](const NamedTensor& w) { return w.name == p.name; });
    if (it == written.parameters.end())
      throw Error(detail::concat("convert: ", p.name, " is missing from the written model", sides));
    if (it->tensor.shape() != p.tensor.shape() ||
        it->tensor.to_vector<float>() != p.tensor.to_vector<float>())
      throw Error(detail::concat("convert: ", p.name, " was written as ", it->tensor.desc(),
                                 " and differs from its source ", p.tensor.desc(), sides));
    ++check.classifier_tensors;
  }
  return check;
}

}  // namespace roformer
