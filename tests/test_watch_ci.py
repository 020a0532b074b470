"""The scheduled watch recipe (ci/github/c128patch-watch.yml): valid YAML, nightly, one run at a time,
no secret in it, the write token only in the Report step, the tool's git without system or global
settings, only c128patch verbs that exist; and its shell steps, run as Actions runs them, in a
clone of a fork (a local bare repo) against a stand-in upstream (tests/watch_upstream.py), with a
stub `gh` (tests/gh_stub.py) recording its calls: a refreshed target pushes its branch and opens,
then updates, one pull request; a conflict opens, then updates, one issue and closes the pull
request; a clean target opens nothing and closes what is left open."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

import watch_upstream as wu
from c128patch.cli import main
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from support import REPO_ROOT, share_environment, tier_unchecked, workflow_commands

yaml = pytest.importorskip("yaml")

WORKFLOW = REPO_ROOT / "ci" / "github" / "c128patch-watch.yml"
SKIPPED = {"Install c128patch": "needs the network; the test's environment has c128patch installed already"}


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def job_env(workspace: Path, upstream: str, targets: str) -> dict[str, str]:
    """What GitHub gives the job's env for this repository (one key per key of the workflow's); the variable
    C128PATCH_PIP_EXTRA_INDEX_URL set to this machine's own extra index (pip's configuration here)."""
    return {"PYTHON": sys.executable, "UPSTREAM": upstream, "TARGETS": targets, "WATCH_TIMEOUT": "900",
            "WATCH_DIR": ".c128patch-watch", "BASE_BRANCH": "main", "C128PATCH_CACHE": f"{workspace}/.c128patch-cache",
            "GH_REPO": "maintainer/c128patch", "PIP_EXTRA_INDEX_URL": local_extra_index()}


def local_extra_index() -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.extra-index-url"],
                          capture_output=True, text=True)
    return os.environ.get("PIP_EXTRA_INDEX_URL") or (proc.stdout.strip() if proc.returncode == 0 else "")


def test_the_body_is_cut_at_a_lines_end_so_no_code_span_of_upstreams_text_is_left_open(workflow, tmp_path):
    """The report is cut to GitHub's body limit; a cut inside a code span (a long upstream subject) left it open, and
    the rest of that line (``@maintainers``, ``<img ...>``) live in the issue."""
    from markdown_it import MarkdownIt

    report = next(s for s in workflow["jobs"]["watch"]["steps"] if s.get("name") == "Report")["run"]
    (cut,) = [line.strip() for line in report.splitlines() if '> "$out/body.md"' in line]
    hostile = "- `" + "y" * 60 + " cc @maintainers <img src=x onerror=alert(1)>`\n"
    lines = ["# c128patch watch\n", *[f"- `{i:05d} an upstream commit`\n" for i in range(1800)]]
    filler = sum(map(len, lines))
    lines.append("- `" + "z" * (60000 - len(hostile) + 2 - filler - 5) + "`\n")  # byte 60000: before its closing `
    (tmp_path / "watch-report.md").write_text("".join(lines) + hostile * 3)
    subprocess.run(["bash", "-c", cut], env={**os.environ, "out": str(tmp_path)}, check=True)
    body = (tmp_path / "body.md").read_text()
    assert "".join(lines).startswith(body) and len(body.encode()) <= 60000 and body.endswith("`\n")
    rendered = MarkdownIt("commonmark").render(body + "\n")
    assert "<img" not in rendered and "@maintainers" not in rendered


def test_it_runs_nightly_and_by_hand(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert set(triggers) == {"schedule", "workflow_dispatch"} and triggers["schedule"][0]["cron"] == "41 4 * * *"


def test_the_behavioural_tier_builds_its_own_environment_from_the_committed_locks(workflow):
    job = workflow["jobs"]["watch"]
    watch = next(s for s in job["steps"] if s.get("id") == "watch")
    assert "c128patch watch --onto" in watch["run"] and "--python" not in watch["run"]  # watch builds the env
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == (  # the CPU torch the locks pin, or the operator's mirror
        "${{ vars.C128PATCH_PIP_EXTRA_INDEX_URL || 'https://download.pytorch.org/whl/cpu' }}")
    setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@"))
    cp = "cp" + setup["with"]["python-version"].replace(".", "")
    locks = sorted((REPO_ROOT / "patches" / "env").glob("v*.lock"))
    assert locks and all(lock.read_text().startswith(f"# c128patch tier environment lock: {cp}-linux-x86_64; ")
                         for lock in locks)


def test_two_runs_never_race(workflow):
    assert workflow["concurrency"] == {"group": "c128patch-watch", "cancel-in-progress": False}


def test_no_secret_lives_in_the_workflow(workflow):
    text = WORKFLOW.read_text()
    assert set(re.findall(r"secrets\.\w+[^}]*", text)) == {"secrets.C128PATCH_WATCH_TOKEN || github.token "}
    assert not re.search(r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_", text)


def test_the_write_token_reaches_only_the_step_that_pushes_and_opens(workflow):
    assert workflow["permissions"] == {}
    job = workflow["jobs"]["watch"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write", "issues": "write"}
    with_token = [s["name"] for s in job["steps"] if "secrets." in str(s) or "github.token" in str(s)]
    assert with_token == ["Report"] and "secrets." not in str(job["env"])
    [checkout] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"] == {"persist-credentials": False}
    report = next(s for s in job["steps"] if s.get("name") == "Report")["run"]
    assert "gh " in report and "push" in report and "gh " not in next(
        s for s in job["steps"] if s.get("name") == "Watch")["run"]


def test_the_tool_runs_git_without_system_or_global_settings(workflow):
    for step in workflow["jobs"]["watch"]["steps"]:
        if "-m c128patch watch" in step.get("run", "") or "ls-remote" in step.get("run", ""):
            assert step["env"]["GIT_CONFIG_NOSYSTEM"] == "1" and step["env"]["GIT_CONFIG_GLOBAL"] == "/dev/null"


def test_the_test_gives_the_job_every_variable_it_names(workflow, tmp_path):
    env = workflow["jobs"]["watch"]["env"]
    assert set(env) == set(job_env(tmp_path, "", ""))
    assert env["WATCH_DIR"] == ".c128patch-watch" and "'main release'" in env["TARGETS"]


def test_every_c128patch_command_line_is_accepted_by_the_cli(workflow):
    seen = []
    for step in workflow["jobs"]["watch"]["steps"]:
        for args in workflow_commands(step.get("run", ""), {"WATCH_TIMEOUT": "2400"}):
            root = click.Context(main, info_name="c128patch", **main.context_settings)
            cmd = main.get_command(root, args[0])
            assert cmd is not None, args
            cmd.make_context(args[0], args[1:], parent=root)  # raises on an unknown or malformed option
            seen.append(args[0])
    assert seen == ["watch"]


# -- the shell steps, run against a local fork and a stand-in upstream -----------------------------


@dataclass
class Run:
    steps: dict[str, subprocess.CompletedProcess]
    outputs: dict[str, dict[str, str]]
    calls: list[dict]  # the gh calls of this run
    state: dict  # the stub's pull requests, issues and labels after it
    branch: str | None  # the fork's c128patch-watch/main after it
    reports: Path  # a copy of what the watch runs wrote (the workspace's is replaced every night)


@dataclass
class Actions:
    """A fork's workspace and its remote; ``run`` runs the workflow's shell steps as Actions would."""

    workflow: dict
    root: Path
    upstream: Git
    runs: list[Run] = field(default_factory=list)
    own_env: bool = False  # the tier in the environment watch builds (as on a runner), not the test's interpreter

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def fork(self) -> Git:
        return Git(git_dir=self.root / "fork.git")

    def setup(self) -> None:
        seed = self.root / "seed"
        for sub in ("patches", "csrc", "overlay", "ci/kernel_probe"):  # the probe: else watch is unchecked
            shutil.copytree(REPO_ROOT / sub, seed / sub)
        (seed / "README.md").write_text("a fork of c128patch\n")
        git = Git(worktree=seed)
        git.run("init", "--quiet", "--initial-branch=main")
        git.run("add", "-A")
        git.run("commit", "--quiet", "-m", "the fork")
        subprocess.run(["git", "clone", "--quiet", "--bare", str(seed), str(self.root / "fork.git")], check=True)
        subprocess.run(["git", "clone", "--quiet", str(self.root / "fork.git"), str(self.workspace)], check=True)
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        (bin_dir / "gh").write_text(f"#!/bin/sh\nexec {sys.executable} {REPO_ROOT / 'tests' / 'gh_stub.py'} \"$@\"\n")
        (bin_dir / "gh").chmod(0o755)
        (self.root / "gh").mkdir()

    def run(self, targets: str, canned: dict[str, str] | None = None) -> Run:
        """``canned``: the Watch step stood in by last night's reports with these outcomes (the recipe's branch
        for an outcome no interpreter here reaches: ``clean`` needs every module imported)."""
        job = self.workflow["jobs"]["watch"]
        environ = {k: v for k, v in os.environ.items() if not (self.own_env and k == "C128PATCH_TIER_PYTHON")}
        env = {**environ, **job_env(self.workspace, str(self.upstream.git_dir), targets),
               "PATH": f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}", "GH_STUB_DIR": str(self.root / "gh"),
               "GITHUB_SHA": Git(worktree=self.workspace).out("rev-parse", "HEAD"),
               "GITHUB_WORKSPACE": str(self.workspace)}
        calls_file = self.root / "gh" / "calls.jsonl"
        before = len(calls_file.read_text().splitlines()) if calls_file.is_file() else 0
        steps, outputs = {}, {}
        for step in job["steps"]:
            if "run" not in step or step.get("name") in SKIPPED:
                continue
            if canned is not None and step.get("id") == "watch":
                for slug, outcome in canned.items():
                    path = self.workspace / job["env"]["WATCH_DIR"] / slug / "watch-report.json"
                    path.write_text(json.dumps({**json.loads(path.read_text()), "outcome": outcome}))
                outputs["watch"] = {"results": " ".join(f"{s}={EXIT[o]}" for s, o in canned.items())}
                continue
            output = self.root / "github-output"
            output.write_text("")
            step_env = {k: re.sub(r"\$\{\{ steps\.(\w+)\.outputs\.(\w+) \}\}",
                                  lambda m: outputs[m.group(1)][m.group(2)], str(v))
                        for k, v in step.get("env", {}).items()}
            if "GH_TOKEN" in step_env:  # GitHub puts the secret (or the job's own token) there
                step_env["GH_TOKEN"] = "test-token"
            assert not any("${{" in v for v in step_env.values()), step_env
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                                  cwd=self.workspace, env={**env, **step_env, "GITHUB_OUTPUT": str(output)},
                                  capture_output=True, text=True)
            steps[step["name"]] = proc
            assert proc.returncode == 0, f"{step['name']}:\n{proc.stdout}\n{proc.stderr}"
            outputs[step.get("id", "")] = dict(line.split("=", 1) for line in output.read_text().splitlines())
        calls = [json.loads(line) for line in calls_file.read_text().splitlines()[before:]]
        state = json.loads((self.root / "gh" / "state.json").read_text())
        reports = self.root / f"night-{len(self.runs) + 1}"
        shutil.copytree(self.workspace / job["env"]["WATCH_DIR"], reports)
        run = Run(steps, outputs, calls, state, self.fork.rev_parse("refs/heads/c128patch-watch/main"), reports)
        self.runs.append(run)
        return run


def verbs(run: Run) -> list[str]:
    return [" ".join(c["argv"][:2]) for c in run.calls]


@pytest.fixture(scope="module")
def actions(workflow, sglang_release_repo, tmp_path_factory) -> Actions:
    """Five nights in a row: main gets a rename in a hunk's context (refreshed; twice), then a moved
    method (conflict; twice), then only an unrelated commit (clean where every module imports, else
    unchecked), then that night's reports again as clean (canned). The first night also watches the newest
    release."""
    pytest.importorskip("torch", reason="watch is clean only where its behavioural tier can import: needs torch")
    root = tmp_path_factory.mktemp("actions")
    upstream = wu.stand_in(sglang_release_repo, root / "upstream.git")
    act = Actions(workflow, root, upstream)
    act.setup()
    rename, moved = wu.rename_in_context(upstream), wu.method_moved(upstream)
    for commit, targets in ((rename, "main release"), (rename, "main"), (moved, "main"), (moved, "main"),
                            (wu.unrelated(upstream), "main")):
        wu.set_branch(upstream, "main", commit)
        act.run(targets)
    act.run("main", canned={"main": "clean"})
    return act


def outcome(run: Run, slug: str) -> str:
    """The night's outcome for ``slug``: clean only where every module imported (``tier_unchecked``)."""
    report = json.loads((run.reports / slug / "watch-report.json").read_text())
    assert [u for u in report["unchecked"] if not u.startswith("C++: ")] == tier_unchecked(report["behaviour"])
    return report["outcome"]


