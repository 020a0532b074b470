"""`c128patch doctor` on real installs: the patched 0.5.23 wheel (real product series) and the plain
upstream 0.5.23 wheel, each `pip install --no-deps` into its own fresh venv, asked through
`--python`. The envs doctor reads are set for the doctor process (it reads them as the serving
process would)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from c128patch.series.manifest import load_series
from c128patch.serve import doctor as doctor_module
from c128patch.serve import serving
from c128patch.serve.serving import ONLINE_C128_DSPARK_RULES
from c128patch.upstream.releases import wheel_for
from c128patch.wheel.patch import patch_wheel
from support import REPO_ROOT, invoke, make_test_series

SERIES_ENVS = ("SGLANG_OPT_USE_ONLINE_COMPRESS", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK",
               "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "SGLANG_DSPARK_RECORD_VERIFY_STREAMS",
               "SGLANG_RAGGED_VERIFY_MODE")
RULES_IN_SERIES = (REPO_ROOT / "overlay" / ONLINE_C128_DSPARK_RULES).is_file()
ON = {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"}


def venv_with(root: Path, wheel: Path | None) -> Path:
    """A fresh venv (no pip of its own) with ``wheel`` installed, no dependencies; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    if wheel is not None:
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-compile", str(wheel)], check=True)
    return python


@pytest.fixture(scope="module")
def patched_python(tmp_path_factory: pytest.TempPathFactory, real_series, sglang_release_repo: Path) -> Path:
    root = tmp_path_factory.mktemp("patched")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        wheel = patch_wheel(real_series, wheel_for("0.5.23"), root / "dist").wheel
    return venv_with(root / "venv", Path(wheel))


