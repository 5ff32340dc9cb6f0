// Every basic op against a plain reference loop written here (on logical
// values, so strides cannot hide a bug), with non-contiguous and broadcast
// inputs; f64 gradient checks; oneDNN (f32/bf16) against the f64 loops; and
// error messages that name both sides.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/ops.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::random_f64;

// --- reference helpers ----------------------------------------------------------

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    idx[size_t(d)] = flat % shape[size_t(d)];
    flat /= shape[size_t(d)];
  }
  return idx;
}

// Row-major position in `in` of output index `idx`, NumPy broadcasting
// (trailing dims aligned, size-1 dims repeat).
int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& in) {
  const size_t lead = idx.size() - in.size();
  int64_t off = 0;
  for (size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : idx[lead + d]);
  return off;
}

Shape bshape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = std::max(da, db);
  }
  return out;
}

Tensor f64(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector<double>(v, s);
}

Tensor ref_binary(const Tensor& a, const Tensor& b,
                  const std::function<double(double, double)>& f) {
  const Shape out = bshape(a.shape(), b.shape());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  std::vector<double> r(size_t(shape_numel(out)));
  for (int64_t i = 0; i < shape_numel(out); ++i) {
    const auto idx = unravel(i, out);
    r[size_t(i)] = f(va[size_t(broadcast_offset(idx, a.shape()))],
                     vb[size_t(broadcast_offset(idx, b.shape()))]);
  }
  return f64(r, out);
}

Tensor ref_unary(const Tensor& a, const std::function<double(double)>& f) {
  auto v = a.to_vector<double>();
  for (double& x : v) x = f(x);
  return f64(v, a.shape());
}

// Sum over `dims` (all when empty) of logical values.
Tensor ref_sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim, bool mean = false) {
  const int64_t nd = x.dim();
  std::vector<bool> red(size_t(nd), dims.empty());
  for (int64_t d : dims) red[size_t(d < 0 ? d + nd : d)] = true;
  Shape kshape = x.shape(), dshape;
  for (int64_t d = 0; d < nd; ++d) {
    if (red[size_t(d)])
      kshape[size_t(d)] = 1;
    else
      dshape.push_back(x.shape()[size_t(d)]);
  }
  std::vector<double> r(size_t(shape_numel(kshape)), 0.0);
  const auto v = x.to_vector<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, x.shape());
    for (int64_t d = 0; d < nd; ++d)
      if (red[size_t(d)]) idx[size_t(d)] = 0;
    r[size_t(broadcast_offset(idx, kshape))] += v[size_t(i)];
  }
  if (mean)
    for (double& s : r) s /= double(x.numel()) / double(r.size());
  return f64(r, keepdim ? kshape : dshape);
}

// [..., M, K] x [..., K, N] with broadcast batch dims, in plain loops.
Tensor ref_matmul(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor()) {
  const Shape ba(a.shape().begin(), a.shape().end() - 2),
      bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = bshape(ba, bb);
  const int64_t M = a.shape()[size_t(a.dim() - 2)], K = a.shape().back(), N = b.shape().back();
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  const std::vector<double> vbias =
      bias.defined() ? bias.to_vector<double>() : std::vector<double>();
  Shape out = batch;
  out.insert(out.end(), {M, N});
  std::vector<double> r;
  for (int64_t t = 0; t < shape_numel(batch); ++t) {
    const auto idx = unravel(t, batch);
    const int64_t oa = broadcast_offset(idx, ba) * M * K, ob = broadcast_offset(idx, bb) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = bias.defined() ? vbias[size_t(n)] : 0.0;
        for (int64_t k = 0; k < K; ++k)
          s += va[size_t(oa + m * K + k)] * vb[size_t(ob + k * N + n)];
        r.push_back(s);
      }
  }
  return f64(r, out);
}

// Gradients of sum(f(inputs) * w) for the given inputs (cast to `dt`).
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, DType dt) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) in.push_back(t.detach().to(dt).set_requires_grad(true));
  const Tensor out = f(in);
  const Tensor w = random_f64(out.shape(), 1234).to(dt);
  sum(mul(out, w)).backward();
  std::vector<Tensor> g;
  for (const Tensor& t : in) g.push_back(t.grad());
  return g;
}

double abs_max(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

std::string error_of(const std::function<void()>& fn) {
  return ::roformer::testing::error_of<Error>(fn);
}

#define EXPECT_MENTIONS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "'" << (msg) << "' lacks '" << (text) << "'"

// A [3, 4] non-contiguous view (transposed).
Tensor transposed34(uint64_t seed, double lo = -1, double hi = 1) {
  return random_f64({4, 3}, seed, lo, hi).transpose(0, 1);
}

// --- elementwise binary ------------------------------------------------------------

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); },
       [](double x, double y) { return x + y; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); },
       [](double x, double y) { return x - y; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); },
       [](double x, double y) { return x * y; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); },
       [](double x, double y) { return x / y; }},
  };
  return cases;
}

