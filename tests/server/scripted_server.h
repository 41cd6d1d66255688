// An OpenAIServer over the scripted test model (scripted_runner.h) with the bundled model's
// tokenizer and chat template: the real server, engine and text pipeline with known outputs.
// Used in-process by server_scripted_test and as the scripted_server program for the Python
// and Node client tests.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_core.h"
#include "server/openai_server.h"
#include "text/tokenizer.h"

namespace m3::testing {

struct ScriptedServerOptions {
  std::filesystem::path model_dir = "models/minimax-m3-tiny";
  // (trigger text, reply text): the first reply whose trigger occurs in the prompt is produced
  // after the last generation marker; an empty trigger matches every prompt.
  std::vector<std::pair<std::string, std::string>> replies;
  std::string marker = "]~b]ai\n";
  server::ServeOptions serve;
  int block_size = 16;
  int64_t num_kv_blocks = 512;
  EngineConfig engine;
  bool load_model = true;  // false: the server starts "loading" until publish_model()
};

class ScriptedServer {
 public:
  explicit ScriptedServer(ScriptedServerOptions options);
  ~ScriptedServer();

  int port() const { return port_; }
  EngineCore& engine() { return *engine_; }
  server::OpenAIServer& server() { return *server_; }
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Makes the model routes ready (when constructed with load_model = false).
  void publish_model();

 private:
  ScriptedServerOptions options_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<EngineCore> engine_;
  std::unique_ptr<server::OpenAIServer> server_;
  int port_ = 0;
};

}  // namespace m3::testing
