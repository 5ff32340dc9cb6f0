// Fine-tuning: task files and their errors, metrics, triplet scoring, and a
// short fine-tune on a synthetic task that must learn it.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "core/ops.h"
#include "layers/roformer.h"
#include "tests/test_support.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/finetune.h"
#include "train/run_precision.h"
#include "train/task_data.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("roformer_ft_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

const char* kWords[] = {"apple", "bread", "cheese", "dog",  "egg",  "fish", "grape", "house",
                        "ink",   "jam",   "kite",   "lamp", "moon", "nut",  "owl",   "pear"};

std::string write_vocab(const TempDir& t) {
  std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (const char* w : kWords) v += std::string(w) + "\n";
  return t.write("vocab.txt", v);
}

FinetuneConfig spec(FinetuneTask task) {
  FinetuneConfig f;
  f.task = task;
  f.text_fields = task == FinetuneTask::kClassification ? std::vector<std::string>{"text"}
                  : task == FinetuneTask::kPair
                      ? std::vector<std::string>{"text_a", "text_b"}
                      : std::vector<std::string>{"anchor", "positive", "negative"};
  return f;
}

std::string error_of(const std::function<void()>& fn) {
  return ::roformer::testing::error_of<InputError>(fn);
}

TEST(TaskFile, ReadsJsonlAndTsv) {
  TempDir t;
  const auto j = t.write("a.jsonl",
                         "{\"text\": \"dog egg\", \"label\": \"yes\"}\n"
                         "{\"text\": \"fish\", \"label\": 1}\n");
  const TaskFile f = read_task_file(j, spec(FinetuneTask::kClassification), LabelUse::kRequired);
  ASSERT_EQ(f.examples.size(), 2u);
  EXPECT_EQ(f.examples[0].texts[0], "dog egg");
  EXPECT_EQ(f.examples[1].label, "1");
  EXPECT_EQ(f.examples[1].line, 2);

  FinetuneConfig p = spec(FinetuneTask::kPair);
  p.format = TaskFormat::kTsv;
  const auto tsv = t.write("a.tsv", "label\ttext_b\ttext_a\nsame\tdog\tdog owl\n");
  const TaskFile g = read_task_file(tsv, p, LabelUse::kRequired);
  ASSERT_EQ(g.examples.size(), 1u);
  EXPECT_EQ(g.examples[0].texts, (std::vector<std::string>{"dog owl", "dog"}));
  EXPECT_EQ(g.examples[0].label, "same");
  EXPECT_EQ(g.examples[0].line, 2);
}

