#include "train/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/safetensors.hpp"
#include "core/sha256.hpp"
#include "model/parameters.hpp"

using namespace laoyao;
using namespace laoyao::train;
namespace fs = std::filesystem;

namespace {

// A tiny GPT's parameters with values that exercise every float bit pattern class.
struct Model {
  std::vector<ParamShape> shapes = {{"embedding.word_embeddings.weight", {8, 4}},
                                    {"decoder.layers.0.self_attention.linear_qkv.weight", {12, 4}},
                                    {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", {4}},
                                    {"decoder.final_layernorm.weight", {4}}};
  std::vector<std::vector<float>> values, m, v;

  explicit Model(uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    auto next = [&] {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      return x;
    };
    for (const auto& p : shapes) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      std::vector<float> a(n), b(n), c(n);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = std::bit_cast<float>(next() & 0xbfffffffu);  // any finite-ish bits, incl. denormals
        b[i] = std::bit_cast<float>(next() & 0xbfffffffu);
        c[i] = std::abs(std::bit_cast<float>(next() & 0xbfffffffu));
      }
      values.push_back(a), m.push_back(b), v.push_back(c);
    }
    values[0][0] = -0.0f;
    values[0][1] = std::numeric_limits<float>::denorm_min();
    values[0][2] = std::bit_cast<float>(0x7fc01234u);  // NaN with a payload
    values[0][3] = std::numeric_limits<float>::infinity();
  }

  CheckpointWrite write(int64_t iteration, bool with_optimizer = true) const {
    CheckpointWrite w;
    for (size_t i = 0; i < shapes.size(); ++i) {
      w.model.push_back({shapes[i].name, shapes[i].shape, values[i].data()});
      if (with_optimizer) {
        w.optimizer.push_back({exp_avg_name(shapes[i].name), shapes[i].shape, m[i].data()});
        w.optimizer.push_back({exp_avg_sq_name(shapes[i].name), shapes[i].shape, v[i].data()});
      }
    }
    TrainStateRecord& s = w.state;
    s.iteration = iteration;
    s.consumed_train_samples = iteration * 32;
    s.consumed_valid_samples = 64;
    s.skipped_train_samples = 3;
    s.skipped_iterations = 1;
    s.nan_iterations = 2;
    s.scheduler_num_steps = iteration * 32;
    s.optimizer_steps = iteration - 1;
    s.floating_point_operations_so_far = 1.2345678901234567e18 * static_cast<double>(iteration);
    s.rng = {{"seed", int64_t{1234}}, {"generator", std::string("0x9e3779b97f4a7c15")}};
    s.model_shape = shape_fields();
    w.run_config_yaml = "model:\n  num_layers: 1\n  hidden_size: 4\n";
    return w;
  }

  static StateMap shape_fields() {
    return {{"num_layers", int64_t{1}},
            {"hidden_size", int64_t{4}},
            {"normalization", std::string("RMSNorm")},
            {"add_bias_linear", false},
            {"rotary_base", 10000.0}};
  }
};

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("laoyao_checkpoint_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    save_ = (dir_ / "ckpt").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> entries(const std::string& d) const {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static void flip_byte(const std::string& path, std::streamoff at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x01));
  }
  template <class F>
  static std::string usage_error(F&& f) {
    try {
      f();
    } catch (const UsageError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no UsageError";
    return "";
  }
  static void expect_has(const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in:\n" << msg;
  }

  fs::path dir_;
  std::string save_;
};

