#include "server/json_parse.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "server/api_error.h"

namespace m3::server {
namespace {

// nlohmann's SAX interface, building the same DOM as Json::parse, with a depth cap and with
// the path of the value being parsed kept, for the messages. The parser itself does not recurse.
class CappedDomBuilder {
 public:
  CappedDomBuilder(std::string_view what, std::string_view field) : what_(what), field_(field) {}

  Json take() { return std::move(root_); }

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool value) { return add(Json(value)); }
  bool number_integer(Json::number_integer_t value) { return add(Json(value)); }
  bool number_unsigned(Json::number_unsigned_t value) { return add(Json(value)); }
  bool number_float(Json::number_float_t value, const Json::string_t&) { return add(Json(value)); }
  bool string(Json::string_t& value) { return add(Json(std::move(value))); }
  bool binary(Json::binary_t& value) { return add(Json::binary(std::move(value))); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool key(Json::string_t& key) {
    key_ = std::move(key);
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& e) {
    const std::string path = value_path();
    if (e.id == 406) {  // out_of_range: a number that overflows a double
      throw ApiError(400,
                     fmt::format("'{}' is a number too large to represent (in {})", path, what_),
                     path);
    }
    throw ApiError(400, fmt::format("{} is not valid JSON (at byte {}): {}", what_, position,
                                    e.what()),
                   std::string(field_));
  }

 private:
  struct Frame {
    Json* container;
    std::string key;  // objects: the key of the member being parsed
  };

  Json& insert(Json value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return root_;
    }
    Json& parent = *frames_.back().container;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(value);
    frames_.back().key = std::move(key_);
    return slot;
  }
  bool add(Json value) {
    insert(std::move(value));
    return true;
  }
  bool open(Json container) {
    if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) {
      const std::string path = value_path();
      throw ApiError(400,
                     fmt::format("{} nests objects and arrays more than {} levels deep (at '{}')",
                                 what_, kMaxJsonDepth, path),
                     path);
    }
    Json& slot = insert(std::move(container));
    frames_.push_back({&slot, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  // Where the value being parsed sits: field.messages[2].content (array indices from the
  // containers' sizes, keys from the frames).
  std::string value_path() const {
    std::string path(field_);
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Json& c = *frames_[i].container;
      const bool innermost = i + 1 == frames_.size();
      if (c.is_array()) {
        // The element being parsed is the next one, unless a deeper frame is inside the last.
        const size_t index = innermost ? c.size() : c.size() - 1;
        path += fmt::format("[{}]", index);
      } else {
        const std::string& key = innermost ? key_ : frames_[i].key;
        if (!path.empty()) path += '.';
        path += key;
      }
    }
    return path.empty() ? std::string(what_) : path;
  }

  std::string_view what_;
  std::string_view field_;
  Json root_;
  std::vector<Frame> frames_;
  std::string key_;  // the key just read, for the value that follows
};

}  // namespace

Json parse_client_json(std::string_view text, std::string_view what, std::string_view field) {
  CappedDomBuilder builder(what, field);
  Json::sax_parse(text.begin(), text.end(), &builder);
  return builder.take();
}

}  // namespace m3::server
