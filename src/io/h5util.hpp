// Thin RAII and helpers over the HDF5 C API: check macro, attributes, 1-D datasets.
#pragma once
#include <hdf5.h>

#include <string>
#include <vector>

#include "base/common.hpp"

namespace gpt::h5 {
// The most specific message of HDF5's error stack (what the last failed call of this thread ran into,
// e.g. "incorrect metadata checksum after all read attempts"), or "" when it holds none.
std::string last_error();
}  // namespace gpt::h5

// Throws Error naming the call, HDF5's own reason (h5::last_error) and where.
#define H5_CHECK(expr)                                                                     \
  ([&]() {                                                                                 \
    auto r_ = (expr);                                                                      \
    if (r_ < 0) ::gpt::throw_check_failure("HDF5", #expr, ::gpt::h5::last_error(), __FILE__, __LINE__); \
    return r_;                                                                             \
  }())

namespace gpt::h5 {

// Owns one HDF5 identifier and closes it with the right function.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = -1;
};

void silence_errors();  // we report errors ourselves
// Once, before any other HDF5 call (main): HDF5 is not to close files itself at exit. A file whose
// close failed (a full disk) stays half-open inside the library, and its own clean-up at exit then
// crashes; every file this program keeps is closed, or given up, by its owner before that.
void init_library();
// Opens a file read-only, also while its writer appends to it (SWMR). A plain open comes first: it fails at
// once on a file a writer holds (or a killed writer left flagged); only then is the file opened as a SWMR
// reader, with kSwmrReadAttempts tries per metadata read. (HDF5's default there, 100 tries with a sleep
// that doubles each time from 1 ns, never returns on a damaged file.) Every later read of the file is
// bounded the same way. Invalid Id when neither opens, with why (when given) saying what HDF5 ran into.
inline constexpr unsigned kSwmrReadAttempts = 24;  // at most ~2^24 ns (17 ms) of sleeping per read
Id open_read_only(const std::string& path, std::string* why = nullptr);
bool exists(hid_t loc, const std::string& path);
Id create_group(hid_t loc, const std::string& name);
Id open_group(hid_t loc, const std::string& name);

void set_attr(hid_t obj, const std::string& name, const std::string& v);
void set_attr(hid_t obj, const std::string& name, int64_t v);
void set_attr(hid_t obj, const std::string& name, double v);
std::string get_attr_str(hid_t obj, const std::string& name);
int64_t get_attr_i64(hid_t obj, const std::string& name);
double get_attr_f64(hid_t obj, const std::string& name);

// An extendible, chunked 1-D dataset of int64 or float64.
Id create_series(hid_t loc, const std::string& name, hid_t type);
void append(hid_t ds, const void* value, hid_t type);
hsize_t length(hid_t ds);
void truncate(hid_t ds, hsize_t n);
template <class T>
std::vector<T> read_all(hid_t ds, hid_t type) {
  std::vector<T> v(length(ds));
  if (!v.empty()) H5_CHECK(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  return v;
}

// Whole fixed-size 1-D datasets (checkpoints).
void write_array(hid_t loc, const std::string& name, hid_t mem_type, hid_t file_type, const void* data, size_t n);
size_t array_length(hid_t loc, const std::string& name);
void read_array(hid_t loc, const std::string& name, hid_t mem_type, void* data, size_t n);
// Strings as one variable-length dataset (summary tables).
void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v);
std::vector<std::string> read_strings(hid_t loc, const std::string& name);

}  // namespace gpt::h5
