#include "hub/repo_id.h"

#include <cctype>

namespace m3::hub {
namespace {

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool valid_part(const std::string& part) {
  if (part.empty() || !word_char(part.front()) || !word_char(part.back())) return false;
  for (char c : part) {
    if (!word_char(c) && c != '-' && c != '.') return false;
  }
  return true;
}

}  // namespace

std::optional<RepoId> parse_repo_id(const std::string& text) {
  constexpr std::size_t kMaxLength = 96;
  if (text.empty() || text.size() > kMaxLength) return std::nullopt;
  if (text.find("--") != std::string::npos || text.find("..") != std::string::npos) return std::nullopt;
  const std::size_t slash = text.find('/');
  RepoId id;
  if (slash == std::string::npos) {
    id.name = text;
  } else {
    id.owner = text.substr(0, slash);
    id.name = text.substr(slash + 1);
    if (!valid_part(id.owner)) return std::nullopt;
  }
  if (!valid_part(id.name)) return std::nullopt;
  return id;
}

}  // namespace m3::hub
