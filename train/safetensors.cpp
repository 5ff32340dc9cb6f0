#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_write.h"

namespace roformer {

namespace fs = std::filesystem;

namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) mant <<= 1, --exp;
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const std::string where = path.string();
  fd_ = ::open(where.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(where + ": cannot open: " + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw InputError(where + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
      throw InputError(where + (S_ISDIR(st.st_mode) ? ": is a directory, expected a file"
                                                    : ": is not a regular file"));
    size_ = size_t(st.st_size);
    if (size_ < 8)
      throw InputError(detail::concat(where, ": not a safetensors file (", size_,
                                      " bytes, shorter than the 8-byte header length)"));
    map_ = static_cast<const uint8_t*>(::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0));
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw InputError(where + ": cannot map: " + std::strerror(errno));
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];
    if (header_len > size_ - 8)
      throw InputError(detail::concat(where, ": header length ", header_len,
                                      " runs past the end of the file (", size_,
                                      " bytes): truncated or not a safetensors file"));
    data_ = map_ + 8 + header_len;
    const uint64_t data_size = size_ - 8 - header_len;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(map_ + 8, map_ + 8 + header_len);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": header is not valid JSON: " + e.what());
    }
    if (!header.is_object()) throw InputError(where + ": header is not a JSON object");
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      const std::string at = where + ": tensor '" + name + "': ";
      if (name == "__metadata__") {
        if (!v.is_object()) throw InputError(where + ": __metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
        continue;
      }
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
          !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
          !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        throw InputError(at +
                         "needs \"dtype\" (string), \"shape\" (list) and \"data_offsets\" "
                         "([begin, end])");
      SafetensorsEntry e;
      e.name = name;
      e.dtype = v["dtype"].get<std::string>();
      // The element count is checked against the file size below; its
      // product must not wrap around first (a shape like [2^62, 8] would).
      uint64_t numel = 1;
      bool overflow = false;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) throw InputError(at + "shape holds a non-integer");
        const uint64_t dim = d.get<uint64_t>();
        if (dim > uint64_t(std::numeric_limits<int64_t>::max()) ||
            __builtin_mul_overflow(numel, dim, &numel))
          overflow = true;
        e.shape.push_back(overflow ? -1 : int64_t(dim));
      }
      if (overflow)
        throw InputError(detail::concat(at, "shape ", v["shape"].dump(),
                                        " has more elements than 64 bits can count"));
      for (const auto& o : v["data_offsets"])
        if (!o.is_number_unsigned()) throw InputError(at + "data_offsets holds a non-integer");
      e.begin = v["data_offsets"][0].get<uint64_t>();
      e.end = v["data_offsets"][1].get<uint64_t>();
      const size_t eb = dtype_bytes(e.dtype);
      if (eb == 0) throw InputError(at + "unknown dtype \"" + e.dtype + "\"");
      if (e.begin > e.end || e.end > data_size)
        throw InputError(detail::concat(at, "data_offsets [", e.begin, ", ", e.end,
                                        "] lie outside the data section (", data_size,
                                        " bytes): the file is truncated or its header is wrong"));
      uint64_t bytes = 0;
      const bool too_big = __builtin_mul_overflow(numel, uint64_t(eb), &bytes);
      if (too_big || e.end - e.begin != bytes)
        throw InputError(
            detail::concat(at, "holds ", e.end - e.begin, " bytes but dtype ", e.dtype,
                           " and shape ", shape_str(e.shape), " need ",
                           too_big ? std::string("more than 2^64") : std::to_string(bytes)));
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(),
              [](const auto& a, const auto& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].begin < entries_[i - 1].end)
        throw InputError(where + ": tensors '" + entries_[i - 1].name + "' and '" +
                         entries_[i].name + "' overlap in the data section");
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

Tensor SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) throw InputError(path_.string() + ": no tensor '" + name + "'");
  Tensor out = Tensor::empty(e->shape, DType::f32);
  float* dst = static_cast<float*>(out.data());
  const uint8_t* src = data_ + e->begin;
  const int64_t n = out.numel();
  // Unaligned-safe loads (offsets need not be 4-byte aligned); safetensors is
  // little-endian, as is every machine this builds for.
  if (e->dtype == "F32") {
    std::memcpy(dst, src, size_t(n) * 4);
  } else if (e->dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = half_to_float(h);
    }
  } else if (e->dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const uint32_t bits = uint32_t(h) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  } else {
    throw InputError(path_.string() + ": tensor '" + name + "' has dtype " + e->dtype +
                     "; only F32, F16 and BF16 weights can be read");
  }
  return out;
}

void write_safetensors(const fs::path& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  std::vector<Tensor> f32;
  for (const NamedTensor& t : tensors) {
    RF_CHECK(seen.insert(t.name).second, "write_safetensors: duplicate tensor name '", t.name, "'");
    RF_CHECK(is_floating(t.tensor.dtype()), "write_safetensors: '", t.name,
             "' is not a floating tensor");
    f32.push_back(t.tensor.to(Device::cpu()).to(DType::f32).contiguous());
    const uint64_t bytes = uint64_t(t.tensor.numel()) * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.tensor.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  write_file_atomically(path, "safetensors file", [&](std::ostream& out) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t((uint64_t(h.size()) >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (const Tensor& t : f32)
      out.write(static_cast<const char*>(t.data()), std::streamsize(t.nbytes()));
  });
}

}  // namespace roformer
