#include "data/hdf5.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/file_write.h"

namespace roformer::hdf5 {
namespace {

// Turns HDF5's automatic error printing off once: errors become exceptions.
// Also keeps HDF5 from closing leftover files at exit: every file is closed by
// its RAII owner, and a file whose close failed (a full disk) would make
// H5_term_library crash in exit(). Must run before the library initialises.
void quiet() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

herr_t innermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;
  return 0;
}

Handle check(hid_t id, Handle::Closer closer, const std::string& what) {
  if (id < 0) fail(what);
  return Handle(id, closer);
}

}  // namespace

void Handle::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

template <>
hid_t native_type<int8_t>() {
  return H5T_NATIVE_INT8;
}
template <>
hid_t native_type<uint8_t>() {
  return H5T_NATIVE_UINT8;
}
template <>
hid_t native_type<int16_t>() {
  return H5T_NATIVE_INT16;
}
template <>
hid_t native_type<uint16_t>() {
  return H5T_NATIVE_UINT16;
}
template <>
hid_t native_type<int32_t>() {
  return H5T_NATIVE_INT32;
}
template <>
hid_t native_type<uint32_t>() {
  return H5T_NATIVE_UINT32;
}
template <>
hid_t native_type<int64_t>() {
  return H5T_NATIVE_INT64;
}
template <>
hid_t native_type<uint64_t>() {
  return H5T_NATIVE_UINT64;
}
template <>
hid_t native_type<float>() {
  return H5T_NATIVE_FLOAT;
}
template <>
hid_t native_type<double>() {
  return H5T_NATIVE_DOUBLE;
}

std::string last_error_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost, &msg);
  return msg;
}

void fail(const std::string& what) {
  const int err = errno;
  std::string msg = last_error_message();
  H5Eclear2(H5E_DEFAULT);
  // HDF5's messages do not say why a write failed; the OS does.
  if (err == ENOSPC || err == EDQUOT || err == EIO || err == EROFS || err == EFBIG)
    msg += std::string(msg.empty() ? "" : "; ") + std::strerror(err);
  throw Error(msg.empty() ? what : what + " (HDF5: " + msg + ")");
}

// --- Object: attributes --------------------------------------------------------

bool Object::has_attr(const std::string& attr) const {
  const htri_t r = H5Aexists(id(), attr.c_str());
  if (r < 0) fail("cannot query attribute '" + attr + "' of " + name_);
  return r > 0;
}

void Object::write_attr(const std::string& attr, hid_t type, const void* data, int64_t n) {
  if (has_attr(attr) && H5Adelete(id(), attr.c_str()) < 0)
    fail("cannot replace attribute '" + attr + "' of " + name_);
  const hsize_t dims[1] = {hsize_t(n)};
  Handle space = check(n == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, nullptr),
                       H5Sclose, "H5Screate");
  Handle a = check(H5Acreate2(id(), attr.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose, "cannot create attribute '" + attr + "' on " + name_);
  if (H5Awrite(a.id(), type, data) < 0) fail("cannot write attribute '" + attr + "' of " + name_);
}

