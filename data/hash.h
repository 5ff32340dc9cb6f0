// 64-bit FNV-1a: a small, dependency-free hash for identities and checksums
// (vocab identity, input fingerprints, the shard's token checksum). Not
// cryptographic: it detects truncation and corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace roformer::data {

class Fnv1a64 {
 public:
  Fnv1a64& update(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    uint64_t h = state_;
    for (size_t i = 0; i < size; ++i) {
      h ^= p[i];
      h *= 0x100000001B3ull;
    }
    state_ = h;
    return *this;
  }
  Fnv1a64& update(std::string_view s) { return update(s.data(), s.size()); }
  // Adds a length prefix first, so ("ab","c") and ("a","bc") hash differently.
  Fnv1a64& update_field(std::string_view s) {
    const uint64_t n = s.size();
    update(&n, sizeof n);
    return update(s);
  }
  template <class T>
  Fnv1a64& update_value(const T& value) {
    return update(&value, sizeof value);
  }
  uint64_t digest() const { return state_; }
  std::string hex() const { return to_hex(state_); }

  static std::string to_hex(uint64_t value) {
    static const char* digits = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 15; i >= 0; --i, value >>= 4) out[size_t(i)] = digits[value & 15];
    return out;
  }

 private:
  uint64_t state_ = 0xCBF29CE484222325ull;
};

}  // namespace roformer::data
