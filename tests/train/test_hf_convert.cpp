// Hugging Face interop: safetensors reading/writing, ours -> HF -> ours bit
// for bit, the golden fixture through an HF folder, and bad folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/ops.h"
#include "layers/roformer.h"
#include "tests/layers/golden_h5.h"
#include "tests/test_support.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/convert_check.h"
#include "train/hf_convert.h"
#include "train/safetensors.h"

namespace roformer {
namespace {

using testing::error_of;
using testing::golden_config;

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("roformer_hf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_vocab(const fs::path& p, int64_t n) {
  std::ofstream out(p);
  const char* specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  // Streamed piece by piece: `"w" + std::to_string(i)` here set off g++ 12's
  // -Wrestrict false positive in char_traits.h (GCC bug 105329).
  for (int64_t i = 0; i < n; ++i) {
    if (i < 5)
      out << specials[i] << "\n";
    else
      out << 'w' << i << "\n";
  }
}

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 50;
  c.embedding_size = 16;  // != hidden: embeddings_project
  c.hidden_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 32;
  c.max_position_embeddings = 64;
  c.rotary_value = true;
  return c;
}

// A pretraining-style checkpoint of a freshly initialised model.
void write_checkpoint(const fs::path& path, const ModelConfig& mc, const fs::path& vocab,
                      const RoFormerForMaskedLM& model,
                      data::PreTokenizer pre_tokenizer = data::PreTokenizer::none) {
  Config c;
  c.model = mc;
  c.data.vocab = vocab.string();
  c.data.pre_tokenizer = pre_tokenizer;
  StageConfig s;
  s.max_seq_len = 16;
  s.batch_size = s.micro_batch_size = 2;
  s.steps = 1;
  c.stages.push_back(s);
  CheckpointData d;
  d.parameters = model.named_parameters();
  d.config_yaml = to_yaml(c);
  d.created_by = "test";
  save_checkpoint(path, d);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  return std::memcmp(va.data(), vb.data(), va.size() * 4) == 0;
}

// `model` as tmp/a.h5 (with a vocabulary), converted to the folder tmp/hf.
void export_to_hf(const TempDir& tmp, const RoFormerForMaskedLM& model) {
  write_vocab(tmp.path / "vocab.txt", 50);
  write_checkpoint(tmp.path / "a.h5", small_config(), tmp.path / "vocab.txt", model);
  convert_to_hf(tmp.path / "a.h5", tmp.path / "hf");
}

TEST(HfConvert, OursToHfToOursIsBitExact) {
  TempDir tmp;
  const RoFormerForMaskedLM model(small_config(), 7);
  export_to_hf(tmp, model);
  for (const char* f : {"config.json", "model.safetensors", "vocab.txt"})
    EXPECT_TRUE(fs::is_regular_file(tmp.path / "hf" / f)) << f;

  // The layout transformers loads: tied decoder written out, names as HF's.
  const SafetensorsFile st(tmp.path / "hf" / "model.safetensors");
  ASSERT_NE(st.find("cls.predictions.decoder.weight"), nullptr);
  EXPECT_TRUE(bit_equal(st.read_f32("cls.predictions.decoder.weight"),
                        model.find("roformer.embeddings.word_embeddings.weight")));
  EXPECT_TRUE(
      bit_equal(st.read_f32("cls.predictions.decoder.bias"), model.find("cls.predictions.bias")));
  EXPECT_NE(st.find("roformer.embeddings_project.weight"), nullptr);

  convert_from_hf(tmp.path / "hf", tmp.path / "b.h5");
  const CheckpointData back = load_checkpoint(tmp.path / "b.h5", false);
  const Config cfg = parse_config_string(back.config_yaml, "b.h5");
  EXPECT_EQ(cfg.model, small_config());
  EXPECT_TRUE(fs::is_regular_file(cfg.data.vocab));
  // Checkpoints store tensors by name (HDF5 orders them alphabetically).
  const auto ours = model.named_parameters();
  ASSERT_EQ(back.parameters.size(), ours.size());
  for (const auto& p : ours) {
    auto it = std::find_if(back.parameters.begin(), back.parameters.end(),
                           [&](const NamedTensor& t) { return t.name == p.name; });
    ASSERT_NE(it, back.parameters.end()) << p.name;
    EXPECT_TRUE(bit_equal(it->tensor, p.tensor)) << p.name;
  }
}

// `convert --device`'s check: the written model read back reproduces its
// source; a changed tensor or a config written wrong is an error naming the
// difference, a fine-tuned model's classifier is compared bit for bit, and
// without the MLM head on one side the encoder is compared.
TEST(HfConvert, TheWrittenModelIsCheckedAgainstItsSource) {
  TempDir tmp;
  const RoFormerForMaskedLM model(small_config(), 7);
  export_to_hf(tmp, model);
  const ConvertedModel source = model_of_checkpoint(tmp.path / "a.h5");
  ConvertedModel written = model_of_hf_folder(tmp.path / "hf", true);
  const ConversionCheck ok = check_conversion(source, written, Device::cpu());
  EXPECT_EQ(ok.hidden_rel_diff, 0.0);  // bit-exact weights, same device
  EXPECT_EQ(ok.logits_rel_diff, 0.0);

  // One weight written wrong: the hidden states move.
  ConvertedModel changed = written;
  int found = 0;
  for (NamedTensor& p : changed.parameters)
    if (p.name == "roformer.encoder.layer.0.output.dense.weight")
      p.tensor = mul(p.tensor, -1.0), ++found;  // a sign lost on the way
  ASSERT_EQ(found, 1);
  const std::string tensor_error =
      error_of([&] { check_conversion(source, changed, Device::cpu()); });
  EXPECT_NE(tensor_error.find("does not reproduce its source: hidden states differ by"),
            std::string::npos)
      << tensor_error;
  // The config written wrong (RoPE base): the same weights give other outputs.
  ConvertedModel rebased = written;
  rebased.config.rope_base = 500.0;
  EXPECT_NE(error_of([&] {
              check_conversion(source, rebased, Device::cpu());
            }).find("does not reproduce its source"),
            std::string::npos);
  // The MLM head alone changed: caught through the logits.
  ConvertedModel head = written;
  for (NamedTensor& p : head.parameters)
    if (p.name == "cls.predictions.bias") p.tensor = add(p.tensor, 1.0);
  EXPECT_NE(error_of([&] { check_conversion(source, head, Device::cpu()); }).find("MLM logits by"),
            std::string::npos);
  // A fine-tuned model's classifier is compared bit for bit, and every error
  // names both sides.
  ConvertedModel tuned = source, tuned_out = written;
  Generator gen{71, 0};
  const Tensor cls = Tensor::randn({3, 24}, gen);
  tuned.parameters.push_back({"classifier.out_proj.weight", cls});
  tuned_out.parameters.push_back({"classifier.out_proj.weight", cls.clone()});
  EXPECT_EQ(check_conversion(tuned, tuned_out, Device::cpu()).classifier_tensors, 1);
  tuned_out.parameters.back().tensor = mul(cls, -1.0);
  const std::string cls_error =
      error_of([&] { check_conversion(tuned, tuned_out, Device::cpu()); });
  EXPECT_NE(cls_error.find("classifier.out_proj.weight was written as"), std::string::npos)
      << cls_error;
  EXPECT_NE(cls_error.find("written from " + source.where), std::string::npos) << cls_error;
  EXPECT_NE(error_of([&] {
              check_conversion(tuned, written, Device::cpu());
            }).find("classifier.out_proj.weight is missing from the written model"),
            std::string::npos);
  // Without the head on one side, only the encoder is compared.
  const ConversionCheck encoder =
      check_conversion(source, model_of_hf_folder(tmp.path / "hf", false), Device::cpu());
  EXPECT_EQ(encoder.logits_rel_diff, -1.0);
  EXPECT_EQ(encoder.hidden_rel_diff, 0.0);
}

// A Chinese (jieba) model names transformers' RoFormerTokenizer, and a folder
// naming it comes back with the jieba pre-tokenizer; BERT's stays BERT's.
TEST(HfConvert, TokenizerClassCarriesThePreTokenizer) {
  TempDir tmp;
  write_vocab(tmp.path / "vocab.txt", 50);
  const RoFormerForMaskedLM model(small_config(), 7);
  for (auto pre : {data::PreTokenizer::jieba, data::PreTokenizer::none}) {
    const std::string name(data::pre_tokenizer_name(pre));
    write_checkpoint(tmp.path / (name + ".h5"), small_config(), tmp.path / "vocab.txt", model, pre);
    convert_to_hf(tmp.path / (name + ".h5"), tmp.path / ("hf-" + name));
    std::ifstream in(tmp.path / ("hf-" + name) / "tokenizer_config.json");
    const auto tj = nlohmann::json::parse(in);
    EXPECT_EQ(tj["tokenizer_class"],
              pre == data::PreTokenizer::jieba ? "RoFormerTokenizer" : "BertTokenizer");
    convert_from_hf(tmp.path / ("hf-" + name), tmp.path / (name + "-back.h5"));
    const CheckpointData back = load_checkpoint(tmp.path / (name + "-back.h5"), false);
    EXPECT_EQ(parse_config_string(back.config_yaml, "back").data.pre_tokenizer, pre) << name;
  }
}

// A folder as transformers' save_pretrained writes it for the golden model:
// tied decoder copies and the sinusoidal embed_positions buffer included.
void write_golden_hf(const fs::path& dir, const testing::GoldenFile& f) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << to_hf_config_json(golden_config()).dump(2);
  write_vocab(dir / "vocab.txt", 1000);
  StateDict tensors;
  for (const auto& name : f.members("weights"))
    tensors.push_back({name, f.read("weights/" + name).to(DType::f32)});
  Generator gen{5, 0};
  tensors.push_back({"roformer.embeddings.embed_positions.weight", Tensor::randn({64, 16}, gen)});
  tensors.push_back({"cls.predictions.decoder.weight",
                     f.read("weights/roformer.embeddings.word_embeddings.weight").to(DType::f32)});
  write_safetensors(dir / "model.safetensors", tensors);
}

