#include "io/h5util.hpp"

namespace gpt::h5 {

void Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = -1;
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void init_library() {
  H5dont_atexit();
  silence_errors();
}

std::string last_error() {
  std::string deepest;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &deepest);
  return deepest;
}

Id open_read_only(const std::string& path, std::string* why) {
  silence_errors();
  Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (f.valid()) return f;
  const std::string plain = last_error();
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (fapl.valid() && H5Pset_metadata_read_attempts(fapl, kSwmrReadAttempts) >= 0)
    f = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl));
  if (!f.valid() && why) {
    const std::string swmr = last_error();
    *why = "HDF5: " + (swmr.empty() || swmr == plain ? plain : plain + "; as a SWMR reader: " + swmr);
  }
  return f;
}

bool exists(hid_t loc, const std::string& path) {
  // check every component so that a missing parent is "no", not an error
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    std::string part = path.substr(0, pos);
    if (!part.empty() && part != "/" && H5Lexists(loc, part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

Id create_group(hid_t loc, const std::string& name) {
  return Id(H5_CHECK(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}
Id open_group(hid_t loc, const std::string& name) { return Id(H5_CHECK(H5Gopen2(loc, name.c_str(), H5P_DEFAULT))); }

// An attribute to read: absent, or unreadable (a damaged file), is input_error naming it.
static void need_attr(hid_t obj, const std::string& name) {
  const htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0) throw input_error("attribute '" + name + "' cannot be read (HDF5: " + last_error() + ")");
  if (e == 0) throw input_error("missing attribute '" + name + "'");
}

static void replace_attr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) > 0) H5_CHECK(H5Adelete(obj, name.c_str()));
}

void set_attr(hid_t obj, const std::string& name, const std::string& v) {
  replace_attr(obj, name);
  Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Id a(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)));
  const char* p = v.c_str();
  H5_CHECK(H5Awrite(a, type, &p));
}
void set_attr(hid_t obj, const std::string& name, int64_t v) {
  replace_attr(obj, name);
  Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Id a(H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(a, H5T_NATIVE_INT64, &v));
}
void set_attr(hid_t obj, const std::string& name, double v) {
  replace_attr(obj, name);
  Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Id a(H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(a, H5T_NATIVE_DOUBLE, &v));
}
std::string get_attr_str(hid_t obj, const std::string& name) {
  need_attr(obj, name);
  Id a(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
  Id ftype(H5_CHECK(H5Aget_type(a)));
  if (H5Tget_class(ftype) != H5T_STRING) throw input_error("attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(ftype) > 0) {
    Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(type, H5Tget_cset(ftype)));
    char* p = nullptr;
    H5_CHECK(H5Aread(a, type, &p));
    std::string s = p ? p : "";
    Id space(H5_CHECK(H5Aget_space(a)));
    H5Dvlen_reclaim(type, space, H5P_DEFAULT, &p);
    return s;
  }
  size_t n = H5Tget_size(ftype);
  std::string s(n, '\0');
  H5_CHECK(H5Aread(a, ftype, s.data()));
  s.resize(s.find('\0') == std::string::npos ? n : s.find('\0'));
  return s;
}
int64_t get_attr_i64(hid_t obj, const std::string& name) {
  need_attr(obj, name);
  Id a(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
  int64_t v = 0;
  H5_CHECK(H5Aread(a, H5T_NATIVE_INT64, &v));
  return v;
}
double get_attr_f64(hid_t obj, const std::string& name) {
  need_attr(obj, name);
  Id a(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
  double v = 0;
  H5_CHECK(H5Aread(a, H5T_NATIVE_DOUBLE, &v));
  return v;
}

Id create_series(hid_t loc, const std::string& name, hid_t type) {
  hsize_t dims = 0, maxdims = H5S_UNLIMITED, chunk = 256;
  Id space(H5_CHECK(H5Screate_simple(1, &dims, &maxdims)));
  Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl, 1, &chunk));
  return Id(H5_CHECK(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
}

hsize_t length(hid_t ds) {
  Id space(H5_CHECK(H5Dget_space(ds)));
  hsize_t n = 0;
  H5_CHECK(H5Sget_simple_extent_dims(space, &n, nullptr));
  return n;
}

void append(hid_t ds, const void* value, hid_t type) {
  hsize_t n = length(ds) + 1;
  H5_CHECK(H5Dset_extent(ds, &n));
  Id fspace(H5_CHECK(H5Dget_space(ds)));
  hsize_t start = n - 1, count = 1;
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  Id mspace(H5_CHECK(H5Screate_simple(1, &count, nullptr)));
  H5_CHECK(H5Dwrite(ds, type, mspace, fspace, H5P_DEFAULT, value));
}

void truncate(hid_t ds, hsize_t n) { H5_CHECK(H5Dset_extent(ds, &n)); }

void write_array(hid_t loc, const std::string& name, hid_t mem_type, hid_t file_type, const void* data, size_t n) {
  hsize_t dims = n;
  Id space(H5_CHECK(H5Screate_simple(1, &dims, nullptr)));
  Id ds(H5_CHECK(H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (n) H5_CHECK(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

size_t array_length(hid_t loc, const std::string& name) {
  if (!exists(loc, name)) throw input_error("missing dataset '" + name + "'");
  Id ds(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  return length(ds);
}

void read_array(hid_t loc, const std::string& name, hid_t mem_type, void* data, size_t n) {
  if (!exists(loc, name)) throw input_error("missing dataset '" + name + "'");
  Id ds(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  if (length(ds) != n)
    throw input_error("dataset '" + name + "' has " + std::to_string(length(ds)) + " elements, expected " +
                      std::to_string(n));
  if (n) H5_CHECK(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v) {
  Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  std::vector<const char*> ptrs;
  for (auto& s : v) ptrs.push_back(s.c_str());
  hsize_t dims = v.size();
  Id space(H5_CHECK(H5Screate_simple(1, &dims, nullptr)));
  Id ds(H5_CHECK(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (!v.empty()) H5_CHECK(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()));
}

}  // namespace gpt::h5

namespace gpt::h5 {

std::vector<std::string> read_strings(hid_t loc, const std::string& name) {
  Id ds(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  Id space(H5_CHECK(H5Dget_space(ds)));
  if (H5Sget_simple_extent_ndims(space) != 1) throw input_error("'" + name + "' is not a list of strings");
  hsize_t n = 0;
  H5_CHECK(H5Sget_simple_extent_dims(space, &n, nullptr));
  std::vector<char*> ptrs(n, nullptr);
  if (n) H5_CHECK(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()));
  std::vector<std::string> out;
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  if (n) H5Dvlen_reclaim(type, space, H5P_DEFAULT, ptrs.data());
  return out;
}

}  // namespace gpt::h5
