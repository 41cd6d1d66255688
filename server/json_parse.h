// Parsing JSON that comes from clients (request bodies, and the JSON strings inside them that are
// parsed too, such as a history tool call's "arguments"): nesting is capped while parsing, so no
// later recursive walk (templates, schema coercion, serialization) can run out of stack on
// client data; a number a double cannot hold is a 400 naming its field, not an infinity.
#pragma once
#include <string_view>

#include "server/json_fields.h"

namespace m3::server {

// Deep enough for any real schema or message; shallow enough that a recursive walk of this many
// levels uses a few hundred KiB of stack at most.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text` or throws ApiError 400. `what` names the text in messages ("the request body");
// `field`, when given, is the request field the text came from: it prefixes the paths in
// messages and is the error's param.
Json parse_client_json(std::string_view text, std::string_view what, std::string_view field = {});

}  // namespace m3::server
