// Weka-format agent traces (the kv-cache-tester / AgentX corpus layout), one session per JSONL
// line. docs/agentic-bench.md defines every field; this file is the parser and the writer.
//
// A session is a tree of agents: the main agent's steps are requests and sub-agent markers; a
// sub-agent holds its own steps (nested sub-agents allowed). A request carries its input and
// output token counts and the hash ids of its input's 64-token blocks (equal ids = equal blocks).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3::loadgen {

struct TraceRequest {
  double t = 0.0;           // seconds from the session's start
  std::string model;        // as recorded; the replay sends its own --model
  int64_t in = 0;           // input tokens (the whole context)
  int64_t out = 0;          // output tokens (replayed as max_tokens with ignore_eos)
  std::vector<int64_t> hash_ids;  // one id per block of `in`, the last block may be partial
  std::optional<double> api_time;    // recorded server time, seconds
  std::optional<double> think_time;  // recorded client delay before this request, seconds
  bool streaming = false;   // type "s" (replayed the same as "n")
};

struct Agent;

// One step of an agent: a request, or a sub-agent it spawns there.
struct AgentStep {
  std::optional<TraceRequest> request;
  std::shared_ptr<const Agent> subagent;
};

struct Agent {
  std::string id;             // "main" for the session's root, else the marker's agent_id
  std::string subagent_type;  // the marker's subagent_type ("" for main)
  double t = 0.0;             // spawn time (sub-agents)
  // "async_launched": the parent does not wait for it (a background sub-agent).
  bool background = false;
  int64_t system_tokens = 0;
  int64_t tool_tokens = 0;
  std::vector<AgentStep> steps;
};

struct Session {
  std::string id;
  std::vector<std::string> models;
  int64_t block_size = 64;
  bool global_hash_scope = false;  // "global": equal ids are equal blocks across sessions too
  Agent main;
  std::string source;  // "FILE:LINE", for messages
};

// Parses one JSONL line. Throws m3::Error naming `where` (FILE:LINE) and the field path
// (requests[3].hash_ids[2]) of the first problem.
Session parse_session(const std::string& line, const std::string& where);
// A .jsonl file (every non-empty line a session), a .json file (one session, kv-cache-tester's
// one file per trace), or a directory of both (sorted by name). Throws on the first bad session
// (naming FILE:LINE, or FILE for .json), or when there is none.
std::vector<Session> read_traces(const std::string& path);

nlohmann::json session_to_json(const Session& session);
void write_traces(const std::string& path, const std::vector<Session>& sessions);

// Every request of the agent and its sub-agents (depth first), for counting.
std::vector<const TraceRequest*> all_requests(const Agent& agent);

}  // namespace m3::loadgen
