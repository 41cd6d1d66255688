#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.h"

namespace m3::app {

void register_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "print the version and build configuration");
  cmd->callback([] {
    std::printf("m3serve %s (cuda: %s)\n", M3SERVE_VERSION, M3SERVE_WITH_CUDA ? "yes" : "no");
  });
}

}  // namespace m3::app