std::vector<float> read(const LoadedCheckpoint& c, const std::string& name, size_t n, bool optimizer = false) {
  std::vector<float> out(n);
  if (optimizer)
    c.read_optimizer(name, out.data(), n);
  else
    c.read_model(name, out.data(), n);
  return out;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_F(Checkpoint, SaveLoadRoundTripIsBitExact) {
  Model mdl(1);
  const std::string it_dir = save_checkpoint(save_, 10, mdl.write(10));
  EXPECT_EQ(it_dir, save_ + "/iter_0000010");
  EXPECT_EQ(entries(save_), (std::vector<std::string>{"iter_0000010", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(entries(it_dir), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "run_config.yaml",
                                                       "train_state.json"}));
  EXPECT_EQ(read_file(tracker_path(save_)), "10");  // Megatron's tracker: the bare number
  EXPECT_EQ(latest_iteration(save_), 10);
  EXPECT_TRUE(checkpoint_exists(save_));
  EXPECT_TRUE(checkpoint_exists(it_dir));
  EXPECT_FALSE(checkpoint_exists(dir_.string()));
  // The recorded checksum is the file's plain SHA-256 (what sha256sum prints).
  const std::string state = read_file(it_dir + "/train_state.json");
  expect_has(state, sha256_hex(read_file(it_dir + "/model.safetensors")));
  expect_has(state, sha256_hex(read_file(it_dir + "/optimizer.safetensors")));
  expect_has(state, sha256_hex(read_file(it_dir + "/run_config.yaml")));
  // The model file is a plain safetensors file with Megatron-Core names in F32.
  SafetensorsFile raw(it_dir + "/model.safetensors");
  ASSERT_NE(raw.find("decoder.layers.0.self_attention.linear_qkv.weight"), nullptr);
  EXPECT_EQ(raw.find("decoder.layers.0.self_attention.linear_qkv.weight")->dtype, Dtype::F32);

  const LoadedCheckpoint c = load_checkpoint(save_);
  EXPECT_EQ(c.dir, it_dir);
  const CheckpointWrite w = mdl.write(10);
  const TrainStateRecord& s = c.state;
  EXPECT_EQ(s.iteration, 10);
  EXPECT_EQ(s.consumed_train_samples, 320);
  EXPECT_EQ(s.consumed_valid_samples, 64);
  EXPECT_EQ(s.skipped_train_samples, 3);
  EXPECT_EQ(s.skipped_iterations, 1);
  EXPECT_EQ(s.nan_iterations, 2);
  EXPECT_EQ(s.scheduler_num_steps, 320);
  EXPECT_EQ(s.optimizer_steps, 9);
  EXPECT_EQ(std::bit_cast<uint64_t>(s.floating_point_operations_so_far),
            std::bit_cast<uint64_t>(w.state.floating_point_operations_so_far));
  EXPECT_EQ(s.rng, w.state.rng);
  EXPECT_EQ(s.model_shape, w.state.model_shape);
  EXPECT_EQ(c.run_config_yaml, w.run_config_yaml);
  for (size_t i = 0; i < mdl.shapes.size(); ++i) {
    const std::string& n = mdl.shapes[i].name;
    EXPECT_TRUE(bits_equal(read(c, n, mdl.values[i].size()), mdl.values[i])) << n;
    EXPECT_TRUE(bits_equal(read(c, exp_avg_name(n), mdl.m[i].size(), true), mdl.m[i])) << n;
    EXPECT_TRUE(bits_equal(read(c, exp_avg_sq_name(n), mdl.v[i].size(), true), mdl.v[i])) << n;
  }
  EXPECT_NO_THROW(check_parameters(c, mdl.shapes));
  EXPECT_NO_THROW(check_model_shape(c, Model::shape_fields()));
  // The iteration directory itself loads too (Bridge accepts an iter_N path as checkpoint.load).
  EXPECT_EQ(load_checkpoint(it_dir).state.iteration, 10);
  EXPECT_THROW(load_checkpoint(it_dir, 20), UsageError);
  // Reading a tensor that is not there, or into the wrong size, names the file.
  float one;
  expect_has(usage_error([&] { c.read_model("nope", &one, 1); }), it_dir + "/model.safetensors");
  expect_has(usage_error([&] { c.read_model(mdl.shapes[2].name, &one, 1); }), "expected 1");
}

TEST_F(Checkpoint, LoadFollowsTheTrackerNeverTheLargestDirectory) {
  Model a(1), b(2);
  save_checkpoint(save_, 10, a.write(10));
  save_checkpoint(save_, 20, b.write(20));
  EXPECT_EQ(read_file(tracker_path(save_)), "20");
  // A complete-looking directory the tracker does not name (e.g. from another run) is not read.
  fs::copy(save_ + "/iter_0000020", save_ + "/iter_0000030", fs::copy_options::recursive);
  EXPECT_EQ(load_checkpoint(save_).state.iteration, 20);
  // An explicit step reads that directory (ckpt_step).
  const LoadedCheckpoint c10 = load_checkpoint(save_, 10);
  EXPECT_EQ(c10.state.iteration, 10);
  EXPECT_TRUE(bits_equal(read(c10, a.shapes[1].name, a.values[1].size()), a.values[1]));
  // ... and a step with no directory is an error naming it.
  expect_has(usage_error([&] { load_checkpoint(save_, 15); }), save_ + "/iter_0000015' does not exist");
  // iter_0000030 holds iteration 20: its name and contents disagree.
  expect_has(usage_error([&] { load_checkpoint(save_, 30); }), "does not match its name");
}

TEST_F(Checkpoint, InterruptedSaveIsIgnoredByLoadAndCleanedByTheNextSave) {
  Model a(1), b(2);
  save_checkpoint(save_, 10, a.write(10));
  // A crash mid-save leaves a temporary directory with partial contents and the old tracker.
  const std::string tmp = save_ + "/iter_0000020.tmp.999999";
  fs::create_directories(tmp);
  std::ofstream(tmp + "/model.safetensors") << "partial";
  EXPECT_EQ(latest_iteration(save_), 10);
  EXPECT_EQ(load_checkpoint(save_).state.iteration, 10);
  EXPECT_EQ(remove_incomplete_checkpoints(save_), std::vector<std::string>{"iter_0000020.tmp.999999"});
  fs::create_directories(tmp);
  save_checkpoint(save_, 20, b.write(20));
  EXPECT_EQ(entries(save_),
            (std::vector<std::string>{"iter_0000010", "iter_0000020", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(load_checkpoint(save_).state.iteration, 20);
}

TEST_F(Checkpoint, FailedSaveLeavesThePreviousCheckpointAndTrackerAlone) {
  Model a(1);
  save_checkpoint(save_, 10, a.write(10));
  CheckpointWrite bad = a.write(20);
  bad.optimizer[3].data = nullptr;  // the writer refuses it midway through the save
  EXPECT_THROW(save_checkpoint(save_, 20, bad), Error);
  EXPECT_EQ(entries(save_), (std::vector<std::string>{"iter_0000010", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(read_file(tracker_path(save_)), "10");
  EXPECT_EQ(load_checkpoint(save_).state.iteration, 10);
  // A tracker names a directory only after it is complete: the directory exists before the tracker
  // moves, so a crash between the two leaves the tracker on the previous, complete checkpoint.
  CheckpointWrite wrong = a.write(20);
  wrong.state.iteration = 21;
  EXPECT_THROW(save_checkpoint(save_, 20, wrong), Error);
}

TEST_F(Checkpoint, SavingTheSameIterationAgainReplacesItWhole) {
  Model a(1), b(2);
  save_checkpoint(save_, 10, a.write(10));
  CheckpointWrite w = b.write(10, /*with_optimizer=*/false);
  w.run_config_yaml = "second: true\n";
  save_checkpoint(save_, 10, w);
  EXPECT_EQ(entries(save_), (std::vector<std::string>{"iter_0000010", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(entries(save_ + "/iter_0000010"),
            (std::vector<std::string>{"model.safetensors", "run_config.yaml", "train_state.json"}));
  const LoadedCheckpoint c = load_checkpoint(save_);
  EXPECT_EQ(c.run_config_yaml, "second: true\n");
  EXPECT_TRUE(bits_equal(read(c, b.shapes[0].name, b.values[0].size()), b.values[0]));
  EXPECT_FALSE(c.optimizer.has_value());
  float x;
  expect_has(usage_error([&] { c.read_optimizer(exp_avg_name(b.shapes[0].name), &x, 1); }),
             "saved without optimizer state");
  EXPECT_NO_THROW(check_parameters(c, b.shapes));
}

TEST_F(Checkpoint, AFlippedByteInAnyFileIsACorruptionErrorNamingIt) {
  Model a(1);
  const std::string it_dir = save_checkpoint(save_, 10, a.write(10));
  const std::string model = it_dir + "/model.safetensors";
  const auto size = static_cast<std::streamoff>(fs::file_size(model));
  flip_byte(model, size - 3);  // in a tensor: the file still parses
  std::string msg = usage_error([&] { load_checkpoint(save_); });
  expect_has(msg, "'" + model + "' is corrupt");
  expect_has(msg, "SHA-256");
  flip_byte(model, size - 3);
  EXPECT_NO_THROW(load_checkpoint(save_));

  flip_byte(model, 20);  // in the header JSON
  expect_has(usage_error([&] { load_checkpoint(save_); }), model);
  flip_byte(model, 20);

  const std::string opt = it_dir + "/optimizer.safetensors";
  flip_byte(opt, static_cast<std::streamoff>(fs::file_size(opt)) - 1);
  expect_has(usage_error([&] { load_checkpoint(save_); }), "'" + opt + "' is corrupt");
  flip_byte(opt, static_cast<std::streamoff>(fs::file_size(opt)) - 1);

  const std::string yaml = it_dir + "/run_config.yaml";
  flip_byte(yaml, 0);
  expect_has(usage_error([&] { load_checkpoint(save_); }), "'" + yaml + "' is corrupt");
  flip_byte(yaml, 0);

  const auto opt_size = fs::file_size(opt);
  fs::resize_file(opt, opt_size - 4);  // truncated
  expect_has(usage_error([&] { load_checkpoint(save_); }),
             "'" + opt + "' is corrupt: it is " + std::to_string(opt_size - 4) + " bytes, " +
                 std::to_string(opt_size) + " were written");
  fs::remove(opt);
  expect_has(usage_error([&] { load_checkpoint(save_); }), "'" + opt + "' is missing");

  std::ofstream(it_dir + "/train_state.json") << "{\"format\": \"laoyao-checkpoint\", \"version\": 1,";
  expect_has(usage_error([&] { load_checkpoint(save_); }), it_dir + "/train_state.json': not valid JSON");
}

TEST_F(Checkpoint, ParameterMismatchNamesEachParameterWithBothShapes) {
  Model a(1);
  save_checkpoint(save_, 10, a.write(10));
  const LoadedCheckpoint c = load_checkpoint(save_);
  std::vector<ParamShape> now = a.shapes;
  now[0].shape = {16, 4};                                              // vocabulary grew
  now.push_back({"decoder.layers.1.mlp.linear_fc1.weight", {8, 4}});  // a layer more
  now.erase(now.begin() + 3);                                          // final norm gone
  const std::string msg = usage_error([&] { check_parameters(c, now); });
  expect_has(msg, c.dir);
  expect_has(msg, "embedding.word_embeddings.weight: checkpoint [8, 4], model [16, 4]");
  expect_has(msg, "missing: decoder.layers.1.mlp.linear_fc1.weight [8, 4]");
  expect_has(msg, "unexpected: decoder.final_layernorm.weight [4]");
  // The optimizer state is held to the same list.
  expect_has(msg, "missing: optimizer.state.exp_avg.decoder.layers.1.mlp.linear_fc1.weight [8, 4]");
  expect_has(msg, "unexpected: optimizer.state.exp_avg_sq.decoder.final_layernorm.weight [4]");
  expect_has(msg, "optimizer.state.exp_avg_sq.embedding.word_embeddings.weight: checkpoint [8, 4], model [16, 4]");
  expect_has(msg, "checkpoint.load=null");
}

TEST_F(Checkpoint, ModelShapeFieldsThatDifferAreNamedWithBothValues) {
  Model a(1);
  save_checkpoint(save_, 10, a.write(10));
  const LoadedCheckpoint c = load_checkpoint(save_);
  StateMap now = Model::shape_fields();
  now["num_layers"] = int64_t{4};
  now["normalization"] = std::string("LayerNorm");
  now.erase("add_bias_linear");
  now["num_moe_experts"] = int64_t{8};
  const std::string msg = usage_error([&] { check_model_shape(c, now); });
  expect_has(msg, "was saved from a different model");
  expect_has(msg, "num_layers: checkpoint 1, current 4");
  expect_has(msg, "normalization: checkpoint \"RMSNorm\", current \"LayerNorm\"");
  expect_has(msg, "add_bias_linear: checkpoint false, current (not set)");
  expect_has(msg, "num_moe_experts: checkpoint (not recorded), current 8");
  EXPECT_EQ(msg.find("hidden_size"), std::string::npos) << "equal fields are not listed";
  // The same number as an integer or a double is the same value.
  StateMap same = Model::shape_fields();
  same["rotary_base"] = int64_t{10000};
  EXPECT_NO_THROW(check_model_shape(c, same));
}

TEST_F(Checkpoint, MissingOrBrokenTrackersAreClearErrors) {
  EXPECT_FALSE(checkpoint_exists(save_));
  EXPECT_EQ(latest_iteration(save_), std::nullopt);  // no directory at all
  expect_has(usage_error([&] { load_checkpoint(save_); }), "does not exist");
  fs::create_directories(save_);
  EXPECT_EQ(latest_iteration(save_), std::nullopt);
  expect_has(usage_error([&] { load_checkpoint(save_); }), "has no latest_checkpointed_iteration.txt");
  write_file_atomic(tracker_path(save_), "release");
  expect_has(usage_error([&] { latest_iteration(save_); }), "release checkpoints are not supported");
  write_file_atomic(tracker_path(save_), "12abc");
  expect_has(usage_error([&] { latest_iteration(save_); }), tracker_path(save_));
  // Too many digits for int64: refused before the number is computed.
  write_file_atomic(tracker_path(save_), "26464128111000561690");
  expect_has(usage_error([&] { latest_iteration(save_); }), "holds '26464128111000561690', expected an iteration");
  write_file_atomic(tracker_path(save_), "999999999999999999");
  EXPECT_EQ(latest_iteration(save_), 999999999999999999);
  write_file_atomic(tracker_path(save_), "7\n");  // a newline is tolerated
  EXPECT_EQ(latest_iteration(save_), 7);
  const std::string msg = usage_error([&] { load_checkpoint(save_); });
  expect_has(msg, "names iteration 7");
  expect_has(msg, save_ + "/iter_0000007' does not exist");
  // A Megatron torch_dist directory is named as such.
  fs::create_directories(save_ + "/iter_0000007");
  std::ofstream(save_ + "/iter_0000007/.metadata") << "x";
  expect_has(usage_error([&] { load_checkpoint(save_); }), "is a Megatron (torch_dist / torch) checkpoint");
}

TEST_F(Checkpoint, ParamShapesComeFromTheParameterTable) {
  model::ParameterTable t;
  t.add("embedding.word_embeddings.weight", {8, 4}, model::Init::Normal, 0.02);
  t.add("decoder.final_layernorm.weight", {4}, model::Init::Ones);
  const auto s = param_shapes(t);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "embedding.word_embeddings.weight");
  EXPECT_EQ(s[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(s[1].name, "decoder.final_layernorm.weight");
}

// ---- pretrained weights ----

namespace {

// Values exactly representable in bf16 (so a bf16 shard holds them exactly).
std::vector<float> bf16_values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 17) - 8) / 4.0f;
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

}  // namespace

TEST_F(Checkpoint, PretrainedFromTwoShardsInBf16AndF32) {
  Model a(3);
  const std::string hf = (dir_ / "mcore").string();
  fs::create_directories(hf);
  const auto emb = bf16_values(32, 1.0f), qkv = bf16_values(48, 0.5f);
  const auto emb16 = to_bf16(emb), qkv16 = to_bf16(qkv);
  write_safetensors(hf + "/model-00001-of-00002.safetensors",
                    {{a.shapes[0].name, Dtype::BF16, a.shapes[0].shape, emb16.data()},
                     {a.shapes[1].name, Dtype::BF16, a.shapes[1].shape, qkv16.data()},
                     {"decoder.layers.0.self_attention.core_attention._extra_state", Dtype::U8, {3}, "abc"}});
  write_safetensors(hf + "/model-00002-of-00002.safetensors",
                    {{a.shapes[2].name, Dtype::F32, a.shapes[2].shape, a.values[2].data()},
                     {a.shapes[3].name, Dtype::F32, a.shapes[3].shape, a.values[3].data()}});
  std::ofstream(hf + "/config.json") << "{}";  // other files in the folder are not read

  const PretrainedWeights p = load_pretrained_weights(hf, a.shapes);
  EXPECT_EQ(p.files.size(), 2u);
  ASSERT_EQ(p.tensors.size(), 4u);
  EXPECT_EQ(p.tensors.at(a.shapes[0].name), emb);
  EXPECT_EQ(p.tensors.at(a.shapes[1].name), qkv);
  EXPECT_TRUE(bits_equal(p.tensors.at(a.shapes[2].name), a.values[2]));
  EXPECT_TRUE(bits_equal(p.tensors.at(a.shapes[3].name), a.values[3]));
  EXPECT_TRUE(p.ignored.empty());

  // A parameter the model needs but no shard has.
  std::vector<ParamShape> more = a.shapes;
  more.push_back({"output_layer.weight", {8, 4}});
  std::string msg = usage_error([&] { load_pretrained_weights(hf, more); });
  expect_has(msg, "pretrained checkpoint '" + hf + "'");
  expect_has(msg, "missing: output_layer.weight [8, 4]");

  // A shape that differs names the shard.
  std::vector<ParamShape> wider = a.shapes;
  wider[3].shape = {8};
  msg = usage_error([&] { load_pretrained_weights(hf, wider); });
  expect_has(msg, "decoder.final_layernorm.weight: checkpoint [4], model [8] (in '" + hf +
                      "/model-00002-of-00002.safetensors')");

  // Tensors the model does not have are refused by default, listed when allowed.
  std::vector<ParamShape> fewer(a.shapes.begin(), a.shapes.end() - 1);
  expect_has(usage_error([&] { load_pretrained_weights(hf, fewer); }), "unexpected: decoder.final_layernorm.weight [4]");
  const PretrainedWeights q = load_pretrained_weights(hf, fewer, /*allow_unexpected=*/true);
  EXPECT_EQ(q.ignored, std::vector<std::string>{"decoder.final_layernorm.weight"});
  EXPECT_EQ(q.tensors.size(), 3u);

  // The same tensor in two shards names both files.
  write_safetensors(hf + "/extra.safetensors", {{a.shapes[3].name, Dtype::F32, a.shapes[3].shape, a.values[3].data()}});
  msg = usage_error([&] { load_pretrained_weights(hf, a.shapes); });
  expect_has(msg, "'decoder.final_layernorm.weight' is in both");
  expect_has(msg, hf + "/extra.safetensors");
  expect_has(msg, hf + "/model-00002-of-00002.safetensors");
}

// A state dict saved with Transformer Engine's layer spec (Megatron's default) names the layer
// norms after the linears they are fused into; they load as the local spec's norms.
TEST_F(Checkpoint, PretrainedAcceptsTransformerEngineNormNames) {
  EXPECT_EQ(local_spec_name("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"),
            "decoder.layers.3.input_layernorm.weight");
  EXPECT_EQ(local_spec_name("decoder.layers.0.mlp.linear_fc1.layer_norm_bias"), "decoder.layers.0.pre_mlp_layernorm.bias");
  EXPECT_EQ(local_spec_name("decoder.layers.0.mlp.linear_fc1.weight"), "decoder.layers.0.mlp.linear_fc1.weight");
  // Grouped MoE experts (TEGroupedMLP) load as SequentialMLP's.
  EXPECT_EQ(local_spec_name("decoder.layers.5.mlp.experts.linear_fc1.weight12"),
            "decoder.layers.5.mlp.experts.local_experts.12.linear_fc1.weight");
  EXPECT_EQ(local_spec_name("decoder.layers.0.mlp.experts.linear_fc2.weight0"),
            "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight");
  EXPECT_EQ(local_spec_name("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"),
            "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight");
  EXPECT_EQ(local_spec_name("decoder.layers.0.mlp.experts.linear_fc1.weightx"),
            "decoder.layers.0.mlp.experts.linear_fc1.weightx") << "not an expert index: left as it is";
  const std::string te = (dir_ / "te").string();
  fs::create_directories(te);
  const std::vector<float> gamma = {1.0f, 2.0f, 3.0f, 4.0f}, beta = {0.5f, 0.25f, 0.0f, -1.0f};
  write_safetensors(te + "/model.safetensors",
                    {{"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", Dtype::F32, {4}, gamma.data()},
                     {"decoder.layers.0.mlp.linear_fc1.layer_norm_bias", Dtype::F32, {4}, beta.data()}});
  std::vector<ParamShape> expected = {{"decoder.layers.0.input_layernorm.weight", {4}},
                                      {"decoder.layers.0.pre_mlp_layernorm.bias", {4}}};
  const PretrainedWeights p = load_pretrained_weights(te, expected);
  EXPECT_EQ(p.tensors.at("decoder.layers.0.input_layernorm.weight"), gamma);
  EXPECT_EQ(p.tensors.at("decoder.layers.0.pre_mlp_layernorm.bias"), beta);
  // Both spellings of one parameter are a conflict, named.
  write_safetensors(te + "/local.safetensors", {{"decoder.layers.0.input_layernorm.weight", Dtype::F32, {4}, gamma.data()}});
  expect_has(usage_error([&] { load_pretrained_weights(te, expected); }), "is in both");
}

TEST_F(Checkpoint, PretrainedFromALaoyaoCheckpointRootOrIterationDirectory) {
  Model a(4);
  const std::string it_dir = save_checkpoint(save_, 10, a.write(10));
  for (const std::string& path : {save_, it_dir}) {
    const PretrainedWeights p = load_pretrained_weights(path, a.shapes);
    ASSERT_EQ(p.files, std::vector<std::string>{it_dir + "/model.safetensors"});
    for (size_t i = 0; i < a.shapes.size(); ++i) EXPECT_TRUE(bits_equal(p.tensors.at(a.shapes[i].name), a.values[i]));
  }
  // Integrity is checked here too.
  flip_byte(it_dir + "/model.safetensors", static_cast<std::streamoff>(fs::file_size(it_dir + "/model.safetensors")) - 1);
  expect_has(usage_error([&] { load_pretrained_weights(save_, a.shapes); }), "is corrupt");
  // A folder with nothing usable, and a path that does not exist.
  fs::create_directories(dir_ / "empty");
  expect_has(usage_error([&] { load_pretrained_weights((dir_ / "empty").string(), a.shapes); }),
             "holds no *.safetensors files");
  expect_has(usage_error([&] { load_pretrained_weights((dir_ / "nope").string(), a.shapes); }), "does not exist");
  // Integer tensors cannot be weights.
  const std::string odd = (dir_ / "ints").string();
  fs::create_directories(odd);
  const std::vector<int32_t> ints(4, 1);
  write_safetensors(odd + "/w.safetensors", {{"decoder.final_layernorm.weight", Dtype::I32, {4}, ints.data()}});
  expect_has(usage_error([&] { load_pretrained_weights(odd, {{"decoder.final_layernorm.weight", {4}}}); }),
             "dtype I32 (expected F32, BF16 or F16");
}

// train_state.json is not covered by the SHA-256s: every counter is checked on load, and a bad one
// is named with the file (an optimizer_steps of -1 would surface later as a NaN).
TEST_F(Checkpoint, ImpossibleCountersInTrainStateAreNamedWithTheFile) {
  Model mdl(6);
  const std::string it_dir = save_checkpoint(save_, 10, mdl.write(10));
  const std::string state = it_dir + "/train_state.json";
  const std::string good = read_file(state);
  auto with = [&](const std::string& field, const std::string& value) {
    const size_t at = good.find("\"" + field + "\": ");
    EXPECT_NE(at, std::string::npos) << field;
    const size_t from = at + field.size() + 4, to = good.find_first_of(",\n", from);
    std::ofstream(state, std::ios::trunc) << good.substr(0, from) + value + good.substr(to);
    return usage_error([&] { load_checkpoint(save_); });
  };
  for (const char* field : {"iteration", "consumed_train_samples", "consumed_valid_samples", "skipped_train_samples",
                            "skipped_iterations", "nan_iterations", "scheduler_num_steps", "optimizer_steps"}) {
    const std::string msg = with(field, "-1");
    expect_has(msg, state);
    expect_has(msg, std::string("field '") + field + "' is -1");
  }
  for (const char* field : {"skipped_iterations", "nan_iterations", "optimizer_steps"}) {
    const std::string msg = with(field, "11");
    expect_has(msg, state);
    expect_has(msg, std::string("field '") + field + "' is 11, more than the 10 iterations");
  }
  expect_has(with("floating_point_operations_so_far", "-5.0"), "'floating_point_operations_so_far' must be a finite");
  expect_has(with("consumed_train_samples", "1.5"), "must be an integer, found 1.5");
  expect_has(with("consumed_train_samples", "1e999"), "not valid JSON");  // nlohmann's out_of_range
  expect_has(with("format", "7"), "not a laoyao train_state.json");  // not a string: no type_error
  std::ofstream(state, std::ios::trunc) << good;
  EXPECT_EQ(load_checkpoint(save_).state.optimizer_steps, 9);
  EXPECT_EQ(load_checkpoint(save_).state.loaded_from, state);
}

TEST_F(Checkpoint, ASaveDirectoryHeldByAnotherRunIsRefusedNamingIt) {
  {
    SaveDirLock mine(save_);
    ASSERT_TRUE(fs::exists(save_ + "/.laoyao_save.lock"));
    EXPECT_NE(read_file(save_ + "/.laoyao_save.lock").find("pid " + std::to_string(::getpid())), std::string::npos);
    // Another run (here another open file description, as another process would have) is refused.
    const std::string msg = usage_error([&] { SaveDirLock theirs(save_); });
    expect_has(msg, "'" + save_ + "' is in use by another run (host ");
    expect_has(msg, "pid " + std::to_string(::getpid()));
    save_checkpoint(save_, 1, Model(7).write(1));  // the holder saves as usual
  }
  // Released with its holder: the file is gone, the checkpoint stays, and the next run takes it.
  EXPECT_FALSE(fs::exists(save_ + "/.laoyao_save.lock"));
  EXPECT_TRUE(fs::exists(save_ + "/iter_0000001/train_state.json"));
  { SaveDirLock next(save_); }
  // A lock that created the folder and saved nothing leaves no folder behind.
  const std::string fresh = (dir_ / "never_saved").string();
  { SaveDirLock l(fresh); }
  EXPECT_FALSE(fs::exists(fresh));
}

// A killed holder's file stays behind, unlocked: it does not stop the next run.
TEST_F(Checkpoint, AStaleLockFileFromAKilledRunIsTakenOver) {
  fs::create_directories(save_);
  std::ofstream(save_ + "/.laoyao_save.lock") << "host elsewhere, pid 1\n";
  SaveDirLock l(save_);
  EXPECT_NE(read_file(save_ + "/.laoyao_save.lock").find("pid " + std::to_string(::getpid())), std::string::npos);
}

namespace {

model::TensorPart whole_part(const ParamShape& p) { return {p.name, p.shape, {model::whole_box(p.shape)}}; }

model::TensorPart rows(const ParamShape& p, int64_t from, int64_t to) {
  model::Box b = model::whole_box(p.shape);
  b.start[0] = from, b.size[0] = to - from;
  return {p.name, p.shape, {b}};
}

model::TensorPart moment(const std::string& name, const model::TensorPart& p) { return {name, p.shape, p.boxes}; }

// Model a's state as three ranks write it: rank 0 the embedding's first rows and the QKV and its
// norm whole, rank 1 the embedding's last rows and the final norm (rank_one_writes: else nothing);
// the embedding's moments cut mid-row (a distributed optimizer's share), the rest whole from rank 0.
// Rank 2 writes nothing.
std::string save_sharded(const std::string& save, const Model& a, bool rank_one_writes = true) {
  const auto& s = a.shapes;
  std::vector<ShardWrite> ranks(3);
  ranks[0].model = {{rows(s[0], 0, 4), a.values[0].data()}, {whole_part(s[1]), a.values[1].data()},
                    {whole_part(s[2]), a.values[2].data()}};
  if (rank_one_writes) ranks[1].model = {{rows(s[0], 4, 8), a.values[0].data() + 16}, {whole_part(s[3]), a.values[3].data()}};
  const model::TensorPart head = model::sub_part(whole_part(s[0]), 0, 14), tail = model::sub_part(whole_part(s[0]), 14, 32);
  ranks[0].optimizer = {{moment(exp_avg_name(s[0].name), head), a.m[0].data()},
                        {moment(exp_avg_sq_name(s[0].name), head), a.v[0].data()}};
  if (rank_one_writes)
    ranks[1].optimizer = {{moment(exp_avg_name(s[0].name), tail), a.m[0].data() + 14},
                          {moment(exp_avg_sq_name(s[0].name), tail), a.v[0].data() + 14}};
  for (size_t i = 1; i < s.size(); ++i) {
    ranks[0].optimizer.push_back({moment(exp_avg_name(s[i].name), whole_part(s[i])), a.m[i].data()});
    ranks[0].optimizer.push_back({moment(exp_avg_sq_name(s[i].name), whole_part(s[i])), a.v[i].data()});
  }
  const CheckpointWrite w = a.write(10);
  const std::string scratch = checkpoint_scratch_dir(save, 10, 4242);
  begin_checkpoint(save, scratch);
  for (int64_t r = 0; r < 3; ++r) write_checkpoint_shard(scratch, r, 3, ranks[static_cast<size_t>(r)]);
  return finish_checkpoint(save, scratch, 10, 3, w.state, w.run_config_yaml);
}

}  // namespace

// Three ranks' shards make one checkpoint: each file holds its writer's parts, train_state.json
// their boxes; whole tensors and any other part of them read back bit for bit.
TEST_F(Checkpoint, ShardsOfSeveralRanksReadBackWholeAndInOtherParts) {
  Model a(1);
  const std::string it_dir = save_sharded(save_, a);
  EXPECT_EQ(entries(it_dir), (std::vector<std::string>{"model.rank00000.safetensors", "model.rank00001.safetensors",
                                                       "optimizer.rank00000.safetensors",
                                                       "optimizer.rank00001.safetensors", "run_config.yaml",
                                                       "train_state.json"}));
  EXPECT_EQ(entries(save_), (std::vector<std::string>{"iter_0000010", "latest_checkpointed_iteration.txt"}));
  const LoadedCheckpoint c = load_checkpoint(save_);
  EXPECT_NO_THROW(check_parameters(c, a.shapes));
  for (size_t i = 0; i < a.shapes.size(); ++i) {
    const std::string& n = a.shapes[i].name;
    EXPECT_TRUE(bits_equal(read(c, n, a.values[i].size()), a.values[i])) << n;
    EXPECT_TRUE(bits_equal(read(c, exp_avg_name(n), a.m[i].size(), true), a.m[i])) << n;
    EXPECT_TRUE(bits_equal(read(c, exp_avg_sq_name(n), a.v[i].size(), true), a.v[i])) << n;
  }
  // Columns 1:3 of the embedding (a part no rank wrote) from both ranks' rows.
  const model::TensorPart cols{a.shapes[0].name, {8, 4}, {{{0, 1}, {8, 2}}}};
  std::vector<float> got(16), want;
  c.model.read(cols, got.data());
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t k = 1; k < 3; ++k) want.push_back(a.values[0][static_cast<size_t>(r * 4 + k)]);
  EXPECT_TRUE(bits_equal(got, want));
  // Read in windows of the flat data (as a restore reads a large tensor): each from the entries it meets.
  for (const int64_t window : {5, 7, 32}) {
    std::vector<float> whole(32);
    const model::TensorPart all = whole_part(a.shapes[0]);
    for (int64_t lo = 0; lo < 32; lo += window)
      c.model.read(model::sub_part(all, lo, std::min<int64_t>(32, lo + window)), whole.data() + lo);
    EXPECT_TRUE(bits_equal(whole, a.values[0])) << "window " << window;
  }
  // The rows are entries of their own shape; the moments cut mid-row are flat.
  SafetensorsFile rank1(it_dir + "/model.rank00001.safetensors");
  EXPECT_EQ(rank1.find(a.shapes[0].name)->shape, (std::vector<int64_t>{4, 4}));
  SafetensorsFile opt1(it_dir + "/optimizer.rank00001.safetensors");
  EXPECT_EQ(opt1.find(exp_avg_name(a.shapes[0].name))->shape, (std::vector<int64_t>{18}));
}

// A shard file missing, truncated or flipped, or a part no rank wrote: one UsageError naming the
// file (and the tensor and its slice), before anything is read where it can be known then.
TEST_F(Checkpoint, AMissingTruncatedOrCorruptShardNamesTheFileAndTheSlice) {
  Model a(1);
  const std::string it_dir = save_sharded(save_, a);
  const std::string rank1 = it_dir + "/model.rank00001.safetensors";
  const auto size = static_cast<std::streamoff>(fs::file_size(rank1));
  // Read lazily, a flipped byte in rank 1's file fails only the reads that need it.
  flip_byte(rank1, size - 3);
  const LoadedCheckpoint lazy = load_checkpoint(save_, std::nullopt, CheckpointVerify::kFilesRead);
  EXPECT_TRUE(bits_equal(read(lazy, a.shapes[1].name, a.values[1].size()), a.values[1]));
  std::string msg = usage_error([&] { read(lazy, a.shapes[0].name, a.values[0].size()); });
  expect_has(msg, "'" + rank1 + "' is corrupt");
  expect_has(usage_error([&] { load_checkpoint(save_); }), "'" + rank1 + "' is corrupt");
  flip_byte(rank1, size - 3);

  const std::string opt1 = it_dir + "/optimizer.rank00001.safetensors";
  const auto opt_size = fs::file_size(opt1);
  fs::resize_file(opt1, opt_size - 8);
  expect_has(usage_error([&] { load_checkpoint(save_, std::nullopt, CheckpointVerify::kFilesRead); }),
             "'" + opt1 + "' is corrupt: it is " + std::to_string(opt_size - 8) + " bytes");
  fs::remove(opt1);
  expect_has(usage_error([&] { load_checkpoint(save_, std::nullopt, CheckpointVerify::kFilesRead); }),
             "'" + opt1 + "' is missing");

  // A parts record whose box leaves the tensor's shape is refused by name before any file is read.
  const std::string state = it_dir + "/train_state.json";
  const std::string good = read_file(state);
  std::string bad = good;
  const std::string key = "\"size\": [";
  const size_t size_at = bad.find(key, bad.find("\"parts\""));  // the first box's first size: past the rows
  ASSERT_NE(size_at, std::string::npos);
  const size_t from = bad.find_first_of("0123456789", size_at + key.size());
  bad.replace(from, bad.find_first_not_of("0123456789", from) - from, "9999999");
  std::ofstream(state, std::ios::trunc) << bad;
  msg = usage_error([&] { load_checkpoint(save_, std::nullopt, CheckpointVerify::kFilesRead); });
  expect_has(msg, "train_state.json");
  expect_has(msg, "is not inside the shape");
  std::ofstream(state, std::ios::trunc) << good;

  // A part no rank wrote: the check names the tensor, what is held and where; a read of it too.
  fs::remove_all(save_);
  save_sharded(save_, a, /*rank_one_writes=*/false);
  const LoadedCheckpoint gap = load_checkpoint(save_);
  msg = usage_error([&] { check_parameters(gap, a.shapes); });
  expect_has(msg, "embedding.word_embeddings.weight [8, 4]: its stored parts hold 16 elements of 32 (a part is missing)");
  expect_has(msg, "model.rank00000.safetensors' embedding.word_embeddings.weight [0:4, 0:4] of [8, 4]");
  expect_has(msg, "missing: decoder.final_layernorm.weight [4]");
  msg = usage_error([&] { read(gap, a.shapes[0].name, a.values[0].size()); });
  expect_has(msg, "hold 16 elements of the 32 of embedding.word_embeddings.weight [0:8, 0:4] of [8, 4] (a part is missing)");
}

// A save whose ranks did not all write is refused by the first rank, and leaves nothing behind.
TEST_F(Checkpoint, FinishingBeforeEveryRankWroteFailsAndRemovesTheScratchFolder) {
  Model a(1);
  const CheckpointWrite w = a.write(10);
  const std::string scratch = checkpoint_scratch_dir(save_, 10, 7);
  begin_checkpoint(save_, scratch);
  ShardWrite mine;
  mine.model.push_back({whole_part(a.shapes[0]), a.values[0].data()});
  write_checkpoint_shard(scratch, 0, 2, mine);
  EXPECT_THROW(finish_checkpoint(save_, scratch, 10, 2, w.state, w.run_config_yaml), Error);
  EXPECT_FALSE(fs::exists(scratch));
  EXPECT_FALSE(checkpoint_exists(save_));
}