TEST(HfConvert, GoldenFixtureThroughHfFolderGivesItsLogits) {
  TempDir tmp;
  const testing::GoldenFile f(std::string(ROFORMER_FIXTURES_DIR) + "/golden_roformer_mlm.h5");
  write_golden_hf(tmp.path / "hf", f);
  convert_from_hf(tmp.path / "hf", tmp.path / "golden.h5");
  const CheckpointData d = load_checkpoint(tmp.path / "golden.h5", false);
  const Config cfg = parse_config_string(d.config_yaml, "golden.h5");
  RoFormerForMaskedLM model(cfg.model, 1);
  model.load_state_dict(d.parameters);
  model.eval();
  const Tensor ids = f.read("input_ids", DType::i32), types = f.read("token_type_ids", DType::i32);
  const Tensor mask = f.read("attention_mask", DType::i32);
  const Tensor ref = f.read("logits");
  NoGradGuard no_grad;
  const auto got = model.mlm_logits(ids, types, mask).to_vector<double>();
  const auto want = ref.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LT(diff / scale, 1e-5);
}

// --- bad folders: a clear InputError, nothing written ---------------------------------

class BadFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    write_vocab(tmp.path / "vocab.txt", 50);
    const RoFormerForMaskedLM model(small_config(), 3);
    write_checkpoint(tmp.path / "a.h5", small_config(), tmp.path / "vocab.txt", model);
    convert_to_hf(tmp.path / "a.h5", hf());
  }
  fs::path hf() const { return tmp.path / "hf"; }
  fs::path out() const { return tmp.path / "out.h5"; }
  // Converts and returns the error message; checks nothing was written.
  std::string fails() {
    std::string msg;
    try {
      convert_from_hf(hf(), out());
    } catch (const InputError& e) {
      msg = e.what();
    }
    EXPECT_FALSE(msg.empty()) << "no error";
    EXPECT_FALSE(fs::exists(out()));
    EXPECT_FALSE(fs::exists(tmp.path / "out.vocab.txt"));
    return msg;
  }
  // Rewrites model.safetensors with `header` and `data_bytes` zero bytes.
  void write_raw(const nlohmann::json& header, size_t data_bytes) {
    const std::string h = header.dump();
    std::ofstream o(hf() / "model.safetensors", std::ios::binary | std::ios::trunc);
    uint64_t n = h.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h << std::string(data_bytes, '\0');
  }
  StateDict tensors() const {
    const SafetensorsFile st(hf() / "model.safetensors");
    StateDict out;
    for (const auto& e : st.entries()) out.push_back({e.name, st.read_f32(e.name)});
    return out;
  }
  TempDir tmp;
};

