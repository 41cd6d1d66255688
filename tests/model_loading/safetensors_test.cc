// safetensors reading: every dtype, zero-copy views, sharded checkpoints, and each kind of corrupt
// file failing with an error that names the file and the tensor.
#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/model_loading/test_util.h"

namespace m3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::safetensors_bytes;
using testing::SafetensorsWriter;
using testing::ScratchDir;
using testing::write_bytes;
using testing::write_text;

// The error text of opening `path`, or "" when it opened.
std::string open_error(const std::filesystem::path& path) {
  try {
    SafetensorsCheckpoint::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> iota_bytes(std::size_t n) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST(Safetensors, ReadsEveryDtypeAsZeroCopyViews) {
  ScratchDir dir;
  SafetensorsWriter w;
  const std::vector<std::pair<std::string, DType>> dtypes = {
      {"F64", DType::kF64},   {"F32", DType::kF32},        {"F16", DType::kF16},
      {"BF16", DType::kBF16}, {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2},
      {"I64", DType::kI64},   {"I32", DType::kI32},        {"I16", DType::kI16},
      {"I8", DType::kI8},     {"U8", DType::kU8},          {"BOOL", DType::kBool}};
  for (const auto& [name, dt] : dtypes)
    w.add("t." + name, dt, {3, 2}, iota_bytes(6 * dtype_size(dt)));
  w.add("empty", DType::kF32, {0, 4}, {});
  w.add("scalar", DType::kF32, {}, iota_bytes(4));
  w.set_metadata("format", "pt");
  w.write(dir / "model.safetensors");

  Tensor keep;
  {
    SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
    ASSERT_EQ(ckpt.size(), dtypes.size() + 2);
    EXPECT_EQ(ckpt.files().at(0).metadata().at("format"), "pt");
    for (const auto& [name, dt] : dtypes) {
      Tensor t = ckpt.tensor("t." + name);
      EXPECT_EQ(t.dtype(), dt) << name;
      EXPECT_EQ(t.shape(), (Shape{3, 2})) << name;
      std::vector<uint8_t> expect = iota_bytes(6 * dtype_size(dt));
      EXPECT_EQ(std::memcmp(t.data(), expect.data(), expect.size()), 0) << name;
    }
    EXPECT_EQ(ckpt.tensor("empty").numel(), 0);
    EXPECT_EQ(ckpt.tensor("scalar").ndim(), 0);
    EXPECT_EQ(ckpt.tensor("scalar").numel(), 1);
    keep = ckpt.tensor("t.F32");
  }
  // The view keeps the mapping alive after the checkpoint object is gone.
  std::vector<uint8_t> expect = iota_bytes(24);
  EXPECT_EQ(std::memcmp(keep.data(), expect.data(), 24), 0);
}

TEST(Safetensors, F8E8M0ScalesReadAsBytes) {
  ScratchDir dir;
  std::string header = R"({"s":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}})";
  write_bytes(dir / "a.safetensors", safetensors_bytes(header, {127, 130}));
  Tensor t = SafetensorsCheckpoint::open(dir / "a.safetensors").tensor("s");
  EXPECT_EQ(t.dtype(), DType::kU8);
  EXPECT_EQ(t.data_as<uint8_t>()[1], 130);
}

TEST(Safetensors, MissingTensorNamesIt) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add_f32("a", {1}, {1.0f});
  w.write(dir / "model.safetensors");
  SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_FALSE(ckpt.contains("b"));
  EXPECT_EQ(ckpt.find("b"), nullptr);
  try {
    ckpt.tensor("b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'b'"));
  }
}

struct CorruptCase {
  const char* label;
  std::string header;
  std::vector<uint8_t> data;
  uint64_t header_len_field;
  std::vector<std::string> message_parts;  // besides the file name
};

class CorruptFile : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(CorruptFile, FailsNamingFileAndTensor) {
  ScratchDir dir;
  const CorruptCase& c = GetParam();
  const auto path = dir / "bad.safetensors";
  write_bytes(path, safetensors_bytes(c.header, c.data, c.header_len_field));
  std::string err = open_error(path);
  ASSERT_FALSE(err.empty()) << c.label << " opened without error";
  EXPECT_THAT(err, HasSubstr("bad.safetensors")) << c.label;
  for (const auto& part : c.message_parts) EXPECT_THAT(err, HasSubstr(part)) << c.label;
}

const std::string kGood = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