TEST(OpsBinary, ForwardMatchesReferenceWithBroadcastAndStrides) {
  const Tensor a = transposed34(1);
  const Tensor b = random_f64({4}, 2, 0.5, 2.0);                    // broadcast along rows
  const Tensor c = random_f64({3, 1}, 3, 0.5, 2.0);                 // broadcast along columns
  const Tensor d = random_f64({1, 4}, 4, 0.5, 2.0).expand({3, 4});  // stride 0
  const Tensor e = random_f64({2, 1, 4}, 5, 0.5, 2.0);              // adds a leading dim
  ASSERT_FALSE(a.is_contiguous());
  for (const BinaryCase& bc : binary_cases()) {
    for (const auto& [x, y] : std::vector<std::pair<Tensor, Tensor>>{
             {a, b}, {a, c}, {c, b}, {a, d}, {a, e}, {b, a.narrow(0, 1, 2)}}) {
      const Tensor want = ref_binary(x, y, bc.ref);
      const Tensor got = bc.op(x, y);
      EXPECT_EQ(got.shape(), want.shape()) << bc.name;
      EXPECT_TRUE(all_close(got, want, 1e-14, 1e-14)) << bc.name;
      EXPECT_TRUE(all_close(bc.op(x.to(DType::f32), y.to(DType::f32)), want, 1e-6, 1e-6))
          << bc.name;
      EXPECT_TRUE(all_close(bc.op(x.to(DType::bf16), y.to(DType::bf16)), want, 2e-2, 2e-2))
          << bc.name;
    }
  }
  // Integer tensors add exactly.
  const Tensor i = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  EXPECT_EQ(add(i, i).to_vector<int64_t>(), (std::vector<int64_t>{2, 4, 6}));
}

TEST(OpsBinary, GradientsMatchFiniteDifferences) {
  for (const BinaryCase& bc : binary_cases()) {
    auto f = [&](const std::vector<Tensor>& in) { return bc.op(in[0].transpose(0, 1), in[1]); };
    EXPECT_TRUE(gradcheck(f, {random_f64({4, 3}, 6), random_f64({3, 1}, 7, 0.5, 2.0)})) << bc.name;
    auto g = [&](const std::vector<Tensor>& in) { return bc.op(in[0], in[1]); };
    EXPECT_TRUE(gradcheck(g, {random_f64({2, 1, 4}, 8), random_f64({3, 4}, 9, 0.5, 2.0)}))
        << bc.name;
  }
}

TEST(OpsBinary, ScalarVariantsAndOperators) {
  const Tensor a = transposed34(10);
  const double s = 1.75;
  EXPECT_TRUE(all_close(add(a, s), ref_unary(a, [&](double x) { return x + s; }), 1e-15, 0));
  EXPECT_TRUE(all_close(sub(a, s), ref_unary(a, [&](double x) { return x - s; }), 1e-15, 0));
  EXPECT_TRUE(all_close(rsub(a, s), ref_unary(a, [&](double x) { return s - x; }), 1e-15, 0));
  EXPECT_TRUE(all_close(mul(a, s), ref_unary(a, [&](double x) { return x * s; }), 1e-15, 0));
  EXPECT_TRUE(all_close(div(a, s), ref_unary(a, [&](double x) { return x / s; }), 1e-15, 0));
  EXPECT_TRUE(all_close(a * s + 1.0, ref_unary(a, [&](double x) { return x * s + 1; }), 1e-15, 0));
  EXPECT_TRUE(
      all_close(2.0 * a - a / a, ref_unary(a, [&](double x) { return 2 * x - 1; }), 1e-15, 1e-15));
  EXPECT_TRUE(all_close(-a, ref_unary(a, [](double x) { return -x; }), 0, 0));
  const std::vector<std::function<Tensor(const Tensor&)>> fns = {
      [](const Tensor& x) { return add(x, 0.3); }, [](const Tensor& x) { return sub(x, 0.3); },
      [](const Tensor& x) { return rsub(x, 0.3); }, [](const Tensor& x) { return mul(x, -2.5); },
      [](const Tensor& x) { return div(x, 4.0); }};
  for (const auto& fn : fns)
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return fn(in[0]); },
                          {random_f64({2, 3}, 11)}));
}

// --- elementwise unary ----------------------------------------------------------------

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input range
};

