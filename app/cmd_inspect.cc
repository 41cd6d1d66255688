// m3serve inspect: reads a model's config.json and loads (or, with --load-format dummy, generates)
// its weights, then prints the configuration and what the weights hold: a quick check that a
// checkpoint is complete and understood, and a timing of load / dummy generation.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "app/commands.h"
#include "app/model_source.h"
#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"

namespace m3::app {

namespace {

struct InspectOptions {
  std::string model;
  HubOptions hub;  // when model is a Hugging Face repo id
  std::string load_format = "auto";
  int num_layers = 0;
  uint64_t seed = 0;
};

struct Totals {
  std::map<std::string, std::pair<int64_t, double>> by_format;  // count, bytes
  void add(const LinearWeight& w) {
    if (!w.defined()) return;
    auto& [count, bytes] = by_format[std::string(weight_format_name(w.format))];
    ++count;
    bytes += static_cast<double>(w.nbytes());
  }
};

void print_config(const ModelConfig& c) {
  std::printf(
      "model_type %s%s: %d layers (%d sparse, %d MoE), hidden %d, heads %d/%d x %d, vocab %d\n",
      c.model_type.c_str(), c.vl_wrapper ? " (text_config)" : "", c.num_layers,
      c.num_sparse_layers(), c.num_moe_layers(), c.hidden_size, c.num_heads, c.num_kv_heads,
      c.head_dim, c.vocab_size);
  std::printf("experts %d (top %d, width %d), shared width %d, dense width %d\n", c.num_experts,
              c.experts_per_token, c.moe_intermediate_size, c.shared_intermediate_size,
              c.dense_intermediate_size);
  std::printf(
      "rope %s theta %g, %d of %d channels; indexer %d x %d, block %d, top-%d, local %d, init %d\n",
      c.rope.type.c_str(), c.rope.theta, c.rope.rotary_dim, c.head_dim, c.index_heads,
      c.index_head_dim, c.index_block_size, c.index_topk_blocks, c.index_local_blocks,
      c.index_init_blocks);
  std::printf("quantization %s: linears %s, experts %s\n",
              c.quant.method.empty() ? "none" : c.quant.method.c_str(),
              std::string(quant_scheme_name(c.quant.linear_scheme)).c_str(),
              std::string(quant_scheme_name(c.quant.expert_scheme)).c_str());
}

void run(InspectOptions o) {
  // A config.json is read as it is; a directory or a repo id names the model (dummy weights need
  // its config alone).
  if (!std::filesystem::is_regular_file(o.model)) {
    o.model = locate_model_dir(o.model, o.hub, o.load_format == "dummy" ? hub::FileSet::kConfig : hub::FileSet::kModel,
                               "MODEL");
  }
  ModelConfig config = load_model_config(o.model);
  if (o.num_layers > 0) override_num_layers(config, o.num_layers);
  print_config(config);
  const auto start = std::chrono::steady_clock::now();
  ModelWeights w;
  if (o.load_format == "dummy") {
    w = make_dummy_weights(config, o.seed);
  } else if (o.load_format == "auto" || o.load_format == "safetensors") {
    w = load_weights(config, o.model);
  } else {
    fail("--load-format '{}' is not supported (auto, safetensors or dummy)", o.load_format);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Totals t;
  t.add(w.lm_head);
  for (const auto& l : w.layers) {
    for (const auto* lw : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.attn.index_q,
                           &l.attn.index_k, &l.mlp.gate, &l.mlp.up, &l.mlp.down})
      t.add(*lw);
    for (const auto& e : l.mlp.experts) t.add(e.gate), t.add(e.up), t.add(e.down);
  }
  std::printf("%-14s %10s %12s\n", "format", "linears", "GB");
  double total = static_cast<double>(w.embed.nbytes());
  for (const auto& [name, cb] : t.by_format) {
    std::printf("%-14s %10lld %12.3f\n", name.c_str(), static_cast<long long>(cb.first),
                cb.second / 1e9);
    total += cb.second;
  }
  std::printf("%-14s %10s %12.3f\n", "embed", "", w.embed.nbytes() / 1e9);
  std::printf("weights %.3f GB in %.2f s (%s)\n", total / 1e9, s, o.load_format.c_str());
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "read config.json and load (or generate) the weights");
  cmd->add_option("model", opts->model,
                  "model directory (config.json + safetensors), config.json, or a Hugging Face repo id")
      ->required();
  add_hub_options(*cmd, opts->hub);
  cmd->add_option("--load-format", opts->load_format,
                  "auto | safetensors | dummy (random weights)");
  cmd->add_option("--num-layers", opts->num_layers, "keep only the first N layers");
  cmd->add_option("--seed", opts->seed, "seed of --load-format dummy");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace m3::app
