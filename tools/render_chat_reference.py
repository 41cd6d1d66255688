#!/usr/bin/env python3
"""Reference renderer for chat templates: Python's jinja2 set up the way transformers'
apply_chat_template sets it up (utils/chat_template_utils.py in transformers 5.x), so that
m3serve's C++ interpreter can be checked byte for byte against it.

The environment: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loop-controls extension and the {% generation %} tag, `tojson` replaced by json.dumps without
ASCII escaping, and the globals raise_exception and strftime_now. The template sees messages,
tools, documents, add_generation_prompt, then the tokenizer's special tokens overridden by the
chat_template_kwargs.

Usage:
  render_chat_reference.py --batch CASES.json --out RESULTS.json
      CASES: a list of {"template": SOURCE, and either "variables": {...} (rendered as is) or
      "messages", "tools", "documents", "add_generation_prompt", "special_tokens", "kwargs"},
      optional "now" (seconds since the epoch, for strftime_now). RESULTS: one
      {"ok": true, "text": ...} or {"ok": false, "type": ..., "message": ...} per case.
  render_chat_reference.py --model DIR --messages FILE.json [--tools FILE.json]
      [--kwargs JSON] [--no-generation-prompt]
      prints the prompt, like `m3serve render-chat`.
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment(now=None):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        moment = datetime.fromtimestamp(now) if now is not None else datetime.now()
        return moment.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def chat_variables(case):
    """What apply_chat_template passes to render(): kwargs override the special tokens."""
    variables = {
        "messages": case.get("messages", []),
        "tools": case.get("tools"),
        "documents": case.get("documents"),
        "add_generation_prompt": case.get("add_generation_prompt", False),
    }
    variables.update({**case.get("special_tokens", {}), **case.get("kwargs", {})})
    return variables


_compiled = {}


def compile_template(source, now):
    """Compiles each (template, clock) once, as transformers caches compiled templates."""
    key = (source, now)
    if key not in _compiled:
        _compiled[key] = make_environment(now).from_string(source)
    return _compiled[key]


def render_case(case):
    try:
        template = compile_template(case["template"], case.get("now"))
        variables = case["variables"] if "variables" in case else chat_variables(case)
        return {"ok": True, "text": template.render(**variables)}
    except Exception as e:  # every failure is a result to compare, not a crash
        return {"ok": False, "type": type(e).__name__, "message": str(e)}


def load_model_template(model_dir, with_tools):
    """The template and special tokens as transformers loads them from a model directory."""
    config = {}
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[key] = value
    if isinstance(config.get("additional_special_tokens"), list):
        special["additional_special_tokens"] = [
            t.get("content") if isinstance(t, dict) else t for t in config["additional_special_tokens"]]
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), special
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template}
        template = named.get("tool_use") if with_tools and "tool_use" in named else named.get("default")
    if not isinstance(template, str):
        sys.exit(f"{model_dir}: no chat template (chat_template.jinja or tokenizer_config.json)")
    return template, special


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch")
    parser.add_argument("--out")
    parser.add_argument("--model")
    parser.add_argument("--messages")
    parser.add_argument("--tools")
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--no-generation-prompt", action="store_true")
    args = parser.parse_args()
    if args.batch:
        with open(args.batch, encoding="utf-8") as f:
            cases = json.load(f)
        results = [render_case(case) for case in cases]
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False)
        return
    if not args.model or not args.messages:
        parser.error("give --batch and --out, or --model and --messages")
    with open(args.messages, encoding="utf-8") as f:
        messages = json.load(f)
    tools = None
    if isinstance(messages, dict):
        tools = messages.get("tools")
        messages = messages["messages"]
    if args.tools:
        with open(args.tools, encoding="utf-8") as f:
            tools = json.load(f)
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list):
            sys.exit(f"{args.tools} must hold a list of tools (or {{\"tools\": [...]}})")
    template, special = load_model_template(args.model, tools is not None)
    result = render_case({"template": template, "messages": messages, "tools": tools,
                          "add_generation_prompt": not args.no_generation_prompt,
                          "special_tokens": special, "kwargs": json.loads(args.kwargs)})
    if not result["ok"]:
        sys.exit(f"error: {result['type']}: {result['message']}")
    sys.stdout.write(result["text"])


if __name__ == "__main__":
    main()
