#include "model/weight_names.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace m3 {

CheckpointLayout detect_checkpoint_layout(const std::vector<std::string>& names) {
  struct Candidate {
    const char* prefix;
    const char* lm_head;
  };
  // "model." is also the start of "model.language_model.": test the longer prefixes first and
  // count only names that continue with a text-model component.
  static constexpr std::array<Candidate, 3> kCandidates = {{
      {"language_model.model.", "language_model.lm_head"},
      {"model.language_model.", "lm_head"},
      {"model.", "lm_head"},
  }};
  for (const Candidate& c : kCandidates) {
    const std::string p = c.prefix;
    bool found = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      if (n.rfind(p, 0) != 0) return false;
      std::string_view rest = std::string_view(n).substr(p.size());
      return rest.starts_with("layers.") || rest.starts_with("embed_tokens.") ||
             rest.starts_with("norm.");
    });
    if (found) return CheckpointLayout{p, c.lm_head};
  }
  fail(
      "checkpoint holds no MiniMax-M3 text model tensors (looked for language_model.model.*, "
      "model.language_model.* and model.* layers / embed_tokens / norm among {} tensors)",
      names.size());
}

bool is_ignored_tensor(std::string_view name) {
  // `(^|\.)mtp\.` as the reference's _keys_to_ignore_on_load_unexpected.
  if (name.starts_with("mtp.") || name.find(".mtp.") != std::string_view::npos) return true;
  if (name.ends_with("rotary_emb.inv_freq")) return true;
  std::string_view rest = name;
  if (rest.starts_with("model.")) rest.remove_prefix(6);
  for (std::string_view vision : {"vision_tower.", "visual.", "vision_model.",
                                  "multi_modal_projector.", "mm_projector.", "patch_merge"})
    if (rest.starts_with(vision)) return true;
  return false;
}

}  // namespace m3
