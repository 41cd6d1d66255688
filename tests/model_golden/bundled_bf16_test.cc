// bf16 activations (--dtype bfloat16) on the bundled model against the Hugging Face model run in
// bf16 on the same checkpoint. Both round at the same points but accumulate in different orders
// (HF's bf16 matmuls round blocked partial sums), so agreement is statistical, not bitwise.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/model_golden/golden_util.h"

namespace m3::test {
namespace {

TEST(BundledBf16, LogitsCloseToReferenceInBf16) {
  const std::filesystem::path golden_dir = "tests/model_golden/data/bundled-tiny";
  LoadedModel m = load_model("models/minimax-m3-tiny", DType::kBF16, KvDType::kBF16, KvDType::kBF16);
  const int vocab = m.model->config().vocab_size;
  const nlohmann::json p = read_json(golden_dir / "golden.json").at("bf16").at("prompts").at(0);
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  const auto rows = p.at("logit_rows").get<std::vector<int>>();
  const std::vector<float> ref = read_f32(golden_dir / p.at("logits_file").get<std::string>(), rows.size() * vocab);
  const std::vector<float> ours = prefill_logits(*m.model, ids, 1 << 20);
  double worst = 0;
  int agree = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* a = ours.data() + size_t(rows[r]) * vocab;
    const float* b = ref.data() + r * vocab;
    worst = std::max(worst, row_rel_error(a, b, vocab));
    agree += argmax(a, vocab) == argmax(b, vocab);
  }
  std::printf("[bundled bf16] logits vs HF bf16: max relative error %.4f, argmax agree %d/%zu\n", worst,
              agree, rows.size());
  EXPECT_LE(worst, 0.08);
}

}  // namespace
}  // namespace m3::test
