// Moving weights between our checkpoints and Hugging Face RoFormer folders
// (config.json + model.safetensors + vocab.txt). Parameter names are already
// Hugging Face's, so conversion is a check of names, shapes and dtypes plus
// the few tensors transformers stores and we do not:
//   - roformer.{embeddings,encoder}.embed_positions.weight: transformers'
//     sinusoidal buffer, recomputed by the model, ignored on the way in;
//   - cls.predictions.decoder.{weight,bias}: tied to the word embedding and to
//     cls.predictions.bias; ignored on the way in, written out as copies.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "layers/model_config.h"
#include "layers/module.h"

namespace roformer {

struct HfFolder {
  ModelConfig config;
  StateDict parameters;         // f32, our (= HF) names, in our model's order
  std::filesystem::path vocab;  // the folder's vocab.txt
  bool lowercase = true;        // tokenizer_config.json do_lower_case (default true)
  // tokenizer_config.json tokenizer_class: RoFormerTokenizer (transformers'
  // Chinese tokenizer, jieba first) -> jieba; anything else -> none.
  data::PreTokenizer pre_tokenizer = data::PreTokenizer::none;
  std::vector<std::string> ignored;  // tensors present in the file but not used
};

// Reads and checks a Hugging Face RoFormer folder. With `require_mlm_head`
// the cls.predictions.* tensors must be present (a RoFormerForMaskedLM);
// without it only roformer.* is required (and kept). A base-model file whose
// names lack the "roformer." prefix is accepted. Every missing, unexpected,
// mis-shaped or unreadable tensor is reported in one InputError.
HfFolder read_hf_folder(const std::filesystem::path& dir, bool require_mlm_head = true);

// `roformer convert --from-hf DIR --out CKPT`: writes CKPT (a checkpoint with
// no optimizer state, finished) and DIR's vocab.txt next to it as
// "<CKPT stem>.vocab.txt", recorded as data.vocab in the checkpoint's config.
// Nothing is written when anything is wrong.
void convert_from_hf(const std::filesystem::path& dir, const std::filesystem::path& out_checkpoint);

// `roformer convert --checkpoint CKPT --to-hf DIR`: config.json,
// model.safetensors (F32) and vocab.txt in the layout
// transformers.RoFormerForMaskedLM.from_pretrained loads (a fine-tuned
// checkpoint: RoFormerForSequenceClassification with id2label). DIR is
// created; files are written to a temporary folder first and moved in last.
void convert_to_hf(const std::filesystem::path& checkpoint, const std::filesystem::path& dir);

}  // namespace roformer
