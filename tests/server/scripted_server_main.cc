// scripted_server: the OpenAI server over the scripted test model, as a program, for client tests
// (the official openai Node package, Python) that need known outputs such as tool calls.
//   scripted_server --model-dir DIR --replies FILE.json [--port 0] [--reasoning-parser P]
//                   [--tool-call-parser P] [--enable-auto-tool-choice]
// FILE.json: [{"trigger": "text in the prompt", "reply": "text the model says"}, ...].
// Prints "listening on http://127.0.0.1:PORT" on stderr and serves until SIGINT/SIGTERM.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/server/scripted_server.h"

int main(int argc, char** argv) {
  CLI::App app{"OpenAI server over a scripted test model"};
  std::string model_dir = "models/minimax-m3-tiny", replies_path;
  m3::testing::ScriptedServerOptions options;
  app.add_option("--model-dir", model_dir, "tokenizer and chat template");
  app.add_option("--replies", replies_path, "JSON list of {trigger, reply}")->required();
  app.add_option("--port", options.serve.port, "0: any free port");
  app.add_option("--reasoning-parser", options.serve.reasoning_parser);
  app.add_option("--tool-call-parser", options.serve.tool_call_parser);
  app.add_flag("--enable-auto-tool-choice", options.serve.enable_auto_tool_choice);
  app.add_flag("--enable-prompt-tokens-details", options.serve.enable_prompt_tokens_details);
  app.add_option("--served-model-name", options.serve.served_model_names);
  CLI11_PARSE(app, argc, argv);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  try {
    std::ifstream in(replies_path);
    nlohmann::json replies = nlohmann::json::parse(in);
    for (const auto& r : replies) options.replies.emplace_back(r.at("trigger"), r.at("reply"));
    options.model_dir = model_dir;
    m3::testing::ScriptedServer server(std::move(options));
    std::fprintf(stderr, "listening on http://127.0.0.1:%d\n", server.port());
    std::fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
