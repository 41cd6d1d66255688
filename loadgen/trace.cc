#include "loadgen/trace.h"

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace m3::loadgen {

using nlohmann::json;

namespace {

// Reads fields of one JSON object, naming the session's line and the field's path in errors.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where, std::string path)
      : object_(object), where_(std::move(where)), path_(std::move(path)) {
    M3_CHECK(object_.is_object(), "{}: {}: expected an object", where_, path_.empty() ? "session" : path_);
  }

  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json* find(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  const json& need(const std::string& key) const {
    const json* v = find(key);
    M3_CHECK(v != nullptr, "{}: {}: missing", where_, name(key));
    return *v;
  }

  double number(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr && fallback) return *fallback;
    M3_CHECK(v != nullptr, "{}: {}: missing", where_, name(key));
    M3_CHECK(v->is_number(), "{}: {}: expected a number, got {}", where_, name(key), v->dump());
    const double x = v->get<double>();
    M3_CHECK(std::isfinite(x) && x >= 0.0, "{}: {}: expected a finite number >= 0, got {}", where_, name(key),
             v->dump());
    return x;
  }

  std::optional<double> optional_number(const std::string& key) const {
    if (find(key) == nullptr) return std::nullopt;
    return number(key);
  }

  int64_t count(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr && fallback) return *fallback;
    M3_CHECK(v != nullptr, "{}: {}: missing", where_, name(key));
    M3_CHECK(v->is_number_integer() && v->get<int64_t>() >= 0, "{}: {}: expected an integer >= 0, got {}", where_,
             name(key), v->dump());
    return v->get<int64_t>();
  }

  std::string text(const std::string& key, std::optional<std::string> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr && fallback) return *fallback;
    M3_CHECK(v != nullptr, "{}: {}: missing", where_, name(key));
    M3_CHECK(v->is_string(), "{}: {}: expected a string, got {}", where_, name(key), v->dump());
    return v->get<std::string>();
  }

  const std::string& where() const { return where_; }

 private:
  const json& object_;
  std::string where_;
  std::string path_;
};

TraceRequest parse_request(const FieldReader& r, const std::string& type, int64_t block_size) {
  TraceRequest q;
  q.t = r.number("t");
  q.model = r.text("model", "");
  q.in = r.count("in");
  q.out = r.count("out");
  q.api_time = r.optional_number("api_time");
  q.think_time = r.optional_number("think_time");
  q.streaming = type == "s";
  if (const json* ids = r.find("hash_ids")) {
    M3_CHECK(ids->is_array(), "{}: {}: expected an array of block ids", r.where(), r.name("hash_ids"));
    for (size_t i = 0; i < ids->size(); ++i) {
      const json& id = (*ids)[i];
      M3_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: {}[{}]: expected an integer >= 0, got {}",
               r.where(), r.name("hash_ids"), i, id.dump());
      q.hash_ids.push_back(id.get<int64_t>());
    }
  }
  // Each block holds block_size tokens, the last one the rest: the ids must cover `in` exactly
  // (or be absent, in which case the prompt has no shared blocks).
  if (!q.hash_ids.empty()) {
    const int64_t blocks = (q.in + block_size - 1) / block_size;
    M3_CHECK(static_cast<int64_t>(q.hash_ids.size()) == blocks,
             "{}: {}: {} ids for in={} tokens, expected ceil({}/{}) = {}", r.where(), r.name("hash_ids"),
             q.hash_ids.size(), q.in, q.in, block_size, blocks);
  }
  return q;
}

