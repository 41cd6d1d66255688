#include "loadgen/trace_generator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace m3::loadgen {

namespace {

// std::lognormal_distribution's output differs between standard libraries; the seeded corpus
// must not, so draws are made from the engine's raw 64-bit words.
class Draws {
 public:
  explicit Draws(uint64_t seed) : engine_(seed) {}
  double uniform() { return (engine_() >> 11) * 0x1.0p-53; }
  double normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  int64_t tokens(double median, double sigma, int64_t min = 1) {
    return std::max<int64_t>(min, static_cast<int64_t>(std::llround(lognormal(median, sigma))));
  }

 private:
  std::mt19937_64 engine_;
};

// The blocks of one agent's growing context: full blocks keep their ids, a partial last block
// gets a fresh id once it changes (as a hash of its tokens would).
struct Context {
  int64_t tokens = 0;
  std::vector<int64_t> ids;

  void grow(int64_t add, int64_t block_size, int64_t& next_id) {
    const int64_t kept_full = tokens / block_size;
    ids.resize(static_cast<size_t>(kept_full));
    tokens += add;
    const int64_t blocks = (tokens + block_size - 1) / block_size;
    while (static_cast<int64_t>(ids.size()) < blocks) ids.push_back(next_id++);
  }
};

struct Builder {
  Builder(const GeneratorOptions& options, Draws& draws) : o(options), draw(draws) {}
  const GeneratorOptions& o;
  Draws& draw;
  int64_t next_id = 1;
  int64_t shared_prefix_blocks = 0;  // the session's system + tools blocks, shared by sub-agents
  std::vector<int64_t> prefix_ids;

  // Appends the agent's requests starting at `t`; returns the time its last request ends.
  double agent(Agent& a, double t, bool is_main, int depth) {
    const double turns_median = is_main ? o.median_turns : o.subagent_median_turns;
    const int turns = static_cast<int>(std::max<int64_t>(1, draw.tokens(turns_median, 0.8)));
    Context ctx;
    // Sub-agents start from the session's tools prefix (same ids: shared blocks) and a prompt.
    if (is_main) {
      ctx.grow(a.system_tokens + a.tool_tokens, o.block_size, next_id);
      prefix_ids = ctx.ids;
      shared_prefix_blocks = (a.system_tokens + a.tool_tokens) / o.block_size;
    } else {
      ctx.ids.assign(prefix_ids.begin(), prefix_ids.begin() + shared_prefix_blocks);
      ctx.tokens = shared_prefix_blocks * o.block_size;
      a.tool_tokens = ctx.tokens;
      ctx.grow(draw.tokens(800, 0.8), o.block_size, next_id);
    }
    int64_t last_out = 0, prev_in = 0;
    for (int turn = 0; turn < turns; ++turn) {
      if (turn > 0) ctx.grow(last_out + draw.tokens(o.median_new_tokens, 1.2), o.block_size, next_id);
      TraceRequest q;
      q.think_time = turn == 0 ? 0.0
                               : (is_main ? draw.lognormal(o.think_median_s, o.think_sigma)
                                          : draw.lognormal(o.subagent_think_median_s, 1.0));
      q.out = draw.tokens(o.median_output_tokens, 1.0);
      q.in = ctx.tokens;
      if (q.in + q.out > o.max_context_tokens) break;
      t += *q.think_time;
      q.t = t;
      q.model = is_main ? "synthetic-main" : "synthetic-sub";
      q.hash_ids = ctx.ids;
      q.streaming = true;
      // A recorded server time: prefill of the uncached part plus decode, at plausible rates.
      q.api_time = 0.5 + q.out / 60.0 + (q.in - prev_in) / 20000.0;
      prev_in = q.in;
      t += *q.api_time;
      last_out = q.out;
      a.steps.push_back(AgentStep{q, nullptr});
      // Sub-agents spawn after a main-agent turn; the next turn waits for them (they run in parallel).
      if (is_main && depth == 0 && turn + 1 < turns && draw.uniform() < o.subagent_probability) {
        const int count = 1 + static_cast<int>(draw.uniform() * 3.0);
        double joined = t;
        for (int k = 0; k < count; ++k) {
          auto sub = std::make_shared<Agent>();
          sub->id = fmt::format("agent_{:03}", next_id % 1000);
          sub->subagent_type = "Explore";
          sub->t = t;
          joined = std::max(joined, agent(*sub, t, false, depth + 1));
          a.steps.push_back(AgentStep{std::nullopt, std::move(sub)});
        }
        t = joined;
      }
    }
    return t;
  }
};

}  // namespace

std::vector<Session> generate_traces(const GeneratorOptions& o) {
  M3_CHECK(o.num_sessions > 0, "--num-sessions must be > 0");
  M3_CHECK(o.block_size > 0, "the block size must be > 0");
  Draws draw(o.seed);
  std::vector<Session> sessions;
  for (int i = 0; i < o.num_sessions; ++i) {
    Session s;
    s.id = fmt::format("synthetic_{:04}", i);
    s.models = {"synthetic-main", "synthetic-sub"};
    s.block_size = o.block_size;
    s.main.id = "main";
    s.main.system_tokens = draw.tokens(o.median_system_tokens, 0.4);
    s.main.tool_tokens = draw.tokens(o.median_tool_tokens, 0.3, 0);
    Builder b(o, draw);
    b.agent(s.main, 0.0, true, 0);
    if (s.main.steps.empty()) {
      // Even the first turn is over the context limit: one small request keeps the session valid.
      TraceRequest q;
      q.in = std::min<int64_t>(o.max_context_tokens / 2, s.main.system_tokens + s.main.tool_tokens);
      q.in = std::max<int64_t>(q.in, 1);
      q.out = 1;
      q.think_time = 0.0;
      for (int64_t k = 0; k < (q.in + o.block_size - 1) / o.block_size; ++k) q.hash_ids.push_back(k + 1);
      s.main.steps.push_back(AgentStep{q, nullptr});
    }
    sessions.push_back(std::move(s));
  }
  return sessions;
}

}  // namespace m3::loadgen