TEST(TaskFile, BadInputNamesFileAndLine) {
  TempDir t;
  const FinetuneConfig c = spec(FinetuneTask::kClassification);
  auto read = [&](const std::string& name, const std::string& text) {
    const std::string p = t.write(name, text);
    return error_of([&] { read_task_file(p, c, LabelUse::kRequired); });
  };
  EXPECT_NE(read("e.jsonl",
                 "{\"text\": \"a\", \"label\": \"x\"}\n\n{\"text\": \"b\", \"label\": \"y\"}\n")
                .find("e.jsonl:2: empty line"),
            std::string::npos);
  EXPECT_NE(read("m.jsonl", "{\"label\": \"x\"}\n").find("m.jsonl:1: missing field \"text\""),
            std::string::npos);
  EXPECT_NE(read("l.jsonl", "{\"text\": \"a\"}\n").find("l.jsonl:1: missing label field \"label\""),
            std::string::npos);
  EXPECT_NE(read("j.jsonl", "{\"text\": \"a\", \"label\": \"x\"}\n{oops\n")
                .find("j.jsonl:2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(read("n.jsonl", "{\"text\": 5, \"label\": \"x\"}\n").find("is not a string"),
            std::string::npos);
  FinetuneConfig tc = c;
  tc.format = TaskFormat::kTsv;
  const auto p1 = t.write("h.tsv", "sentence\tlabel\nx\ty\n");
  EXPECT_NE(error_of([&] {
              read_task_file(p1, tc, LabelUse::kRequired);
            }).find("h.tsv:1: the header row has no column \"text\""),
            std::string::npos);
  const auto p2 = t.write("c.tsv", "label\ttext\nx\n");
  EXPECT_NE(error_of([&] {
              read_task_file(p2, tc, LabelUse::kRequired);
            }).find("c.tsv:2: missing field \"text\""),
            std::string::npos);
}

TEST(TaskFile, LabelsUnknownLabelsAndTruncation) {
  TempDir t;
  const data::Tokenizer tok(write_vocab(t));
  FinetuneConfig c = spec(FinetuneTask::kClassification);
  c.max_seq_len = 8;
  const TaskFile train = read_task_file(
      t.write("t.jsonl",
              "{\"text\": \"dog\", \"label\": \"b\"}\n"
              "{\"text\": \"apple bread cheese dog egg fish grape house\", \"label\": \"a\"}\n"),
      c, LabelUse::kRequired);
  const auto labels = resolve_labels(c, train);
  EXPECT_EQ(labels, (std::vector<std::string>{"a", "b"}));
  const EncodedTask enc = encode_task(train, tok, c, labels);
  EXPECT_EQ(enc.truncated, 1);
  EXPECT_EQ(enc.examples[1].parts[0].input_ids.size(), 8u);
  EXPECT_EQ(enc.examples[0].label, 1);

  c.truncation = Truncation::kError;
  EXPECT_NE(error_of([&] {
              encode_task(train, tok, c, labels);
            }).find("t.jsonl:2: 10 tokens, more than finetune.max_seq_len (8)"),
            std::string::npos);
  const TaskFile val = read_task_file(t.write("v.jsonl", "{\"text\": \"dog\", \"label\": \"c\"}\n"),
                                      c, LabelUse::kRequired);
  EXPECT_NE(error_of([&] {
              encode_task(val, tok, c, labels);
            }).find("v.jsonl:1: unknown label \"c\" (the model knows \"a\", \"b\")"),
            std::string::npos);

  // Triplets: (A, B) and (A, C) with token types 0/1.
  const FinetuneConfig tc = spec(FinetuneTask::kTriplet);
  const TaskFile trip = read_task_file(t.write("x.jsonl",
                                               "{\"anchor\": \"dog\", \"positive\": \"owl\", "
                                               "\"negative\": \"egg fish\", \"label\": \"C\"}\n"),
                                       tc, LabelUse::kRequired);
  const auto tl = resolve_labels(tc, trip);
  EXPECT_EQ(tl, (std::vector<std::string>{"B", "C"}));
  const EncodedTask te = encode_task(trip, tok, tc, tl);
  ASSERT_EQ(te.examples[0].parts.size(), 2u);
  EXPECT_EQ(te.examples[0].parts[1].token_type_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(te.examples[0].label, 1);
}

TEST(Metrics, AccuracyMacroF1Confusion) {
  // truth: a a a b b c ; predicted: a a b b c c
  const EvalReport r = score_predictions({0, 0, 0, 1, 1, 2}, {0, 0, 1, 1, 2, 2}, {"a", "b", "c"});
  EXPECT_DOUBLE_EQ(r.accuracy, 4.0 / 6.0);
  // F1: a = 2*2/(4+0+1) = 0.8, b = 2/(2+1+1) = 0.5, c = 2/(2+1+0) = 2/3.
  EXPECT_NEAR(r.macro_f1, (0.8 + 0.5 + 2.0 / 3.0) / 3, 1e-12);
  EXPECT_EQ(r.confusion, (std::vector<std::vector<int64_t>>{{2, 1, 0}, {0, 1, 1}, {0, 0, 1}}));
  EXPECT_NE(format_eval_report(r).find("accuracy 66.67%"), std::string::npos);
}

TEST(Triplet, ScoresAndLossOnAHandCheckedCase) {
  // Pair scores interleaved: example 0 (s_AB = 2, s_AC = 0), example 1 (s_AB = -1, s_AC = 1).
  const Tensor pair = Tensor::from_vector<float>({2, 0, -1, 1}, {4, 1});
  const Tensor s = triplet_scores(pair);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 0, -1, 1}));
  EXPECT_EQ(argmax(s, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));  // B, then C
  // Labels B, C: each loss log(1 + e^-2) = 0.126928...
  const double loss = cross_entropy(s, Tensor::from_vector<int64_t>({0, 1}, {2})).item();
  EXPECT_NEAR(loss, std::log1p(std::exp(-2.0)), 1e-6);
  // Label C for example 0 (wrong way round): log(1 + e^2).
  const double bad =
      cross_entropy(s.narrow(0, 0, 1), Tensor::from_vector<int64_t>({1}, {1})).item();
  EXPECT_NEAR(bad, std::log1p(std::exp(2.0)), 1e-5);
  EXPECT_THROW(triplet_scores(Tensor::zeros({3, 1})), Error);
}