std::vector<AgentStep> parse_steps(const FieldReader& parent, const std::string& key, int64_t block_size, int depth) {
  M3_CHECK(depth < 16, "{}: {}: sub-agents nested deeper than 16", parent.where(), parent.name(key));
  const json& list = parent.need(key);
  M3_CHECK(list.is_array(), "{}: {}: expected an array", parent.where(), parent.name(key));
  std::vector<AgentStep> steps;
  for (size_t i = 0; i < list.size(); ++i) {
    FieldReader r(list[i], parent.where(), fmt::format("{}[{}]", parent.name(key), i));
    const std::string type = r.text("type");
    AgentStep step;
    if (type == "n" || type == "s") {
      step.request = parse_request(r, type, block_size);
    } else if (type == "subagent") {
      auto agent = std::make_shared<Agent>();
      agent->id = r.text("agent_id", fmt::format("agent_{}", i));
      agent->subagent_type = r.text("subagent_type", "");
      agent->t = r.number("t");
      agent->background = r.text("status", "completed") == "async_launched";
      agent->system_tokens = r.count("system_tokens", 0);
      agent->tool_tokens = r.count("tool_tokens", 0);
      agent->steps = parse_steps(r, "requests", block_size, depth + 1);
      step.subagent = std::move(agent);
    } else {
      fail("{}: {}: unknown type '{}' (expected \"n\", \"s\" or \"subagent\")", r.where(), r.name("type"), type);
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

void collect(const Agent& agent, std::vector<const TraceRequest*>& out) {
  for (const AgentStep& s : agent.steps) {
    if (s.request) out.push_back(&*s.request);
    if (s.subagent) collect(*s.subagent, out);
  }
}

json request_to_json(const TraceRequest& q) {
  json j = {{"t", q.t}, {"type", q.streaming ? "s" : "n"}, {"model", q.model}, {"in", q.in}, {"out", q.out},
            {"hash_ids", q.hash_ids}};
  if (q.api_time) j["api_time"] = *q.api_time;
  if (q.think_time) j["think_time"] = *q.think_time;
  return j;
}

json steps_to_json(const std::vector<AgentStep>& steps) {
  json list = json::array();
  for (const AgentStep& s : steps) {
    if (s.request) {
      list.push_back(request_to_json(*s.request));
      continue;
    }
    const Agent& a = *s.subagent;
    list.push_back({{"t", a.t}, {"type", "subagent"}, {"agent_id", a.id}, {"subagent_type", a.subagent_type},
                    {"status", a.background ? "async_launched" : "completed"}, {"system_tokens", a.system_tokens},
                    {"tool_tokens", a.tool_tokens}, {"requests", steps_to_json(a.steps)}});
  }
  return list;
}

}  // namespace

Session parse_session(const std::string& line, const std::string& where) {
  json doc;
  try {
    doc = json::parse(line);
  } catch (const json::parse_error& e) {
    fail("{}: not JSON ({})", where, e.what());
  }
  FieldReader r(doc, where, "");
  Session s;
  s.source = where;
  s.id = r.text("id");
  s.block_size = r.count("block_size", 64);
  M3_CHECK(s.block_size > 0, "{}: block_size: must be > 0", where);
  const std::string scope = r.text("hash_id_scope", "local");
  M3_CHECK(scope == "local" || scope == "global", "{}: hash_id_scope: expected \"local\" or \"global\", got '{}'",
           where, scope);
  s.global_hash_scope = scope == "global";
  if (const json* models = r.find("models")) {
    M3_CHECK(models->is_array(), "{}: models: expected an array of strings", where);
    for (const json& m : *models) {
      M3_CHECK(m.is_string(), "{}: models: expected an array of strings", where);
      s.models.push_back(m.get<std::string>());
    }
  }
  s.main.id = "main";
  s.main.system_tokens = r.count("system_tokens", 0);
  s.main.tool_tokens = r.count("tool_tokens", 0);
  s.main.steps = parse_steps(r, "requests", s.block_size, 0);
  M3_CHECK(!all_requests(s.main).empty(), "{}: requests: the session has no request", where);
  return s;
}

namespace {

void read_jsonl(const std::string& path, std::vector<Session>& sessions) {
  std::ifstream in(path);
  M3_CHECK(in.good(), "cannot open trace file '{}'", path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    sessions.push_back(parse_session(line, fmt::format("{}:{}", path, number)));
  }
}

// A kv-cache-tester trace file: one session, the whole file (it may span many lines).
void read_json(const std::string& path, std::vector<Session>& sessions) {
  std::ifstream in(path);
  M3_CHECK(in.good(), "cannot open trace file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  sessions.push_back(parse_session(text.str(), path));
}

}  // namespace

std::vector<Session> read_traces(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<Session> sessions;
  if (fs::is_directory(path)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".json" || ext == ".jsonl")) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      if (f.extension() == ".json") {
        read_json(f.string(), sessions);
      } else {
        read_jsonl(f.string(), sessions);
      }
    }
  } else if (fs::path(path).extension() == ".json") {
    read_json(path, sessions);
  } else {
    read_jsonl(path, sessions);
  }
  M3_CHECK(!sessions.empty(), "trace file '{}' holds no session", path);
  return sessions;
}

json session_to_json(const Session& s) {
  return {{"id", s.id},
          {"models", s.models},
          {"block_size", s.block_size},
          {"hash_id_scope", s.global_hash_scope ? "global" : "local"},
          {"system_tokens", s.main.system_tokens},
          {"tool_tokens", s.main.tool_tokens},
          {"requests", steps_to_json(s.main.steps)}};
}

void write_traces(const std::string& path, const std::vector<Session>& sessions) {
  std::ofstream out(path);
  M3_CHECK(out.good(), "cannot write trace file '{}'", path);
  for (const Session& s : sessions) out << session_to_json(s).dump() << '\n';
  M3_CHECK(out.good(), "writing trace file '{}' failed", path);
}

std::vector<const TraceRequest*> all_requests(const Agent& agent) {
  std::vector<const TraceRequest*> out;
  collect(agent, out);
  return out;
}

}  // namespace m3::loadgen
