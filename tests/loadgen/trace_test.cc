// The Weka trace parser: fields, sub-agents, the writer's round trip, and errors that name the
// file's line and the field.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loadgen/trace.h"

namespace m3::loadgen {
namespace {

const char* kSession =
    R"({"id":"s1","models":["m"],"block_size":64,"hash_id_scope":"local","system_tokens":10,"tool_tokens":20,)"
    R"("requests":[{"t":0,"type":"n","model":"m","in":100,"out":5,"hash_ids":[1,2],"api_time":1.5,"think_time":0},)"
    R"({"t":2,"type":"subagent","agent_id":"a1","subagent_type":"Explore","status":"completed","models":["m"],)"
    R"("requests":[{"t":2,"type":"s","model":"m","in":64,"out":3,"hash_ids":[9],"ttft":0.1}]},)"
    R"({"t":9,"type":"s","model":"m","in":130,"out":7,"hash_ids":[1,2,3],"think_time":4.5}]})";

std::string error_of(const std::string& line) {
  try {
    parse_session(line, "traces.jsonl:7");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Trace, ParsesRequestsAndSubagents) {
  const Session s = parse_session(kSession, "x:1");
  EXPECT_EQ(s.id, "s1");
  EXPECT_EQ(s.block_size, 64);
  EXPECT_FALSE(s.global_hash_scope);
  EXPECT_EQ(s.main.system_tokens, 10);
  EXPECT_EQ(s.main.tool_tokens, 20);
  ASSERT_EQ(s.main.steps.size(), 3u);
  const TraceRequest& first = *s.main.steps[0].request;
  EXPECT_EQ(first.in, 100);
  EXPECT_EQ(first.out, 5);
  EXPECT_EQ(first.hash_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_DOUBLE_EQ(*first.api_time, 1.5);
  ASSERT_TRUE(s.main.steps[1].subagent);
  EXPECT_EQ(s.main.steps[1].subagent->id, "a1");
  EXPECT_FALSE(s.main.steps[1].subagent->background);
  EXPECT_TRUE(s.main.steps[1].subagent->steps[0].request->streaming);
  EXPECT_DOUBLE_EQ(*s.main.steps[2].request->think_time, 4.5);
  EXPECT_EQ(all_requests(s.main).size(), 3u);
}

TEST(Trace, WriterRoundTrips) {
  const std::vector<Session> in = {parse_session(kSession, "x:1")};
  const std::string path = ::testing::TempDir() + "/loadgen_roundtrip.jsonl";
  write_traces(path, in);
  const std::vector<Session> back = read_traces(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(session_to_json(back[0]), session_to_json(in[0]));
  EXPECT_EQ(back[0].source, path + ":1");
  std::remove(path.c_str());
}

TEST(Trace, ErrorsNameTheLineAndTheField) {
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"n","in":10,"out":"five"}]})"),
            "traces.jsonl:7: requests[0].out: expected an integer >= 0, got \"five\"");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"n","out":1}]})"), "traces.jsonl:7: requests[0].in: missing");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"n","in":10,"out":1,"hash_ids":[1,-2]}]})"),
            "traces.jsonl:7: requests[0].hash_ids[1]: expected an integer >= 0, got -2");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"n","in":130,"out":1,"hash_ids":[1]}]})"),
            "traces.jsonl:7: requests[0].hash_ids: 1 ids for in=130 tokens, expected ceil(130/64) = 3");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"subagent","requests":[{"t":-1,"type":"n","in":1,"out":1}]}]})"),
            "traces.jsonl:7: requests[0].requests[0].t: expected a finite number >= 0, got -1");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[{"t":0,"type":"x"}]})"),
            "traces.jsonl:7: requests[0].type: unknown type 'x' (expected \"n\", \"s\" or \"subagent\")");
  EXPECT_EQ(error_of(R"({"requests":[]})"), "traces.jsonl:7: id: missing");
  EXPECT_EQ(error_of(R"({"id":"s","requests":[]})"), "traces.jsonl:7: requests: the session has no request");
  EXPECT_EQ(error_of(R"({"id":"s","hash_id_scope":"galaxy","requests":[]})"),
            "traces.jsonl:7: hash_id_scope: expected \"local\" or \"global\", got 'galaxy'");
  EXPECT_NE(error_of("{not json").find("traces.jsonl:7: not JSON"), std::string::npos);
}

TEST(Trace, FileErrorsNameTheLine) {
  const std::string path = ::testing::TempDir() + "/loadgen_bad.jsonl";
  {
    std::ofstream out(path);
    out << kSession << "\n\n" << R"({"id":"s","requests":[{"t":0,"type":"n","in":1}]})" << "\n";
  }
  try {
    read_traces(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":3: requests[0].out: missing");
  }
  std::remove(path.c_str());
}

TEST(Trace, ReadsJsonFilesAndDirectories) {
  const std::string dir = ::testing::TempDir() + "/loadgen_trace_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/b.jsonl") << kSession << "\n" << kSession << "\n";
    // One session spread over several lines, as kv-cache-tester writes them.
    std::ofstream(dir + "/a.json") << "{\n  \"id\": \"pretty\",\n  \"requests\": [{\"t\": 0, \"type\": \"n\", "
                                      "\"in\": 3, \"out\": 1}]\n}\n";
    std::ofstream(dir + "/notes.txt") << "ignored";
  }
  const std::vector<Session> all = read_traces(dir);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].id, "pretty");
  EXPECT_EQ(all[0].source, dir + "/a.json");
  EXPECT_EQ(all[2].source, dir + "/b.jsonl:2");
  EXPECT_EQ(read_traces(dir + "/a.json").size(), 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace m3::loadgen
