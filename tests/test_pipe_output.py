"""Output that survives a pipe: off a terminal a table is as wide as its content (no cell cut or
folded, whatever $COLUMNS says), and a download prints plain progress lines on stderr (bytes, file,
seconds) where a terminal would show a bar. Real commands, the real series and a real release wheel
served from a local package index."""

from __future__ import annotations

import functools
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from c128patch import progress
from c128patch.progress import PlainReporter, transfer
from c128patch.upstream.releases import _pip_reports_bytes, wheel_for
from support import error_line, invoke, table_column


@pytest.mark.parametrize("columns", ["80", "400"])
def test_gates_fits_100_columns_piped_and_cuts_no_cell(real_series, columns):
    """Issue 37: output a person reads. gates' table was 411 columns piped (each cell on one line); it fits 100,
    as matrix's does, every cell's text still there whole (its lines joined), no name cut (the rows: --markdown)."""
    res = invoke("gates", as_json=False, env={"COLUMNS": columns})
    assert res.code == 0, res.err
    table = [line.rstrip() for line in res.text.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(map(len, table)) <= 100, max(map(len, table))
    names, what = table_column(res.text, 0), table_column(res.text, 1)
    for g in real_series.gates:
        assert f"{g.name} ({g.declared_by}) {g.default} ({g.type})" in names, names
        for part in (g.enables, g.notes, *(f"needs {n}" for n in g.requires), *(f"not with {n}" for n in g.conflicts)):
            assert " ".join(part.split()) in what, part
    assert "…" not in res.text


def test_check_off_a_terminal_cuts_no_entry_name(real_series, sglang_release_repo):
    res = invoke("check", "--sglang-rev", "v0.5.22", "--sglang-rev", "v0.5.23", as_json=False, env={"COLUMNS": "60"})
    assert res.code == 0, res.err
    rows = [line for line in res.text.splitlines() if line.startswith("│")]
    names = [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()]
    assert names == [e.name for e in real_series.entries]
    assert "…" not in res.text


@pytest.mark.parametrize("columns", ["100", "400"])
def test_check_table_fits_100_columns_piped_or_wide(real_series, sglang_release_repo, columns):
    """Issue 37: output a person reads. check's table was 140-190 columns piped (one line per row, as wide as its
    longest cell); like matrix's, it fits 100, its cells wrapped, no entry name cut (the details: --json)."""
    res = invoke("check", as_json=False, env={"COLUMNS": columns})
    assert res.code == 0, res.err
    table = [line.rstrip() for line in res.text.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(map(len, table)) <= 100, max(map(len, table))
    names = [row.split("│")[1].strip() for row in table if row.startswith("│") and row.split("│")[1].strip()]
    assert names == [e.name for e in real_series.entries]
    assert "…" not in res.text and "v0.5.20" in res.text and "v0.5.23" in res.text


def test_a_long_transfer_prints_a_line_every_few_seconds_and_at_its_end():
    out, now = io.StringIO(), [100.0]
    rep = PlainReporter(stream=out, every=5.0, clock=lambda: now[0])
    total = 40_000_000
    for t, done in ((0, 0), (1, 1_000_000), (4.9, 9_000_000), (5.0, 10_000_000), (7, 20_000_000), (10.5, 30_000_000),
                    (12, total), (12, total)):
        now[0] = 100.0 + t
        transfer(rep, "downloading sglang 0.5.23 wheel (file 4 of 4)", done, total)
    rep.step("a step says nothing off a terminal")
    assert out.getvalue().splitlines() == [
        "downloading sglang 0.5.23 wheel (file 4 of 4): 0.0 of 40.0 MB, 0 s",
        "downloading sglang 0.5.23 wheel (file 4 of 4): 10.0 of 40.0 MB, 5 s",
        "downloading sglang 0.5.23 wheel (file 4 of 4): 30.0 of 40.0 MB, 10 s",
        "downloading sglang 0.5.23 wheel (file 4 of 4): 40.0 of 40.0 MB, 12 s",
    ]


def test_a_transfer_of_unknown_bytes_is_silent_for_its_first_seconds():
    """A download that fails at once (an unknown release) prints its error alone, no ': 0 s' line."""
    out, now = io.StringIO(), [50.0]
    rep = PlainReporter(stream=out, every=5.0, clock=lambda: now[0])
    for t in (0, 1, 4.9, 5.0, 6, 10.2):
        now[0] = 50.0 + t
        transfer(rep, "downloading sglang 9.9.9 wheel", -1, None)
    assert out.getvalue().splitlines() == ["downloading sglang 9.9.9 wheel: 5 s",
                                           "downloading sglang 9.9.9 wheel: 10 s"]
    quick = io.StringIO()
    rep = PlainReporter(stream=quick, every=5.0, clock=lambda: now[0])
    transfer(rep, "downloading sglang 9.9.9 wheel", -1, None)
    assert quick.getvalue() == ""


def _wait_for(out: io.StringIO, lines: int) -> list[str]:
    for _ in range(500):  # 5 s at most, however busy the machine: the beat is 0.01 s
        if len(out.getvalue().splitlines()) >= lines:
            break
        threading.Event().wait(0.01)
    return out.getvalue().splitlines()


def test_a_step_left_open_prints_its_phase_and_elapsed_time_every_beat():
    """A piped run of long work is never silent longer than a beat (10 s in the tool): the open step and its
    seconds, counted from that step; nothing after close, nothing before the first step."""
    out, now = io.StringIO(), [0.0]
    rep = PlainReporter(stream=out, clock=lambda: now[0], beat=0.01)
    threading.Event().wait(0.05)
    assert out.getvalue() == ""
    now[0] = 100.0
    rep.step("applying the series")
    now[0] = 130.0
    assert _wait_for(out, 2)[:2] == ["applying the series: 30 s"] * 2
    rep.step("proving the tree")
    now[0] = 145.0
    lines = _wait_for(out, len(out.getvalue().splitlines()) + 1)
    assert lines[-1] == "proving the tree: 15 s"
    rep.close()
    threading.Event().wait(0.05)
    settled = out.getvalue()
    threading.Event().wait(0.1)
    assert out.getvalue() == settled


def test_error_line_takes_the_progress_lines_before_the_error_and_nothing_else():
    """tests/support.py's error_line (a process's one-line error, a busy machine's heartbeats before it): the lines
    PlainReporter prints pass before the error; a second error, a traceback or any other line does not."""
    from c128patch.progress import transfer_line

    error = "c128patch: error: file size limit reached while patching"
    beat, moved = "patching the upstream wheel: 12 s", transfer_line("sglang-0.5.23.whl", 12_600_000, 34_500_000, 14)
    wait = "waiting for /c/sglang-releases.lock: another run holds its lock (at most 600 s, C128PATCH_LOCK_TIMEOUT)"
    assert error_line(f"{beat}\n{moved}\n{error}\n") == error_line(f"{wait}\n{error}") == error_line(error) == error
    for said in (f"{error}\n{beat}", f"Traceback (most recent call last):\n{error}", f"warning: x\n{error}",
                 f"{error}\n{error}", "", f"c128patch: error: 3 s\n{error}"):
        with pytest.raises(AssertionError):
            error_line(said)


HOSTILE_STEP = "the gate audit on v0.5.23[/x] \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\\x07"


def test_a_step_naming_input_is_plain_text_on_a_terminal_and_off_one(monkeypatch, capsys):
    """A step names input (a series' base, a journal's branch): on a terminal rich's progress took it as markup
    (``[/x]``: a MarkupError traceback), off one its ESC and BEL reached the terminal raw."""
    out = io.StringIO()
    rep = PlainReporter(stream=out, clock=lambda: 0.0, beat=0.01)
    rep.step(HOSTILE_STEP)
    assert _wait_for(out, 1)[0] == "the gate audit on v0.5.23[/x] ]8;;https://evil.example\\link]8;;\\: 0 s"
    rep.close()
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    with progress.reporter(True, title="t") as rich_rep:
        rich_rep.step(HOSTILE_STEP)
        rich_rep.transfer(HOSTILE_STEP, 1, 2)
    assert "\x1b]8;;https://evil" not in capsys.readouterr().err


def test_steps_begun_one_after_another_do_not_silence_the_beat():
    """A cold apply's imports, entries and proof are steps shorter than a beat each, longer together (35 s of
    silence piped, issue 37): the beat counts from the last line said, not from the last step begun."""
    out = io.StringIO()
    rep = PlainReporter(stream=out, beat=0.3)
    for i in range(120):  # 1.2 s: four beats, a step every 10 ms
        rep.step(f"importing part {i}")
        threading.Event().wait(0.01)
    rep.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(re.fullmatch(r"importing part \d+: 0 s", line) for line in lines), lines


def test_a_command_off_a_terminal_beats_after_10_seconds_without_a_line_until_it_ends(monkeypatch, capsys):
    """The tool's beat is 10 s (read in a fresh process: the tests' own is longer, conftest.py); a command's
    reporter off a terminal beats at it, and stops when the command ends."""
    from c128patch import progress

    shipped = subprocess.run([sys.executable, "-c", "from c128patch import progress; print(progress.BEAT)"],
                             capture_output=True, text=True, check=True).stdout
    assert shipped == "10.0\n"
    monkeypatch.setattr(progress, "is_terminal", lambda stream: False)
    monkeypatch.setattr(progress, "BEAT", 0.01)
    with progress.reporter(True) as rep:
        rep.step("lint")
        threading.Event().wait(0.2)
    threading.Event().wait(0.05)
    said = capsys.readouterr().err.splitlines()
    threading.Event().wait(0.1)
    assert said and set(said) == {"lint: 0 s"} and capsys.readouterr().err == ""


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_with_json_a_long_step_still_beats_on_stderr_off_a_terminal(monkeypatch, capsys, terminal):
    """--json (a reporter not enabled) keeps stdout for its JSON; off a terminal (CI piping the nightly watch) its
    long steps still say where they are on stderr; on a terminal it stays quiet as before."""
    from c128patch import progress

    monkeypatch.setattr(progress, "is_terminal", lambda stream: terminal)
    monkeypatch.setattr(progress, "BEAT", 0.01)
    with progress.reporter(False) as rep:
        rep.step("the behavioural tier")
        threading.Event().wait(0.2)
    out = capsys.readouterr()
    assert out.out == "" and (out.err == "" if terminal else "the behavioural tier: 0 s" in out.err), out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def local_index(tmp_path, sglang_release_repo):
    """A PEP 503 index on 127.0.0.1 holding the real sglang 0.5.20 wheel, and an empty cache: pip
    downloads it over HTTP, as from PyPI."""
    wheel = wheel_for("0.5.20")
    root = tmp_path / "index"
    (root / "simple" / "sglang").mkdir(parents=True)
    shutil.copy(wheel, root / wheel.name)
    (root / "simple" / "sglang" / "index.html").write_text(f'<a href="../../{wheel.name}">{wheel.name}</a>\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    (tmp_path / "cache").mkdir()  # the release history as built already (a copy); only the wheel is missing
    shutil.copytree(sglang_release_repo, tmp_path / "cache" / sglang_release_repo.name)
    try:
        yield {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple",
               "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "C128PATCH_WHEELHOUSE": "",
               "C128PATCH_CACHE": str(tmp_path / "cache")}
    finally:
        server.shutdown()


@pytest.mark.skipif(not _pip_reports_bytes(), reason="this pip is older than 24.1: it prints no byte progress "
                                                    "(--progress-bar raw); a fresh venv's bundled pip can be")
def test_a_download_off_a_terminal_prints_plain_progress_lines(local_index, tmp_path):
    lines, mb = _download_lines(local_index, tmp_path)
    assert lines[0].startswith(f"downloading sglang 0.5.20 wheel: 0.0 of {mb} MB, ")
    assert lines[-1].startswith(f"downloading sglang 0.5.20 wheel: {mb} of {mb} MB, ") and lines[-1].endswith(" s")


def test_with_a_pip_that_reports_no_bytes_the_lines_say_the_time_then_the_size(local_index, tmp_path, monkeypatch):
    import c128patch.upstream.releases as releases

    monkeypatch.setattr(releases, "_pip_reports_bytes", lambda: False)
    local_index = {**local_index, "PIP_PROGRESS_BAR": "off"}
    lines, mb = _download_lines(local_index, tmp_path)
    assert all(re.fullmatch(r"downloading sglang 0\.5\.20 wheel: \d+ s", line) for line in lines[:-1]), lines
    assert re.fullmatch(rf"downloading sglang 0\.5\.20 wheel: {mb} of {mb} MB, \d+ s", lines[-1]), lines


def _download_lines(env: dict, tmp_path: Path) -> tuple[list[str], str]:
    res = invoke("wheel", "--from-release", "0.5.20", "-o", str(tmp_path / "dist"), as_json=False, env=env)
    assert res.code == 0, res.err
    size = (Path(env["C128PATCH_CACHE"]) / "wheels").glob("sglang-0.5.20-*.whl")
    mb = f"{next(size).stat().st_size / 1e6:.1f}"
    lines = [line for line in res.err.splitlines() if line.startswith("downloading sglang 0.5.20 wheel: ")]
    assert lines, res.err
    assert "progress" not in res.text.lower() and "downloading" not in res.text  # stdout: the result only
    assert list((tmp_path / "dist").glob("sglang-0.5.20+c128.*.whl"))
    return lines, mb


def test_a_reader_that_stops_reading_does_not_change_the_exit_code(real_series, sglang_release_repo):
    """``c128patch check | head -1``: click exits 1 at the first write to the closed pipe; the command's own code
    (0: it applies) and an empty stderr are what a shell with ``pipefail`` must see."""
    for args in (["check", "--sglang-rev", "v0.5.23"], ["check", "--sglang-rev", "v0.5.23", "--json"]):
        proc = subprocess.Popen([sys.executable, "-m", "c128patch", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # gone before the first line: every write meets a closed pipe
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err
        assert err == ""


@pytest.mark.parametrize("args", [["gates"], ["gates", "--json"]], ids=["table", "json"])
def test_output_to_a_full_disk_is_one_line_and_never_exit_0(args):
    """``c128patch gates > /dev/full`` (a report redirected onto a full disk): rich's or click's write raised a
    traceback (ENOSPC) after the work; it is one line on stderr and exit 2, never the work's 0."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "c128patch", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "c128patch: error: its output could not be written to stdout (No space left on device): " \
                          "what it said is lost\n", proc.stderr


@pytest.mark.parametrize("args", [["gates"], ["lint", "--json"]])
def test_output_to_a_closed_stdout_is_one_line_and_never_exit_0(args):
    """``c128patch lint --json >&-``: python had no stdout, the report went nowhere and the command exited 0; it is
    one line on stderr and exit 2, as for a full disk (and fd 1 is no file the tool opens next)."""
    proc = subprocess.run(["sh", "-c", 'exec "$0" -m c128patch "$@" >&-', sys.executable, *args],
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc.stderr) == "c128patch: error: its output could not be written to stdout (stdout is " \
                                      "closed): what it said is lost", proc.stderr


def test_pythoninspect_in_the_operators_environment_keeps_each_verbs_exit_code(tmp_path):
    """Helper 147: with ``PYTHONINSPECT=1`` in the environment the interpreter takes no ``SystemExit``: every verb
    exited 1 with a SystemExit traceback (``capacity`` and a refused ``check`` alike: the verbs' codes, watch's
    verdicts, were lost) and, on a terminal, opened a prompt where ``PYTHONSTARTUP`` ran."""
    startup, ran = tmp_path / "startup.py", tmp_path / "ran.txt"
    startup.write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONINSPECT": "1", "PYTHONSTARTUP": str(startup)}
    for verb, code in ((["capacity", "--budget-gib", "10"], 0), (["check", "--sglang-rev", "no-such-rev"], 2),
                       (["lint", "--offline", "--series", str(tmp_path / "none")], 2)):
        run = subprocess.run([sys.executable, "-m", "c128patch", *verb], env=env, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
        assert run.returncode == code and "Traceback" not in run.stderr and "SystemExit" not in run.stderr, (
            verb, run.returncode, run.stderr)
        assert code == 0 or run.stderr.startswith("c128patch: error: "), (verb, run.stderr)
    assert not ran.exists()


def test_pip_download_runs_nothing_of_the_current_folder(tmp_path, monkeypatch):
    """Helper 147: ``wheel --from-release`` downloads with ``python -m pip``, which puts the current folder first on
    sys.path; pip imports ``typing`` before it drops it: run from an upstream tree, the tree's top-level ``typing.py``
    ran as the operator (their tokens in its environment). pip runs in its download folder now."""
    from c128patch.upstream import releases

    marker, here = tmp_path / "ran.txt", tmp_path / "tree"
    here.mkdir()
    for name in ("typing.py", "json.py", "runpy.py"):
        (here / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    monkeypatch.chdir(here)
    (tmp_path / "dest").mkdir()
    ok, _ = releases._pip_download_into(tmp_path / "dest", "0.0.0", ("--index-url", "http://127.0.0.1:9/simple",
                                                                     "--retries", "0", "--timeout", "1"), None)
    assert not ok and not marker.exists(), marker.read_text()
