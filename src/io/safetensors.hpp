// safetensors files, the weights format Hugging Face loads: an 8-byte little-endian header length, a JSON
// header (each tensor's dtype, shape and byte range in the data; `__metadata__` strings), then the raw
// little-endian data, tensors back to back. Written as F32 or BF16; read from F32, BF16 or F16.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpt {

// JSON text parsed, refusing an object that gives a key twice (nlohmann::json, like most readers, would
// keep one of them silently): input_error "key 'K' is given twice ...".
nlohmann::json parse_json_unique_keys(const std::string& text);

struct TensorOut {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* out)> fill;  // writes the tensor's elements, row-major, fp32
};

// Writes path (through path.tmp and a rename), one tensor at a time; input_error if it cannot.
void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors, bool bf16,
                       const std::map<std::string, std::string>& metadata);

class SafetensorsReader {
 public:
  // Reads and checks the header: JSON with no key given twice, every range inside the file; input_error
  // naming the file otherwise.
  explicit SafetensorsReader(const std::string& path);
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::vector<int64_t>& shape(const std::string& name) const;
  // The tensor as fp32, row-major.
  std::vector<float> read(const std::string& name) const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the data, after the header
  };
  const Entry& entry(const std::string& name) const;
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> tensors_;
};

}  // namespace gpt
