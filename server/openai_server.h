// The OpenAI-compatible server: the routes of server/routes.h on an HttpServer, with readiness and
// graceful draining. The serve command owns the model and the engine and hands them over with
// set_model() once loaded.
#pragma once
#include <chrono>
#include <functional>
#include <memory>

#include "server/http_server.h"
#include "server/server_context.h"

namespace m3::server {

class OpenAIServer {
 public:
  explicit OpenAIServer(ServeOptions options);
  ~OpenAIServer();

  // Binds options.host:port (0: a free port) and starts answering; /health is 503 and model
  // routes answer 503 until set_model(). Returns the port. Throws m3::Error if it cannot bind.
  int start();
  void set_model(std::shared_ptr<const ModelContext> model);

  // Graceful shutdown: new requests get 503 and /health turns 503; requests in flight may finish
  // for up to `grace`; then `abort_in_flight` is called (it should make the engine abort them)
  // and their handlers get a moment to send what they have. Finally the HTTP server stops.
  void drain_and_stop(std::chrono::milliseconds grace,
                      const std::function<void()>& abort_in_flight);
  void stop();

  ServerContext& context() { return context_; }

 private:
  ServerContext context_;
  HttpServer http_;
};

}  // namespace m3::server
