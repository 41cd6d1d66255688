#!/usr/bin/env python3
"""The grammar engine against independent judges: hundreds of generated JSON schemas, regexes,
choice lists, EBNF grammars and tool sets go through grammar_walk (random tokens of the tiny
model's byte-level vocabulary, within each step's mask, until the constraint completes); every
completed text must validate (python3-jsonschema for schemas, re.fullmatch for regexes, json /
a recursive-descent check for grammars, the M3 markup read back for tool calls), nearly every
walk must complete within its token budget, and specs with unsupported keywords must be refused
naming the keyword.

usage: test_grammar_oracle.py GRAMMAR_WALK MODEL_DIR"""
import json
import random
import re
import subprocess
import sys

import jsonschema

NS = "]<]minimax[>["
rng = random.Random(20261202)


def rand_name():
    return rng.choice(["id", "name", "age", "tags", "score", "kind", "items", "meta", "x", "y_z", "flag", "when"])


def rand_string_schema():
    s = {"type": "string"}
    r = rng.random()
    if r < 0.3:
        s["maxLength"] = rng.randint(0, 8)
        s["minLength"] = rng.randint(0, s["maxLength"])
    elif r < 0.45:
        s["pattern"] = rng.choice(["^[a-z]{1,6}$", "^\\d{3}-\\d{2}$", "^(cat|dog)s?$", "^[A-Z][a-z]*( [A-Z][a-z]*){0,2}$",
                                   "ab+c", "^x\\.y$", "^[^\\\\\"]{0,4}$", "^\\w+@\\w+\\.com$"])
    elif r < 0.55:
        s["format"] = rng.choice(["date", "time", "date-time", "uuid", "email", "ipv4"])
    elif r < 0.65:
        s["enum"] = rng.sample(["red", "green", "blue", "with \"quote\"", "back\\slash", "ünï", "日本"], rng.randint(1, 3))
    else:
        s["maxLength"] = rng.randint(1, 12)
    return s


def rand_schema(depth=0, defs=None):
    r = rng.random()
    if depth > 2 or r < 0.35:
        kind = rng.choice(["string", "integer", "number", "boolean", "null", "enum", "const"])
        if kind == "string":
            return rand_string_schema()
        if kind == "integer":
            s = {"type": "integer"}
            if rng.random() < 0.6:
                lo = rng.randint(-1000, 1000)
                s["minimum"] = lo
                s["maximum"] = lo + rng.randint(0, 2000)
            if rng.random() < 0.2:
                s["exclusiveMinimum"] = s.pop("minimum", -5)
            return s
        if kind == "number":
            s = {"type": "number"}
            if rng.random() < 0.5:
                lo = rng.randint(-50, 50)
                s["minimum"] = lo
                s["maximum"] = lo + rng.randint(0, 100)
                if rng.random() < 0.3:
                    s["exclusiveMaximum"] = s.pop("maximum")
            return s
        if kind == "enum":
            return {"enum": rng.sample([1, 2.5, "a", None, True, [1, 2], {"k": "v"}], rng.randint(1, 4))}
        if kind == "const":
            return {"const": rng.choice(["fixed", 42, False, None, {"a": [1]}])}
        return {"type": kind}
    if r < 0.6:
        props = {}
        for _ in range(rng.randint(0, 4)):
            props[rand_name()] = rand_schema(depth + 1, defs)
        s = {"type": "object", "properties": props, "additionalProperties": False}
        names = list(props)
        s["required"] = rng.sample(names, rng.randint(0, len(names)))
        return s
    if r < 0.75:
        s = {"type": "array", "items": rand_schema(depth + 1, defs)}
        if rng.random() < 0.7:
            s["maxItems"] = rng.randint(0, 4)
            s["minItems"] = rng.randint(0, s["maxItems"])
        if rng.random() < 0.2:
            s["prefixItems"] = [rand_schema(depth + 1, defs) for _ in range(rng.randint(1, 2))]
        return s
    if r < 0.85:
        return {"anyOf": [rand_schema(depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    if r < 0.92:
        types = rng.sample(["string", "integer", "boolean", "null", "array"], 2)
        return {"oneOf": [{"type": t} if t != "array" else {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
                          for t in types]}
    if defs is not None:
        target = rand_schema(depth + 1, defs)
        name = f"d{len(defs)}"
        defs[name] = target
        return {"$ref": f"#/$defs/{name}"}
    return {"type": "boolean"}


def schema_specs(n):
    specs = []
    for _ in range(n):
        defs = {}
        s = rand_schema(0, defs)
        if defs:
            s = dict(s)
            s["$defs"] = defs
        specs.append(s)
    # Recursion through $ref, and common shapes.
    specs.append({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                               "maxItems": 2}},
                                     "required": ["v"], "additionalProperties": False}},
                  "$ref": "#/$defs/node"})
    specs.append({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]})
    specs.append({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                            {"properties": {"b": {"type": "string", "maxLength": 3}}, "required": ["b"]}]})
    specs.append({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                             "required": ["kind", "x"], "additionalProperties": False},
                            {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "boolean"}},
                             "required": ["kind", "y"], "additionalProperties": False}]})
    specs.append({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 5}})
    return specs


