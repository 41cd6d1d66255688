// m3serve: one binary, subcommands in app/cmd_*.cc.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>

#include "app/commands.h"
#include "app/option_suggestion.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // A write to a connection whose peer is gone (an HTTP client, or another node's process under
  // --nnodes) must come back as an error the caller reports (EPIPE), not end the process
  // silently: Gloo's transport does not ask for MSG_NOSIGNAL on every write.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"m3serve: an inference server for the MiniMax-M3 model family"};
  app.require_subcommand(1);
  app.set_version_flag("--version", M3SERVE_VERSION);
  m3::app::register_version(app);
  m3::app::register_render_chat(app);
  m3::app::register_tokenize(app);
  m3::app::register_generate(app);
  m3::app::register_score(app);
  m3::app::register_inspect(app);
  m3::app::register_plan(app);
  m3::app::register_serve(app);
  m3::app::register_bench_serve(app);
  m3::app::register_bench_latency(app);
  m3::app::register_bench_throughput(app);
  m3::app::register_bench_http(app);
  m3::app::register_bench_agentic(app);
  m3::app::expand_vllm_short_options(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    // Also after another error (a required option missing), a misspelling may be its cause.
    std::fputs(m3::app::unknown_option_hints(app).c_str(), stderr);
    return status;
  } catch (const m3::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
