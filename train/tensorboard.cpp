#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace roformer {

namespace fs = std::filesystem;

namespace {

// --- CRC-32C, reflected polynomial 0x82F63B78, one table ---------------------
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// --- the few protocol-buffer encodings an Event needs --------------------------
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
template <class T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1 (double); step = 2 (int64); file_version = 3; summary = 5 }
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, uint64_t(step));
  return e;
}

// --- reading ---------------------------------------------------------------------
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  const fs::path* path;
  size_t record_offset;

  [[noreturn]] void fail(const char* what) const {
    throw InputError(detail::concat(path->string(), ": malformed event in the record at byte ",
                                    record_offset, ": ", what));
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) fail("truncated varint");
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
  }
  template <class T>
  T fixed() {
    if (end - p < ptrdiff_t(sizeof(T))) fail("truncated fixed-size field");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  Cursor sub() {
    const uint64_t n = varint();
    if (uint64_t(end - p) < n) fail("length-delimited field runs past the record");
    Cursor c{p, p + n, path, record_offset};
    p += n;
    return c;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        break;
      case 1:
        fixed<uint64_t>();
        break;
      case 2:
        sub();
        break;
      case 5:
        fixed<uint32_t>();
        break;
      default:
        fail("unknown wire type");
    }
  }
};

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& table = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError(detail::concat("cannot create the TensorBoard directory ", dir.string(), ": ",
                                    ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double start = now_seconds();
  path_ = dir / detail::concat("events.out.tfevents.", int64_t(start), ".", host, ".", getpid());
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_)
    throw InputError(
        detail::concat("cannot open ", path_.string(), " for writing: ", std::strerror(errno)));
  std::string e = event(start, 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value,
                                   double wall_time) {
  // Summary { repeated Value value = 1 }, Value { tag = 1; simple_value = 2 (float) }
  std::string v;
  put_bytes(v, 1, tag);
  put_tag(v, 2, 5);
  put_fixed(v, float(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event(wall_time < 0 ? now_seconds() : wall_time, step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  // uint64 length, uint32 masked CRC of the length, payload, uint32 masked CRC.
  std::string r;
  const uint64_t n = payload.size();
  put_fixed(r, n);
  put_fixed(r, masked_crc32c(r.data(), 8));
  r += payload;
  put_fixed(r, masked_crc32c(payload.data(), payload.size()));
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size())
    throw Error(detail::concat("writing ", path_.string(), " failed: ", std::strerror(errno)));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)
    throw Error(detail::concat("writing ", path_.string(), " failed: ", std::strerror(errno)));
}

TensorBoardEvents read_tensorboard_events(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(detail::concat("cannot open ", path.string()));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TensorBoardEvents out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    auto bad = [&](const char* what) {
      return InputError(detail::concat(path.string(), ": bad record at byte ", pos, ": ", what));
    };
    if (bytes.size() - pos < 12) throw bad("truncated header");
    uint64_t n;
    uint32_t len_crc;
    std::memcpy(&n, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    if (masked_crc32c(bytes.data() + pos, 8) != len_crc) throw bad("length CRC does not match");
    if (bytes.size() - pos - 12 < n || bytes.size() - pos - 12 - n < 4)
      throw bad("record runs past the end of the file");
    const char* payload = bytes.data() + pos + 12;
    uint32_t data_crc;
    std::memcpy(&data_crc, payload + n, 4);
    if (masked_crc32c(payload, n) != data_crc) throw bad("data CRC does not match");

    Cursor c{reinterpret_cast<const uint8_t*>(payload),
             reinterpret_cast<const uint8_t*>(payload) + n, &path, pos};
    double wall_time = 0;
    int64_t step = 0;
    std::vector<TensorBoardScalar> values;
    while (c.p < c.end) {
      const uint64_t key = c.varint();
      const int field = int(key >> 3), wire = int(key & 7);
      if (field == 1 && wire == 1) {
        wall_time = c.fixed<double>();
      } else if (field == 2 && wire == 0) {
        step = int64_t(c.varint());
      } else if (field == 3 && wire == 2) {
        Cursor s = c.sub();
        out.file_version.assign(reinterpret_cast<const char*>(s.p), size_t(s.end - s.p));
      } else if (field == 5 && wire == 2) {
        Cursor summary = c.sub();
        while (summary.p < summary.end) {
          const uint64_t k = summary.varint();
          if ((k >> 3) != 1 || (k & 7) != 2) {
            summary.skip(int(k & 7));
            continue;
          }
          Cursor value = summary.sub();
          TensorBoardScalar s;
          while (value.p < value.end) {
            const uint64_t vk = value.varint();
            if (vk == (1 << 3 | 2)) {
              Cursor t = value.sub();
              s.tag.assign(reinterpret_cast<const char*>(t.p), size_t(t.end - t.p));
            } else if (vk == (2 << 3 | 5)) {
              s.value = value.fixed<float>();
            } else {
              value.skip(int(vk & 7));
            }
          }
          values.push_back(s);
        }
      } else {
        c.skip(wire);
      }
    }
    for (TensorBoardScalar& s : values) {
      s.step = step;
      s.wall_time = wall_time;
      out.scalars.push_back(std::move(s));
    }
    pos += 12 + n + 4;
  }
  return out;
}

}  // namespace roformer
