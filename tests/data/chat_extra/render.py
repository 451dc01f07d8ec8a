#!/usr/bin/env python3
"""Renders cases.json with each checkpoint's own chat_template.

Ground truth for tests/test_chat.c. With transformers installed it renders
through transformers' own Jinja setup; otherwise through jinja2 configured as
transformers configures it (sandboxed, trim_blocks, lstrip_blocks,
loopcontrols, raise_exception). Usage: render.py OUT.json [--check-refs]
--check-refs also renders the `chat` rows of tests/data/tokenizer_refs.json
and fails on any difference (validates the jinja2 fallback).
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.dirname(here)


def template(family):
    with open(os.path.join(data, "tokenizers", family, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]


def compile_template(src):
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return _compile_jinja_template(src), "transformers"
    except ImportError:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        return env.from_string(src), "jinja2"


SPECIAL = {
    "qwen3": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>",
               "unk_token": "<unk>"},
}


def render(tmpl, family, case):
    kw = dict(SPECIAL[family])
    kw.update(case.get("kwargs", {}))
    try:
        return tmpl.render(messages=case["messages"],
                           add_generation_prompt=case["add_generation_prompt"], **kw), None
    except Exception as e:  # the template rejected the conversation
        return None, str(e)


def main():
    out_path = sys.argv[1]
    with open(os.path.join(here, "cases.json")) as f:
        cases = json.load(f)
    compiled = {fam: compile_template(template(fam)) for fam in ("qwen3", "gemma3")}
    bad = 0
    if "--check-refs" in sys.argv:
        with open(os.path.join(data, "tokenizer_refs.json")) as f:
            refs = json.load(f)
        for fam in ("qwen3", "gemma3"):
            for row in refs[fam]["chat"]:
                got, _ = render(compiled[fam][0], fam, row)
                if got != row["rendered"]:
                    bad += 1
                    print("refs mismatch", fam, json.dumps(row["messages"]))
    result = {"renderer": {fam: compiled[fam][1] for fam in compiled}, "cases": []}
    for case in cases:
        fam = case["family"]
        got, error = render(compiled[fam][0], fam, case)
        row = dict(case)
        if error is None:
            row["rendered"] = got
        else:
            row["error"] = error
        result["cases"].append(row)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