// Synthetic task: label "yes" when the text contains "moon".
std::string synthetic(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ostringstream out;
  for (size_t i = 0; i < n; ++i) {
    const bool yes = i % 2 == 0;
    std::string text;
    const int len = 3 + int(rng() % 5);
    const int at = int(rng() % size_t(len));
    for (int w = 0; w < len; ++w) {
      std::string word = kWords[rng() % 16];
      if (word == "moon") word = "owl";
      if (yes && w == at) word = "moon";
      text += (w ? " " : "") + word;
    }
    out << "{\"text\": \"" << text << "\", \"label\": \"" << (yes ? "yes" : "no") << "\"}\n";
  }
  return out.str();
}

std::string tiny_config(const TempDir& t, const std::string& extra) {
  return "run: {dir: " + (t.path / "run").string() + ", seed: 3, threads: 2}\n" +
         "model: {vocab_size: 21, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2,\n"
         "        intermediate_size: 64, max_position_embeddings: 64, hidden_dropout_prob: 0.0,\n"
         "        attention_probs_dropout_prob: 0.0}\n" +
         "data: {vocab: " + write_vocab(t) + "}\n" + "log: {every_steps: 1000, progress: never}\n" +
         "finetune:\n"
         "  task: classification\n"
         "  train_file: " +
         t.write("train.jsonl", synthetic(256, 1)) + "\n" +
         "  validation_file: " + t.write("val.jsonl", synthetic(64, 2)) + "\n" +
         "  test_file: " + t.write("test.jsonl", synthetic(64, 3)) + "\n" + extra +
         "  max_seq_len: 16\n  batch_size: 16\n  epochs: 6\n  lr: 3.0e-3\n  warmup_ratio: 0.1\n";
}

TEST(Finetune, LearnsASyntheticTaskAndResumes) {
  TempDir t;
  const Config config = parse_config_string(tiny_config(t, ""), "synthetic.yaml");
  const FinetuneResult r = run_finetune(config);
  ASSERT_TRUE(r.finished);
  EXPECT_GE(r.best_validation_accuracy, 0.95);
  ASSERT_TRUE(r.test.has_value());
  EXPECT_GE(r.test->accuracy, 0.9);
  EXPECT_EQ(r.test->examples, 64);
  // The test record goes through the run's one log: one TensorBoard file.
  int events_files = 0;
  for (const auto& e : fs::directory_iterator(t.path / "run" / "tb"))
    events_files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(events_files, 1);
  {
    std::ifstream log(t.path / "run" / "metrics.jsonl");
    std::string line, last;
    while (std::getline(log, line)) last = line;
    EXPECT_EQ(nlohmann::json::parse(last)["type"], "test") << last;
  }

  // The saved best model reproduces the validation score, and predicts.
  const TaskModel model(t.path / "run");
  EXPECT_EQ(model.labels(), (std::vector<std::string>{"no", "yes"}));
  EXPECT_DOUBLE_EQ(model.evaluate((t.path / "val.jsonl").string(), *config.finetune).accuracy,
                   r.validation->accuracy);
  const std::string in =
      t.write("p.jsonl", "{\"text\": \"dog moon egg\"}\n{\"text\": \"dog egg\"}\n");
  std::ostringstream out;
  EXPECT_EQ(model.predict(in, out), 2);
  std::istringstream lines(out.str());
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  EXPECT_EQ(nlohmann::json::parse(l1)["label"], "yes");
  EXPECT_EQ(nlohmann::json::parse(l2)["label"], "no");
  EXPECT_TRUE(is_finetuned_checkpoint(t.path / "run"));

  // Rerun on the finished run dir: resumes after the last epoch, same best model.
  const FinetuneResult again = run_finetune(config);
  EXPECT_TRUE(again.finished);
  EXPECT_EQ(again.epochs_done, 6);
  EXPECT_DOUBLE_EQ(again.test->accuracy, r.test->accuracy);
}