TEST(OpsUnary, ForwardGradientAndF32MatchReference) {
  const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -2, 2},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.2,
       3},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
       0.2, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -2,
       2},
      {"pow2.5", [](const Tensor& x) { return pow(x, 2.5); },
       [](double x) { return std::pow(x, 2.5); }, 0.2, 2},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -2,
       2},
      {"elu_plus_one", [](const Tensor& x) { return elu_plus_one(x); },
       [](double x) { return x > 0 ? x + 1 : std::exp(x); }, -2, 2},
  };
  for (const UnaryCase& uc : cases) {
    const Tensor x = transposed34(12, uc.lo, uc.hi);
    const Tensor want = ref_unary(x, uc.ref);
    EXPECT_TRUE(all_close(uc.op(x), want, 1e-14, 1e-14)) << uc.name;
    EXPECT_TRUE(all_close(uc.op(x.to(DType::f32)), want, 1e-5, 1e-6)) << uc.name;
    EXPECT_TRUE(all_close(uc.op(x.to(DType::bf16)), want, 2e-2, 2e-2)) << uc.name;
    EXPECT_TRUE(
        gradcheck([&](const std::vector<Tensor>& in) { return uc.op(in[0].transpose(0, 1)); },
                  {random_f64({4, 3}, 13, uc.lo, uc.hi)}))
        << uc.name;
    // Broadcast (stride-0) input.
    const Tensor xe = random_f64({1, 4}, 14, uc.lo, uc.hi).expand({3, 4});
    EXPECT_TRUE(all_close(uc.op(xe), ref_unary(xe, uc.ref), 1e-14, 1e-14)) << uc.name;
  }
}

// --- reductions ------------------------------------------------------------------------

TEST(OpsReduce, SumAndMeanOverDimsMatchReference) {
  const Tensor x = random_f64({3, 4, 5}, 15);
  const Tensor xp = random_f64({5, 3, 4}, 16).permute({1, 2, 0});  // [3, 4, 5], strided
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {-1}, {0, 1, 2}};
  for (const Tensor& t : {x, xp}) {
    for (const auto& dims : dim_sets) {
      for (bool keep : {false, true}) {
        const Tensor want = ref_sum(t, dims, keep);
        EXPECT_TRUE(all_close(sum(t, dims, keep), want, 1e-13, 1e-13));
        EXPECT_TRUE(all_close(mean(t, dims, keep), ref_sum(t, dims, keep, true), 1e-13, 1e-13));
        EXPECT_TRUE(all_close(sum(t.to(DType::f32), dims, keep), want, 1e-5, 1e-5));
      }
    }
  }
  EXPECT_NEAR(sum(x).item(), ref_sum(x, {}, false).item(), 1e-12);
  EXPECT_NEAR(mean(xp).item(), ref_sum(xp, {}, false, true).item(), 1e-13);
  EXPECT_EQ(sum(x).dim(), 0);
  // Sum of a broadcast view counts every repeated element.
  const Tensor e = random_f64({1, 4}, 17).expand({6, 4});
  EXPECT_TRUE(all_close(sum(e, {0}), ref_sum(e, {0}, false), 1e-13, 0));
}

TEST(OpsReduce, SumAndMeanGradients) {
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return sum(in[0], {0, 2});
      },
      {random_f64({3, 4, 2}, 18)}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return mean(in[0].permute({2, 0, 1}), {1}, true);
      },
      {random_f64({3, 4, 2}, 19)}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mean(in[0]); },
                        {random_f64({3, 2}, 20)}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return sum_to(in[0], {1, 3});
      },
      {random_f64({2, 4, 3}, 21)}));
}

TEST(OpsReduce, MaxAndArgmaxMatchReference) {
  const Tensor x = random_f64({5, 3, 4}, 22).permute({1, 0, 2});  // [3, 5, 4], strided
  for (int64_t dim : {0, 1, -1}) {
    for (bool keep : {false, true}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      const auto [values, indices] = max(x, dim, keep);
      EXPECT_EQ(indices.dtype(), DType::i64);
      Shape kshape = x.shape();
      kshape[size_t(d)] = 1;
      const auto vx = x.to_vector<double>();
      std::vector<double> want_v(size_t(shape_numel(kshape)), -1e300);
      std::vector<int64_t> want_i(want_v.size(), -1);
      for (int64_t i = 0; i < x.numel(); ++i) {
        auto idx = unravel(i, x.shape());
        const int64_t along = idx[size_t(d)];
        idx[size_t(d)] = 0;
        const auto o = size_t(broadcast_offset(idx, kshape));
        if (vx[size_t(i)] > want_v[o]) {
          want_v[o] = vx[size_t(i)];
          want_i[o] = along;
        }
      }
      Shape out_shape = kshape;
      if (!keep) out_shape.erase(out_shape.begin() + d);
      EXPECT_EQ(values.shape(), out_shape);
      EXPECT_EQ(values.to_vector<double>(), want_v);
      EXPECT_EQ(indices.to_vector<int64_t>(), want_i);
      EXPECT_EQ(argmax(x, dim, keep).to_vector<int64_t>(), want_i);
      EXPECT_EQ(argmax(x.to(DType::f32), dim, keep).to_vector<int64_t>(), want_i);
    }
  }
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return max(in[0], 1).first; },
                        {random_f64({3, 5}, 23)}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) { return max(in[0].transpose(0, 1), 0, true).first; },
      {random_f64({3, 5}, 24)}));
}

// --- matmul and linear ------------------------------------------------------------------

struct MatmulCase {
  const char* name;
  Tensor a, b;
};

