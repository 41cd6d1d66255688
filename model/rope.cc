// RoPE parameters exactly as transformers 5.17 derives them (configuration_utils'
// convert_rope_params_to_dict / standardize_rope_params and modeling_rope_utils' init functions).
// The reference computes inv_freq in float32 torch ops; each step below mirrors one of them in
// float, with the powers evaluated in double and rounded (torch's float pow is within 1 ulp).
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/log.h"
#include "model/config_fields.h"

namespace m3::config_detail {

namespace {

// base ** (arange(0, dim, 2).float() / dim), in float32.
std::vector<float> pos_freqs(double base, int dim) {
  std::vector<float> out;
  for (int i = 0; i < dim; i += 2) {
    float exponent = static_cast<float>(i) / static_cast<float>(dim);
    out.push_back(static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(exponent))));
  }
  return out;
}

std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> f = pos_freqs(base, dim);
  for (float& x : f) x = 1.0f / x;
  return f;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

void compute_yarn(RopeConfig& r, const Fields& rp, int dim, int64_t max_pos) {
  const double base = r.theta;
  std::optional<double> factor = rp.opt_number("factor");
  const double f =
      factor ? *factor : static_cast<double>(max_pos) / r.original_max_position_embeddings;
  r.factor = f;
  std::optional<double> mscale = rp.opt_number("mscale");
  std::optional<double> mscale_all_dim = rp.opt_number("mscale_all_dim");
  if (auto af = rp.opt_number("attention_factor")) {
    r.attention_factor = *af;
  } else if (mscale && *mscale != 0 && mscale_all_dim && *mscale_all_dim != 0) {
    r.attention_factor = yarn_mscale(f, *mscale) / yarn_mscale(f, *mscale_all_dim);
  } else {
    r.attention_factor = yarn_mscale(f, 1.0);
  }
  // `rope_parameters.get("beta_fast") or 32`: 0 also falls back.
  double beta_fast = rp.get_number("beta_fast", 0.0);
  double beta_slow = rp.get_number("beta_slow", 0.0);
  r.beta_fast = beta_fast != 0 ? beta_fast : 32.0;
  r.beta_slow = beta_slow != 0 ? beta_slow : 1.0;
  const bool truncate = rp.get_bool("truncate", true);

  auto correction_dim = [&](double rotations) {
    return (dim *
            std::log(r.original_max_position_embeddings / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // the reference's guard against a zero-width ramp

  std::vector<float> pf = pos_freqs(base, dim);
  const float ff = static_cast<float>(f);
  const float range = static_cast<float>(high - low);
  r.inv_freq.clear();
  for (int i = 0; i < dim / 2; ++i) {
    float extrapolation = 1.0f / pf[i];
    float interpolation = 1.0f / (ff * pf[i]);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / range;
    ramp = std::fmin(std::fmax(ramp, 0.0f), 1.0f);
    float extrapolation_factor = 1.0f - ramp;
    r.inv_freq.push_back(interpolation * (1.0f - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
}

void compute_llama3(RopeConfig& r, const Fields& rp) {
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
    if (!rp.has(key)) rp.reject(key, "required for rope_type 'llama3'");
  r.factor = rp.get_number("factor", 1.0);
  r.low_freq_factor = rp.get_number("low_freq_factor", 1.0);
  r.high_freq_factor = rp.get_number("high_freq_factor", 4.0);
  const double old_context = r.original_max_position_embeddings;
  const float low_wavelen = static_cast<float>(old_context / r.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_context / r.high_freq_factor);
  const float factor = static_cast<float>(r.factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  for (float& inv : r.inv_freq) {
    float wavelen = two_pi / inv;
    float scaled = wavelen > low_wavelen ? inv / factor : inv;
    float smooth =
        (static_cast<float>(old_context) / wavelen - static_cast<float>(r.low_freq_factor)) /
        static_cast<float>(r.high_freq_factor - r.low_freq_factor);
    float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv = medium ? smoothed : scaled;
  }
}

std::vector<float> read_factor_list(const Fields& rp, const char* key, int count) {
  const nlohmann::json* v = rp.raw(key);
  if (!v) rp.reject(key, "required for rope_type 'longrope'");
  if (!v->is_array() || static_cast<int>(v->size()) != count)
    rp.reject(key, fmt::format("expected a list of {} numbers (rotary_dim / 2)", count));
  std::vector<float> out;
  for (const auto& e : *v) {
    if (!e.is_number()) rp.reject(key, "expected a list of numbers");
    out.push_back(static_cast<float>(e.get<double>()));
  }
  return out;
}

void compute_longrope(RopeConfig& r, const Fields& rp, int dim, int64_t max_pos) {
  std::vector<float> short_factor = read_factor_list(rp, "short_factor", dim / 2);
  std::vector<float> long_factor = read_factor_list(rp, "long_factor", dim / 2);
  std::optional<double> factor = rp.opt_number("factor");
  const double original = r.original_max_position_embeddings;
  r.factor = factor ? *factor : static_cast<double>(max_pos) / original;
  if (auto af = rp.opt_number("attention_factor")) {
    r.attention_factor = *af;
  } else {
    r.attention_factor =
        r.factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(r.factor) / std::log(original));
  }
  std::vector<float> pf = pos_freqs(r.theta, dim);
  r.inv_freq.clear();
  r.inv_freq_long.clear();
  for (int i = 0; i < dim / 2; ++i) {
    r.inv_freq.push_back(1.0f / (short_factor[i] * pf[i]));
    r.inv_freq_long.push_back(1.0f / (long_factor[i] * pf[i]));
  }
}

}  // namespace

RopeConfig parse_rope(const Fields& text, int head_dim, int64_t max_pos,
                      const std::vector<std::string>& layer_type_names) {
  // rope_scaling (legacy) wins over rope_parameters when it is a non-empty dict.
  const char* key = "rope_parameters";
  if (const nlohmann::json* legacy = text.raw("rope_scaling");
      legacy && !(legacy->is_object() && legacy->empty()))
    key = "rope_scaling";
  nlohmann::json empty = nlohmann::json::object();
  std::optional<Fields> given = text.opt_object(key);
  const Fields rp = given ? *given : Fields(empty, text.source(), text.name(key) + ".");

  if (given) {
    for (const auto& t : layer_type_names)
      if (rp.raw(t.c_str()))
        text.reject(key,
                    "per-layer-type RoPE parameters are not supported (the MiniMax-M3 "
                    "reference reads one global rope_parameters)");
  }

  RopeConfig r;
  r.type = rp.get_string("rope_type", rp.get_string("type", "default"));
  // rope_theta: rope_parameters, else the legacy top-level field, else default_theta (5e6).
  if (rp.raw("rope_theta")) {
    r.theta = rp.get_number("rope_theta", 0.0);
  } else {
    r.theta = text.get_number("rope_theta", 5000000.0);
  }
  if (!(r.theta > 0)) rp.reject("rope_theta", fmt::format("must be positive, got {}", r.theta));
  r.partial_rotary_factor = rp.has("partial_rotary_factor")
                                ? rp.get_number("partial_rotary_factor", 1.0)
                                : text.get_number("partial_rotary_factor", 1.0);
  if (!(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1))
    rp.reject("partial_rotary_factor",
              fmt::format("must be in (0, 1], got {}", r.partial_rotary_factor));
  r.rotary_dim = static_cast<int>(head_dim * r.partial_rotary_factor);
  if (r.rotary_dim < 2 || r.rotary_dim % 2 != 0)
    rp.reject("partial_rotary_factor",
              fmt::format("head_dim {} x {} gives {} rotated channels; an even count >= 2 is "
                          "required",
                          head_dim, r.partial_rotary_factor, r.rotary_dim));

  const bool needs_original = r.type == "yarn" || r.type == "llama3" || r.type == "longrope";
  if (needs_original) {
    // A top-level original_max_position_embeddings overrides the dict's (Phi3 convention).
    std::optional<int64_t> original = text.opt_int("original_max_position_embeddings");
    if (!original) original = rp.opt_int("original_max_position_embeddings");
    if (!original) original = max_pos;
    if (*original <= 0)
      rp.reject("original_max_position_embeddings",
                fmt::format("must be positive, got {}", *original));
    r.original_max_position_embeddings = static_cast<int>(*original);
  }

  const int dim = r.rotary_dim;
  if (r.type == "default") {
    r.inv_freq = default_inv_freq(r.theta, dim);
  } else if (r.type == "linear") {
    if (!rp.has("factor")) rp.reject("factor", "required for rope_type 'linear'");
    r.factor = rp.get_number("factor", 1.0);
    r.inv_freq = default_inv_freq(r.theta, dim);
    for (float& x : r.inv_freq) x /= static_cast<float>(r.factor);
  } else if (r.type == "dynamic") {
    if (!rp.has("factor")) rp.reject("factor", "required for rope_type 'dynamic'");
    r.factor = rp.get_number("factor", 1.0);
    // At seq_len = max_position_embeddings (the reference's init and every shorter sequence).
    const double seq_len = static_cast<double>(max_pos);
    double base =
        r.theta * std::pow((r.factor * seq_len / static_cast<double>(max_pos)) - (r.factor - 1),
                           static_cast<double>(dim) / (dim - 2));
    r.inv_freq = default_inv_freq(base, dim);
  } else if (r.type == "yarn") {
    if (!rp.raw("factor")) rp.reject("factor", "required for rope_type 'yarn'");
    compute_yarn(r, rp, dim, max_pos);
  } else if (r.type == "llama3") {
    r.inv_freq = default_inv_freq(r.theta, dim);
    compute_llama3(r, rp);
  } else if (r.type == "longrope") {
    compute_longrope(r, rp, dim, max_pos);
  } else {
    rp.reject("rope_type", fmt::format("'{}' is not supported (default, linear, dynamic, yarn, "
                                       "llama3, longrope)",
                                       r.type));
  }

  if (std::optional<int64_t> declared = text.opt_int("rotary_dim"); declared && *declared != dim)
    M3_LOG_WARN(
        "{}: {} is {} but the reference rotates int(head_dim {} x partial_rotary_factor {}) "
        "= {} channels; using {}",
        text.source(), text.name("rotary_dim"), *declared, head_dim, r.partial_rotary_factor, dim,
        dim);
  return r;
}

}  // namespace m3::config_detail