void Object::set_attr(const std::string& attr, std::string_view value) {
  if (has_attr(attr) && H5Adelete(id(), attr.c_str()) < 0)
    fail("cannot replace attribute '" + attr + "' of " + name_);
  // Fixed-length UTF-8 string (size >= 1: HDF5 rejects empty string types).
  Handle type = check(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  H5Tset_size(type.id(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.id(), H5T_STR_NULLPAD);
  H5Tset_cset(type.id(), H5T_CSET_UTF8);
  Handle space = check(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  Handle a = check(H5Acreate2(id(), attr.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose, "cannot create attribute '" + attr + "' on " + name_);
  std::string padded(value);
  padded.resize(std::max<size_t>(1, value.size()), '\0');
  if (H5Awrite(a.id(), type.id(), padded.data()) < 0)
    fail("cannot write attribute '" + attr + "' of " + name_);
}

std::string Object::attr_string(const std::string& attr) const {
  Handle a = check(H5Aopen(id(), attr.c_str(), H5P_DEFAULT), H5Aclose,
                   "missing attribute '" + attr + "' in " + name_);
  Handle type = check(H5Aget_type(a.id()), H5Tclose, "H5Aget_type");
  if (H5Tget_class(type.id()) != H5T_STRING)
    throw Error("attribute '" + attr + "' of " + name_ + " is not a string");
  if (H5Tis_variable_str(type.id()) > 0) {  // e.g. written by h5py
    Handle mem = check(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
    H5Tset_size(mem.id(), H5T_VARIABLE);
    H5Tset_cset(mem.id(), H5Tget_cset(type.id()));
    char* ptr = nullptr;
    if (H5Aread(a.id(), mem.id(), &ptr) < 0) fail("cannot read attribute '" + attr + "'");
    std::string out = ptr ? ptr : "";
    Handle space = check(H5Aget_space(a.id()), H5Sclose, "H5Aget_space");
    H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, &ptr);
    return out;
  }
  const size_t size = H5Tget_size(type.id());
  std::string out(size, '\0');
  if (H5Aread(a.id(), type.id(), out.data()) < 0) fail("cannot read attribute '" + attr + "'");
  out.resize(std::min(out.size(), out.find('\0')));
  return out;
}

int64_t Object::attr_size(const std::string& attr) const {
  Handle a = check(H5Aopen(id(), attr.c_str(), H5P_DEFAULT), H5Aclose,
                   "missing attribute '" + attr + "' in " + name_);
  Handle space = check(H5Aget_space(a.id()), H5Sclose, "H5Aget_space");
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  if (n < 0) fail("cannot size attribute '" + attr + "'");
  return int64_t(n);
}

void Object::read_attr(const std::string& attr, hid_t type, void* data, int64_t n) const {
  Handle a = check(H5Aopen(id(), attr.c_str(), H5P_DEFAULT), H5Aclose,
                   "missing attribute '" + attr + "' in " + name_);
  Handle space = check(H5Aget_space(a.id()), H5Sclose, "H5Aget_space");
  const hssize_t have = H5Sget_simple_extent_npoints(space.id());
  if (have != n)
    throw Error("attribute '" + attr + "' of " + name_ + " holds " + std::to_string(have) +
                " values, expected " + std::to_string(n));
  if (H5Aread(a.id(), type, data) < 0) fail("cannot read attribute '" + attr + "' of " + name_);
}

// --- Dataset -----------------------------------------------------------------

int64_t Dataset::size() const {
  Handle space = check(H5Dget_space(id()), H5Sclose, "H5Dget_space " + name_);
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank != 1) throw Error("dataset " + name_ + " is not 1-D");
  hsize_t dims[1];
  H5Sget_simple_extent_dims(space.id(), dims, nullptr);
  return int64_t(dims[0]);
}

size_t Dataset::element_bytes() const {
  Handle type = check(H5Dget_type(id()), H5Tclose, "H5Dget_type " + name_);
  return H5Tget_size(type.id());
}

bool Dataset::is_integer() const {
  Handle type = check(H5Dget_type(id()), H5Tclose, "H5Dget_type " + name_);
  return H5Tget_class(type.id()) == H5T_INTEGER;
}

bool Dataset::is_signed() const {
  Handle type = check(H5Dget_type(id()), H5Tclose, "H5Dget_type " + name_);
  return H5Tget_sign(type.id()) == H5T_SGN_2;
}

void Dataset::read_range(hid_t mem_type, void* out, int64_t offset, int64_t count) const {
  const int64_t n = size();
  if (offset < 0 || count < 0 || offset + count > n)
    throw Error("read of [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                ") is outside dataset " + name_ + " of " + std::to_string(n) + " elements");
  if (count == 0) return;
  Handle file_space = check(H5Dget_space(id()), H5Sclose, "H5Dget_space");
  const hsize_t start[1] = {hsize_t(offset)}, dims[1] = {hsize_t(count)};
  if (H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start, nullptr, dims, nullptr) < 0)
    fail("H5Sselect_hyperslab");
  Handle mem_space = check(H5Screate_simple(1, dims, nullptr), H5Sclose, "H5Screate_simple");
  if (H5Dread(id(), mem_type, mem_space.id(), file_space.id(), H5P_DEFAULT, out) < 0)
    fail("cannot read dataset " + name_ + " (corrupt or truncated file?)");
}

// --- Group -------------------------------------------------------------------

bool Group::exists(const std::string& child) const {
  const htri_t r = H5Lexists(id(), child.c_str(), H5P_DEFAULT);
  if (r < 0) fail("cannot look up '" + child + "' in " + name_);
  return r > 0;
}

Group Group::create_group(const std::string& child) {
  return Group(check(H5Gcreate2(id(), child.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     H5Gclose, "cannot create group '" + child + "' in " + name_),
               name_ + "/" + child);
}

Group Group::open_group(const std::string& child) const {
  if (!exists(child)) throw InputError("no group '" + child + "' in " + name_);
  return Group(check(H5Gopen2(id(), child.c_str(), H5P_DEFAULT), H5Gclose,
                     "cannot open group '" + child + "' in " + name_),
               name_ + "/" + child);
}

Dataset Group::open_dataset(const std::string& child) const {
  if (!exists(child)) throw InputError("no dataset '" + child + "' in " + name_);
  return Dataset(check(H5Dopen2(id(), child.c_str(), H5P_DEFAULT), H5Dclose,
                       "cannot open dataset '" + child + "' in " + name_),
                 name_ + "/" + child);
}

Dataset Group::write_raw(const std::string& child, hid_t mem_type, hid_t file_type,
                         const void* data, int64_t n, const DatasetOptions& options) {
  const hsize_t dims[1] = {hsize_t(n)};
  Handle space = check(H5Screate_simple(1, dims, nullptr), H5Sclose, "H5Screate_simple");
  Handle dcpl = check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  if (n > 0 && options.chunk > 0) {
    const hsize_t chunk[1] = {hsize_t(std::min<int64_t>(options.chunk, n))};
    if (H5Pset_chunk(dcpl.id(), 1, chunk) < 0) fail("H5Pset_chunk");
    if (options.fletcher32 && H5Pset_fletcher32(dcpl.id()) < 0) fail("H5Pset_fletcher32");
    if (options.shuffle && H5Pset_shuffle(dcpl.id()) < 0) fail("H5Pset_shuffle");
    if (options.deflate > 0 && H5Pset_deflate(dcpl.id(), unsigned(options.deflate)) < 0)
      fail("H5Pset_deflate (is zlib support built in?)");
  }
  Dataset ds(check(H5Dcreate2(id(), child.c_str(), file_type, space.id(), H5P_DEFAULT, dcpl.id(),
                              H5P_DEFAULT),
                   H5Dclose, "cannot create dataset '" + child + "' in " + name_),
             name_ + "/" + child);
  if (n > 0 && H5Dwrite(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("cannot write dataset " + ds.name());
  return ds;
}

namespace {
herr_t collect(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Group::children() const {
  std::vector<std::string> names;
  if (H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names) < 0)
    fail("cannot list " + name_);
  return names;
}

// --- File --------------------------------------------------------------------

File File::open(const std::string& path, bool writable) {
  quiet();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError("file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec))
    throw InputError("'" + path + "' is a directory, expected an HDF5 file");
  File f;
  const hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    const std::string msg = last_error_message();
    H5Eclear2(H5E_DEFAULT);
    throw InputError("'" + path + "' is not a readable HDF5 file (truncated or corrupt?)" +
                     (msg.empty() ? "" : ": " + msg));
  }
  f.file_ = Handle(id, H5Fclose);
  f.path_ = path;
  f.root_ = Group(check(H5Gopen2(id, "/", H5P_DEFAULT), H5Gclose, "open root of " + path), path);
  return f;
}

File File::create(const std::string& path) {
  quiet();
  File f;
  f.file_ = check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                  "cannot create HDF5 file '" + path + "'");
  f.path_ = path;
  f.root_ = Group(check(H5Gopen2(f.file_.id(), "/", H5P_DEFAULT), H5Gclose, "open root of " + path),
                  path);
  return f;
}

void File::flush() {
  if (file_.valid() && H5Fflush(file_.id(), H5F_SCOPE_GLOBAL) < 0) fail("cannot flush " + path_);
}

void File::close() {
  root_ = Group();
  if (file_.valid()) {
    // Close here rather than in the handle to report a failed close (data may be lost).
    if (H5Fclose(file_.release()) < 0) fail("cannot close " + path_);
  }
}

// --- AtomicFile ---------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_ = path_ + ".tmp." + std::to_string(::getpid());
  file_ = File::create(temp_);
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  // Truncate first: on a full disk this frees the space HDF5 needs to flush
  // its metadata, so the close succeeds and no half-closed file is left.
  std::error_code ec;
  std::filesystem::resize_file(temp_, 0, ec);
  try {
    file_.close();
  } catch (...) {
  }
  std::filesystem::remove(temp_, ec);
}

void AtomicFile::commit() {
  RF_CHECK(!committed_, "AtomicFile ", path_, " committed twice");
  file_.flush();
  file_.close();
  fsync_path(temp_);
  std::error_code ec;
  std::filesystem::rename(temp_, path_, ec);
  if (ec) throw Error("cannot rename '" + temp_ + "' to '" + path_ + "': " + ec.message());
  committed_ = true;
  const auto dir = std::filesystem::path(path_).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), /*is_directory=*/true);
}

}  // namespace roformer::hdf5