@pytest.fixture(scope="module")
def upstream_python(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    return venv_with(tmp_path_factory.mktemp("upstream") / "venv", wheel_for("0.5.23"))


STANDINS = Path(__file__).parent / "doctor_standins"


def doctor(python: Path, *args: str, env: dict[str, str] | None = None, pythonpath: Path | None = None,
           standin: str | None = None, timeout: float | None = None):
    """(exit code, report JSON, {topic: [(level, message)]}) of `doctor --python python --json`.
    ``standin``: the package doctor's serving probe imports instead of sglang (tests/doctor_standins/:
    a real install cannot import here, without torch or a GPU stack)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in SERIES_ENVS:
            mp.delenv(name, raising=False)
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        if pythonpath is not None:
            mp.setenv("PYTHONPATH", str(pythonpath))
        if standin is not None:
            assert pythonpath is None
            mp.setenv("PYTHONPATH", str(STANDINS))
            mp.setattr(serving, "MODULES", {"package": standin, "server_args": f"{standin}.server_args",
                                            "config": f"{standin}.config"})
        if timeout is not None:
            mp.setattr(serving, "TIMEOUT", timeout)
        # --json before the `--`: what follows it is the serving command line
        res = invoke("doctor", "--python", str(python), "--json", *(["--", *args] if args else []))
    report = res.out
    topics: dict[str, list[tuple[str, str]]] = {}
    for f in report["findings"]:
        topics.setdefault(f["topic"], []).append((f["level"], f["message"]))
    return res.code, report, topics


SGLANG_STANDIN = "c128patch_standin_sglang"


def test_a_patched_build_with_its_gates_unset_passes_where_a_stand_in_sglang_imports(patched_python: Path):
    code, report, topics = doctor(patched_python, standin=SGLANG_STANDIN)
    assert code == 0 and report["ok"] is True
    assert not [f for f in report["findings"] if f["level"] == "error"]
    assert topics["import"][0][0] == "ok" and topics["import"][0][1].startswith(f"`import sglang` works in ")
    assert topics["args"] == [("ok", "sglang's own server-arguments parser accepts no launch arguments; not given: "
                                     "--model-path (needed at launch)")]


def test_a_real_install_where_sglang_does_not_import_is_an_error(patched_python: Path):
    """The real patched wheel without its dependencies (no numpy, no torch): it cannot serve."""
    code, report, topics = doctor(patched_python)
    assert code == 1 and report["ok"] is False
    ((level, message),) = topics["import"]
    assert level == "error" and message.startswith(f"`import sglang` fails in {patched_python}: ModuleNotFoundError: "
                                                   "No module named ")
    assert "args" not in topics  # no launch arguments given: the import error says it all


def test_the_readmes_doctor_command_on_a_python_that_cannot_import_sglang_exits_1(patched_python: Path):
    code, _, topics = doctor(patched_python, "--speculative-algorithm", "DSPARK", env=ON)
    assert code == 1
    assert topics["import"][0][0] == "error"
    assert topics["args"] == [("error",
                               "cannot check `--speculative-algorithm DSPARK` with sglang's own server-arguments "
                                        "parser: it needs `import sglang`, which fails")]


def test_an_unknown_launch_flag_is_an_error_from_the_parser_the_serving_python_imports(patched_python: Path):
    """The stand-in's parser (tests/doctor_standins/, a few of upstream's options), not one of doctor's own:
    `--mem-fraction-static`, a real sglang option the stand-in lacks, is refused."""
    code, _, topics = doctor(patched_python, "--speculative-algorithm", "DSPARK", "--no-such-flag",
                             standin=SGLANG_STANDIN)
    assert code == 1
    assert topics["args"] == [("error", "sglang's own server-arguments parser refuses `--speculative-algorithm DSPARK "
                                        "--no-such-flag`: unrecognized arguments: --no-such-flag")]
    code, _, topics = doctor(patched_python, "--model-path", "m", "--speculative-algorithm", "NOPE",
                             standin=SGLANG_STANDIN)
    assert code == 1 and "argument --speculative-algorithm: invalid choice: 'NOPE'" in topics["args"][0][1]
    code, _, topics = doctor(patched_python, "--model-path", "m", "--tp", "8", standin=SGLANG_STANDIN)
    assert code == 0 and topics["args"] == [("ok",
                                             "sglang's own server-arguments parser accepts `--model-path m --tp 8`")]
    code, _, topics = doctor(patched_python, "--model-path", "m", "--mem-fraction-static", "0.8",
                             standin=SGLANG_STANDIN)
    assert code == 1 and topics["args"][0][1].endswith("unrecognized arguments: --mem-fraction-static 0.8")


def test_an_import_that_does_not_finish_is_an_error(patched_python: Path):
    code, _, topics = doctor(patched_python, standin="c128patch_standin_slow", timeout=3)
    assert code == 1 and topics["import"] == [
        ("error", f"`import sglang` fails in {patched_python}: it did not finish in 3 s; the server cannot start there "
                  "(install sglang with its dependencies, then the patched wheel over it: docs/deploy.md in "
                  "c128patch's repository)")]


def test_the_dspark_gate_without_a_gpu_is_an_error(patched_python: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(doctor_module, "nvidia_smi", lambda _: ([], "nvidia-smi not found"))  # as on a host without one
    _, _, topics = doctor(patched_python, standin=SGLANG_STANDIN)
    assert topics["gpu"] == [("warn", "no NVIDIA GPU here (nvidia-smi not found)")]  # gates off: upstream's business
    code, _, topics = doctor(patched_python, standin=SGLANG_STANDIN, env=ON)
    assert code == 1 and topics["gpu"] == [
        ("error", "no NVIDIA GPU here (nvidia-smi not found): the series' gates set run its kernels on the GPU")]


def test_the_installed_sglang_is_named_with_where_it_came_from(patched_python: Path, real_series):
    _, report, topics = doctor(patched_python)
    version = f"0.5.23+c128.{real_series.version}.{real_series.digest()[:8]}"
    site = Path(report["sglang"]["path"])
    assert site.parent.parent.parent.parent == patched_python.parent.parent
    ((level, message),) = topics["sglang"]
    assert level == "ok" and message.startswith(f"sglang {version} at {site} (pip, from file://")


def test_a_patched_build_is_recognised_with_its_series_label_and_sbom(patched_python: Path, real_series):
    _, _, topics = doctor(patched_python)
    ((level, message),) = topics["build"]
    assert level == "ok"
    assert message == (f"c128patch build: series c128patch {real_series.version} (digest {real_series.digest()[:8]}) "
                       "on sglang 0.5.23 (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl); the version label and "
                       "the SBOM agree with the provenance")
    assert topics["series"] == [("ok", f"the build carries this tool's series c128patch {real_series.version}")]


def test_every_entry_the_build_carries_is_listed_with_its_gate(patched_python: Path, real_series):
    _, _, topics = doctor(patched_python)
    lines = [m for _, m in topics["entry"]]
    assert [m.split(" ", 1)[0] for m in lines] == [e.name for e in real_series.entries]
    for line, entry in zip(lines, real_series.entries):
        assert line.endswith(f": gate {entry.gate or 'none'}")


def test_the_installed_files_are_checked_against_record(patched_python: Path):
    _, _, topics = doctor(patched_python)
    ((level, message),) = topics["record"]
    assert level == "ok" and message.endswith(" installed files match RECORD")


@pytest.mark.parametrize("record", ["", "sglang/__init__.py,,\n", "sglang/__init__.py,md5=x,1\n"])
def test_a_record_listing_no_hashed_file_is_not_a_match(tmp_path: Path, record: str):
    """Helper 139: a RECORD emptied (or with no sha256 row) was "ok: 0 installed files match RECORD": a check that
    checked nothing said it held."""
    from c128patch.serve.install import Dist

    info = tmp_path / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(record)
    report = doctor_module.Report()
    doctor_module._record(report, Dist("0.5.23", info, tmp_path))
    ((finding),) = report.findings
    assert finding.level == "warn" and finding.message.endswith("lists no file with a hash: the installed files "
                                                                "cannot be checked"), finding


def test_a_record_row_naming_a_huge_or_special_file_is_not_read_whole(tmp_path: Path, monkeypatch):
    """Helper 144: doctor hashed every file RECORD names with ``read_bytes``: a row naming a 10 GB sparse file (or,
    as root, ``../../proc/kcore``) was read whole into memory. Only regular files are read, never past RECORD's size
    nor 1 GiB; a FIFO is named, not opened."""
    from c128patch.errors import C128Error
    from c128patch.serve.install import Dist

    info = tmp_path / "sglang-0.5.23.dist-info"
    info.mkdir()
    with open(tmp_path / "big.so", "wb") as f:
        f.truncate(10 << 30)  # sparse: no disk
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "small.py").write_bytes(b"x = 1\n")
    (info / "RECORD").write_text(f"big.so,sha256=AAAA,{10 << 30}\npipe.py,sha256=AAAA,3\nsmall.py,sha256=AAAA,999\n"
                                 "small.py,sha256=AAAA,\n")
    read_whole = pytest.fail  # the old check: (site / name).read_bytes()
    monkeypatch.setattr(Path, "read_bytes", lambda self: read_whole(f"read whole: {self}"))
    report = doctor_module.Report()
    doctor_module._record(report, Dist("0.5.23", info, tmp_path))
    ((finding),) = report.findings
    assert finding.level == "error", finding
    assert "big.so (over 1 GiB: not read)" in finding.message and "pipe.py (not a regular file)" in finding.message
    assert "small.py (modified)" in finding.message
    (info / "RECORD").unlink()
    (info / "RECORD").symlink_to(tmp_path / "big.so")  # RECORD itself: a link to a huge file
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read_whole(f"read whole: {self}"))
    with pytest.raises(C128Error, match="RECORD is over 16 MiB: not an installer's file"):
        doctor_module._record(doctor_module.Report(), Dist("0.5.23", info, tmp_path))


def test_a_record_row_naming_a_file_outside_the_install_is_never_read(tmp_path: Path):
    """h146: doctor hashed every file RECORD names, wherever it lay: a row `../../../../secret` (as root,
    `../../etc/shadow`), `/abs/secret` or a link in site-packages to it was read and its match said ("ok: 3 installed
    files match RECORD"). Only files in the site folder and the environment's scripts folder (pip's
    `../../../bin/sglang`) are read; any other row is an error naming it, unread."""
    from c128patch.serve.install import Dist
    from c128patch.wheel.tools import record_hash

    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir(parents=True)
    (site / "sglang").mkdir()
    (site / "sglang" / "a.py").write_bytes(b"a = 1\n")
    (tmp_path / "env" / "bin").mkdir()
    (tmp_path / "env" / "bin" / "sglang").write_bytes(b"#!/bin/sh\n")
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0\n")
    (site / "sglang" / "link.py").symlink_to(secret)
    rows = {"sglang/a.py": b"a = 1\n", "../../../bin/sglang": b"#!/bin/sh\n"}
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in rows.items())
    (info / "RECORD").write_text(record)
    report = doctor_module.Report()
    doctor_module._record(report, Dist("0.5.23", info, site))
    assert [(f.level, f.message) for f in report.findings] == [("ok", "2 installed files match RECORD")]
    for name in ("../../../../secret", str(secret), "sglang/link.py", "../../../bin/../../secret"):
        (info / "RECORD").write_text(record + f"{name},{record_hash(secret.read_bytes())},11\n")
        report = doctor_module.Report()
        doctor_module._record(report, Dist("0.5.23", info, site))
        ((finding),) = report.findings
        assert finding.level == "error" and f"{name} (outside the install: not read)" in finding.message, finding


def test_a_modified_installed_file_is_an_error_naming_it(patched_python: Path):
    target = next(patched_python.parent.parent.glob("lib/python*/site-packages/sglang/srt/environ.py"))
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# edited after install\n")
        code, _, topics = doctor(patched_python)
    finally:
        target.write_bytes(original)
    assert code == 1
    ((level, message),) = topics["record"]
    assert level == "error" and "installed files differ from RECORD: sglang/srt/environ.py (modified)" in message


def test_unset_envs_are_read_with_the_installed_defaults(patched_python: Path):
    _, _, topics = doctor(patched_python)
    env = [m for _, m in topics["env"]]
    assert "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK unset (default False)" in env
    assert "SGLANG_RAGGED_VERIFY_MODE unset (default static)" in env


def test_set_envs_say_what_they_enable(patched_python: Path, real_series):
    _, _, topics = doctor(patched_python, env=ON)
    gate = next(g for g in real_series.gates if g.name == "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK")
    assert ("ok", f"SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1: {gate.enables}") in topics["env"]


def test_a_value_sglang_cannot_parse_is_an_error_with_sglangs_warning(patched_python: Path):
    code, _, topics = doctor(patched_python, env={"SGLANG_DSPARK_RECORD_VERIFY_STREAMS": "maybe"})
    assert code == 1
    assert ("error",
            'SGLANG_DSPARK_RECORD_VERIFY_STREAMS=maybe: Invalid value for SGLANG_DSPARK_RECORD_VERIFY_STREAMS: '
                     '"maybe" is not a valid boolean value, using default "False"') in topics["env"]


def test_a_value_outside_a_gates_choices_is_an_error_without_launch_arguments(patched_python: Path):
    """sglang reads any text for SGLANG_RAGGED_VERIFY_MODE and refuses all but its modes at launch: doctor said
    `ok env SGLANG_RAGGED_VERIFY_MODE=bogus` where no launch arguments were given."""
    code, _, topics = doctor(patched_python, env={"SGLANG_RAGGED_VERIFY_MODE": "bogus"})
    assert code == 1
    assert ("error", "SGLANG_RAGGED_VERIFY_MODE=bogus: sglang takes only static, cap-accept, compact and refuses "
                     "anything else at launch") in topics["env"]
    _, _, topics = doctor(patched_python, env={"SGLANG_RAGGED_VERIFY_MODE": "compact"})
    assert [level for level, m in topics["env"] if m.startswith("SGLANG_RAGGED_VERIFY_MODE=")] == ["ok"]


def test_a_gate_value_sglang_cannot_parse_is_what_startup_refuses_not_arguments_doctor_could_not_check(
        patched_python: Path):
    """The build's startup check reads the envs strictly where its gate is on (sglang: a warning and the default):
    that is its refusal at launch. With the gate off (unset, or itself unparsable: sglang reads the default) the
    check does not run, and doctor never said `cannot check the launch arguments` for an env value."""
    args = ("--speculative-algorithm", "DSPARK")
    code, _, topics = doctor(patched_python, *args, env={**ON, "SGLANG_OPT_USE_ONLINE_COMPRESS": "on"})
    assert code == 1
    assert topics["startup"] == [("error", "startup would refuse for `--speculative-algorithm DSPARK`: "
                                           'SGLANG_OPT_USE_ONLINE_COMPRESS="on" is not a valid boolean value')]
    assert ("info", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK needs SGLANG_OPT_USE_ONLINE_COMPRESS, which is off here "
                    "(SGLANG_OPT_USE_ONLINE_COMPRESS=on): without it SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK does "
                    "nothing") in topics["env"]  # it said "which is not set" of a variable set to "on"
    for env in ({"SGLANG_OPT_USE_ONLINE_COMPRESS": "on"}, {**ON, "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "on"}):
        _, _, topics = doctor(patched_python, env=env)
        assert [level for level, _ in topics["startup"]] == ["ok"], topics["startup"]
        assert any(level == "error" and "is not a valid boolean value" in m for level, m in topics["env"])


@contextlib.contextmanager
def without_startup_rules(python: Path) -> Iterator[None]:
    """The patched install as a build without startup rules: its rules module moved aside meanwhile."""
    rules = _installed(python, ONLINE_C128_DSPARK_RULES)
    aside = rules.with_name(rules.name + ".aside")
    rules.rename(aside)
    try:
        yield
    finally:
        aside.rename(rules)


def test_without_startup_rules_a_gate_without_what_it_needs_is_an_error(patched_python: Path):
    with without_startup_rules(patched_python):
        code, _, topics = doctor(patched_python, env={"SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"})
    assert code == 1
    assert ("error", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK needs SGLANG_OPT_USE_ONLINE_COMPRESS, which is not set: "
                     "without it SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK does nothing") in topics["env"]
    assert topics["startup"] == [("warn", f"this build carries no startup rules ({ONLINE_C128_DSPARK_RULES}): what "
                                          "startup would refuse is not checked")]


def test_without_startup_rules_two_conflicting_gates_are_an_error(patched_python: Path):
    with without_startup_rules(patched_python):
        code, _, topics = doctor(patched_python, env={**ON, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "1"})
    assert code == 1
    assert ("error", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK and SGLANG_EXPERIMENTAL_ONLINE_C128_MTP are both set: "
                     "they do not go together") in topics["env"]


def test_plain_upstream_is_named_and_the_series_gates_do_nothing_there(upstream_python: Path):
    code, report, topics = doctor(upstream_python, env={"SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"})
    assert code == 1 and report["build"] is None
    assert topics["build"] == [("warn",
                                "plain sglang 0.5.23: not a c128patch build (no sglang/c128patch_provenance.json)"
                                        "; the series' gates do nothing here")]
    assert ("error", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1 is set, but this sglang does not declare it (not a "
                     "c128patch build): it does nothing here") in topics["env"]
    assert topics["record"][0][0] == "ok"


def test_plain_upstream_with_no_series_env_set_is_not_an_error(upstream_python: Path):
    code, _, topics = doctor(upstream_python, env={"SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}, standin=SGLANG_STANDIN)
    assert code == 0
    assert topics["env"][0][0] == "ok"  # upstream's own variable, read by upstream's environ.py


def test_an_sglang_that_shadows_the_installed_one_is_an_error(patched_python: Path, release_trees):
    shadow = release_trees["v0.5.23"]
    code, _, topics = doctor(patched_python, pythonpath=shadow)
    assert code == 1
    (level, message), = topics["sglang"]
    assert level == "error" and message.startswith(
        f"`import sglang` resolves to {shadow / 'sglang'}, not the installed")


def test_a_python_without_sglang_is_an_error(tmp_path: Path):
    code, _, topics = doctor(venv_with(tmp_path / "venv", None))
    assert code == 1
    assert topics["sglang"][0][0] == "error" and topics["sglang"][0][1].startswith("no sglang is installed for ")


def test_a_venv_folder_given_as_python_names_its_interpreter(tmp_path: Path):
    """`--python /opt/sglang` (the venv, not its bin/python) said only "cannot run /opt/sglang: Permission denied"."""
    venv = tmp_path / "sglang"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    res = invoke("doctor", "--python", str(venv), as_json=False)
    assert res.code == 2
    assert res.err.strip() == (f"c128patch: error: {venv} is a folder, not a Python: pass --python the serving "
                               f"interpreter ({venv / 'bin' / 'python'})")


def test_a_python_that_does_not_run_is_one_line(tmp_path: Path):
    """README's doctor line on a host without /opt/sglang (issue 37's walk): the path once, then why."""
    res = invoke("doctor", "--python", str(tmp_path / "nope"), as_json=False)
    assert res.code == 2
    assert res.err.strip() == f"c128patch: error: cannot run {tmp_path / 'nope'}: No such file or directory", res.err


def test_the_text_report_is_one_line_per_finding(patched_python: Path):
    res = invoke("doctor", "--python", str(patched_python), as_json=False)
    lines = res.text.strip().splitlines()
    assert res.code == 1 and lines[0].startswith("doctor: 1 error(s), ")  # the verdict first; `import sglang` fails
    assert lines[0].endswith(": this sglang would not do what the envs ask (errors below)")
    assert [line.split()[:2] for line in lines if line.startswith("error")] == [["error", "import"]]
    assert all(line.split()[0] in ("ok", "info", "warn", "error") for line in lines[1:])


# -- startup rules: the build's own module, run from the install -----------------------------------

RULES_STANDIN = '''"""A module with the startup rules' interface (config_from_args, startup_refusals), for
doctor's plumbing: it is loaded from the install by path and its lines are reported as they are."""


