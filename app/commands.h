// Each subcommand of the m3serve binary registers itself on the CLI11 app from its own file.
#pragma once

namespace CLI {
class App;
}

namespace m3::app {

// Every register_* adds one subcommand whose callback runs it; the callback throws m3::Error on
// bad input, which main() prints and turns into exit status 1.
void register_version(CLI::App& app);
void register_render_chat(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);
void register_score(CLI::App& app);
void register_inspect(CLI::App& app);
void register_plan(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench_serve(CLI::App& app);
// bench latency / throughput join the `bench` group register_bench_serve creates: call them after it.
void register_bench_latency(CLI::App& app);
void register_bench_throughput(CLI::App& app);
void register_bench_http(CLI::App& app);
void register_bench_agentic(CLI::App& app);

// Rewrites vLLM's multi-letter short options (-tp) that CLI11 cannot parse into their long form,
// in place, so `vllm serve` command lines work unchanged with `m3serve serve` (and `m3serve plan`).
void expand_vllm_short_options(int argc, char** argv);

}  // namespace m3::app