std::vector<MatmulCase> matmul_cases() {
  return {
      {"2d", random_f64({3, 4}, 25), random_f64({4, 5}, 26)},
      {"batched", random_f64({2, 3, 4}, 27), random_f64({2, 4, 5}, 28)},
      {"broadcast b", random_f64({2, 3, 4}, 29), random_f64({4, 5}, 30)},
      {"broadcast a", random_f64({3, 4}, 31), random_f64({2, 4, 5}, 32)},
      {"broadcast both", random_f64({2, 1, 3, 4}, 33), random_f64({5, 4, 6}, 34)},
      {"transposed a", random_f64({4, 3}, 35).transpose(0, 1), random_f64({4, 5}, 36)},
      {"transposed b", random_f64({3, 4}, 37), random_f64({5, 4}, 38).transpose(0, 1)},
      {"transposed both batched", random_f64({2, 4, 3}, 39).transpose(1, 2),
       random_f64({2, 5, 4}, 40).transpose(1, 2)},
      {"permuted heads", random_f64({2, 3, 2, 4}, 41).permute({0, 2, 1, 3}),
       random_f64({2, 4, 2, 5}, 42).permute({0, 2, 1, 3})},
      {"expanded batch", random_f64({1, 3, 4}, 43).expand({3, 3, 4}), random_f64({3, 4, 2}, 44)},
      {"large", random_f64({48, 96}, 45), random_f64({96, 40}, 46)},
  };
}

TEST(OpsMatmul, F64LoopAndOneDnnMatchReference) {
  for (const MatmulCase& mc : matmul_cases()) {
    const Tensor want = ref_matmul(mc.a, mc.b);
    EXPECT_TRUE(all_close(matmul(mc.a, mc.b), want, 1e-13, 1e-13)) << mc.name;
    // f32 on oneDNN.
    EXPECT_TRUE(all_close(matmul(mc.a.to(DType::f32), mc.b.to(DType::f32)), want, 1e-5, 1e-5))
        << mc.name;
    // bf16 on oneDNN: within 1e-2 of the product of the bf16-rounded inputs.
    const Tensor ab = mc.a.to(DType::bf16), bb = mc.b.to(DType::bf16);
    const Tensor got = matmul(ab, bb);
    EXPECT_EQ(got.dtype(), DType::bf16);
    const Tensor want_b = ref_matmul(ab, bb);
    const double scale = std::max(abs_max(want_b), 1e-3);
    EXPECT_TRUE(all_close(got, want_b, 1e-2, 1e-2 * scale)) << mc.name;
  }
}

TEST(OpsMatmul, GradientsMatchFiniteDifferences) {
  for (const MatmulCase& mc : matmul_cases()) {
    if (std::string(mc.name) == "large") continue;  // finite differences are O(n^2)
    // The strided views are rebuilt from contiguous leaves inside f.
    const Tensor a = mc.a.contiguous(), b = mc.b.contiguous();
    EXPECT_TRUE(
        gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}))
        << mc.name;
  }
  auto transposed = [](const std::vector<Tensor>& in) {
    return matmul(in[0].transpose(-1, -2), in[1].transpose(-1, -2));
  };
  EXPECT_TRUE(gradcheck(transposed, {random_f64({2, 4, 3}, 47), random_f64({1, 5, 4}, 48)}));
  auto expanded = [](const std::vector<Tensor>& in) {
    return matmul(in[0].expand({3, 2, 4}), in[1]);
  };
  EXPECT_TRUE(gradcheck(expanded, {random_f64({2, 4}, 49), random_f64({3, 4, 2}, 50)}));
}

TEST(OpsMatmul, OneDnnBackwardMatchesF64Backward) {
  for (const MatmulCase& mc : matmul_cases()) {
    auto f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
    const auto g64 = grads_of(f, {mc.a, mc.b}, DType::f64);
    const auto g32 = grads_of(f, {mc.a, mc.b}, DType::f32);
    const auto g16 = grads_of(f, {mc.a, mc.b}, DType::bf16);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(g32[i].dtype(), DType::f32);
      EXPECT_EQ(g32[i].shape(), i == 0 ? mc.a.shape() : mc.b.shape());
      EXPECT_TRUE(all_close(g32[i], g64[i], 1e-5, 1e-5)) << mc.name << " input " << i;
      const double scale = std::max(abs_max(g64[i]), 1e-3);
      EXPECT_TRUE(all_close(g16[i], g64[i], 3e-2, 3e-2 * scale)) << mc.name << " input " << i;
    }
  }
}

