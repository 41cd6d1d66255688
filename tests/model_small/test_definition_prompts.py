#!/usr/bin/env python3
"""The verdict expert iteration trains on (tools/train/definition_prompts.py): which documents give
prompts, which completions are targets, and what counts as a looping line; and, with --m3serve,
gen_targets.py end to end on a few prompts through a live `m3serve serve` of the bundled model on
the CPU (its output format, its statistics, and that each target passes the verdict it was
chosen by)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
import definition_prompts as DP  # noqa: E402

M3SERVE = None

FUNCTION_DOC = '''# file: pkg/util.py
def clamp(x, lo, hi):
    """Clamp x to [lo, hi]."""
    return max(lo, min(hi, x))
'''
CLASS_DOC = '''# file: pkg/point.py
class Point:
    """A point in the plane."""

    def __init__(self, x, y):
        self.x = x
        self.y = y
'''
CHAT_PROMPT = "]~!b[]~b]user\nWrite `add(a, b)`.[e~[\n]~b]ai\n</mm:think>"
CHAT_DOC = CHAT_PROMPT + "```python\ndef add(a, b):\n    return a + b\n```[e~["
# Thinking enabled or adaptive: the prompt ends at the assistant marker, the turn opens the tags.
OPEN_CHAT_PROMPT = "]~!b[]~b]user\nWrite `sub(a, b)`.[e~[\n]~b]ai\n"
OPEN_CHAT_DOC = (OPEN_CHAT_PROMPT + "<mm:think>The user wants sub.</mm:think>```python\ndef sub(a, b):\n"
                 "    return a - b\n```[e~[")
TOOL_DOC = "]~!b[]~b]user\nAdd 1 and 2.[e~[\n]~b]ai\n<tool_call>...</tool_call>[e~["
NS = "]<]minimax[>["
TOOL_PROMPT = ("]~!b[]~b]developer\nYou are a helpful assistant.\n\n# Tools\n<tools>\n"
               '<tool>{"description": "Add two numbers.", "name": "add", "parameters": {"properties": '
               '{"a": {"type": "integer"}, "b": {"type": "integer"}, "note": {"type": "object"}}, '
               '"required": ["a", "b"], "type": "object"}}</tool>\n'
               '<tool>{"description": "Say hi.", "name": "hello", "parameters": {"properties": {}, '
               '"type": "object"}}</tool>\n</tools>[e~[\n]~b]user\nAdd 1 and 2.[e~[\n]~b]ai\n')


def call(name, args, think=""):
    """An assistant turn with one call in the M3 markup (text/templates/minimax_m3.jinja)."""
    tags = "".join(f"{NS}<{k}>{v}{NS}</{k}>" for k, v in args)
    return f"{think}{NS}<tool_call>\n{NS}<invoke name=\"{name}\">{tags}{NS}</invoke>\n{NS}</tool_call>"


TOOL_CALL = call("add", [("a", "1"), ("b", "2")])
TOOL_DOC_M3 = (TOOL_PROMPT + "</mm:think>" + TOOL_CALL + "[e~[\n]~b]tool\n<response>3</response>[e~[\n]~b]ai\n"
               "</mm:think>3.[e~[\n")


class Prompts(unittest.TestCase):
    def test_function_and_class_stop_after_the_docstring(self):
        kind, prompt = DP.prompt_of_document(FUNCTION_DOC)
        self.assertEqual(kind, "function")
        self.assertEqual(prompt, '# file: pkg/util.py\ndef clamp(x, lo, hi):\n    """Clamp x to [lo, hi]."""\n')
        kind, prompt = DP.prompt_of_document(CLASS_DOC)
        self.assertEqual(kind, "class")
        self.assertTrue(prompt.endswith('"""A point in the plane."""\n'))

    def test_chat_cut_after_the_assistant_marker_and_closed_think(self):
        self.assertEqual(DP.prompt_of_document(CHAT_DOC), ("chat", CHAT_PROMPT))

    def test_tool_exchange_cut_before_the_call(self):
        self.assertEqual(DP.prompt_of_document(TOOL_DOC_M3), ("tool", TOOL_PROMPT + "</mm:think>"))
        self.assertEqual(set(DP.offered_tools(TOOL_PROMPT)), {"add", "hello"})

    def test_documents_that_give_no_prompt(self):
        self.assertIsNone(DP.prompt_of_document(TOOL_DOC))  # no python block
        self.assertIsNone(DP.prompt_of_document("# file: a.py\ndef f():\n    return 1\n"))  # no docstring
        self.assertIsNone(DP.prompt_of_document('# file: a.py\ndef f():\n    """Only a docstring."""\n'))
        self.assertIsNone(DP.prompt_of_document("# file: a.py\nx = 1\n"))
        self.assertIsNone(DP.prompt_of_document("plain text"))


class Loops(unittest.TestCase):
    def test_exact_repeat_of_a_long_line(self):
        text = "    x = compute(a)\n    y = other(b)\n    x = compute(a)\n"
        self.assertEqual(DP.looping_lines(text), [2])

    def test_short_lines_repeat_freely(self):
        self.assertEqual(DP.looping_lines("    else:\n        return\n    else:\n        return\n"), [])

    def test_shape_repeated_more_than_three_times(self):
        three = "".join(f"    self.{n} = {n}_value\n" for n in ("alpha", "beta", "gamma"))
        self.assertEqual(DP.looping_lines(three), [])
        four = three + "    self.delta = delta_value\n"
        self.assertEqual(DP.looping_lines(four), [3])


class RepeatedRuns(unittest.TestCase):
    def test_a_unit_repeated_inside_a_line(self):
        self.assertTrue(DP.repeated_runs('    return f(x, prec=prec, prec=prec, prec=prec, prec=prec)'))
        self.assertTrue(DP.repeated_runs('I will call it with path="config", path="config", path="config", '
                                         'path="config", path="config".'))

    def test_ordinary_text_has_none(self):
        self.assertEqual(DP.repeated_runs("# " + "=" * 70), [])  # one character
        self.assertEqual(DP.repeated_runs("x = [0, 0, 0, 0]"), [])  # too short a unit
        self.assertEqual(DP.repeated_runs("f(a, a, a)\n"), [])


class ToolCalls(unittest.TestCase):
    def test_a_call_of_an_offered_tool(self):
        disabled = TOOL_PROMPT + "</mm:think>"  # thinking disabled: the prompt closes the tag
        self.assertTrue(DP.check_tool_call(disabled, TOOL_CALL, True))
        self.assertTrue(DP.check_tool_call(disabled, call("hello", []), True))
        self.assertTrue(DP.check_tool_call(TOOL_PROMPT, "</mm:think>" + TOOL_CALL, True))
        self.assertTrue(DP.check_tool_call(TOOL_PROMPT, call("add", [("a", "1"), ("b", "2")],
                                                             "<mm:think>Add them.</mm:think>"), True))
        nested = call("add", [("a", "1"), ("b", "2"), ("note", f"{NS}<k>v{NS}</k>")])
        self.assertTrue(DP.check_tool_call(disabled, nested, True))

    def test_the_turn_opens_as_the_template_writes_it(self):
        disabled = TOOL_PROMPT + "</mm:think>"
        self.assertFalse(DP.check_tool_call(TOOL_PROMPT, TOOL_CALL, True))  # no think tag at all
        self.assertFalse(DP.check_tool_call(TOOL_PROMPT, "Add them.</mm:think>" + TOOL_CALL, True))  # no opening
        self.assertFalse(DP.check_tool_call(TOOL_PROMPT, "<mm:think>Add them." + TOOL_CALL, True))  # not closed
        self.assertFalse(DP.check_tool_call(disabled, "<mm:think>Add.</mm:think>" + TOOL_CALL, True))

    def test_calls_an_agent_cannot_use(self):
        bad = {
            "not ended": (TOOL_CALL, False),
            "unknown tool": (call("sub", [("a", "1"), ("b", "2")]), True),
            "missing required": (call("add", [("a", "1")]), True),
            "unknown parameter": (call("add", [("a", "1"), ("b", "2"), ("c", "3")]), True),
            "repeated parameter": (call("add", [("a", "1"), ("a", "1"), ("b", "2")]), True),
            "unclosed tag": (TOOL_CALL.replace(f"{NS}</b>", ""), True),
            "unclosed block": (TOOL_CALL[:-len(NS + "</tool_call>")], True),
            "words after the block": (TOOL_CALL + " done", True),
            "two blocks": (TOOL_CALL + TOOL_CALL, True),
            "no call": ("3", True),
        }
        for why, (text, ended) in bad.items():
            with self.subTest(why):
                self.assertFalse(DP.check_tool_call(TOOL_PROMPT + "</mm:think>", text, ended))

    def test_tool_targets(self):
        disabled = TOOL_PROMPT + "</mm:think>"
        self.assertEqual(DP.target_text("tool", disabled, TOOL_CALL, True), (True, TOOL_CALL))
        looping = call("add", [("a", "1"), ("b", "2")], "<mm:think>" + 'with a="1", ' * 6 + "</mm:think>")
        self.assertEqual(DP.target_text("tool", TOOL_PROMPT, looping, True), (True, None))
        self.assertEqual(DP.target_text("tool", disabled, TOOL_CALL, False), (False, None))

    def test_kinds_of_the_prompt_order(self):
        with tempfile.TemporaryDirectory() as tmp:
            defs = os.path.join(tmp, "defs.jsonl")
            with open(defs, "w") as fh:
                for doc in (FUNCTION_DOC, TOOL_DOC_M3, CHAT_DOC):
                    fh.write(json.dumps(doc) + "\n")
            self.assertEqual(sorted(k for k, _ in DP.prompts_in_order(defs, 0)), ["chat", "function"])
            self.assertEqual(sorted(k for k, _ in DP.prompts_in_order(defs, 0, DP.ALL_KINDS)),
                             ["chat", "function", "tool"])


class ThinkingModes(unittest.TestCase):
    def test_held_out_chat_prompts_in_adaptive_thinking(self):
        import eval_code
        with open(os.path.join(ROOT, "tests", "model_small", "code_prompts.json")) as fh:
            chat = [p["prompt"] for p in json.load(fh)["prompts"] if p["kind"] == "chat"]
        self.assertEqual(len(chat), 30)
        for prompt in chat:
            adaptive = eval_code.with_thinking(prompt, "adaptive")
            self.assertIn(eval_code.THINKING_LINES["adaptive"], adaptive)
            self.assertNotIn(eval_code.THINKING_LINES["disabled"], adaptive)
            self.assertTrue(adaptive.endswith(DP.ASSISTANT))  # the model opens the think tags itself
            self.assertEqual(eval_code.with_thinking(prompt, "disabled"), prompt)


class ForcedThinkOpen(unittest.TestCase):
    def test_only_sampled_open_chat_and_tool_prompts(self):
        import gen_targets
        self.assertTrue(gen_targets.forces_think_open("chat", OPEN_CHAT_PROMPT, "sampled", 1))
        self.assertTrue(gen_targets.forces_think_open("tool", TOOL_PROMPT, "sampled", 1))
        self.assertFalse(gen_targets.forces_think_open("chat", OPEN_CHAT_PROMPT, "greedy", 1))  # measures the model
        self.assertFalse(gen_targets.forces_think_open("chat", CHAT_PROMPT, "sampled", 1))  # thinking disabled
        self.assertFalse(gen_targets.forces_think_open("function", "# file: a.py\n", "sampled", 1))
        self.assertFalse(gen_targets.forces_think_open("chat", OPEN_CHAT_PROMPT, "sampled", 0))


class Targets(unittest.TestCase):
    def setUp(self):
        _, self.prompt = DP.prompt_of_document(FUNCTION_DOC)

    def test_a_definition_that_ends_is_a_target_up_to_its_end(self):
        ok, target = DP.target_text("function", self.prompt, "    return max(lo, min(hi, x))\n\nprint(1)\n", False)
        self.assertTrue(ok)
        self.assertEqual(target, "    return max(lo, min(hi, x))\n")

    def test_a_loop_parses_but_is_no_target(self):
        body = "    value = clamp_inner(x)\n" * 5
        self.assertEqual(DP.target_text("function", self.prompt, body, False), (True, None))

    def test_a_loop_inside_a_line_is_no_target(self):
        body = "    return clamp_inner(x, lo=lo, lo=lo, lo=lo, lo=lo, lo=lo)\n"
        self.assertEqual(DP.target_text("function", self.prompt, body, False), (True, None))

    def test_chat_answers_keep_the_think_tags_of_the_template(self):
        answer = "```python\ndef sub(a, b):\n    return a - b\n```"
        thought = "<mm:think>The user wants sub.</mm:think>" + answer
        self.assertEqual(DP.target_text("chat", OPEN_CHAT_PROMPT, thought, True), (True, thought))
        self.assertEqual(DP.target_text("chat", OPEN_CHAT_PROMPT, "</mm:think>" + answer, True),
                         (True, "</mm:think>" + answer))
        # the reasoning without its tags parses but would reach a client as the answer: no target
        self.assertEqual(DP.target_text("chat", OPEN_CHAT_PROMPT, "The user wants sub." + answer, True), (True, None))
        self.assertEqual(DP.target_text("chat", CHAT_PROMPT, thought, True), (True, None))  # thinking disabled

    def test_a_syntax_error_fails(self):
        self.assertEqual(DP.target_text("function", self.prompt, "    return (x\n", False), (False, None))

    def test_chat_target_ends_at_the_fence_unless_the_turn_ended(self):
        answer = "```python\ndef add(a, b):\n    return a + b\n```\nMore words"
        self.assertEqual(DP.target_text("chat", CHAT_PROMPT, answer, False),
                         (True, "```python\ndef add(a, b):\n    return a + b\n```"))
        self.assertEqual(DP.target_text("chat", CHAT_PROMPT, answer, True), (True, answer))
        self.assertEqual(DP.target_text("chat", CHAT_PROMPT, "no code", True), (False, None))

    def test_stop_strings_cut_a_completion(self):
        self.assertEqual(DP.cut_completion("function", "    return 1\n\ndef g():\n"), ("    return 1\n", True))
        self.assertEqual(DP.cut_completion("function", "    return 1\n"), ("    return 1\n", False))


@unittest.skipIf(M3SERVE is None and "--m3serve" not in sys.argv, "needs --m3serve")
class GenTargets(unittest.TestCase):
    def test_targets_of_the_bundled_model(self):
        with tempfile.TemporaryDirectory() as tmp:
            defs = os.path.join(tmp, "defs.jsonl")
            with open(defs, "w") as fh:
                for doc in (FUNCTION_DOC, CLASS_DOC, CHAT_DOC, TOOL_DOC, TOOL_DOC_M3, OPEN_CHAT_DOC):
                    fh.write(json.dumps(doc) + "\n")
            out, stats, neg = (os.path.join(tmp, n) for n in ("t.jsonl", "s.json", "n.jsonl"))
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train", "gen_targets.py"),
                            "--m3serve", M3SERVE, "--model", os.path.join(ROOT, "models", "minimax-m3-small"),
                            "--defs", defs, "--count", "8", "--samples", "2", "--seed", "3", "--device", "cpu",
                            "--concurrency", "9", "--out", out, "--negatives", neg, "--stats", stats],
                           check=True, timeout=600)
            with open(stats) as fh:
                s = json.load(fh)
            self.assertEqual(s["prompts"], 5)  # the tool exchange without the M3 markup gives none
            self.assertEqual(s["completions"], 15)
            self.assertEqual(sum(v["n"] for v in s["by_mode_kind"].values()), 15)
            self.assertEqual(s["by_mode_kind"]["greedy_tool"]["n"], 1)
            # the open chat prompt (and not the one that closed the tags) is counted for its tags
            self.assertEqual(s["by_mode_kind"]["greedy_chat"]["open_turns"], 1)
            self.assertLessEqual(s["by_mode_kind"]["greedy_chat"]["tags_right"], 1)
            with open(out) as fh:
                rows = [json.loads(line) for line in fh]
            self.assertEqual(len(rows), s["targets"])
            self.assertEqual(sum(v["accepted"] for v in s["by_mode_kind"].values()), len(rows))
            for r in rows:
                self.assertIn(r["mode"], ("greedy", "sampled"))
                if r["kind"] in ("chat", "tool"):
                    self.assertEqual(DP.target_text("chat", r["prompt"], r["target"], True), (True, r["target"]))
                else:  # a target re-checked as a completion ends where it ended
                    self.assertEqual(DP.target_text(r["kind"], r["prompt"], r["target"], False), (True, r["target"]))
            with open(neg) as fh:
                negatives = [json.loads(line) for line in fh]
            self.assertEqual(len(negatives), s["negatives"])
            self.assertEqual(sum(v["negatives"] for v in s["by_mode_kind"].values()), len(negatives))
            self.assertLessEqual(len(rows) + len(negatives), 15)
            for r in negatives:  # no target, and it looped or did not end
                ended = r["finish_reason"] == "stop" and r["kind"] in ("chat", "tool")
                self.assertIsNone(DP.target_text(r["kind"], r["prompt"], r["completion"], ended)[1])
                self.assertTrue(r["finish_reason"] == "length" or DP.looping_lines(r["completion"])
                                or DP.repeated_runs(r["completion"]))


if __name__ == "__main__":
    if "--m3serve" in sys.argv:
        i = sys.argv.index("--m3serve")
        M3SERVE = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    unittest.main()
