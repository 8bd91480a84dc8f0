#include "io/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "base/common.hpp"
#include "base/input_file.hpp"

namespace gpt {

namespace {

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t s : shape) n *= size_t(s);
  return n;
}

// Little-endian hosts only (x86-64 and aarch64, what this trainer runs on): the data is written as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

}  // namespace

nlohmann::json parse_json_unique_keys(const std::string& text) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // of each object being read, innermost last
  const json::parser_callback_t check = [&keys](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second) {
      throw input_error("key '" + parsed.get<std::string>() + "' is given twice (readers keep one of them: which "
                        "one is meant is unknown)");
    }
    return true;
  };
  return json::parse(text, check);
}

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors, bool bf16,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header;
  header["__metadata__"] = metadata;
  const size_t esize = bf16 ? 2 : 4;
  uint64_t off = 0;
  for (const TensorOut& t : tensors) {
    const uint64_t bytes = numel(t.shape) * esize;
    header[t.name] = {{"dtype", bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw input_error("cannot write '" + tmp + "'");
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  std::vector<float> buf;
  std::vector<uint16_t> half;
  for (const TensorOut& t : tensors) {
    buf.assign(numel(t.shape), 0.0f);
    t.fill(buf.data());
    if (bf16) {
      half.resize(buf.size());
      for (size_t i = 0; i < buf.size(); ++i) half[i] = f32_to_bf16(buf[i]);
      out.write(reinterpret_cast<const char*>(half.data()), std::streamsize(half.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size() * 4));
    }
  }
  out.flush();
  const bool ok = bool(out);
  out.close();
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw input_error("writing '" + path + "' failed (disk full?)");
  }
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  check_input_file(path, "safetensors file");  // a FIFO would block the open, a device never end
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot open '" + path + "'");
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&n), 8) || n > size - 8 || n > (100u << 20))
    throw input_error("'" + path + "' is not a safetensors file (bad header length)");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  data_start_ = 8 + n;
  nlohmann::json h;
  try {
    h = parse_json_unique_keys(text);
    for (auto& [name, v] : h.items()) {
      if (name == "__metadata__") continue;
      Entry e;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      e.begin = v.at("data_offsets").at(0).get<uint64_t>();
      e.end = v.at("data_offsets").at(1).get<uint64_t>();
      if (e.end < e.begin || data_start_ + e.end > size)
        throw input_error("tensor '" + name + "' lies outside the file (truncated?)");
      tensors_[name] = e;
    }
  } catch (const nlohmann::json::exception& ex) {
    throw input_error("'" + path + "' has a malformed safetensors header: " + ex.what());
  } catch (const Error& ex) {
    throw input_error("'" + path + "' safetensors header: " + ex.what());
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw input_error("'" + path_ + "' has no tensor '" + name + "'");
  return it->second;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

std::vector<float> SafetensorsReader::read(const std::string& name) const {
  const Entry& e = entry(name);
  const size_t n = numel(e.shape);
  const size_t esize = e.dtype == "F32" ? 4 : (e.dtype == "BF16" || e.dtype == "F16") ? 2 : 0;
  if (!esize) throw input_error("'" + path_ + "' tensor '" + name + "' is " + e.dtype + ", expected F32, BF16 or F16");
  if (e.end - e.begin != n * esize)
    throw input_error("'" + path_ + "' tensor '" + name + "': its byte range does not match its shape and dtype");
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(data_start_ + e.begin));
  std::vector<float> out(n);
  if (esize == 4) {
    in.read(reinterpret_cast<char*>(out.data()), std::streamsize(n * 4));
  } else {
    std::vector<uint16_t> half(n);
    in.read(reinterpret_cast<char*>(half.data()), std::streamsize(n * 2));
    for (size_t i = 0; i < n; ++i) out[i] = e.dtype == "BF16" ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
  }
  if (!in) throw input_error("'" + path_ + "': reading tensor '" + name + "' failed (truncated?)");
  return out;
}

}  // namespace gpt