def main_issues(run: Run) -> list[dict]:
    return [i for i in run.state["issues"] if i["labels"] == ["c128patch-watch-main"]]


def test_release_stands_for_the_newest_release_tag(actions):
    assert actions.runs[0].outputs["targets"]["list"] == "main=main release=v0.5.23"


def test_a_refreshed_target_pushes_the_refreshed_series_to_its_branch(actions):
    first = actions.runs[0]
    fork, out = actions.fork, first.reports / "main"
    assert first.branch and fork.out("rev-parse", f"{first.branch}^") == fork.out("rev-parse", "refs/heads/main")
    assert (fork.out("log", "-1", "--format=%s", first.branch)
            .startswith("patches: refresh the series for upstream main@"))
    changed = fork.out("diff", "--name-only", "refs/heads/main", first.branch).splitlines()
    assert changed == sorted(json.loads((out / "watch-report.json").read_text())["refreshed"]["changed"])
    for path in changed:
        assert fork.blob(first.branch, path) == (out / "series" / path).read_bytes()


def test_a_refreshed_target_opens_one_pull_request_with_the_report_as_its_body(actions):
    first = actions.runs[0]
    [create] = [c for c in first.calls if c["argv"][:2] == ["pr", "create"]]
    argv = create["argv"]
    assert argv[argv.index("--head") + 1] == "c128patch-watch/main" and argv[argv.index("--base") + 1] == "main"
    assert argv[argv.index("--title") + 1].startswith("c128patch watch (main): refreshed on main@")
    report = (first.reports / "main" / "watch-report.md").read_text()
    assert create["body"] == report and report.startswith("# c128patch watch: `refreshed` on `main@")