INSTANTIATE_TEST_SUITE_P(
    Safetensors, CorruptFile,
    ::testing::Values(
        CorruptCase{"header_length_past_end", kGood, iota_bytes(8), 1000, {"header length 1000"}},
        CorruptCase{"header_length_huge", kGood, iota_bytes(8), UINT64_MAX - 1, {"header length"}},
        CorruptCase{"bad_json", R"({"w":{"dtype":"F32",)", {}, UINT64_MAX, {"not valid JSON"}},
        CorruptCase{"header_not_object", "[1,2]", {}, UINT64_MAX, {"not a JSON object"}},
        CorruptCase{"entry_not_object", R"({"w":3})", {}, UINT64_MAX, {"'w'"}},
        CorruptCase{"unknown_dtype",
                    R"({"w":{"dtype":"F4X","shape":[2],"data_offsets":[0,8]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "unknown dtype 'F4X'"}},
        CorruptCase{"missing_dtype",
                    R"({"w":{"shape":[2],"data_offsets":[0,8]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "dtype"}},
        CorruptCase{"negative_shape",
                    R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "shape"}},
        CorruptCase{"float_shape",
                    R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "shape"}},
        CorruptCase{"shape_not_array",
                    R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "shape"}},
        CorruptCase{"offsets_past_data",
                    R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                    iota_bytes(4),
                    UINT64_MAX,
                    {"'w'", "past the data section"}},
        CorruptCase{"offsets_reversed",
                    R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "begin after end"}},
        CorruptCase{"offsets_arity",
                    R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "data_offsets"}},
        CorruptCase{"offsets_negative",
                    R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})",
                    iota_bytes(8),
                    UINT64_MAX,
                    {"'w'", "data_offsets"}},
        CorruptCase{"size_mismatch",
                    R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                    iota_bytes(12),
                    UINT64_MAX,
                    {"'w'", "needs 12 bytes", "hold 8"}},
        CorruptCase{
            "shape_overflow",
            R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
            iota_bytes(8),
            UINT64_MAX,
            {"'w'"}},
        CorruptCase{
            "overlap",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            iota_bytes(12),
            UINT64_MAX,
            {"'a'", "'b'", "overlap"}},
        CorruptCase{
            "metadata_not_object", R"({"__metadata__":[1]})", {}, UINT64_MAX, {"__metadata__"}}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Safetensors, TruncatedFilesFail) {
  ScratchDir dir;
  write_bytes(dir / "short.safetensors", {1, 2, 3});
  EXPECT_THAT(open_error(dir / "short.safetensors"),
              AllOf(HasSubstr("short.safetensors"), HasSubstr("truncated")));
  write_bytes(dir / "zero.safetensors", {});
  EXPECT_THAT(open_error(dir / "zero.safetensors"), HasSubstr("truncated"));
  // A valid file cut inside its data section.
  SafetensorsWriter w;
  w.add_f32("w", {4}, {1, 2, 3, 4});
  w.write(dir / "cut.safetensors");
  std::filesystem::resize_file(dir / "cut.safetensors",
                               std::filesystem::file_size(dir / "cut.safetensors") - 3);
  EXPECT_THAT(
      open_error(dir / "cut.safetensors"),
      AllOf(HasSubstr("cut.safetensors"), HasSubstr("'w'"), HasSubstr("past the data section")));
}

TEST(Safetensors, EmptyTensorsNeverOverlap) {
  ScratchDir dir;
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  write_bytes(dir / "a.safetensors", safetensors_bytes(header, iota_bytes(8)));
  EXPECT_EQ(open_error(dir / "a.safetensors"), "");
}

TEST(Safetensors, MissingFileFails) {
  ScratchDir dir;
  EXPECT_THAT(open_error(dir / "nope.safetensors"), HasSubstr("nope.safetensors"));
  EXPECT_THAT(open_error(dir.path()), HasSubstr("no model.safetensors.index.json"));
}

std::string numbered(int i) {
  std::string s = "t";
  s += std::to_string(i);
  return s;
}

TEST(Safetensors, ShardedIndex) {
  ScratchDir dir;
  SafetensorsWriter w;
  for (int i = 0; i < 7; ++i) w.add_f32(numbered(i), {2}, {float(i), float(i) + 0.5f});
  w.write_sharded(dir.path(), 3);
  SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(ckpt.files().size(), 3u);
  EXPECT_EQ(ckpt.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    Tensor t = ckpt.tensor(numbered(i));
    EXPECT_EQ(t.data_as<float>()[1], i + 0.5f);
  }
  EXPECT_THAT(ckpt.file_of("t1"), HasSubstr("model-00002-of-00003.safetensors"));
  // The index file itself may be given.
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "model.safetensors.index.json").size(), 7u);
}

TEST(Safetensors, ShardMissingListedTensorFails) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add_f32("a", {1}, {1});
  w.write(dir / "s1.safetensors");
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})");
  EXPECT_THAT(open_error(dir.path()),
              AllOf(HasSubstr("s1.safetensors"), HasSubstr("'ghost'"), HasSubstr("missing")));
}

TEST(Safetensors, IndexErrorsNameTheIndex) {
  ScratchDir dir;
  write_text(dir / "model.safetensors.index.json", "{not json");
  EXPECT_THAT(open_error(dir.path()),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not valid JSON")));
  write_text(dir / "model.safetensors.index.json", R"({"metadata":{}})");
  EXPECT_THAT(open_error(dir.path()), HasSubstr("weight_map"));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":3}})");
  EXPECT_THAT(open_error(dir.path()), HasSubstr("'a'"));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  EXPECT_THAT(open_error(dir.path()), HasSubstr("'a'"));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"absent.safetensors"}})");
  EXPECT_THAT(open_error(dir.path()), HasSubstr("absent.safetensors"));
}

TEST(Safetensors, CorruptShardNamesTheShard) {
  ScratchDir dir;
  write_bytes(dir / "s1.safetensors",
              safetensors_bytes(R"({"a":{"dtype":"F32","shape":[9],"data_offsets":[0,4]}})",
                                iota_bytes(4)));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors"}})");
  EXPECT_THAT(open_error(dir.path()), AllOf(HasSubstr("s1.safetensors"), HasSubstr("'a'")));
}

TEST(Safetensors, DirectoryWithoutIndexMergesFilesAndRejectsDuplicates) {
  ScratchDir dir;
  SafetensorsWriter a, b;
  a.add_f32("x", {1}, {1});
  b.add_f32("y", {1}, {2});
  a.write(dir / "a.safetensors");
  b.write(dir / "b.safetensors");
  EXPECT_EQ(SafetensorsCheckpoint::open(dir.path()).size(), 2u);
  b.add_f32("x", {1}, {3});
  b.write(dir / "b.safetensors");
  EXPECT_THAT(open_error(dir.path()),
              AllOf(HasSubstr("'x'"), HasSubstr("a.safetensors"), HasSubstr("b.safetensors")));
}

}  // namespace
}  // namespace m3