TEST(OpsLinear, ForwardMatchesReferenceWithAndWithoutBias) {
  const Tensor w = random_f64({5, 4}, 51), bias = random_f64({5}, 52);
  const Tensor x3 = random_f64({2, 3, 4}, 53);
  const Tensor xt = random_f64({3, 2, 4}, 54).transpose(0, 1);  // [2, 3, 4], strided
  const Tensor x1 = random_f64({4}, 55);
  const Tensor wt = w.transpose(0, 1);
  for (const Tensor& x : {x3, xt, x1}) {
    const Tensor want_nb = ref_matmul(x.reshape({-1, 4}), wt);
    Shape out_shape = x.shape();
    out_shape.back() = 5;
    const Tensor want = ref_matmul(x.reshape({-1, 4}), wt, bias).reshape(out_shape);
    EXPECT_TRUE(all_close(linear(x, w, bias), want, 1e-13, 1e-13));
    EXPECT_TRUE(all_close(linear(x, w), want_nb.reshape(out_shape), 1e-13, 1e-13));
    EXPECT_TRUE(all_close(linear(x.to(DType::f32), w.to(DType::f32), bias.to(DType::f32)), want,
                          1e-5, 1e-5));
    EXPECT_TRUE(all_close(linear(x.to(DType::f32), w.to(DType::f32)), want_nb.reshape(out_shape),
                          1e-5, 1e-5));
    const Tensor xb = x.to(DType::bf16), wb = w.to(DType::bf16), bb = bias.to(DType::bf16);
    const Tensor want_b =
        ref_matmul(xb.reshape({-1, 4}), wb.transpose(0, 1), bb).reshape(out_shape);
    EXPECT_TRUE(all_close(linear(xb, wb, bb), want_b, 1e-2, 1e-2 * abs_max(want_b)));
  }
  // A larger f32 case so oneDNN's blocked kernels run.
  const Tensor xl = random_f64({4, 16, 96}, 56), wl = random_f64({80, 96}, 57),
               bl = random_f64({80}, 58);
  const Tensor want_l =
      ref_matmul(xl.reshape({-1, 96}), wl.transpose(0, 1), bl).reshape({4, 16, 80});
  EXPECT_TRUE(all_close(linear(xl.to(DType::f32), wl.to(DType::f32), bl.to(DType::f32)), want_l,
                        1e-5, 1e-4));
}

TEST(OpsLinear, GradientsAndOneDnnBackward) {
  auto with_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  auto no_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
  auto strided = [](const std::vector<Tensor>& in) {
    return linear(in[0].transpose(0, 1), in[1], in[2]);
  };
  const Tensor x = random_f64({2, 3, 4}, 59), w = random_f64({5, 4}, 60), b = random_f64({5}, 61);
  EXPECT_TRUE(gradcheck(with_bias, {x, w, b}));
  EXPECT_TRUE(gradcheck(no_bias, {x, w}));
  EXPECT_TRUE(gradcheck(strided, {random_f64({3, 2, 4}, 62), w, b}));
  // The oneDNN backward (f32) against the f64 loop backward.
  const Tensor xs = random_f64({3, 2, 4}, 63);
  const auto g64 = grads_of(with_bias, {x, w, b}, DType::f64);
  const auto g32 = grads_of(with_bias, {x, w, b}, DType::f32);
  const auto s64 = grads_of(strided, {xs, w, b}, DType::f64);
  const auto s32 = grads_of(strided, {xs, w, b}, DType::f32);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(all_close(g32[i], g64[i], 1e-5, 1e-5)) << i;
    EXPECT_TRUE(all_close(s32[i], s64[i], 1e-5, 1e-5)) << i;
  }
}

TEST(OpsMatmul, EmptyInnerDimensionGivesZerosOrBias) {
  // oneDNN divides by K; an empty sum must still be 0 (+ bias), not a crash.
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    EXPECT_EQ(matmul(Tensor::ones({2, 0}, dt), Tensor::ones({0, 3}, dt)).to_vector<double>(),
              std::vector<double>(6, 0.0));
    EXPECT_EQ(matmul(Tensor::ones({2, 3, 0}, dt), Tensor::ones({0, 1}, dt)).to_vector<double>(),
              std::vector<double>(6, 0.0));
  }
}

// --- structure ---------------------------------------------------------------------------

