#include "io/checkpoint_fp8.hpp"

#include <algorithm>

#include "io/h5util.hpp"
#include "io/raw_io.hpp"

namespace gpt {

namespace {
void write_checked(hid_t g, const char* name, const std::vector<float>& v) {
  h5::write_array(g, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, v.data(), v.size());
  h5::Id ds(H5_CHECK(H5Dopen2(g, name, H5P_DEFAULT)));
  h5::set_attr(ds, "checksum", int64_t(xxh3(v.data(), v.size() * sizeof(float))));
}
std::vector<float> read_checked(hid_t g, const char* name, const std::string& where) {
  std::vector<float> v(h5::array_length(g, name));
  h5::read_array(g, name, H5T_NATIVE_FLOAT, v.data(), v.size());
  h5::Id ds(H5_CHECK(H5Dopen2(g, name, H5P_DEFAULT)));
  if (uint64_t(h5::get_attr_i64(ds, "checksum")) != xxh3(v.data(), v.size() * sizeof(float)))
    throw input_error(where + ": its FP8 state fails its checksum (the file is corrupt)");
  return v;
}

// The order of the flat vector before names: per layer, per product, per role.
Fp8Scaling::State from_flat(const std::vector<float>& flat, int n_layer, const std::string& where) {
  static const char* kProducts[] = {"qkv", "attproj", "fc", "fcproj"};
  static const char* kRoles[] = {"input", "weight", "grad"};
  Fp8Scaling::State s;
  const size_t n = size_t(n_layer) * 12;
  if (flat.size() < 1 + 2 * n || (flat.size() - 1) % n != 0)
    throw input_error(where + ": its FP8 state holds " + std::to_string(flat.size()) + " values, which is not " +
                      "1 + 12 * n_layer * (1 + history) for this model's " + std::to_string(n_layer) + " layers");
  s.steps = int64_t(flat[0]);
  s.history = int((flat.size() - 1) / n - 1);
  for (int l = 0; l < n_layer; ++l)
    for (const char* p : kProducts)
      for (const char* r : kRoles) s.names.push_back(fp8_tensor_name(l, p, r));
  s.scale.assign(flat.begin() + 1, flat.begin() + 1 + n);
  s.amax_history.assign(flat.begin() + 1 + n, flat.end());
  return s;
}
}  // namespace

void write_fp8_state(hid_t file, const Fp8Scaling::State& s) {
  h5::Id g = h5::create_group(file, "fp8");
  h5::set_attr(g, "steps", s.steps);
  h5::set_attr(g, "history", int64_t(s.history));
  h5::write_strings(g, "names", s.names);
  write_checked(g, "scale", s.scale);
  write_checked(g, "amax_history", s.amax_history);
}

Fp8Scaling::State read_fp8_state(hid_t file, int n_layer, const std::string& where) {
  if (h5::exists(file, "fp8_state")) return from_flat(read_checked(file, "fp8_state", where), n_layer, where);
  Fp8Scaling::State s;
  if (!h5::exists(file, "fp8")) return s;
  h5::Id g = h5::open_group(file, "fp8");
  s.steps = h5::get_attr_i64(g, "steps");
  s.history = int(h5::get_attr_i64(g, "history"));
  s.names = h5::read_strings(g, "names");
  s.scale = read_checked(g, "scale", where);
  s.amax_history = read_checked(g, "amax_history", where);
  if (s.scale.size() != s.names.size() || s.amax_history.size() != s.names.size() * size_t(std::max(s.history, 0)))
    throw input_error(where + ": its FP8 state's names, scales and histories do not match in length");
  return s;
}

}  // namespace gpt
