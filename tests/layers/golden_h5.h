// Reads the golden fixtures written by tests/golden/make_golden_roformer.py:
// datasets as f64/i32 tensors, string attributes, and the names in a group.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/model_config.h"

namespace roformer::testing {

class GoldenFile {
 public:
  explicit GoldenFile(const std::string& path) : path_(path) {
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file_ < 0) throw Error("golden: cannot open " + path);
  }
  ~GoldenFile() { H5Fclose(file_); }
  GoldenFile(const GoldenFile&) = delete;
  GoldenFile& operator=(const GoldenFile&) = delete;

  // The dataset at `name` as a tensor of `dtype` (f64 or i32).
  Tensor read(const std::string& name, DType dtype = DType::f64) const {
    const hid_t ds = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
    if (ds < 0) throw Error("golden: no dataset '" + name + "' in " + path_);
    const hid_t space = H5Dget_space(ds);
    const int nd = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(size_t(std::max(nd, 0)));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    Tensor out = Tensor::empty(shape, dtype);
    const hid_t mem = dtype == DType::f64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT32;
    const herr_t status = H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    H5Sclose(space);
    H5Dclose(ds);
    if (status < 0) throw Error("golden: cannot read '" + name + "' in " + path_);
    return out;
  }

  // A variable-length string attribute of the root group.
  std::string attribute(const std::string& name) const {
    const hid_t attr = H5Aopen(file_, name.c_str(), H5P_DEFAULT);
    if (attr < 0) throw Error("golden: no attribute '" + name + "' in " + path_);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    char* value = nullptr;
    const herr_t status = H5Aread(attr, type, &value);
    std::string out = status >= 0 && value ? value : "";
    if (value) H5free_memory(value);
    H5Tclose(type);
    H5Aclose(attr);
    return out;
  }

  // Names of the members of a group, in the file's (alphabetical) order.
  std::vector<std::string> members(const std::string& group) const {
    std::vector<std::string> names;
    H5Literate_by_name(
        file_, group.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
        [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
          static_cast<std::vector<std::string>*>(data)->push_back(name);
          return 0;
        },
        &names, H5P_DEFAULT);
    return names;
  }

 private:
  std::string path_;
  hid_t file_;
};

// The fixtures' model (tests/golden/make_golden_roformer.py CONFIG).
inline ModelConfig golden_config() {
  ModelConfig c;
  c.vocab_size = 1000;
  c.embedding_size = 64;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 128;
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  c.max_position_embeddings = 64;
  c.type_vocab_size = 2;
  c.layer_norm_eps = 1e-12;
  return c;
}

// The golden file `name`: the committed fixture, or ROFORMER_GOLDEN_DIR's
// freshly generated one (scripts/gpu_check.sh makes a set with transformers
// on the GPU machine before it is committed).
inline std::string golden_path(const std::string& name) {
  const char* dir = std::getenv("ROFORMER_GOLDEN_DIR");
  return std::string(dir && *dir ? dir : ROFORMER_FIXTURES_DIR) + "/" + name;
}

// The reference must be transformers itself (its "reference" attribute names
// it and the class `model`): always for the committed fixtures, and for a
// fresh set when ROFORMER_GOLDEN_REQUIRE_HF=1. A fresh set without it may come
// from the in-repo re-implementation (machines without transformers).
inline void expect_golden_origin(const GoldenFile& f, const std::string& model) {
  const std::string reference = f.attribute("reference");
  EXPECT_NE(reference.find(model), std::string::npos) << reference;
  const char* dir = std::getenv("ROFORMER_GOLDEN_DIR");
  const char* require = std::getenv("ROFORMER_GOLDEN_REQUIRE_HF");
  if (!(dir && *dir) || (require && std::string(require) == "1")) {
    EXPECT_EQ(reference.rfind("transformers ", 0), 0u) << "not made by transformers: " << reference;
  }
}

// max |a - b| / max |b|: relative error at the scale of the reference.
inline double max_rel_error(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  EXPECT_EQ(va.size(), vb.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace roformer::testing
