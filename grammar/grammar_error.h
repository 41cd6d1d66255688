// The grammar engine's error: what a client gave (a schema, regex, grammar or choice list) cannot
// be compiled or enforced. `keyword` names the schema keyword, or the part of the spec, at fault,
// so that the server can answer 400 naming it.
#pragma once
#include <string>

#include "core/error.h"

namespace m3::grammar {

class GrammarError : public m3::Error {
 public:
  GrammarError(std::string keyword, const std::string& message)
      : m3::Error(message), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

}  // namespace m3::grammar