def test_a_clean_target_opens_nothing_and_an_unchecked_one_its_issue(actions):
    first = actions.runs[0]
    said = outcome(first, "release")
    assert said in ("clean", "unchecked") and f"release: {said} on v0.5.23@" in first.steps["Report"].stdout
    assert verbs(first) == ["pr list", "issue list", "pr create", "pr list", "issue list"] + (
        [] if said == "clean" else ["label create", "issue create"])


def test_the_next_night_updates_the_pull_request_and_pushes_nothing_new(actions):
    first, second = actions.runs[:2]
    assert verbs(second) == ["pr list", "issue list", "pr edit"]
    assert second.calls[-1]["argv"][2] == "1" and second.branch == first.branch
    assert "c128patch-watch/main already holds this refresh" in second.steps["Report"].stdout
    assert [p["state"] for p in second.state["prs"]] == ["open"]


def test_a_conflict_opens_one_issue_and_closes_the_refresh_pull_request(actions):
    third = actions.runs[2]
    assert verbs(third) == ["pr list", "issue list", "label create", "issue create", "pr close"]
    [issue] = main_issues(third)
    assert issue["title"].startswith("c128patch watch (main): conflict on")
    assert f"## Conflict: {wu.RS}\n" in issue["body"]
    assert third.state["prs"][0]["state"] == "closed" and \
        f"see https://github.com/maintainer/c128patch/issues/{issue['number']}" in third.state["prs"][0]["comment"]


