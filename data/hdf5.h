// Small RAII wrappers over the HDF5 C API, shared by corpus shards and
// checkpoints: files (with atomic create via temp file + flush + fsync +
// rename), groups, 1-D datasets (chunked, deflate-compressed, Fletcher-32
// checksummed) and attributes (strings, scalars, 1-D arrays).
//
// HDF5's own error printing is switched off; failures throw roformer::Error
// (or InputError when a file cannot be opened) with HDF5's innermost message.
// The Debian HDF5 build is not thread-safe: use these from one thread at a time.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace roformer::hdf5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership without closing.
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// The HDF5 native type for T (integers, float, double).
template <class T>
hid_t native_type();
template <>
hid_t native_type<int8_t>();
template <>
hid_t native_type<uint8_t>();
template <>
hid_t native_type<int16_t>();
template <>
hid_t native_type<uint16_t>();
template <>
hid_t native_type<int32_t>();
template <>
hid_t native_type<uint32_t>();
template <>
hid_t native_type<int64_t>();
template <>
hid_t native_type<uint64_t>();
template <>
hid_t native_type<float>();
template <>
hid_t native_type<double>();

// Throws roformer::Error with `what` and HDF5's innermost error message.
[[noreturn]] void fail(const std::string& what);
// The innermost message on HDF5's error stack ("" if none).
std::string last_error_message();

// Anything that carries attributes (a file's root group, a group, a dataset).
class Object {
 public:
  hid_t id() const { return handle_.id(); }
  const std::string& name() const { return name_; }  // for messages

  bool has_attr(const std::string& attr) const;
  void set_attr(const std::string& attr, std::string_view value);
  void set_attr(const std::string& attr, const char* value) {
    set_attr(attr, std::string_view(value));
  }
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  void set_attr(const std::string& attr, T value) {
    write_attr(attr, native_type<T>(), &value, 0);
  }
  template <class T>
  void set_attr_array(const std::string& attr, std::span<const T> values) {
    write_attr(attr, native_type<T>(), values.data(), int64_t(values.size()));
  }

  // Reading converts between numeric types as HDF5 does; a missing attribute
  // or one of the wrong kind throws.
  std::string attr_string(const std::string& attr) const;
  template <class T>
  T attr(const std::string& attr) const {
    T value{};
    read_attr(attr, native_type<T>(), &value, 1);
    return value;
  }
  template <class T>
  std::vector<T> attr_array(const std::string& attr) const {
    std::vector<T> values(static_cast<size_t>(attr_size(attr)));
    read_attr(attr, native_type<T>(), values.data(), int64_t(values.size()));
    return values;
  }
  int64_t attr_size(const std::string& attr) const;

 protected:
  Object() = default;
  Object(Handle h, std::string name) : handle_(std::move(h)), name_(std::move(name)) {}
  void write_attr(const std::string& attr, hid_t type, const void* data, int64_t n);  // n=0: scalar
  void read_attr(const std::string& attr, hid_t type, void* data, int64_t n) const;

  Handle handle_;
  std::string name_;
};

struct DatasetOptions {
  int64_t chunk = 1 << 16;  // elements per chunk (clamped to the size)
  int deflate = 4;          // 0 = no compression
  bool shuffle = true;      // byte shuffle before deflate (helps integers)
  bool fletcher32 = true;   // per-chunk checksum: HDF5 refuses corrupt chunks
};

class Dataset : public Object {
 public:
  Dataset() = default;
  Dataset(Handle h, std::string name) : Object(std::move(h), std::move(name)) {}
  int64_t size() const;          // elements of a 1-D dataset
  size_t element_bytes() const;  // size of the stored element type
  bool is_integer() const;
  bool is_signed() const;
  template <class T>
  std::vector<T> read() const {
    std::vector<T> out(static_cast<size_t>(size()));
    read_range(native_type<T>(), out.data(), 0, int64_t(out.size()));
    return out;
  }
  // Elements [offset, offset + count) converted to T.
  template <class T>
  void read(T* out, int64_t offset, int64_t count) const {
    read_range(native_type<T>(), out, offset, count);
  }

 private:
  void read_range(hid_t mem_type, void* out, int64_t offset, int64_t count) const;
};

class Group : public Object {
 public:
  Group() = default;
  Group(Handle h, std::string name) : Object(std::move(h), std::move(name)) {}
  bool exists(const std::string& child) const;
  Group create_group(const std::string& child);
  Group open_group(const std::string& child) const;
  Dataset open_dataset(const std::string& child) const;
  // A 1-D dataset holding `values`, stored as `file_type` (e.g. uint16 for
  // token ids that fit) or as T when file_type is H5I_INVALID_HID.
  template <class T>
  Dataset write_dataset(const std::string& child, std::span<const T> values,
                        const DatasetOptions& options = {}, hid_t file_type = H5I_INVALID_HID) {
    return write_raw(child, native_type<T>(), file_type < 0 ? native_type<T>() : file_type,
                     values.data(), int64_t(values.size()), options);
  }
  // Names of the direct children (groups and datasets), sorted.
  std::vector<std::string> children() const;

 private:
  Dataset write_raw(const std::string& child, hid_t mem_type, hid_t file_type, const void* data,
                    int64_t n, const DatasetOptions& options);
};

class File {
 public:
  // Opens an existing file; InputError if it is missing or not a readable
  // HDF5 file (a truncated file fails here).
  static File open(const std::string& path, bool writable = false);
  // Creates (truncates) `path`.
  static File create(const std::string& path);

  File() = default;
  File(File&&) = default;
  File& operator=(File&&) = default;

  Group& root() { return root_; }
  const Group& root() const { return root_; }
  const std::string& path() const { return path_; }
  hid_t id() const { return file_.id(); }
  void flush();
  void close();  // releases the root group and the file

 private:
  Handle file_;
  Group root_;
  std::string path_;
};

// Writes `path` atomically: the content goes to a temporary name next to it;
// commit() flushes, closes, fsyncs and renames it over `path`. Destroying an
// uncommitted AtomicFile deletes the temporary file, so a crash or an error
// never leaves a half-written file under the final name.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  File& file() { return file_; }
  Group& root() { return file_.root(); }
  const std::string& temp_path() const { return temp_; }
  void commit();

 private:
  std::string path_, temp_;
  File file_;
  bool committed_ = false;
};

}  // namespace roformer::hdf5