TEST(OpsStructure, ConcatStackSplit) {
  const Tensor a = transposed34(63);  // [3, 4] strided
  const Tensor b = random_f64({3, 2}, 64);
  const Tensor c = random_f64({1, 4}, 65).expand({2, 4});  // stride 0
  const Tensor ab = concat({a, b}, 1);
  ASSERT_EQ(ab.shape(), (Shape{3, 6}));
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  const auto vab = ab.to_vector<double>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 6; ++j)
      EXPECT_EQ(vab[size_t(i * 6 + j)], j < 4 ? va[size_t(i * 4 + j)] : vb[size_t(i * 2 + j - 4)]);
  const Tensor ac = concat({a, c}, -2);
  ASSERT_EQ(ac.shape(), (Shape{5, 4}));
  auto vac = a.to_vector<double>();
  for (double v : c.to_vector<double>()) vac.push_back(v);
  EXPECT_EQ(ac.to_vector<double>(), vac);

  const Tensor s0 = stack({a, a.to(DType::f64), mul(a, 2.0)}, 0);
  const Tensor s2 = stack({a, mul(a, 2.0)}, -1);
  ASSERT_EQ(s0.shape(), (Shape{3, 3, 4}));
  ASSERT_EQ(s2.shape(), (Shape{3, 4, 2}));
  const auto v2 = s2.to_vector<double>();
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(v2[size_t(2 * i)], va[size_t(i)]);
    EXPECT_EQ(v2[size_t(2 * i + 1)], 2 * va[size_t(i)]);
  }
  EXPECT_TRUE(all_close(s0.select(0, 2), mul(a, 2.0), 0, 0));

  const std::vector<Tensor> parts = split(ab, {1, 3, 2}, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), (Shape{3, 3}));
  EXPECT_TRUE(all_close(parts[0], a.narrow(1, 0, 1), 0, 0));
  EXPECT_TRUE(all_close(parts[2], b, 0, 0));

  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return concat({in[0].transpose(0, 1), in[1]}, 1);
      },
      {random_f64({4, 3}, 66), random_f64({3, 2}, 67)}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return stack({in[0], in[1]}, 1);
      },
      {random_f64({2, 3}, 68), random_f64({2, 3}, 69)}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        const auto p = split(in[0], {2, 1, 2}, 0);
        return concat({mul(p[2], 3.0), p[0]}, 0);  // p[1] gets no gradient: zeros
      },
      {random_f64({5, 3}, 70)}));
}

TEST(OpsStructure, WhereAndMaskedFill) {
  const Tensor cond = Tensor::from_vector<int64_t>({1, 0, 0}, {3, 1});
  const Tensor a = transposed34(71);
  const Tensor b = random_f64({4}, 72);
  const Tensor got = where(cond, a, b);
  const Tensor want = ref_binary(
      ref_binary(cond.to(DType::f64), a, [](double c, double x) { return c != 0 ? x : NAN; }), b,
      [](double x, double y) { return std::isnan(x) ? y : x; });
  EXPECT_TRUE(all_close(got, want, 0, 0));
  // A floating condition counts nonzero as true.
  const Tensor fcond = Tensor::from_vector<float>({0.f, 2.f, 0.f, -1.f}, {4});
  const auto wv = where(fcond, a, b).to_vector<double>();
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_EQ(wv[size_t(i)], (i % 4 == 1 || i % 4 == 3) ? av[size_t(i)] : bv[size_t(i % 4)]);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return where(cond, in[0].transpose(0, 1), in[1]); },
      {random_f64({4, 3}, 73), random_f64({4}, 74)}));

  const Tensor mask = Tensor::from_vector<int32_t>({0, 1, 1, 0}, {1, 4});
  const Tensor filled = masked_fill(a, mask, -1e4);
  const auto fv = filled.to_vector<double>();
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_EQ(fv[size_t(i)], (i % 4 == 1 || i % 4 == 2) ? -1e4 : av[size_t(i)]);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, 7); },
                        {random_f64({3, 4}, 75)}));
  const std::string msg = error_of([&] { masked_fill(a, Tensor::zeros({2, 4}), 0); });
  EXPECT_MENTIONS(msg, "masked_fill");
}

TEST(OpsStructure, CastConvertsValuesAndGradientDtype) {
  const Tensor x = Tensor::from_vector<double>({1.5, -2.7, 3.25, 1e-9}, {2, 2});
  EXPECT_EQ(cast(x, DType::f32).to_vector<float>(),
            (std::vector<float>{1.5f, -2.7f, 3.25f, 1e-9f}));
  EXPECT_EQ(cast(x, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3, 0}));
  EXPECT_EQ(cast(x.transpose(0, 1), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 3, -2, 0}));
  EXPECT_EQ(cast(Tensor::from_vector<int32_t>({4, -5}, {2}), DType::f64).to_vector<double>(),
            (std::vector<double>{4, -5}));
  const auto bf = cast(x, DType::bf16).to_vector<double>();
  EXPECT_EQ(bf[0], 1.5);
  EXPECT_NEAR(bf[1], -2.7, 0.01);
  EXPECT_NE(bf[1], double(float(-2.7)));  // rounded to 8 mantissa bits
  // The gradient comes back in the input's dtype.
  const Tensor xl = x.detach().clone().set_requires_grad(true);
  const Tensor w = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  sum(mul(cast(xl, DType::f32), w)).backward();
  EXPECT_EQ(xl.grad().dtype(), DType::f64);
  EXPECT_EQ(xl.grad().to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_FALSE(cast(xl, DType::i64).requires_grad());
}