def test_the_next_conflict_night_updates_the_issue(actions):
    fourth = actions.runs[3]
    assert verbs(fourth) == ["pr list", "issue list", "label create", "issue edit"]
    assert len(main_issues(fourth)) == 1


def test_an_unrelated_night_closes_the_issue_where_clean_and_updates_it_where_unchecked(actions):
    fifth = actions.runs[4]
    clean = outcome(fifth, "main") == "clean"
    assert verbs(fifth) == ["pr list", "issue list"] + (["issue close"] if clean else ["label create", "issue edit"])
    assert main_issues(fifth)[0]["state"] == ("closed" if clean else "open")


def test_a_clean_night_closes_the_open_issue(actions):
    sixth = actions.runs[5]  # the canned clean outcome
    if outcome(actions.runs[4], "main") == "clean":
        pytest.skip("the fifth night was clean already and closed the issue")
    assert verbs(sixth) == ["pr list", "issue list", "issue close"]
    [issue] = main_issues(sixth)
    assert issue["state"] == "closed" and issue["comment"].startswith("The series applies strictly on main@")


def test_the_recipe_as_written_builds_the_tiers_environment_and_is_clean_on_the_newest_release(workflow,
                                                                                            sglang_release_repo,
                                                                                            tmp_path):
    """The recipe's shell steps as written, on a fresh workspace (its own empty C128PATCH_CACHE), the tier not pointed
    at the test's interpreter: watch builds v0.5.23's environment from the committed lock with the operator's pip
    settings (C128PATCH_PIP_EXTRA_INDEX_URL: this machine's index) and the night is clean, exit 0, every module the
    series adds or changes imported and every scenario passed, gates off and on; nothing opened. Skipped here: the
    Install step (the fork's checkout here holds the series, not the package; the test's interpreter has it) and
    the upload of the reports (an action, not a shell step). The environment built, the same key as the run's cache
    would build from that lock, is then handed to that cache (support.share_environment): built once a run."""
    act = Actions(workflow, tmp_path, wu.stand_in(sglang_release_repo, tmp_path / "upstream.git"), own_env=True)
    act.setup()
    run = act.run("release")
    assert "release: c128patch watch --onto v0.5.23 exited 0" in run.steps["Watch"].stdout
    report = json.loads((run.reports / "release" / "watch-report.json").read_text())
    assert report["outcome"] == "clean" and report["unchecked"] == [], report["unchecked"]
    tier = report["behaviour"]
    assert tier["env"]["built"] and tier["env"]["lock"] == "patches/env/v0.5.23.lock"
    assert tier["env"]["python"].startswith(f"{act.workspace}/.c128patch-cache/envs/")
    for gates in tier["json"]["tiers"]:
        assert len(gates["modules"]) == 11 and all(m["status"] == "ok" for m in gates["modules"].values()), gates
        assert len(gates["scenarios"]) == 8 and all(s["status"] == "passed" for s in gates["scenarios"].values())
    assert verbs(run) == ["pr list", "issue list"]
    # the environment it built, to the tests that take v0.5.23's from the run's cache (support.share_environment)
    share_environment(Path(tier["env"]["python"]).parents[2])


def test_no_line_watch_prints_is_read_as_a_workflow_command(workflow):
    """Watch prints what upstream wrote (subjects, paths, the code of a hunk's context: C++'s ``::ns::f();`` starts
    a line): the runner read such a line as a workflow command (``::error::``, ``::add-mask::``, ``::set-output``).
    The Watch step stops commands around every watch it runs, with a token no output can guess, then resumes them."""
    run = next(s for s in workflow["jobs"]["watch"]["steps"] if s.get("id") == "watch")["run"]
    lines = [line.strip() for line in run.splitlines()]
    start, watch, end = (next(i for i, line in enumerate(lines) if mark in line)
                         for mark in ('echo "::stop-commands::$stop"', "-m c128patch watch", 'echo "::$stop::"'))
    assert start < watch < end, run
    (token,) = [line for line in lines[:start] if line.startswith("stop=")]
    made = {subprocess.run(["bash", "-c", f'PYTHON={sys.executable}; {token}; echo "$stop"'], capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(2)}
    assert len(made) == 2 and all(re.fullmatch("[0-9a-f]{32}", t) for t in made), made
