"""A stand-in for the `gh` CLI in the watch workflow's test: it records every call (with the body
file's text) in $GH_STUB_DIR/calls.jsonl and keeps the repository's pull requests, issues and
labels in $GH_STUB_DIR/state.json, answering `list` as GitHub would. Only the forms the workflow
uses are understood; anything else exits 2 with its arguments, so the test sees it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STATE = {"prs": [], "issues": [], "labels": []}
VALUE_FLAGS = {"--head", "--base", "--title", "--body-file", "--label", "--state", "--json", "--jq", "--comment",
               "--color", "--description"}


def parse(args: list[str]) -> tuple[list[str], dict[str, str]]:
    words, flags, i = [], {}, 0
    while i < len(args):
        if args[i] in VALUE_FLAGS:
            flags[args[i]] = args[i + 1]
            i += 2
        elif args[i].startswith("--"):
            flags[args[i]] = ""
            i += 1
        else:
            words.append(args[i])
            i += 1
    return words, flags


def main(argv: list[str]) -> int:
    root = Path(os.environ["GH_STUB_DIR"])
    if not os.environ.get("GH_TOKEN") or not os.environ.get("GH_REPO"):
        print("gh stub: GH_TOKEN and GH_REPO must be set", file=sys.stderr)
        return 4
    state_file = root / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else json.loads(json.dumps(STATE))
    words, flags = parse(argv)
    body = Path(flags["--body-file"]).read_text() if "--body-file" in flags else None
    with open(root / "calls.jsonl", "a") as log:
        log.write(json.dumps({"argv": argv, "body": body}) + "\n")
    what, verb = (words + ["", ""])[:2]
    url = f"https://github.com/{os.environ['GH_REPO']}"
    items = {"pr": state["prs"], "issue": state["issues"]}.get(what)
    if verb == "list" and items is not None and flags.get("--json") == "number" and flags.get("--jq") == ".[].number":
        for item in items:
            if item["state"] == flags.get("--state", "open") and (
                    (what == "pr" and item["head"] == flags.get("--head"))
                    or (what == "issue" and flags.get("--label") in item["labels"])):
                print(item["number"])
    elif verb == "create" and items is not None:
        number = 1 + len(state["prs"]) + len(state["issues"])
        item = {"number": number, "state": "open", "title": flags["--title"], "body": body,
                "labels": [flags["--label"]] if "--label" in flags else []}
        if what == "pr":
            item.update(head=flags["--head"], base=flags["--base"])
        items.append(item)
        print(f"{url}/{'pull' if what == 'pr' else 'issues'}/{number}")
    elif verb in ("edit", "close") and items is not None and len(words) == 3:
        item = next(i for i in items if str(i["number"]) == words[2])
        if verb == "edit":
            item.update(title=flags["--title"], body=body)
        else:
            item.update(state="closed", comment=flags.get("--comment", ""))
    elif what == "label" and verb == "create" and len(words) == 3:
        if words[2] in state["labels"] and "--force" not in flags:
            print(f"label {words[2]!r} already exists", file=sys.stderr)
            return 1
        if words[2] not in state["labels"]:
            state["labels"].append(words[2])
    else:
        print(f"gh stub: unsupported: {argv}", file=sys.stderr)
        return 2
    state_file.write_text(json.dumps(state, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
