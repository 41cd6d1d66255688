// The structured-output fields of a request, as vLLM and OpenAI spell them, into one spec
// (grammar/structured_output.h):
//   response_format: {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name",
//                    "schema", "strict"}} | {"type": "text"}
//   structured_outputs: {"json": schema (object or JSON text), "regex", "choice", "grammar",
//                        "json_object": true}  (vLLM; one of them)
//   guided_json, guided_regex, guided_choice, guided_grammar  (vLLM's older names)
// At most one of them may constrain a request; options m3serve cannot honour (whitespace
// patterns, structural tags, a backend choice) are 400s naming the field.
#pragma once
#include <optional>

#include "grammar/structured_output.h"
#include "server/json_fields.h"

namespace m3::server {

std::optional<grammar::StructuredOutputSpec> parse_structured_output(const Json& body);

}  // namespace m3::server