REGEXES = ["[a-z]+", "\\d{1,4}(\\.\\d{1,2})?", "(yes|no|maybe)", "[A-Z]{2}-\\d{3}", "(ab|cd)*e", "[^a-z\\n]{1,5}",
           "\\w+\\s\\w+", "(0|[1-9][0-9]*)", "a{2,3}b?", "[αβγ]+", "x(y(z)?)?", "#[0-9a-fA-F]{6}",
           "(\\+|-)?\\d+", "[\\u00e0-\\u00ff]{1,3}", ".{0,3}!", "\"[^\"]*\"", "(?:foo|bar)+baz", "[\\[\\]]{1,2}"]

CHOICES = [["positive", "negative", "neutral"], ["A", "B", "C", "D"], ["yes", "yes!", "yes!!"],
           ["日本", "中国", "한국"], ["with space", "with\nnewline", "tab\there"], ["\"quoted\"", "{json}"]]

GRAMMARS = [
    ("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | root\n", "nested"),
    ("root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") factor)*\n"
     "factor ::= [1-9] [0-9]{0,2} | \"(\" expr \")\"\n", "arith"),
    ("root ::= object\nobject ::= \"{\" (pair (\",\" pair)*)? \"}\"\npair ::= string \":\" value\n"
     "value ::= string | [1-9] [0-9]{0,2} | object | \"true\" | \"null\"\nstring ::= \"\\\"\" [a-z]{0,5} \"\\\"\"\n", "json"),
    ("root ::= line{1,3}\nline ::= word (\" \" word)* \"\\n\"\nword ::= [a-zA-Z]+\n", "lines"),
]


def check_grammar(kind, text):
    if kind == "nested":
        # root = "[" (item ("," item)*)? "]", item = digits | root: parsed by hand.
        pos = 0

        def root():
            nonlocal pos
            assert text[pos] == "["
            pos += 1
            if text[pos] == "]":
                pos += 1
                return
            while True:
                if text[pos] == "[":
                    root()
                else:
                    m = re.match(r"[0-9]+", text[pos:])
                    assert m
                    pos += m.end()
                if text[pos] == "]":
                    pos += 1
                    return
                assert text[pos] == ","
                pos += 1
        root()
        return pos == len(text)
    if kind == "arith":
        return re.fullmatch(r"[0-9+\-*/()]+", text) and (compile(text, "<expr>", "eval") is not None)
    if kind == "json":
        return isinstance(json.loads(text), dict)
    if kind == "lines":
        return re.fullmatch(r"([a-zA-Z]+( [a-zA-Z]+)*\n){1,3}", text)
    raise AssertionError(kind)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "unit": {"type": "string", "enum": ["c", "f"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 30},
                                         "filters": {"type": "object", "properties": {"lang": {"type": "string", "maxLength": 5}},
                                                     "additionalProperties": False},
                                         "limit": {"type": ["integer", "null"], "maximum": 50, "minimum": 0},
                                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["query", "limit"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

UNSUPPORTED = [
    ({"type": "number", "multipleOf": 2}, "json_schema.multipleOf"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "json_schema.properties.a.not"),
    ({"type": "array", "uniqueItems": True}, "json_schema.uniqueItems"),
    ({"type": "string", "format": "hostname-idn"}, "json_schema.format"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "json_schema.patternProperties"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "json_schema.oneOf"),
    ({"type": "string", "pattern": "(a)\\1"}, "json_schema.pattern"),
    ({"$ref": "https://example.com/s.json"}, "json_schema.$ref"),
    ({"type": "number", "minimum": 0.5}, "json_schema.minimum"),
    ({"if": {"type": "string"}}, "json_schema.if"),
    # additionalProperties does not see the properties of allOf siblings: merging would be wrong.
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}], "additionalProperties": False}, "json_schema.allOf"),
    ({"type": "string", "minLenght": 3}, "json_schema.minLenght"),
]
BAD_REGEXES = ["(a", "a{3,1}", "(?=a)b", "\\bword", "a++", "[z-a]", "x{1001}"]
BAD_GRAMMARS = ["root ::= root \"a\" | \"b\"", "root ::= missing", "item ::= \"a\"", "root ::= \"a\" (", "root ::= [a-"]