TEST(OpsStructure, IndexSelect) {
  const Tensor x = random_f64({5, 2, 3}, 76);
  for (const Tensor& idx : {Tensor::from_vector<int64_t>({4, 0, 4, 2}, {4}),
                            Tensor::from_vector<int32_t>({4, 0, 4, 2}, {4})}) {
    const Tensor got = index_select(x, idx);
    ASSERT_EQ(got.shape(), (Shape{4, 2, 3}));
    const auto vx = x.to_vector<double>(), vg = got.to_vector<double>();
    const int64_t rows[] = {4, 0, 4, 2};
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(vg[size_t(i * 6 + j)], vx[size_t(rows[i] * 6 + j)]);
  }
  // Repeated indices accumulate their gradients; a strided source works too.
  const Tensor idx = Tensor::from_vector<int64_t>({4, 0, 4, 2}, {4});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], idx); },
                        {random_f64({5, 3}, 77)}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return index_select(in[0].transpose(0, 1), idx); },
      {random_f64({3, 5}, 78)}));
  // The kernel checks the indices on the device; the error comes at the next
  // sync point (here the read of the result), naming the index and position.
  const Tensor bad = index_select(x, Tensor::from_vector<int64_t>({1, 5}, {2}));
  const std::string msg = error_of([&] { bad.to_vector<double>(); });
  EXPECT_MENTIONS(msg, "index 5");
  EXPECT_MENTIONS(msg, "position 1");
  EXPECT_MENTIONS(msg, "f64[5, 2, 3]");
  // Raised once: the next read is clean.
  EXPECT_NO_THROW(x.to_vector<double>());
}

// --- views ------------------------------------------------------------------------------

TEST(OpsViews, ValuesMatchIndexArithmeticAndGradientsCheck) {
  const Tensor x = random_f64({2, 3, 4}, 79);
  const auto v = x.to_vector<double>();
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[size_t((i * 3 + j) * 4 + k)]; };

  const Tensor t = x.transpose(0, 2);     // [4, 3, 2]
  const Tensor p = x.permute({2, 0, 1});  // [4, 2, 3]
  const auto vt = t.to_vector<double>(), vp = p.to_vector<double>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(vt[size_t((k * 3 + j) * 2 + i)], at(i, j, k));
        EXPECT_EQ(vp[size_t((k * 2 + i) * 3 + j)], at(i, j, k));
      }
  EXPECT_TRUE(t.shares_storage_with(x));
  EXPECT_EQ(x.reshape({4, 6}).to_vector<double>(), v);  // a view: logical order kept
  EXPECT_TRUE(x.reshape({4, 6}).shares_storage_with(x));
  EXPECT_EQ(t.reshape({24}).to_vector<double>(), vt);  // a copy
  const Tensor n = x.narrow(1, 1, 2);
  ASSERT_EQ(n.shape(), (Shape{2, 2, 4}));
  const auto vn = n.to_vector<double>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(vn[size_t((i * 2 + j) * 4 + k)], at(i, j + 1, k));
  EXPECT_EQ(x.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(x.unsqueeze(1).to_vector<double>(), v);
  EXPECT_EQ(x.unsqueeze(1).squeeze(1).shape(), x.shape());
  const Tensor col = random_f64({3, 1}, 80);
  const Tensor e = col.expand({2, 3, 4});
  const auto vc = col.to_vector<double>(), ve = e.to_vector<double>();
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(ve[size_t(i)], vc[size_t((i / 4) % 3)]);

  using In = const std::vector<Tensor>&;
  EXPECT_TRUE(gradcheck([](In in) { return in[0].reshape({4, 6}); }, {x}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].transpose(0, 2).reshape({6, 4}); }, {x}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].permute({2, 0, 1}); }, {x}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].narrow(2, 1, 2); }, {x}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].unsqueeze(0).squeeze(0).unsqueeze(2); }, {x}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].expand({2, 3, 4}); }, {col}));
  EXPECT_TRUE(gradcheck([](In in) { return in[0].select(1, 2); }, {x}));
}

// --- error messages -----------------------------------------------------------------------