TEST_F(BadFolder, MissingFile) {
  fs::remove(hf() / "vocab.txt");
  EXPECT_NE(fails().find("vocab.txt is missing"), std::string::npos);
}

TEST_F(BadFolder, WrongShapeAndMissingAndUnexpectedReportedTogether) {
  StateDict t = tensors();
  for (auto& x : t)
    if (x.name == "roformer.encoder.layer.0.attention.self.query.weight")
      x.tensor = Tensor::zeros({24, 25});
  std::erase_if(
      t, [](const NamedTensor& x) { return x.name == "roformer.embeddings.LayerNorm.bias"; });
  t.push_back({"roformer.pooler.dense.weight", Tensor::zeros({2, 2})});
  write_safetensors(hf() / "model.safetensors", t);
  const std::string msg = fails();
  EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("query.weight' has shape [24, 25]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor 'roformer.embeddings.LayerNorm.bias'"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("unexpected tensor 'roformer.pooler.dense.weight'"), std::string::npos) << msg;
}

TEST_F(BadFolder, WrongDtype) {
  nlohmann::json h;
  h["roformer.embeddings.LayerNorm.bias"] = {
      {"dtype", "I32"}, {"shape", {16}}, {"data_offsets", {0, 64}}};
  write_raw(h, 64);
  const std::string msg = fails();
  EXPECT_NE(msg.find("has dtype I32"), std::string::npos) << msg;
}