def main():
    walker, model = sys.argv[1], sys.argv[2]
    lines, judges = [], []

    def add(kind, spec, judge, seeds=4, budget=300):
        lines.append(json.dumps({"kind": kind, "spec": spec, "seeds": seeds, "budget": budget}))
        judges.append((kind, spec, judge))

    for s in schema_specs(260):
        validator = jsonschema.Draft202012Validator(s, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        add("json_schema", s, lambda t, v=validator: v.validate(json.loads(t)) or True)
    add("json_object", {}, lambda t: isinstance(json.loads(t), dict), seeds=20)
    for r in REGEXES:
        add("regex", r, lambda t, r=r: re.fullmatch(r, t) is not None, seeds=12)
    for c in CHOICES:
        add("choice", c, lambda t, c=c: t in c, seeds=12)
    for g, kind in GRAMMARS:
        add("grammar", g, lambda t, k=kind: bool(check_grammar(k, t)), seeds=16, budget=400)
    for markup in ["minimax_m3", "minimax_m2"]:
        for only in ["", "get_weather", "search", "noop"]:
            for parallel in [True, False]:
                add("tools", {"tools": TOOLS, "only": only, "parallel": parallel, "markup": markup},
                    lambda t, only=only, parallel=parallel, m=markup: check_tool_calls(t, only, parallel, m),
                    seeds=8, budget=400)
    bad_start = len(lines)
    for s, keyword in UNSUPPORTED:
        add("json_schema", s, keyword)
    for r in BAD_REGEXES:
        add("regex", r, "regex")
    for g in BAD_GRAMMARS:
        add("grammar", g, "grammar")

    proc = subprocess.run([walker, model], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=280)
    if proc.returncode != 0:
        print(proc.stderr)
        return 1
    outputs = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(outputs) == len(lines), (len(outputs), len(lines), proc.stderr[-2000:])
    failures, walks, completed, incomplete = [], 0, 0, {}
    for i, ((kind, spec, judge), out) in enumerate(zip(judges, outputs)):
        if i >= bad_start:
            if "error" not in out:
                failures.append(f"{kind} {spec!r}: accepted, but it should be refused naming {judge}")
            elif not out["keyword"].startswith(judge):
                failures.append(f"{kind} {spec!r}: refused naming {out['keyword']!r}, not {judge!r}: {out['error']}")
            continue
        if "error" in out:
            failures.append(f"{kind} {json.dumps(spec)}: refused: {out['error']}")
            continue
        for text in out["texts"]:
            walks += 1
            if text is None:
                incomplete[kind] = incomplete.get(kind, 0) + 1
                continue
            completed += 1
            try:
                ok = judge(text)
            except Exception as e:  # noqa: BLE001 - any judge failure is a test failure
                ok = False
                text = f"{text!r} ({type(e).__name__}: {str(e)[:200]})"
            if not ok:
                failures.append(f"{kind} {json.dumps(spec)[:300]}: invalid output {text!r}"[:800])
    print(f"grammar oracle: {len(lines)} specs, {walks} walks, {completed} completed, {len(failures)} failures; "
          f"incomplete by kind: {incomplete}")
    for f in failures[:40]:
        print("  " + f)
    if completed < 0.97 * walks:
        print(f"too few walks completed within their budget: {completed} of {walks}")
        return 1
    return 1 if failures else 0


def check_tool_calls(text, only, parallel, markup):
    """Reads the markup back the way text/tool_parser.h does for these schemas and validates."""
    if markup == "minimax_m2":
        opener, closer = "<minimax:tool_call>\n", "</minimax:tool_call>"
        invoke_re, invoke_fmt = r'<invoke name="([^"]+)">\n(.*?)</invoke>\n', '<invoke name="{}">\n{}</invoke>\n'
        param_re, param_fmt = r'<parameter name="([^"]+)">([^<]*)</parameter>\n', '<parameter name="{}">{}</parameter>\n'
    else:
        opener, closer = NS + "<tool_call>\n", NS + "</tool_call>"
        invoke_re = re.escape(NS) + r'<invoke name="([^"]+)">(.*?)' + re.escape(NS) + r"</invoke>\n"
        invoke_fmt = NS + '<invoke name="{}">{}' + NS + "</invoke>\n"
        param_re = re.escape(NS) + r"<([^<>]+)>(.*?)" + re.escape(NS) + r"</\1>"
        param_fmt = NS + "<{0}>{1}" + NS + "</{0}>"
    assert text.startswith(opener) and text.endswith(closer), text
    body = text[len(opener):-len(closer)]
    calls = re.findall(invoke_re, body, re.S)
    assert calls and "".join(invoke_fmt.format(n, b) for n, b in calls) == body, text
    assert parallel or len(calls) == 1, text
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name, params_text in calls:
        assert name in tools and (not only or name == only), name
        schema = tools[name]
        args = {}
        params = re.findall(param_re, params_text, re.S)
        assert "".join(param_fmt.format(k, v) for k, v in params) == params_text, params_text
        for key, value in params:
            prop = schema["properties"][key]
            types = prop.get("type")
            if types == "string" or ("enum" in prop and all(isinstance(e, str) for e in prop["enum"])):
                args[key] = value
            elif value.strip().lower() == "null" and types and "null" in types:
                args[key] = None
            else:
                args[key] = json.loads(value)
        jsonschema.validate(args, schema)
    return True


if __name__ == "__main__":
    sys.exit(main())