TEST(OpsErrors, MismatchesNameBothSides) {
  const Tensor a = Tensor::zeros({2, 3});
  const Tensor d64 = Tensor::zeros({3}, DType::f64);
  for (const BinaryCase& bc : binary_cases()) {
    const std::string dt = error_of([&] { bc.op(a, d64); });
    EXPECT_MENTIONS(dt, bc.name);
    EXPECT_MENTIONS(dt, "f32[2, 3]");
    EXPECT_MENTIONS(dt, "f64[3]");
    const std::string sh = error_of([&] { bc.op(a, Tensor::zeros({4})); });
    EXPECT_MENTIONS(sh, bc.name);
    EXPECT_MENTIONS(sh, "[2, 3]");
    EXPECT_MENTIONS(sh, "[4]");
  }
  const std::string mm = error_of([] { matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); });
  EXPECT_MENTIONS(mm, "matmul");
  EXPECT_MENTIONS(mm, "f32[2, 3]");
  EXPECT_MENTIONS(mm, "f32[4, 5]");
  const std::string mmd = error_of([] {
    matmul(Tensor::zeros({2, 3}), Tensor::zeros({3, 2}, DType::f64));
  });
  EXPECT_MENTIONS(mmd, "f32[2, 3]");
  EXPECT_MENTIONS(mmd, "f64[3, 2]");
  const std::string mmb = error_of([] {
    matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5}));
  });
  EXPECT_MENTIONS(mmb, "matmul");
  EXPECT_MENTIONS(mmb, "[2]");
  EXPECT_MENTIONS(mmb, "[3]");
  EXPECT_MENTIONS(error_of([] { matmul(Tensor::zeros({3}), Tensor::zeros({3, 2})); }), "f32[3]");

  const std::string ls = error_of([] { linear(Tensor::zeros({2, 3}), Tensor::zeros({5, 4})); });
  EXPECT_MENTIONS(ls, "linear");
  EXPECT_MENTIONS(ls, "f32[2, 3]");
  EXPECT_MENTIONS(ls, "f32[5, 4]");
  const std::string ld = error_of([] {
    linear(Tensor::zeros({2, 4}), Tensor::zeros({5, 4}, DType::f64));
  });
  EXPECT_MENTIONS(ld, "linear");
  EXPECT_MENTIONS(ld, "f32[2, 4]");
  EXPECT_MENTIONS(ld, "f64[5, 4]");
  const std::string lb = error_of([] {
    linear(Tensor::zeros({2, 4}, DType::f64), Tensor::zeros({5, 4}, DType::f64),
           Tensor::zeros({5}));
  });
  EXPECT_MENTIONS(lb, "linear");
  EXPECT_MENTIONS(lb, "f32[5]");
  EXPECT_MENTIONS(lb, "f64[5, 4]");
  const std::string lbs = error_of([] {
    linear(Tensor::zeros({2, 4}), Tensor::zeros({5, 4}), Tensor::zeros({4}));
  });
  EXPECT_MENTIONS(lbs, "f32[4]");
  EXPECT_MENTIONS(lbs, "f32[5, 4]");

  const std::string cc = error_of([] {
    concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1);
  });
  EXPECT_MENTIONS(cc, "concat");
  EXPECT_MENTIONS(cc, "f32[2, 3]");
  EXPECT_MENTIONS(cc, "f32[3, 3]");
  const std::string cd = error_of([] {
    concat({Tensor::zeros({2, 3}), Tensor::zeros({2, 3}, DType::f64)}, 0);
  });
  EXPECT_MENTIONS(cd, "f64[2, 3]");
  const std::string wd = error_of(
      [] { where(Tensor::zeros({2}), Tensor::zeros({2}), Tensor::zeros({2}, DType::bf16)); });
  EXPECT_MENTIONS(wd, "where");
  EXPECT_MENTIONS(wd, "f32[2]");
  EXPECT_MENTIONS(wd, "bf16[2]");
  const std::string sp = error_of([] { split(Tensor::zeros({5, 2}), {2, 2}, 0); });
  EXPECT_MENTIONS(sp, "split");
  EXPECT_MENTIONS(sp, "f32[5, 2]");
  EXPECT_MENTIONS(error_of([] { sum(Tensor::zeros({2, 3}), {2}); }), "sum");
  EXPECT_MENTIONS(error_of([] { sum(Tensor::zeros({2, 3}), {1, -1}); }), "twice");
  EXPECT_MENTIONS(error_of([] { Tensor::zeros({2, 3}).reshape({4, 2}); }), "f32[2, 3]");
  EXPECT_MENTIONS(error_of([] { Tensor::zeros({2, 3}).expand({2, 4}); }), "f32[2, 3]");
  // -1 cannot be inferred when the other sizes multiply to 0.
  EXPECT_MENTIONS(error_of([] { Tensor::zeros({0}).reshape({-1, 0}); }), "[-1, 0]");
  EXPECT_EQ(Tensor::zeros({3, 0}).reshape({0, 4}).shape(), (Shape{0, 4}));
  EXPECT_TRUE(Tensor::zeros({3, 0}).is_contiguous());
  EXPECT_MENTIONS(error_of([] { Tensor::zeros({2, 3}).squeeze(0); }), "f32[2, 3]");
  EXPECT_MENTIONS(error_of([] { Tensor::zeros({2, 3}).narrow(1, 2, 2); }), "f32[2, 3]");
  EXPECT_MENTIONS(error_of([] { exp(Tensor::zeros({2}, DType::i64)); }), "i64[2]");
  // A 0-d tensor has no dimension 0.
  const Tensor scalar = Tensor::full({}, 3.0);
  EXPECT_MENTIONS(error_of([&] { max(scalar, 0); }), "max: dimension 0 out of range");
  EXPECT_MENTIONS(error_of([&] { scalar.transpose(0, -1); }), "transpose");
  EXPECT_MENTIONS(error_of([&] { sum(scalar, {0}); }), "sum");
  EXPECT_MENTIONS(error_of([&] { scalar.narrow(0, 0, 1); }), "narrow");
  EXPECT_EQ(scalar.unsqueeze(0).shape(), (Shape{1}));
  EXPECT_EQ(stack({scalar, scalar}, 0).shape(), (Shape{2}));
}

}  // namespace
}  // namespace roformer
