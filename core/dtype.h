// Element types. bf16 is stored as the upper half of an IEEE f32 and converted
// with round-to-nearest-even; arithmetic on it happens in f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace roformer {

enum class DType : uint8_t { f32, bf16, f64, i32, i64 };

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float value) {
    uint32_t u;
    std::memcpy(&u, &value, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
      bits = uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
      bits = uint16_t(u >> 16);
    }
  }
  explicit bf16(double value) : bf16(float(value)) {}
  operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f64;
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::i64;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
}

// The type arithmetic on T happens in: f64 stays f64, everything else is f32.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls fn(T{}) with T the C++ type of a floating dtype. Bf16 is the type
// bf16 maps to (the CUDA kernels pass __nv_bfloat16).
template <class Bf16 = bf16, class Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::bf16:
      return fn(Bf16{});
    default:
      break;
  }
  throw Error(
      detail::concat(op, ": expected a floating dtype (f32, bf16, f64), got ", dtype_name(t)));
}

// Calls fn(T{}) for any dtype (Bf16 as for dispatch_floating).
template <class Bf16 = bf16, class Fn>
decltype(auto) dispatch_all(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::bf16:
      return fn(Bf16{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
  }
  throw Error("unknown dtype");
}

// Calls fn(T{}) with T the C++ type of an integer (index) dtype.
template <class Fn>
decltype(auto) dispatch_index(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
    default:
      break;
  }
  throw Error(detail::concat(op, ": expected an index dtype (i32, i64), got ", dtype_name(t)));
}

}  // namespace roformer
