// File formats and number text: shortest round-trip numbers, safetensors, Hugging Face GPT-2 folders.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/common.hpp"
#include "base/format.hpp"
#include "test_util.hpp"
#include "io/checkpoint.hpp"
#include "io/hf.hpp"
#include "io/safetensors.hpp"
#include "model/params.hpp"

using namespace gpt;
namespace fs = std::filesystem;

namespace {
std::string temp_dir(const char* name) {
  const fs::path d = fs::temp_directory_path() / (std::string("gpt2_formats_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

ModelDims tiny_dims() {
  ModelDims d;
  d.n_layer = 2;
  d.n_head = 2;
  d.n_embd = 8;
  d.vocab_size = 50;
  d.padded_vocab = 128;
  d.max_seq_len = 16;
  return d;
}

// Random real parameters; vocabulary padding rows and alignment gaps zero, as a trained model has them.
std::vector<float> random_params(const ParamLayout& L) {
  std::vector<float> v(L.total(), 0.0f);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (int b = 0; b < L.n_buckets(); ++b)
    for (const TensorInfo& t : L.bucket(b).tensors) {
      const size_t n = t.real_numel;
      for (size_t i = 0; i < n; ++i) v[L.logical_offset(b) + t.offset + i] = nd(rng);
    }
  return v;
}
}  // namespace

TEST(Formats, numbers_print_shortest_round_trip) {
  EXPECT_TRUE(shortest(3e-4f) == std::string("0.0003")) << shortest(3e-4f);
  EXPECT_TRUE(shortest(0.9f) == std::string("0.9")) << shortest(0.9f);
  EXPECT_TRUE(shortest(0.1 + 0.2) == std::string("0.30000000000000004")) << shortest(0.1 + 0.2);
  EXPECT_TRUE(yaml_float(3e-4f) == std::string("0.0003")) << yaml_float(3e-4f);
  EXPECT_TRUE(yaml_float(1e-8f) == std::string("1.0e-08")) << yaml_float(1e-8f);  // a '.' so that YAML 1.1 readers see a float
  EXPECT_TRUE(yaml_float(1.0f) == std::string("1.0")) << yaml_float(1.0f);
  EXPECT_TRUE(shortest(1e-5) == std::string("1e-05")) << shortest(1e-5);
  EXPECT_TRUE(shortest(1234.5) == std::string("1234.5")) << shortest(1234.5);
  EXPECT_TRUE(shortest(52147.0) == std::string("52147")) << shortest(52147.0);
  EXPECT_TRUE(yaml_float(0.95f) == std::string("0.95")) << yaml_float(0.95f);
  for (float f : {6e-4f, 0.02f, 1e-5f, 123456.7f, 3.0e-3f}) EXPECT_TRUE(std::stof(yaml_float(f)) == f);
}

TEST(Formats, safetensors_layout_and_round_trip) {
  const std::string dir = temp_dir("st");
  const std::string path = dir + "/t.safetensors";
  std::vector<TensorOut> ts = {{"a", {2, 3}, [](float* o) { for (int i = 0; i < 6; ++i) o[i] = float(i) + 0.5f; }},
                               {"b", {3}, [](float* o) { o[0] = -1; o[1] = 1e-3f; o[2] = 7; }}};
  write_safetensors(path, ts, false, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_TRUE(n % 8 == 0);  // data 8-byte aligned
  EXPECT_TRUE(fs::file_size(path) == 8 + n + 9 * 4);
  const SafetensorsReader r(path);
  EXPECT_TRUE(r.names() == std::vector<std::string>({"a", "b"}));
  EXPECT_TRUE(r.shape("a") == std::vector<int64_t>({2, 3}));
  EXPECT_TRUE(r.read("a")[5] == 5.5f && r.read("b")[1] == 1e-3f);
  write_safetensors(path, ts, true, {});
  EXPECT_TRUE(SafetensorsReader(path).read("b")[1] == bf16_to_f32(f32_to_bf16(1e-3f)));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage";
  EXPECT_THROW_WITH(SafetensorsReader bad(path), "not a safetensors file");
  fs::remove_all(dir);
}

TEST(Formats, hf_folder_round_trips_bit_exactly_with_conv1d_transposes) {
  const ParamLayout L(tiny_dims());
  const std::vector<float> params = random_params(L);
  const std::string dir = temp_dir("hf");
  write_hf_model(dir, L, params, false);
  EXPECT_TRUE(is_hf_model_dir(dir));
  const SafetensorsReader st(dir + "/model.safetensors");
  EXPECT_TRUE(st.shape("transformer.wte.weight") == std::vector<int64_t>({50, 8}));  // unpadded vocabulary
  EXPECT_TRUE(st.shape("transformer.h.1.attn.c_attn.weight") == std::vector<int64_t>({8, 24}));  // (in, out)
  EXPECT_TRUE(st.shape("transformer.h.0.mlp.c_proj.weight") == std::vector<int64_t>({32, 8}));
  EXPECT_TRUE(!st.has("lm_head.weight"));  // tied to wte
  // c_attn.weight[i][o] is the trainer's qkvw[o][i]
  const TensorInfo& q = L.bucket(L.layer_bucket(1)).tensor("qkvw");
  const float* qkvw = params.data() + L.logical_offset(L.layer_bucket(1)) + q.offset;
  const std::vector<float> c_attn = st.read("transformer.h.1.attn.c_attn.weight");
  EXPECT_TRUE(c_attn[3 * 24 + 17] == qkvw[17 * 8 + 3]);
  const std::vector<float> back = read_hf_model(dir, L);
  EXPECT_TRUE(back.size() == params.size() && std::memcmp(back.data(), params.data(), 4 * params.size()) == 0);
  fs::remove_all(dir);
}

TEST(Formats, hf_folder_of_another_model_is_a_named_error) {
  const ParamLayout L(tiny_dims());
  const std::string dir = temp_dir("hf_other");
  write_hf_model(dir, L, random_params(L), false);
  ModelDims d = tiny_dims();
  d.n_layer = 3;
  EXPECT_THROW_WITH(read_hf_model(dir, ParamLayout(d)), "n_layer is 2 but the config says 3");
  fs::remove_all(dir);
}


// A live run's keep_last may remove the checkpoint being read: the reader goes on with the newest one left
// when it was given the run; damage in a folder still there, or a step folder given by name, is an error.
TEST(Formats, a_checkpoint_removed_while_read_gives_way_to_the_newest_left) {
  const std::string run = temp_dir("race");
  const auto step_folder = [&](const char* name) {
    const std::string dir = run + "/checkpoints/" + name;
    fs::create_directories(dir);
    std::ofstream(dir + "/rank_00000.h5") << "x";
    return dir;
  };
  step_folder("step_00000001");
  step_folder("step_00000002");
  std::vector<std::string> seen;
  read_resolved_checkpoint(run, [&](const std::string& dir) {
    seen.push_back(fs::path(dir).filename().string());
    if (seen.size() == 1) {  // removed under the reader, which then fails on a file that is gone
      fs::remove_all(dir);
      throw input_error("checkpoint '" + dir + "' is incomplete: its MANIFEST is missing");
    }
  });
  EXPECT_TRUE(seen == std::vector<std::string>({"step_00000002", "step_00000001"}));
  int calls = 0;
  EXPECT_THROW_WITH(read_resolved_checkpoint(run, [&](const std::string&) {
                      ++calls;
                      throw input_error("damaged");
                    }),
                    "damaged");
  EXPECT_EQ(calls, 1);
  const std::string named = step_folder("step_00000003");
  calls = 0;
  EXPECT_THROW_WITH(read_resolved_checkpoint(named, [&](const std::string& dir) {
                      ++calls;
                      fs::remove_all(dir);
                      throw input_error("gone");
                    }),
                    "gone");
  EXPECT_EQ(calls, 1);
  fs::remove_all(run);
}
