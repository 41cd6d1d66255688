// The checks `m3serve serve` runs before it starts, and its chat template. Options that cannot be
// honoured on this machine fail at start with a message naming the option (docs/reference.md
// D7).
#pragma once
#include <optional>
#include <string>

#include "app/model_loader.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace m3::app {

// Checks that never touch the GPU driver (serve calls it before blocking SIGINT/SIGTERM in every
// thread): the parallel layout against the model's config.json when there is one (the layout's
// own error names a dimension that does not divide), and the loader's own file-free checks
// (speculative decoding among them). Throws m3::Error naming the option.
void check_deployment_options(const ModelOptions& model_options, const EngineOptions& engine_options);

// --chat-template: a file, or the template text itself; empty: the model's own (none is fine:
// chat requests then get a 400 that says so).
std::optional<text::ChatTemplate> load_chat_template(const std::string& setting,
                                                     const std::string& model_dir,
                                                     const text::Tokenizer& tokenizer);

}  // namespace m3::app