TEST_F(BadFolder, TruncatedFile) {
  const fs::path p = hf() / "model.safetensors";
  fs::resize_file(p, fs::file_size(p) - 100);
  const std::string msg = fails();
  EXPECT_NE(msg.find("outside the data section"), std::string::npos) << msg;
  fs::resize_file(p, 20);  // cut inside the header
  EXPECT_NE(fails().find("runs past the end of the file"), std::string::npos);
}

TEST_F(BadFolder, HeaderLiesAboutOffsets) {
  nlohmann::json h;
  h["a"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 12}}};  // 4 floats != 12 bytes
  write_raw(h, 16);
  EXPECT_NE(fails().find("holds 12 bytes but dtype F32 and shape [4] need 16"), std::string::npos);
  h["a"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  h["b"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}};
  write_raw(h, 24);
  EXPECT_NE(fails().find("overlap"), std::string::npos);
}

TEST(Safetensors, ReadsF16AndBF16) {
  TempDir tmp;
  // 1.0, -2.5, 65504 (max half), 2^-24 (smallest subnormal) in F16; 3.0 in BF16.
  const uint16_t f16[] = {0x3c00, 0xc100, 0x7bff, 0x0001};
  const uint16_t bf16[] = {0x4040};
  nlohmann::json h;
  h["h"] = {{"dtype", "F16"}, {"shape", {2, 2}}, {"data_offsets", {0, 8}}};
  h["b"] = {{"dtype", "BF16"}, {"shape", {1}}, {"data_offsets", {8, 10}}};
  const std::string hs = h.dump();
  {
    std::ofstream o(tmp.path / "x.safetensors", std::ios::binary);
    uint64_t n = hs.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << hs;
    o.write(reinterpret_cast<const char*>(f16), 8);
    o.write(reinterpret_cast<const char*>(bf16), 2);
  }
  const SafetensorsFile st(tmp.path / "x.safetensors");
  EXPECT_EQ(st.read_f32("h").to_vector<float>(),
            (std::vector<float>{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(st.read_f32("b").to_vector<float>(), std::vector<float>{3.0f});
  EXPECT_EQ(st.read_f32("h").shape(), (Shape{2, 2}));
}

}  // namespace
}  // namespace roformer
