#include "app/vllm_compat_flags.h"

#include <CLI/CLI.hpp>

#include "core/log.h"

namespace m3::app {

const std::vector<CompatFlag>& vllm_compat_flags() {
  static const std::vector<CompatFlag> kFlags = {
      {"--attention-backend", true,
       "m3serve has one attention implementation per device (its own MSA kernels: the CPU reference or the Hopper "
       "kernels), so there is no backend to choose; this value is not used"},
      {"--disable-hybrid-kv-cache-manager", false,
       "m3serve has one KV manager (K, V and index-K of every layer per block), nothing to disable"},
      {"--trust-remote-code", false, "no remote code is ever run: config.json is read as data"},
      {"--uvicorn-log-level", true, "there is no uvicorn; the server's log level is --log-level"},
      {"--disable-uvicorn-access-log", false, "there is no uvicorn and no access log"},
      {"--disable-log-requests", false, "requests are not logged (there is no request log to disable)"},
      {"--enable-log-requests", false, "m3serve has no per-request log; /metrics counts requests"},
      {"--max-log-len", true, "prompts are not logged, so there is nothing to truncate"},
      {"--swap-space", true,
       "there is no CPU swap space: a preempted request frees its KV blocks and is recomputed later"},
      {"--disable-custom-all-reduce", false,
       "m3serve has no custom all-reduce kernel: tensor-parallel sums go through NCCL (GPU) or Gloo (CPU)"},
  };
  return kFlags;
}

void add_vllm_compat_flags(CLI::App& cmd, GivenCompatFlags& out) {
  auto* group = cmd.add_option_group(
      "vLLM compatibility", "vllm serve options without a counterpart: accepted, each logs what m3serve does instead");
  for (const CompatFlag& flag : vllm_compat_flags()) {
    const std::string help = "accepted: " + std::string(flag.instead);
    if (flag.takes_value) {
      group->add_option_function<std::string>(
          std::string(flag.name), [&out, &flag](const std::string& value) { out.given.push_back({&flag, value}); },
          help);
    } else {
      group->add_flag_callback(std::string(flag.name), [&out, &flag] { out.given.push_back({&flag, {}}); }, help);
    }
  }
}

void log_vllm_compat_flags(const GivenCompatFlags& given) {
  for (const GivenCompatFlags::Given& g : given.given) {
    M3_LOG_INFO("{}{}{}: {}", g.flag->name, g.value.empty() ? "" : " ", g.value, g.flag->instead);
  }
}

}  // namespace m3::app