def config_from_args(argv, environ):
    if "--config" in argv:
        raise ValueError("--config FILE: options in a config file are not read here")
    return {"tbo": "--enable-two-batch-overlap" in argv, "gate": environ.get("SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK")}


def startup_refusals(config):
    return ["--enable-two-batch-overlap: refused by this build"] if config["tbo"] and config["gate"] == "1" else []
'''


@pytest.fixture(scope="module")
def rules_python(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    """A c128patch build of 0.5.23 (a test series declaring the DSPARK gate) whose overlay installs a
    rules module at the path the series' startup rules take."""
    root = tmp_path_factory.mktemp("rules")
    declare = "    SGLANG_OPT_USE_ONLINE_COMPRESS = EnvBool(False)\n"  # and the gate beside it, as the series does
    series_root = make_test_series(root / "series", sglang_release_repo, {"python/sglang/srt/environ.py": (
        declare, declare + "    SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK = EnvBool(False)\n")}, overlay=False)
    source = series_root / "overlay" / "rules.py"
    source.parent.mkdir(parents=True)
    source.write_text(RULES_STANDIN)
    manifest = series_root / "patches" / "series.toml"
    manifest.write_text(manifest.read_text() + '\n[[entries]]\nname = "rules"\nkind = "overlay"\n'
                        'source = "overlay/rules.py"\n'
                        f'target = "python/{ONLINE_C128_DSPARK_RULES}"\nwhy = "test"\nbase = "v0.5.23"\n')
    from c128patch.ops.lint import update_hashes

    update_hashes(load_series(series_root))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        wheel = patch_wheel(load_series(series_root), wheel_for("0.5.23"), root / "dist").wheel
    return venv_with(root / "venv", Path(wheel))


def test_doctor_reports_what_the_builds_startup_rules_refuse(rules_python: Path):
    code, report, topics = doctor(rules_python, "--enable-two-batch-overlap", env=ON)
    assert code == 1 and report["startup"]["available"] is True
    assert topics["startup"] == [("error", "startup would refuse for `--enable-two-batch-overlap`: "
                                           "--enable-two-batch-overlap: refused by this build")]


def test_with_startup_rules_the_references_needs_are_information(rules_python: Path):
    _, _, topics = doctor(rules_python, env={"SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"})
    needs = [(lvl, m) for lvl, m in topics["env"] if " needs " in m]
    assert [lvl for lvl, _ in needs] == ["info"]


def test_launch_arguments_the_rules_cannot_read_are_an_error(rules_python: Path):
    code, _, topics = doctor(rules_python, "--config", "x.yaml", env=ON)
    assert code == 1
    assert topics["startup"] == [("error", "cannot check the launch arguments: ValueError: --config FILE: options in a "
                                           "config file are not read here")]


def test_nothing_refused_says_so_with_the_arguments(rules_python: Path):
    _, _, topics = doctor(rules_python, "--tp", "8", env=ON, standin=SGLANG_STANDIN)
    assert topics["args"][0][0] == "ok"
    assert topics["startup"] == [("ok", "startup would refuse nothing for `--tp 8`")]


def test_startup_is_not_ok_for_arguments_sglangs_parser_could_not_read(rules_python: Path):
    code, _, topics = doctor(rules_python, "--tp", "8", env=ON)  # `import sglang` fails: the parser never ran
    assert code == 1 and topics["args"][0][0] == "error"
    assert topics["startup"] == [("warn", "the rules refuse nothing for `--tp 8`, but sglang's own parser did not "
                                          "read these arguments (see args): not checked")]


def test_an_unknown_option_before_the_launch_arguments_is_named(patched_python: Path):
    res = invoke("doctor", "--python", str(patched_python), "--pyhton", "x", as_json=False)
    assert res.code == 2 and "No such option '--pyhton'. Did you mean '--python'?" in res.err
    # a misspelt option of doctor's own is not moved after `--` as a launch argument (it said
    # "launch arguments go after `--`: c128patch doctor -- --pyhton x"); an unknown one still is
    assert "after `--`" not in res.err, res.err
    res = invoke("doctor", "--python", str(patched_python), "--tp", "8", as_json=False)
    assert res.code == 2 and res.err.strip().endswith(
        f"launch arguments go after `--`: c128patch doctor --python {patched_python} -- --tp 8"), res.err


@pytest.mark.parametrize("code, said", [
    ("import sys\nsys.exit(0)\n", "cannot read sglang's environ.py: "),
    ("import os\nos._exit(0)\n", "the child process reading it: it exited (status 0) without an answer"),
    ("while True:\n    pass\n", "the child process reading it: it did not finish in 2 s"),
    ("import os\nos.write(1, b'C128PATCH-ANSWER {\"environ_error\": \"\", \"gates\": [], \"startup\": {\"path\": \"\", "
     "\"available\": false, \"config\": {}, \"refusals\": [], \"error\": \"\"}}\\n')\nos._exit(0)\n",
     "the child process reading it: its output holds an answer line it did not write (1 for one)"),
    ("import atexit, os\natexit.register(os.write, 1, b'C128PATCH-ANSWER {\\n')\n",
     "the child process reading it: its output holds an answer line it did not write (2 for one)")],
    ids=["exits", "os-exit", "hangs", "forged-answer", "marker-in-its-output"])
def test_an_environ_py_that_exits_silently_or_hangs_is_an_error(patched_python: Path, code: str, said: str,
                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(serving, "INSTALL_TIMEOUT", 2)
    target = _installed(patched_python, "sglang") / "srt" / "environ.py"
    original = target.read_bytes()
    try:
        target.write_text(code)
        exit_code, report, topics = doctor(patched_python, standin=SGLANG_STANDIN)
    finally:
        target.write_bytes(original)
    assert exit_code == 1 and report["ok"] is False
    ((level, message),) = topics["env"]
    assert level == "error" and said in message, message


def test_a_hanging_environ_py_is_said_while_doctor_waits_with_its_bound(patched_python: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """Helper 187: a looping installed `environ.py` held doctor 60 s (300 s for sglang's import) with nothing on
    screen. Each bounded wait is a progress step naming its bound (off a terminal: a line every beat)."""
    from c128patch import progress

    monkeypatch.setattr(serving, "INSTALL_TIMEOUT", 3)
    monkeypatch.setattr(serving, "TIMEOUT", 4)  # (sglang's import reads environ.py too: it waited the whole 300 s)
    monkeypatch.setattr(progress, "BEAT", 0.5)
    target = _installed(patched_python, "sglang") / "srt" / "environ.py"
    original = target.read_bytes()
    try:
        target.write_text("while True:\n    pass\n")
        res = invoke("doctor", "--python", str(patched_python), as_json=False)
    finally:
        target.write_bytes(original)
    assert res.code == 1, res.err
    assert "reading sglang's environ.py and startup rules in a child (at most 3 s): " in res.err, res.err
    assert "did not finish in 3 s" in res.text, res.text
    assert "importing sglang in " in res.err and "(at most 4 s)" in res.err, res.err


def test_doctor_reports_the_series_startup_rules_line_for_line(patched_python: Path):
    import importlib.util

    assert RULES_IN_SERIES, f"the series' startup rules (overlay/{ONLINE_C128_DSPARK_RULES}) are gone"
    spec = importlib.util.spec_from_file_location("test_doctor_rules", REPO_ROOT / "overlay" / ONLINE_C128_DSPARK_RULES)
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    args = ["--speculative-algorithm", "EAGLE", "--enable-two-batch-overlap"]
    env = {**ON, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "1"}
    want = rules.startup_refusals(rules.config_from_args(args, {**os.environ, **env}))
    assert want  # the rules refuse this configuration
    code, _, topics = doctor(patched_python, *args, env=env)
    assert code == 1
    assert topics["startup"] == [("error", f"startup would refuse for `{' '.join(args)}`: {line}") for line in want]


@pytest.mark.parametrize("prints", ["[]", "{}", "garbage", '{"executable": 1}', "[" * 100_000])
def test_a_program_that_is_not_a_python_is_one_line(tmp_path: Path, prints: str):
    fake = tmp_path / "python"
    (tmp_path / "answer").write_text(prints + "\n")
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'answer'}\n")
    fake.chmod(0o755)
    res = invoke("doctor", "--python", str(fake), as_json=False)
    assert res.code == 2, (res.code, res.err)
    (line,) = res.err.strip().splitlines()
    assert line.startswith(f"c128patch: error: {fake} did not answer as a Python does ("), line


@pytest.mark.parametrize("script, said", [
    (r"printf '\377\376{}\n'", "{fake} did not answer as a Python does ("),
    (r"printf '\377\n' >&2; exit 3", "cannot ask {fake} what it has installed: ")])
def test_a_program_printing_non_utf8_is_one_line(tmp_path: Path, script: str, said: str):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    res = invoke("doctor", "--python", str(fake), as_json=False)
    assert res.code == 2, (res.code, res.err)
    (line,) = res.err.strip().splitlines()
    assert line.startswith("c128patch: error: " + said.format(fake=fake)), line


def _installed(python: Path, name: str) -> Path:
    return next(python.parent.parent.glob(f"lib/python*/site-packages/{name}"))


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b'{"url": ["x"], "dir_info": []}', b"[" * 100_000])
def test_a_direct_url_json_of_the_wrong_shape_is_said(patched_python: Path, content: bytes):
    target = _installed(patched_python, "sglang-*.dist-info") / "direct_url.json"
    original = target.read_bytes()
    try:
        target.write_bytes(content)
        _, _, topics = doctor(patched_python)
    finally:
        target.write_bytes(original)
    ((level, message),) = topics["sglang"]
    assert level == "ok" and message.endswith(", from an unreadable direct_url.json)"), message


@pytest.mark.parametrize("content, said", [(b'{"series": "\xff\xfe"}', "not UTF-8 (byte 0xff"),
                                           (b"[]", "a JSON list, not an object"),
                                           (b'{"entries": {"a": 1}}', "not a c128patch provenance record"),
                                           (b"[" * 100_000, "nested too deeply")])
def test_a_provenance_that_is_not_one_is_an_error_not_a_traceback(patched_python: Path, content: bytes, said: str):
    target = _installed(patched_python, "sglang") / "c128patch_provenance.json"
    original = target.read_bytes()
    try:
        target.write_bytes(content)
        code, _, topics = doctor(patched_python)
    finally:
        target.write_bytes(original)
    assert code == 1
    ((level, message),) = topics["build"]
    assert level == "error" and said in message, message


def test_what_the_serving_python_answers_is_printed_as_data(tmp_path: Path):
    """The serving python's answer (its executable, version, platform, sglang's version and site) reached the
    terminal raw: an OSC-8 link, a CSI clearing the screen, U+202E, and a newline forging a line of doctor's."""
    fake = tmp_path / "python"
    answer = {"executable": "/usr/bin/py\x1b]8;;http://evil.example\x07thon\u202e",
              "version": "3.11.7\x1b[2J\nforged: ok", "tag": "cp311\x9b", "platform": "linux\x1b[31m",
              "import_path": None, "dists": {"sglang": {"version": "0.5.23\x1b]8;;http://e\x07+c128\u202e",
                                                        "dist_info": None, "site": "/site\x1b[5m", "requires": []}}}
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(answer)}\nEOF\n")
    fake.chmod(0o755)
    res = invoke("doctor", "--python", fake, as_json=False)
    assert res.code == 1 and "Python 3.11.7[2J ⏎ forged: ok" in res.text, (res.code, res.err, res.text)
    assert not any(c in res.text for c in "\x1b\x07\x9b\u202e"), res.text
    assert not any(line.startswith("forged") for line in res.text.splitlines())


def test_a_probe_that_floods_its_output_or_leaves_a_child_holding_it_is_answered_at_once(tmp_path: Path):
    """Helper 134: a probe printing 3 GB held 9 GB of the tool's memory (and ran past its limit); one that answered
    and left a child in a session of its own holding its stdout was "did not finish in 300 s", the child left
    running after doctor."""
    flood = "import sys\nsys.stdin.readline()\nfor i in range(3000): sys.stdout.write('x' * (1 << 20))\n"
    started = time.monotonic()
    got = serving.ask(sys.executable, flood, [], 60)
    assert "more than 16 MiB to its stdout" in got.error and time.monotonic() - started < 20, got
    pids = tmp_path / "pids"
    left = ("import os, sys, time\nmark = sys.stdin.readline().strip()\nif os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        open({str(pids)!r}, 'a').write(os.readlink('/proc/self') + '\\n')\n        time.sleep(30)\n"
            "    os._exit(0)\ntime.sleep(0.5)\nprint(mark, '{\"ok\": 1}', flush=True)\n")
    started = time.monotonic()
    got = serving.ask(sys.executable, left, [], 20)
    assert got.data == {"ok": 1} and not got.error and time.monotonic() - started < 10, got
    (pid,) = map(int, pids.read_text().split())  # the daemon it left (a double fork, a session of its own): ended
    # (its pid as the host's /proc says it: in the probe's pid namespace, os.getpid() is that namespace's)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_first_probe_what_is_installed_has_the_probes_guarantees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Helper 139: doctor's first question (``install.probe``: where sglang is installed) ran the serving Python with
    the operator's whole environment, read until its pipes closed and kept all it printed: a site hook of the venv
    (a ``.pth``; here a wrapper) saw HF_TOKEN, a daemon it left holding stdout held doctor 120 s ("timed out", the
    script's text in the line) and outlived it. It runs as the other probes do now."""
    from c128patch.errors import C128Error
    from c128patch.serve import install

    monkeypatch.setenv("HF_TOKEN", "hf_c128")
    pids, seen = tmp_path / "pids", tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "${{HF_TOKEN:-none}}" > {seen}\n'
                      f'setsid sh -c \'read -r p _ < /proc/self/stat; echo $p >> {pids}; exec sleep 30\' &\n'
                      f'exec {sys.executable} "$@"\n')  # (its pid as the host's /proc says it)
    python.chmod(0o755)
    started = time.monotonic()
    found = install.probe(str(python))
    assert found.version and time.monotonic() - started < 20 and seen.read_text() == "none\n"
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):  # the daemon it left: ended with the probe
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    python.write_text(f"#!/bin/sh\nhead -c 20000000 /dev/zero\nexec {sys.executable} \"$@\"\n")
    with pytest.raises(C128Error, match="cannot ask .* what it has installed: it wrote more than 16 MiB"):
        install.probe(str(python))


def test_no_probe_runs_a_module_of_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Helper 139: ``python -c`` puts the current folder first on sys.path: doctor run in an upstream tree whose top
    level holds ``json.py`` ran it in each of its three probes (the probes' own ``import json``). None runs it now;
    an ``sglang`` there that would shadow the install at a launch from here is still found."""
    from c128patch.serve import install

    marker = tmp_path / "RAN"
    for name in ("json", "platform", "warnings"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    tell = "answer({'ok': 1})\n"
    got = serving.ask(sys.executable, serving._COMMON + tell, [], 30)
    assert got.data == {"ok": 1} and not got.error, got
    assert install.probe(sys.executable).version and not marker.exists()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('sglang')\n")
    assert install.probe(sys.executable).import_path == tmp_path / "sglang" and not marker.exists()


def test_a_probe_sees_no_token_of_the_operators_environment(monkeypatch: pytest.MonkeyPatch):
    """Helper 134: doctor's probes (the installed sglang, its environ.py) saw every variable of the operator's
    environment: HF_TOKEN, AWS_SECRET_ACCESS_KEY, SSH_AUTH_SOCK, a *_PASSWORD; they keep the install's own only."""
    secrets_ = {"HF_TOKEN": "hf_c128", "AWS_SECRET_ACCESS_KEY": "aws_c128", "SSH_AUTH_SOCK": "/tmp/agent.c128",
                "DB_PASSWORD": "pw_c128", "GITHUB_TOKEN": "ghp_c128"}
    for name, value in {**secrets_, "SGLANG_OPT_USE_ONLINE_COMPRESS": "1", "CUDA_HOME": "/usr/local/cuda"}.items():
        monkeypatch.setenv(name, value)
    tell = "import os, sys, json\nmark = sys.stdin.readline().strip()\nprint(mark, json.dumps(dict(os.environ)))\n"
    got = serving.ask(sys.executable, tell, [], 30)
    assert not got.error and not set(secrets_) & set(got.data), got
    assert got.data["SGLANG_OPT_USE_ONLINE_COMPRESS"] == "1" and got.data["CUDA_HOME"] == "/usr/local/cuda", got


def test_a_probe_keeps_no_credential_a_kept_name_begins_or_a_family_holds(monkeypatch: pytest.MonkeyPatch):
    """Helper 139: the list was of prefixes: "HOME" kept HOMEBREW_GITHUB_API_TOKEN, "LANG" LANGCHAIN_API_KEY, "USER"
    USER_PASSWORD, "SGLANG_" sglang's own SGLANG_PRECISION_HF_TOKEN, "NVIDIA_" NVIDIA_API_KEY. A gate whose name says
    TOKENS is still the install's."""
    secrets_ = {"HOMEBREW_GITHUB_API_TOKEN": "ghp_c128", "LANGCHAIN_API_KEY": "ls_c128", "USER_PASSWORD": "pw_c128",
                "PATHWAY_SECRET": "pw_c128", "SGLANG_PRECISION_HF_TOKEN": "hf_c128", "NVIDIA_API_KEY": "nv_c128",
                "TORCH_HUB_TOKEN": "t_c128", "XDG_AUTH": "x_c128"}
    kept = {"SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS": "64", "HOME": "/home/op", "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "TORCH_CUDA_ARCH_LIST": "9.0"}
    for name, value in {**secrets_, **kept}.items():
        monkeypatch.setenv(name, value)
    tell = "import os, sys, json\nmark = sys.stdin.readline().strip()\nprint(mark, json.dumps(dict(os.environ)))\n"
    got = serving.ask(sys.executable, tell, [], 30)
    assert not got.error and not set(secrets_) & set(got.data), got
    assert {k: got.data.get(k) for k in kept} == kept, got


def test_a_daemon_a_probe_forks_dies_when_doctor_is_sigkilled(tmp_path: Path):
    """A probe that forks a daemon (double fork, ``setsid``) then doctor SIGKILLed: the daemon ran on (``_reaping``
    ends it only while doctor lives; no pid namespace). The probe now runs as the first process of a pid namespace
    of its own (``serving.contained``): killing doctor kills it, and it all it forked."""
    if serving.contained()[1]:
        pytest.skip(f"no pid namespace here: {serving.contained()[1]}")
    pids = tmp_path / "pids"
    left = ("import os, sys, time\nsys.stdin.readline()\nif os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        open({str(pids)!r}, 'a').write(os.readlink('/proc/self') + '\\n')\n        time.sleep(60)\n"
            "    os._exit(0)\ntime.sleep(60)\n")
    doctor = subprocess.Popen([sys.executable, "-c", "import sys; from c128patch.serve import serving; "
                               "serving.ask(sys.executable, sys.argv[1], [], 120)", left])
    until = time.monotonic() + 60
    while not (pids.exists() and pids.read_text().endswith("\n")) and time.monotonic() < until:
        time.sleep(0.05)
    doctor.kill()
    doctor.wait()
    found = pids.read_text().split()  # (its pid as this namespace's /proc says it: /proc/self)
    assert found, "the probe forked no daemon"
    for _ in range(50):  # the namespace's processes are killed as its first one dies
        found = [p for p in found if Path(f"/proc/{p}").exists()]
        if not found:
            break
        time.sleep(0.1)
    assert found == [], found


def test_where_the_probes_cannot_have_a_pid_namespace_doctor_says_so(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(doctor_module, "contained", lambda: ([], "unshare: Operation not permitted"))
    res = invoke("doctor", "--python", sys.executable, as_json=False)
    assert ("the probes run without a pid namespace of their own here (unshare: Operation not permitted)"
            in res.text), res.text


def test_where_the_tools_children_cannot_be_tied_to_it_doctor_says_so(monkeypatch: pytest.MonkeyPatch):
    """Helper 157: without setpriv (util-linux < 2.33, macOS) a Group's child is not killed with a SIGKILLed tool
    (``procs.dying_prefix``); the host's check says so, and says nothing where they are tied."""
    res = invoke("doctor", "--python", sys.executable, as_json=False)
    assert "children are not tied" not in res.text, res.text
    monkeypatch.setattr(doctor_module, "dying_prefix", lambda: ([], "no setpriv (util-linux)"))
    res = invoke("doctor", "--python", sys.executable, as_json=False)
    assert "the tool's children are not tied to it here (no setpriv (util-linux))" in res.text, res.text


def test_a_layer_doctor_cannot_read_is_said_as_an_error_not_dropped(tmp_path: Path):
    """Helper 163: `doctor --layer L` (or a config's, or $C128PATCH_LAYERS') where L is refused (here a leftover refresh
    journal deleting ../victim.txt) dropped the stack with no word: no line named L or why, the layers in effect were
    not said, and the report's only trace was "this tool carries no env reference: the envs are not read" (where an
    sglang is installed). The refusal is an error finding now; nothing is deleted."""
    layer = tmp_path / "L"
    (layer / "patches").mkdir(parents=True)
    (layer / "patches" / "series.toml").write_text('[series]\nname = "site"\nversion = "1"\nbase = "v0.5.23"\n')
    (layer / ".c128patch-txn" / "files").mkdir(parents=True)
    (layer / ".c128patch-txn" / "plan.json").write_text(json.dumps(
        {"moves": [], "deletes": ["../victim.txt"], "group": {"id": "g", "parts": [os.path.realpath(layer)]}}))
    (tmp_path / "victim.txt").write_text("keep")
    res = invoke("doctor", "--layer", layer)
    said = [f["message"] for f in res.out["findings"] if f["level"] == "error" and f["topic"] == "series"]
    assert res.code == 1 and len(said) == 1, res.out
    assert "not read" in said[0] and "an interrupted refresh cannot be finished" in said[0] and str(layer) in said[0]
    assert (tmp_path / "victim.txt").read_text() == "keep"


FORGE = "import __main__, os, sys\n__main__.answer({answer})\nsys.__stdout__.flush()\nos._exit(0)\n"


@pytest.mark.parametrize("answer", ["{'x': 1}", "{'import_error': 5, 'args_error': '', 'args_checked': True, "
                                    "'parser_built': True, 'required_missing': 7}", "[]"])
def test_an_answer_the_installed_sglang_writes_itself_is_checked_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str):
    """Helper 173: the installed code runs in the probe's process and can call its ``answer`` (``__main__.answer``)
    and ``os._exit``: a wrong-shaped answer was taken as the probe's and doctor ended in a TypeError/KeyError
    traceback. It is an error naming the forged answer now."""
    (tmp_path / "forger").mkdir()
    (tmp_path / "forger" / "__init__.py").write_text(FORGE.format(answer=answer))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setitem(serving.MODULES, "package", "forger")
    sv = serving.probe_serving(sys.executable, [])
    assert "its answer line is not the probe's" in sv.import_error and not sv.args_checked, sv
    environ = tmp_path / serving.ENVIRON
    environ.parent.mkdir(parents=True)
    environ.write_text(FORGE.format(answer="{'environ_error': '', 'gates': [{'declared': True}], 'startup': {}}"))
    got = serving.probe_install(sys.executable, str(tmp_path), ["SGLANG_X"], [])
    assert got.error.startswith("its answer line is not the probe's") and not got.data, got
