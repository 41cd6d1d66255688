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
TOOL_DOC = "]~!b[]~b]user\nAdd 1 and 2.[e~[\n]~b]ai\n<tool_call>...</tool_call>[e~["


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
                for doc in (FUNCTION_DOC, CLASS_DOC, CHAT_DOC, TOOL_DOC):
                    fh.write(json.dumps(doc) + "\n")
            out, stats, neg = (os.path.join(tmp, n) for n in ("t.jsonl", "s.json", "n.jsonl"))
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train", "gen_targets.py"),
                            "--m3serve", M3SERVE, "--model", os.path.join(ROOT, "models", "minimax-m3-small"),
                            "--defs", defs, "--count", "8", "--samples", "2", "--seed", "3", "--device", "cpu",
                            "--concurrency", "9", "--out", out, "--negatives", neg, "--stats", stats],
                           check=True, timeout=600)
            with open(stats) as fh:
                s = json.load(fh)
            self.assertEqual(s["prompts"], 3)  # the tool exchange gives none
            self.assertEqual(s["completions"], 9)
            self.assertEqual(sum(v["n"] for v in s["by_mode_kind"].values()), 9)
            with open(out) as fh:
                rows = [json.loads(line) for line in fh]
            self.assertEqual(len(rows), s["targets"])
            self.assertEqual(sum(v["accepted"] for v in s["by_mode_kind"].values()), len(rows))
            for r in rows:
                self.assertIn(r["mode"], ("greedy", "sampled"))
                if r["kind"] == "chat":
                    self.assertEqual(DP.target_text("chat", r["prompt"], r["target"], True), (True, r["target"]))
                else:  # a target re-checked as a completion ends where it ended
                    self.assertEqual(DP.target_text(r["kind"], r["prompt"], r["target"], False), (True, r["target"]))
            with open(neg) as fh:
                negatives = [json.loads(line) for line in fh]
            self.assertEqual(len(negatives), s["negatives"])
            self.assertEqual(sum(v["negatives"] for v in s["by_mode_kind"].values()), len(negatives))
            self.assertLessEqual(len(rows) + len(negatives), 9)
            for r in negatives:  # no target, and it looped or did not end
                ended = r["finish_reason"] == "stop" and r["kind"] == "chat"
                self.assertIsNone(DP.target_text(r["kind"], r["prompt"], r["completion"], ended)[1])
                self.assertTrue(r["finish_reason"] == "length" or DP.looping_lines(r["completion"]))


if __name__ == "__main__":
    if "--m3serve" in sys.argv:
        i = sys.argv.index("--m3serve")
        M3SERVE = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    unittest.main()