// run.precision: bf16 fine-tunes as well as f32 and evaluates the saved model
// in bf16 too (within a test example of the f32 evaluation).
TEST(Finetune, Bf16LearnsTheSyntheticTask) {
  if (!cpu_has_native_bf16()) GTEST_SKIP() << "this CPU has no bf16 dot products";
  TempDir t;
  std::string yaml = tiny_config(t, "");
  yaml.insert(yaml.find("threads: 2") + 10, ", precision: bf16");
  const Config config = parse_config_string(yaml, "synthetic.yaml");
  ASSERT_EQ(config.run.precision, Precision::kBf16);
  const FinetuneResult r = run_finetune(config);
  ASSERT_TRUE(r.finished);
  EXPECT_GE(r.best_validation_accuracy, 0.95);
  ASSERT_TRUE(r.test.has_value());
  EXPECT_GE(r.test->accuracy, 0.9);
  const TaskModel model(t.path / "run");
  const double f32 = model.evaluate((t.path / "val.jsonl").string(), *config.finetune).accuracy;
  double bf16 = 0;
  {
    const RunPrecision precision(config);
    bf16 = model.evaluate((t.path / "val.jsonl").string(), *config.finetune).accuracy;
  }
  EXPECT_NEAR(bf16, f32, 1.0 / 64 + 1e-9);
  EXPECT_NEAR(bf16, r.validation->accuracy, 1.0 / 64 + 1e-9);
}

// An interrupted run (here: its last epoch checkpoint lost) restarts that
// epoch from the previous checkpoint and ends bit for bit where an
// uninterrupted run ends.
TEST(Finetune, ResumeRestartsTheInterruptedEpochExactly) {
  TempDir t;
  const std::string yaml = tiny_config(t, "");
  Config a = parse_config_string(yaml, "a.yaml",
                                 {"finetune.epochs=2", "run.dir=" + (t.path / "a").string()});
  Config b = parse_config_string(yaml, "b.yaml",
                                 {"finetune.epochs=2", "run.dir=" + (t.path / "b").string()});
  run_finetune(a);
  run_finetune(b);
  auto b_ckpts = list_checkpoints(t.path / "b" / "checkpoints");
  ASSERT_EQ(b_ckpts.size(), 2u);
  fs::remove(b_ckpts.back());  // as if killed during epoch 2
  const FinetuneResult resumed = run_finetune(b);
  EXPECT_TRUE(resumed.finished);
  const auto last_a = load_checkpoint(list_checkpoints(t.path / "a" / "checkpoints").back(), true);
  const auto last_b = load_checkpoint(list_checkpoints(t.path / "b" / "checkpoints").back(), true);
  EXPECT_EQ(last_a.state.global_step, last_b.state.global_step);
  EXPECT_EQ(last_a.state.stage, 2);
  ASSERT_EQ(last_a.parameters.size(), last_b.parameters.size());
  for (size_t i = 0; i < last_a.parameters.size(); ++i)
    EXPECT_EQ(last_a.parameters[i].tensor.to_vector<float>(),
              last_b.parameters[i].tensor.to_vector<float>())
        << last_a.parameters[i].name;
  EXPECT_EQ(last_a.exp_avg.to_vector<float>(), last_b.exp_avg.to_vector<float>());
}

// Non-finite steps follow the pretraining rule: skipped and counted, nothing
// saved during the streak, and a stop with advice after too many in a row.
TEST(Finetune, NonFiniteStepsStopWithAdviceAndNoCheckpoint) {
  TempDir t;
  const Config config =
      parse_config_string(tiny_config(t, ""), "nan.yaml",
                          {"finetune.lr=1e30", "finetune.warmup_ratio=0", "optim.clip_grad_norm=0",
                           "optim.max_nonfinite_in_a_row=2"});
  const std::string msg = error_of([&] { run_finetune(config); });
  EXPECT_NE(msg.find("3 steps in a row had a non-finite loss or gradient"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("finetune.lr=1e+29"), std::string::npos) << msg;
  EXPECT_TRUE(list_checkpoints(t.path / "run" / "checkpoints").empty());
}

TEST(Finetune, RejectsACheckpointOfAnotherShape) {
  TempDir t;
  // A "pretraining" checkpoint of a wider model.
  Config pre = parse_config_string(tiny_config(t, ""), "pre.yaml");
  pre.model.hidden_size = 48;
  pre.finetune.reset();
  StageConfig s;
  s.max_seq_len = 16;
  s.batch_size = s.micro_batch_size = 1;
  s.steps = 1;
  pre.stages.push_back(s);
  const RoFormerForMaskedLM model(pre.model, 1);
  CheckpointData d;
  d.parameters = model.named_parameters();
  d.config_yaml = to_yaml(pre);
  save_checkpoint(t.path / "pre.h5", d);

  const Config config = parse_config_string(
      tiny_config(t, "  init_checkpoint: " + (t.path / "pre.h5").string() + "\n"), "ft.yaml");
  const std::string msg = error_of([&] { run_finetune(config); });
  EXPECT_NE(msg.find("holds a different model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.hidden_size: checkpoint 48, config 32"), std::string::npos) << msg;
}

}  // namespace
}  // namespace roformer
