#!/usr/bin/env python3
"""Renders chat-template cases with Jinja2 configured as transformers' apply_chat_template does
(an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; the globals
raise_exception and strftime_now; tojson as json.dumps with ensure_ascii off).

Usage: jinja_reference.py CASES.json OUT.json
CASES.json: [{"template": str, "variables": {...}}, ...]
OUT.json:   [{"output": str} or {"error": str}, ...]
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

cases = json.load(open(sys.argv[1], encoding="utf-8"))
out = []
for case in cases:
    try:
        out.append({"output": env.from_string(case["template"]).render(**case["variables"])})
    except Exception as e:  # noqa: BLE001 - any failure is the case's answer
        out.append({"error": f"{type(e).__name__}: {e}"})
json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
