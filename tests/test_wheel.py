"""c128patch wheel / verify-wheel on the real sglang 0.5.23 release wheel (a test series: a real patch
made against upstream, adding a gate to srt/environ.py and editing a JIT .cuh, plus an overlay).

The patched wheel is built once per session; the tests read it, tamper copies of it, install it."""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from c128patch.errors import C128Error
from c128patch.series.manifest import load_series, sha256_file
from c128patch.upstream.releases import WheelZip, wheel_for, wheel_timestamp
from c128patch.wheel.patch import patch_wheel
from c128patch.wheel.rules import refusal
from c128patch.wheel.sbom import PROPERTY_PREFIX, PatchEntry, diff_bytes, indexed_properties, purl_pypi
from c128patch.wheel.tools import InWheel, check_record
from c128patch.wheel.verify import verify_wheel
from support import REPO_ROOT, error_line, invoke, make_test_series

ENVIRON = "python/sglang/srt/environ.py"
CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
GATE_LINE = "    SGLANG_C128PATCH_TEST_GATE = EnvBool(False)\n"
CUH_LINE = "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch wheel test\n"
EDITS = {
    ENVIRON: ("    SGLANG_DSPARK_ENABLE_MULTI_STREAM = EnvBool(True)\n",
              "    SGLANG_DSPARK_ENABLE_MULTI_STREAM = EnvBool(True)\n" + GATE_LINE),
    CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n", CUH_LINE),
}
OVERLAY = "sglang/c128_test_overlay.py"


@pytest.fixture(scope="session")
def wheel_series(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    return make_test_series(tmp_path_factory.mktemp("wheel-series"), sglang_release_repo, EDITS)


@pytest.fixture(scope="session")
def upstream_wheel(sglang_release_repo: Path) -> Path:
    """The real sglang 0.5.23 release wheel (cache, wheelhouse, or downloaded)."""
    return wheel_for("0.5.23")


@pytest.fixture(scope="session")
def patched(tmp_path_factory: pytest.TempPathFactory, wheel_series: Path, upstream_wheel: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)  # the release's own time, whatever CI sets
        return patch_wheel(load_series(wheel_series), upstream_wheel, tmp_path_factory.mktemp("dist"))


@functools.lru_cache(maxsize=4)
def _members(wheel: str, size: int) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}


def members(wheel: Path) -> dict[str, bytes]:
    """name -> bytes of a wheel's files (cached: the 0.5.23 wheels are read by many tests)."""
    return _members(str(wheel), wheel.stat().st_size)


def run_cli(args: list[str]):
    return invoke(*args, as_json=False)


# -- what the patched wheel holds --------------------------------------------------------------


def test_version_name_and_tags(patched, upstream_wheel: Path, wheel_series: Path):
    series = load_series(wheel_series)
    out = Path(patched.wheel)
    want = Version(f"0.5.23+c128.{series.version}.{series.digest()[:8]}")
    name, version, build, tags = parse_wheel_filename(out.name)
    assert (str(name), version, build) == ("sglang", want, ())
    assert tags == parse_wheel_filename(upstream_wheel.name)[3]  # platform tags kept
    assert out.name == upstream_wheel.name.replace("0.5.23", str(want), 1)
    files = members(out)
    dist = f"sglang-{want}.dist-info"
    meta = files[f"{dist}/METADATA"].decode()
    assert f"\nVersion: {want}\n" in meta
    upstream_meta = members(upstream_wheel)["sglang-0.5.23.dist-info/METADATA"].decode()
    assert meta == upstream_meta.replace("\nVersion: 0.5.23\n", f"\nVersion: {want}\n")  # nothing else changed
    assert files[f"{dist}/WHEEL"] == members(upstream_wheel)["sglang-0.5.23.dist-info/WHEEL"]
    assert not [n for n in files if n.startswith("sglang-0.5.23.dist-info/")]


def test_files_patched_and_everything_else_identical(patched, upstream_wheel: Path):
    new, old = members(Path(patched.wheel)), members(upstream_wheel)
    assert GATE_LINE.encode() in new["sglang/srt/environ.py"] and GATE_LINE.encode() not in old["sglang/srt/environ.py"]
    assert CUH_LINE.encode() in new[CUH.removeprefix("python/")]
    assert new[OVERLAY] == b"VALUE = 1\n"
    changed = {"sglang/srt/environ.py", CUH.removeprefix("python/")}
    added = {OVERLAY, "sglang/c128patch_provenance.json"}
    body_new = {n for n in new if ".dist-info/" not in n}
    body_old = {n for n in old if ".dist-info/" not in n}
    assert body_new == body_old | added
    for name in body_old - changed:
        assert new[name] == old[name], name


def test_record_and_zip_layout(patched, upstream_wheel: Path):
    out = Path(patched.wheel)
    check = check_record(out)
    assert check.files == len(members(out))
    with zipfile.ZipFile(out) as zf:
        infos = zf.infolist()
    assert not [i for i in infos if i.is_dir()]
    assert infos[-1].filename.endswith(".dist-info/RECORD")
    names = [i.filename for i in infos]
    body = [n for n in names if ".dist-info/" not in n]
    assert names[: len(body)] == sorted(body)  # the package first, sorted; .dist-info last
    stamp = __import__("time").gmtime(wheel_timestamp(upstream_wheel))[:6]
    assert {i.date_time for i in infos} == {stamp}  # SOURCE_DATE_EPOCH = the upstream release's time
    modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in infos}
    assert set(modes.values()) <= {0o644, 0o755, 0o664}
    assert all(modes[n] == 0o755 for n in names if n.endswith(".so"))


def test_provenance_record(patched, upstream_wheel: Path, wheel_series: Path):
    series = load_series(wheel_series)
    record = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    assert record["series"] == {"name": "test", "version": "1", "digest": series.digest()}
    up = record["upstream"]
    assert up["rev"] == "v0.5.23" and up["version"] == "0.5.23" and up["wheel"] == upstream_wheel.name
    assert up["wheel_sha256"] == hashlib.sha256(upstream_wheel.read_bytes()).hexdigest()
    rows = {e["name"]: e for e in record["entries"]}
    assert [e["name"] for e in record["entries"]] == [e.name for e in series.entries]
    assert rows["test-patch"]["sha256"] == sha256_file(wheel_series / "patches" / "0001-test.patch")
    assert sorted(rows["test-patch"]["files"]) == sorted([ENVIRON, CUH])
    assert rows["test-overlay"]["target"] == "python/" + OVERLAY


def test_reproducible_bytes(patched, tmp_path: Path, wheel_series: Path, upstream_wheel: Path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    (wheel_series / "overlay" / "sglang" / "c128_test_overlay.py").touch()  # mtimes must not matter
    again = patch_wheel(load_series(wheel_series), upstream_wheel, tmp_path / "again")
    assert again.sha256 == patched.sha256 == hashlib.sha256(Path(again.wheel).read_bytes()).hexdigest()
    assert Path(again.wheel).name == Path(patched.wheel).name


# -- SBOM ---------------------------------------------------------------------------------------


def sbom_of(wheel: Path) -> dict:
    files = members(wheel)
    (name,) = [n for n in files if ".dist-info/sboms/" in n]
    assert name.endswith(".dist-info/sboms/c128patch.cdx.json")
    return json.loads(files[name])


def test_sbom_is_valid_cyclonedx_16(patched):
    validation = pytest.importorskip("cyclonedx.validation.json")
    from cyclonedx.schema import SchemaVersion

    text = json.dumps(sbom_of(Path(patched.wheel)))
    assert validation.JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None


def test_sbom_pedigree(patched, upstream_wheel: Path, wheel_series: Path):
    series = load_series(wheel_series)
    doc = sbom_of(Path(patched.wheel))
    comp = doc["metadata"]["component"]
    assert comp["name"] == "sglang" and comp["version"] == patched.version
    assert comp["purl"] == f"pkg:pypi/sglang@{patched.version.replace('+', '%2B')}"
    (anc,) = comp["pedigree"]["ancestors"]
    assert anc["purl"] == "pkg:pypi/sglang@0.5.23" == purl_pypi("sglang", "0.5.23")
    assert anc["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(upstream_wheel.read_bytes()).hexdigest()}]
    patches = comp["pedigree"]["patches"]
    assert [p["type"] for p in patches] == ["unofficial", "unofficial"]
    assert patches[0]["diff"]["text"]["content"] == (wheel_series / "patches" / "0001-test.patch").read_text()
    assert "+++ b/python/sglang/c128_test_overlay.py" in patches[1]["diff"]["text"]["content"]
    rows = indexed_properties(doc, PROPERTY_PREFIX)
    assert [r["name"] for r in rows] == [e.name for e in series.entries]  # series order kept
    assert rows[0] == {"name": "test-patch", "kind": "patch", "gate": "none", "upstream": "", "upstream_status": "",
                       "file": "0001-test.patch", "sha256": series.entries[0].sha256}
    tools = doc["metadata"]["tools"]["components"]
    assert [t["name"] for t in tools] == ["c128patch"]


def test_sbom_patch_resolves_upstream_pr():
    entry = PatchEntry("e", "patch", "SGLANG_X", "sgl-project/sglang#32035", "open", "0001.patch", "ab" * 32,
                       b"diff --git a/x b/x\n", "why")
    patch = entry.patch()
    assert patch["type"] == "unofficial" and patch["diff"]["text"]["content"] == "diff --git a/x b/x\n"
    (issue,) = patch["resolves"]
    assert issue["id"] == "sgl-project/sglang#32035" and issue["description"] == "why"
    assert issue["references"] == ["https://github.com/sgl-project/sglang/pull/32035"]
    assert {p["name"].rsplit(":", 1)[1]: p["value"] for p in entry.properties(3)}["gate"] == "SGLANG_X"
    assert all(p["name"].startswith("c128patch:entry:3:") for p in entry.properties(3))
    binary = PatchEntry("e", "patch", "", "", "", "f", "0" * 64, b"\xff\xfe", "").patch()
    assert binary["diff"]["text"]["encoding"] == "base64" and diff_bytes(binary) == b"\xff\xfe"
    assert "resolves" not in binary


# -- verify-wheel -------------------------------------------------------------------------------


def test_verify_ok(patched, wheel_series: Path):
    res = run_cli(["verify-wheel", patched.wheel, "--series", str(wheel_series), "--json"])
    assert res.code == 0, res.err
    data = json.loads(res.text)
    assert data["ok"] and data["version"] == patched.version
    assert [e["status"] for e in data["entries"]] == ["present", "present"]
    assert data["compiled"] == 2  # environ.py and the overlay


def retouched(src: Path, dest_dir: Path, suffix: str, edit) -> Path:
    """A copy of ``src`` with the member whose name ends in ``suffix`` changed by ``edit(text) -> text`` and
    RECORD regenerated (``tampered``: stored, fast), so RECORD stays valid and only the deeper checks can notice."""
    (name,) = [n for n in members(src) if n == suffix or n.endswith(f"/{suffix}")]
    return tampered(src, dest_dir, {name: edit(members(src)[name].decode()).encode()})


def verify_fails(wheel: Path, contains: str, *extra: str) -> str:
    res = run_cli(["verify-wheel", str(wheel), *extra])
    assert res.code == 1, (res.code, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("c128patch: error: "), res.err
    assert contains in lines[0], lines[0]
    return lines[0]


def test_verify_catches_a_reverted_patch(patched, tmp_path: Path):
    undo = retouched(Path(patched.wheel), tmp_path, "sglang/srt/environ.py", lambda text: text.replace(GATE_LINE, ""))
    verify_fails(undo, "entry 'test-patch' is not in the wheel as recorded: sglang/srt/environ.py")


def test_verify_catches_a_changed_overlay(patched, tmp_path: Path):
    verify_fails(retouched(Path(patched.wheel), tmp_path, OVERLAY, lambda _: "VALUE = 2\n"), "overlay 'test-overlay'")


def test_verify_catches_sbom_drift(patched, tmp_path: Path):
    drift = retouched(Path(patched.wheel), tmp_path, "sboms/c128patch.cdx.json",
                      lambda text: text.replace('"value": "test-patch"', '"value": "renamed"'))
    verify_fails(drift, "SBOM entry 1 (renamed): name")


def test_verify_catches_a_record_mismatch(patched, tmp_path: Path):
    bad = tmp_path / Path(patched.wheel).name
    with zipfile.ZipFile(patched.wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "sglang/srt/environ.py":
                data = data.replace(b"EnvBool(False)", b"EnvBool(True) ", 1)  # same size, other bytes
            info.compress_type = zipfile.ZIP_STORED  # not deflated again: fast
            dst.writestr(info, data)
    verify_fails(bad, "RECORD hash mismatch")


def test_verify_catches_a_syntax_error(patched, tmp_path: Path):
    broken = retouched(Path(patched.wheel), tmp_path, "sglang/srt/environ.py", lambda text: text + "\ndef broken(:\n")
    verify_fails(broken, "sglang/srt/environ.py does not compile")


def test_verify_against_another_series(patched, tmp_path: Path, sglang_release_repo: Path):
    other = make_test_series(tmp_path / "other", sglang_release_repo, {CUH: EDITS[CUH]}, overlay=False)
    verify_fails(Path(patched.wheel), "not from", "--series", str(other))


def test_verify_refuses_upstream_wheel(upstream_wheel: Path):
    verify_fails(upstream_wheel, "no c128patch provenance")


# -- variants chosen by the wheel's version (the real series) ------------------------------------


def test_real_series_variants_follow_the_wheel_version(real_series, tmp_path: Path, sglang_release_repo: Path):
    multi = [e for e in real_series.entries if len(e.patch_files()) > 1]
    assert multi, "the product series has no entry with per-release variants"
    res = patch_wheel(real_series, wheel_for("0.5.20"), tmp_path)
    used = {row["name"]: row["file"].removeprefix("patches/") for row in res.entries}
    for entry in multi:
        # the variant whose base is the newest release not after 0.5.20
        bases = [(Version(v.base.lstrip("v")), v.file) for v in entry.patch_files()
                 if Version(v.base.lstrip("v")) <= Version("0.5.20")]
        assert used[entry.name] == max(bases)[1], entry.name
    res2 = run_cli(["verify-wheel", res.wheel, "--series", str(real_series.root)])
    assert res2.code == 0, res2.err


# -- bad input: one line, exit 2, the output folder untouched ------------------------------------


# a download's progress line (progress.transfer_line): a lookup slower than 5 s on a busy machine prints one
PROGRESS = re.compile(r"downloading [^:]+: (\d+\.\d (of \d+\.\d )?MB, )?\d+ s")


def refused(args: list[str], out: Path, contains: str) -> str:
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    res = run_cli([*args, "-o", str(out)])
    assert res.code == 2, (res.code, res.err, res.text)
    lines = [line for line in res.err.strip().splitlines() if not PROGRESS.fullmatch(line)]
    assert len(lines) == 1 and lines[0].startswith("c128patch: error: "), res.err
    assert contains in lines[0], lines[0]
    after = sorted(p.name for p in out.iterdir()) if out.exists() else None
    assert after == before, "the output folder changed"
    return lines[0]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    (d / "keep.txt").write_text("mine\n")
    return d


def test_missing_wheel(tmp_path: Path, out: Path, wheel_series: Path):
    refused(["wheel", "--from-wheel", str(tmp_path / "nope.whl"), "--series", str(wheel_series)], out, "missing wheel")


def test_not_a_wheel(tmp_path: Path, out: Path, wheel_series: Path):
    text = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    text.write_text("not a zip\n")
    refused(["wheel", "--from-wheel", str(text), "--series", str(wheel_series)], out, "not a wheel")
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    refused(["wheel", "--from-wheel", str(other), "--series", str(wheel_series)], out, "not a wheel")


def test_not_an_sglang_wheel(tmp_path: Path, out: Path, wheel_series: Path):
    whl = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("other/__init__.py", "")
        zf.writestr("other-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
        zf.writestr("other-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("other-1.0.dist-info/RECORD", "")
    refused(["wheel", "--from-wheel", str(whl), "--series", str(wheel_series)], out, "not an sglang wheel")


def test_unknown_release(out: Path, wheel_series: Path):
    refused(["wheel", "--from-release", "banana", "--series", str(wheel_series)], out, "not a release version")
    refused(["wheel", "--from-release", "9.9.9", "--series", str(wheel_series)], out, "unknown release 'v9.9.9'")


def test_both_or_neither_source(out: Path, wheel_series: Path, upstream_wheel: Path):
    refused(["wheel", "--series", str(wheel_series)], out, "exactly one of")
    refused(["wheel", "--from-wheel", str(upstream_wheel), "--from-release", "0.5.23", "--series", str(wheel_series)],
            out, "exactly one of")


def test_already_patched(patched, out: Path, wheel_series: Path):
    refused(["wheel", "--from-wheel", patched.wheel, "--series", str(wheel_series)], out,
            "already patched by c128patch")


def test_binary_touching_entry(tmp_path: Path, out: Path, sglang_release_repo: Path, upstream_wheel: Path):
    loader = "python/sglang/srt/rust_extensions/loader.py"
    series = make_test_series(tmp_path / "s", sglang_release_repo,
                              {loader: ('"""', '"""c128patch test: ', )}, overlay=False)
    line = refused(["wheel", "--from-wheel", str(upstream_wheel), "--series", str(series)], out,
                   "entry 'test-patch' cannot be applied to a built wheel")
    assert "sglang/srt/rust_extensions/ holds a compiled extension" in line and "c128patch build" in line


@pytest.mark.parametrize("target", ["python/sglang/srt/ENVIRON.py", "python/sglang/SRT/environ.py"])
def test_an_overlay_that_folds_onto_a_wheel_file_is_refused_before_writing(tmp_path: Path, out: Path,
                                                                          upstream_wheel: Path, target: str):
    """Helper 175: a layer overlay at `python/sglang/srt/ENVIRON.py` passed `lint` and `wheel`, and `verify-wheel`
    refused the wheel `wheel` had made ("one file on some file systems"): installed on macOS or Windows it replaces
    upstream's environ.py, no patch of that file reviewed. `wheel` refuses it before writing, naming the entry."""
    layer = tmp_path / "layer"
    (layer / "overlay").mkdir(parents=True)
    data = b"X = 1\n"
    (layer / "overlay" / "x.py").write_bytes(data)
    (layer / "patches").mkdir()
    (layer / "patches" / "series.toml").write_text(
        '[series]\nname = "site"\nversion = "1"\nbase = "v0.5.23"\n\n[[entries]]\nname = "folds"\n'
        f'kind = "overlay"\nsource = "overlay/x.py"\ntarget = "{target}"\nwhy = "test"\ngate = ""\n'
        f'base = "v0.5.23"\nsha256 = "{hashlib.sha256(data).hexdigest()}"\n')
    line = refused(["wheel", "--from-wheel", str(upstream_wheel), "--layer", str(layer)], out,
                   "entry 'site/folds' writes sglang/")
    assert "one file with sglang/srt/environ.py where names fold" in line, line


def test_conflicting_patch(tmp_path: Path, sglang_release_repo: Path, wheel_series: Path):
    """The test series was made against 0.5.23; environ.py's context differs in 0.5.20. Exit 1, as
    `apply` exits on an entry that does not apply (and as `check` predicts)."""
    out = tmp_path / "new-out"  # not created before: must not exist after
    res = run_cli(["wheel", "--from-release", "0.5.20", "--series", str(wheel_series), "-o", str(out)])
    assert res.code == 1, (res.code, res.err)
    line, note = res.err.strip().splitlines()  # the error, then check's note: 0.5.20 is older than the series' base
    assert note.startswith("note: v0.5.20 is older than (or not descended from) every release the series was made on")
    assert line.startswith("c128patch: error: entry 'test-patch' (patches/0001-test.patch) "
                           "does not apply to sglang-0.5.20")
    assert "sglang/srt/environ.py hunk #1 @@" in line and "no wheel was written" in line
    assert not out.exists()


def test_refusal_rule_cases():
    dirs = {"sglang/srt/rust_extensions", "sglang/srt/mem_cache/rust_tree_core"}
    assert refusal("python/sglang/srt/environ.py", dirs) is None
    assert refusal("python/sglang/kernels/jit/csrc/deepseek_v4/x.cuh", dirs) is None
    assert refusal("python/sglang/srt/mem_cache/radix_cache.py", dirs) is None  # a sibling of the binary's folder
    assert "build input" in refusal("python/pyproject.toml", dirs)
    assert "build input" in refusal("rust/sglang-radix-tree/src/lib.rs", dirs)
    assert "'.so' files" in refusal("python/sglang/srt/x.so", dirs)
    assert "'.rs' files" in refusal("python/sglang/srt/x.rs", dirs)
    assert ("rust_tree_core/ holds a compiled extension"
            in refusal("python/sglang/srt/mem_cache/rust_tree_core/sub/a.py", dirs))


# -- install check --------------------------------------------------------------------------------


def test_installs_and_uninstalls_cleanly(patched, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # no pip to install
    py = venv / "bin" / "python"
    pip_in_venv = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check", "--no-input"]

    def pip(*args: str) -> str:
        proc = subprocess.run([*pip_in_venv, *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = {p.relative_to(site) for p in site.rglob("*")}
    pip("install", "--no-deps", "--no-compile", "--no-index", patched.wheel)
    assert (site / "sglang/srt/environ.py").read_text().count(GATE_LINE) == 1  # the new gate is declared
    assert CUH_LINE in (site / CUH.removeprefix("python/")).read_text()
    assert (site / OVERLAY).read_text() == "VALUE = 1\n"
    assert (site / "sglang/c128patch_provenance.json").is_file()
    meta = subprocess.run([str(py), "-c",
                           "import importlib.metadata as m; print(m.version('sglang')); "
                           "print(m.distribution('sglang').name)"],
                          capture_output=True, text=True, check=True)
    version, _ = meta.stdout.split()
    assert version == patched.version
    listed = subprocess.run([str(py), "-c",
                             "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('sglang')))"],
                            capture_output=True, text=True, check=True).stdout.split("\n")
    assert set(members(Path(patched.wheel))) <= set(listed)  # every file of the wheel is recorded as installed
    assert f"Version: {patched.version}" in pip("show", "sglang")
    # pip check parses every installed METADATA: the only complaints may be the requirements that
    # --no-deps left out (sglang's own Requires-Dist, intact), never invalid metadata or versions.
    proc = subprocess.run([*pip_in_venv, "check"], capture_output=True, text=True)
    problems = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert problems and all(re.fullmatch(rf"sglang {re.escape(patched.version)} requires \S+, "
                                         r"which is not installed\.", ln)
                            for ln in problems), problems[:3]
    inspect = json.loads(pip("inspect", "--local"))
    (dist,) = [d for d in inspect["installed"] if d["metadata"]["name"] == "sglang"]
    assert dist["metadata"]["version"] == patched.version
    pip("uninstall", "-y", "sglang")
    after = {p.relative_to(site) for p in site.rglob("*")}
    assert after == before, sorted(map(str, after - before))[:5]
    shutil.rmtree(venv)


# -- authenticity: the wheel is its pinned upstream wheel plus exactly the declared diffs ----------


def tampered(src: Path, dest_dir: Path, changes: dict[str, bytes | None]) -> Path:
    """A copy of ``src`` with members replaced/added (bytes) or removed (None) and RECORD rewritten
    to match (stored, not deflated: fast), so only the deeper checks can notice."""
    from c128patch.wheel.authentic import record_hash

    files = {n: d for n, d in {**members(src), **changes}.items() if d is not None}
    (record,) = [n for n in files if n.endswith(".dist-info/RECORD")]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(
        [[n, record_hash(d), len(d)] for n, d in files.items() if n != record] + [[record, "", ""]])
    files[record] = text.getvalue().encode()
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / src.name
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(files, key=lambda n: n == record):
            zf.writestr(name, files[name])
    return out


@pytest.mark.parametrize("where", ["evil.pth", "{data}/purelib/evil.pth", "{data}/platlib/evil.pth",
                                   "{data}/scripts/sglang-evil", "{data}/data/bin/python3"])
def test_verify_without_authenticity_refuses_a_member_run_at_install_or_start(patched, tmp_path: Path, where: str):
    """Helper 170: `verify-wheel --no-authenticity` (RECORD recomputed) passed a wheel with a `.pth` at the root (Python
    runs its `import` lines at every start), in `.data/purelib`, or a `.data/scripts` program, saying only
    "authenticity NOT checked". No sglang release wheel has one, and without upstream's wheel nothing vouches for it:
    refused, named (authenticity refuses it as "not in upstream's")."""
    name = where.format(data=f"sglang-{patched.version}.data")
    bad = tampered(Path(patched.wheel), tmp_path, {name: b"import os; os.system('id')\n"})
    verify_fails(bad, f"{name}: a .pth at site-packages' root runs at every Python start", "--no-authenticity")


def test_verify_without_authenticity_names_what_it_did_not_vouch_for(patched, tmp_path: Path):
    """Helper 170: an edited entry_points.txt (a console script of the attacker's), RECORD recomputed: without
    authenticity nothing can check it; `verify-wheel --no-authenticity` said "authenticity NOT checked" and no more.
    It names the .dist-info files and counts the compiled modules no check vouched for (the JSON lists them)."""
    dist = f"sglang-{patched.version}.dist-info"
    bad = tampered(Path(patched.wheel), tmp_path, {f"{dist}/entry_points.txt": b"[console_scripts]\nx = os:system\n"})
    res = run_cli(["verify-wheel", str(bad), "--no-authenticity"])
    assert res.code == 0 and "nothing proves the files no entry touches are upstream's, among them METADATA, WHEEL, " \
        "entry_points.txt" in res.text, res.text
    assert f"{dist}/entry_points.txt" in invoke("verify-wheel", bad, "--no-authenticity").out["unvouched"]
    verify_fails(bad, f"{dist}/entry_points.txt differs from upstream's")


def test_verify_proves_authenticity(patched, wheel_series: Path, upstream_wheel: Path):
    res = invoke("verify-wheel", patched.wheel, "--series", str(wheel_series), "--upstream-wheel", str(upstream_wheel))
    assert res.code == 0, res.err
    auth = res.out["authenticity"]
    assert auth["upstream_wheel"] == upstream_wheel.name and auth["found"] == "given"
    assert auth["upstream_sha256"] == hashlib.sha256(upstream_wheel.read_bytes()).hexdigest()
    body = [n for n in members(upstream_wheel) if not n.endswith(".dist-info/RECORD")]
    assert auth["derived"] == 3  # environ.py, the .cuh, the overlay
    assert auth["identical"] == len(body) - 2  # every other upstream file (METADATA: only its Version line)
    text = run_cli(["verify-wheel", patched.wheel])  # found in the wheelhouse/cache
    assert text.code == 0 and "authentic: " in text.text and "(wheelhouse)" in text.text, text.err


def test_verify_catches_a_backdoored_untouched_file(patched, tmp_path: Path, wheel_series: Path):
    victim = "sglang/srt/utils/common.py"
    assert victim in members(Path(patched.wheel))

    src = Path(patched.wheel)
    bad = tampered(src, tmp_path, {victim: members(src)[victim] + b"\nimport os; os.system('true')\n"})
    assert invoke("verify-wheel", str(bad), "--no-authenticity").code == 0
    want = f"{victim} differs from upstream's {Path(patched.upstream_wheel).name} and no entry changes it"
    verify_fails(bad, want)
    verify_fails(bad, want, "--series", str(wheel_series))


def test_verify_catches_an_extra_edit_in_a_touched_file(patched, tmp_path: Path):
    src = Path(patched.wheel)  # the series' lines stay (reverse-apply passes), one more is added
    environ = b"import os  # c128patch tamper\n" + members(src)["sglang/srt/environ.py"]
    verify_fails(tampered(src, tmp_path, {"sglang/srt/environ.py": environ}),
                 "sglang/srt/environ.py is not what the series' diffs make of upstream's")


def test_verify_catches_added_and_removed_files(patched, tmp_path: Path):
    src = Path(patched.wheel)
    verify_fails(tampered(src, tmp_path / "a", {"sglang/c128_evil.py": b"X = 1\n"}),
                 "sglang/c128_evil.py is not in upstream's")
    verify_fails(tampered(src, tmp_path / "r", {"sglang/version.py": None}), "sglang/version.py of upstream's")


def test_verify_catches_a_repinned_upstream(patched, tmp_path: Path, upstream_wheel: Path):
    """A wheel claiming another upstream wheel (provenance and SBOM both re-pinned) is not this one's."""
    fake = "ab" * 32
    src = Path(patched.wheel)
    prov = "sglang/c128patch_provenance.json"
    (sbom,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    bad = tampered(src, tmp_path, {n: members(src)[n].replace(patched.upstream_sha256.encode(), fake.encode())
                                   for n in (prov, sbom)})
    line = verify_fails(bad, "not made from the upstream wheel at hand")
    assert upstream_wheel.name in line and fake[:16] in line
    other = wheel_for("0.5.22")  # the wrong upstream wheel given by hand
    verify_fails(src, "not made from the upstream wheel at hand", "--upstream-wheel", str(other))


def test_verify_offline_without_upstream_wheel(patched, tmp_path: Path, monkeypatch):
    """No upstream wheel here and no index: "cannot check authenticity", exit 2, never a pass."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("C128PATCH_WHEELHOUSE", raising=False)
    res = run_cli(["verify-wheel", patched.wheel])
    assert res.code == 2, (res.code, res.err)
    (line,) = res.err.strip().splitlines()
    assert line.startswith("c128patch: error: cannot check authenticity: no upstream wheel "
                           f"{Path(patched.upstream_wheel).name} here (give --upstream-wheel PATH or go online")
    opt_out = run_cli(["verify-wheel", patched.wheel, "--no-authenticity"])
    assert opt_out.code == 0 and "authenticity NOT checked" in opt_out.text, opt_out.err


def test_verify_refuses_duplicate_members(patched, tmp_path: Path):
    """A backdoored copy of a file appended under the same name: refused, whichever copy a reader takes."""
    bad = tmp_path / Path(patched.wheel).name
    shutil.copy(patched.wheel, bad)
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(bad, "a") as zf:
        zf.writestr("sglang/srt/environ.py", "import os; os.system('true')\n")
    verify_fails(bad, "duplicate archive member 'sglang/srt/environ.py'")


@pytest.mark.parametrize("where", ["none", "before", "between"])
def test_verify_refuses_a_wheel_holding_an_archive_its_central_directory_skips(patched, tmp_path: Path, where):
    """A zip of a `.pth` put before the wheel (or its local record between two members): zipfile reads the central
    directory at the end and never sees it, a reader going from the start (`jar t < wheel`, a streaming installer)
    sees it first. Refused in one line, before anything else; the same wheel without it verifies. Its members are
    stored, not deflated again (as ``_with_changed_member``): the check is of the local records' tiling, whatever
    their compression."""
    hidden = io.BytesIO()
    with zipfile.ZipFile(hidden, "w") as zf:
        zf.writestr("zzz-evil.pth", "import os; os.system('true')\n")
    local = hidden.getvalue()[: hidden.getvalue().index(b"PK\x01\x02")]  # its member's local record alone
    bad = tmp_path / Path(patched.wheel).name
    with zipfile.ZipFile(patched.wheel) as src, open(bad, "wb") as out:
        if where == "before":
            out.write(hidden.getvalue())
        with zipfile.ZipFile(out, "w") as dst:
            for n, info in enumerate(src.infolist()):
                dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_STORED)
                if n == 0 and where == "between":
                    assert dst.fp is not None
                    dst.fp.write(local)
                    dst.start_dir = dst.fp.tell()  # (zipfile writes the next member where the last one ended)
    res = run_cli(["verify-wheel", str(bad)])
    if where == "none":
        assert res.code == 0, res.err
        return
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "that no member of its central directory accounts for" in res.err, res.err


def _hidden_in(src: Path, dest: Path, host: str, hidden: bytes) -> Path:
    """``src`` with the local record ``hidden`` put right after ``host``'s deflate stream, inside the extent the central
    directory gives ``host`` (its local header keeps the stream's own size; the offsets after it moved)."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info, start = zf.getinfo(host), zf.start_dir
    assert info.compress_type == zipfile.ZIP_DEFLATED
    name, extra = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    end, k = info.header_offset + 30 + name + extra + info.compress_size, len(hidden)
    out = data[:end] + hidden + data[end:]
    pos = start + k
    while out[pos:pos + 4] == b"PK\x01\x02":  # the central directory: the host's extent grows, later offsets move
        size, offset = struct.unpack("<I", out[pos + 20:pos + 24])[0], struct.unpack("<I", out[pos + 42:pos + 46])[0]
        if offset == info.header_offset:
            out[pos + 20:pos + 24] = struct.pack("<I", size + k)
        elif offset > info.header_offset:
            out[pos + 42:pos + 46] = struct.pack("<I", offset + k)
        pos += 46 + sum(struct.unpack("<HHH", out[pos + 28:pos + 34]))
    out[pos + 16:pos + 20] = struct.pack("<I", struct.unpack("<I", out[pos + 16:pos + 20])[0] + k)  # (the EOCD)
    dest.write_bytes(bytes(out))
    return dest


def test_verify_refuses_a_member_record_hidden_past_a_deflate_streams_end(patched, tmp_path: Path,
                                                                          wheel_series: Path, upstream_wheel: Path):
    """h152: a `.pth`'s local record put inside `environ.py`'s compressed extent, past its deflate stream's end, the
    central directory's size of it grown to cover it: zipfile reads that extent and stops at the stream's end (the
    member reads whole, its CRC and RECORD hash right), the records tile the file, and `verify-wheel --series`
    (authenticity too) passed it; `jar t < wheel` goes by the local header's size and lists `zzz-evil.pth`."""
    hidden = io.BytesIO()
    with zipfile.ZipFile(hidden, "w") as zf:
        zf.writestr("zzz-evil.pth", "import os; os.system('true')\n")
    local = hidden.getvalue()[: hidden.getvalue().index(b"PK\x01\x02")]
    bad = _hidden_in(Path(patched.wheel), tmp_path / Path(patched.wheel).name, "sglang/srt/environ.py", local)
    with zipfile.ZipFile(bad) as zf:  # what zipfile sees: the wheel as it was
        assert "zzz-evil.pth" not in zf.namelist() and zf.read("sglang/srt/environ.py")
    if shutil.which("jar"):
        listed = subprocess.run(["jar", "t"], stdin=open(bad, "rb"), capture_output=True, text=True).stdout
        assert "zzz-evil.pth" in listed.splitlines()
    res = run_cli(["verify-wheel", str(bad), "--series", str(wheel_series), "--upstream-wheel", str(upstream_wheel)])
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "that no member of its central directory accounts for" in res.err, res.err


def test_a_member_with_a_data_descriptor_hides_nothing_past_its_deflate_streams_end(tmp_path: Path):
    """h152: a member written with a data descriptor (no sizes in its local header: a reader going from the start
    inflates to the stream's end) opens; the same with a record put past that end, inside its extent, is one line."""
    class Unseekable(io.RawIOBase):  # (zipfile writes data descriptors to a stream it cannot seek back in)
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:  # noqa: ANN001
            self.data += b
            return len(b)

    stream = Unseekable()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/environ.py", "X = 1\n" * 200)
        zf.writestr("pkg/other.py", "Y = 2\n")
    good = tmp_path / "good.whl"
    good.write_bytes(bytes(stream.data))
    with zipfile.ZipFile(good) as zf:
        assert zf.getinfo("pkg/environ.py").flag_bits & 0x08
    WheelZip(good).close()
    hidden = io.BytesIO()
    with zipfile.ZipFile(hidden, "w") as zf:
        zf.writestr("zzz-evil.pth", "import os\n")
    bad = _hidden_in(good, tmp_path / "bad.whl", "pkg/environ.py",
                     hidden.getvalue()[: hidden.getvalue().index(b"PK\x01\x02")])
    with pytest.raises(C128Error, match="that no member of its central directory accounts for"):
        WheelZip(bad)


@pytest.mark.parametrize("how", ["method", "encrypted"])
def test_verify_names_a_member_zipfile_cannot_read(patched, tmp_path: Path, how):
    """A member marked encrypted, or compressed by a method zipfile lacks (99: AES): verify-wheel printed
    RuntimeError's or NotImplementedError's traceback where it read it. Refused by name, in one line."""
    import struct

    data = bytearray(Path(patched.wheel).read_bytes())
    with zipfile.ZipFile(patched.wheel) as zf:
        info = zf.getinfo("sglang/srt/environ.py")
        pos = zf.start_dir
    while data[pos + 46: pos + 46 + len(info.filename)] != info.filename.encode():  # its central directory record
        pos += 46 + sum(struct.unpack("<HHH", data[pos + 28: pos + 34]))
    if how == "method":
        struct.pack_into("<H", data, pos + 10, 99)
        struct.pack_into("<H", data, info.header_offset + 8, 99)
    else:
        struct.pack_into("<H", data, pos + 8, info.flag_bits | 1)
        struct.pack_into("<H", data, info.header_offset + 6, info.flag_bits | 1)
    bad = tmp_path / Path(patched.wheel).name
    bad.write_bytes(bytes(data))
    verify_fails(bad, "member sglang/srt/environ.py is encrypted or compressed by a method zipfile cannot read")


@pytest.mark.parametrize("digits", [300, 5000])
def test_a_series_version_too_long_for_a_wheels_name_is_one_line(wheel_series, upstream_wheel, tmp_path, digits):
    """A series (a pull request's) whose version is 300 digits: `wheel` printed OSError's "File name too long"
    traceback renaming the .dist-info; 5000 digits: ValueError's (Python's int conversion limit) in packaging."""
    series = tmp_path / "series"
    shutil.copytree(wheel_series, series)
    manifest = series / "patches" / "series.toml"
    text = manifest.read_text()
    version = text.split('version = "', 1)[1].split('"', 1)[0]
    manifest.write_text(text.replace(f'version = "{version}"', f'version = "{"9" * digits}"', 1))
    line = refused(["wheel", "--from-wheel", str(upstream_wheel), "--series", str(series)], tmp_path / "out",
                   contains="characters long, over the 160 its file and .dist-info names can hold")
    assert "9" * 41 not in line


def with_provenance(patched, dest: Path, text: bytes) -> Path:
    return tampered(Path(patched.wheel), dest, {"sglang/c128patch_provenance.json": text})


@pytest.mark.parametrize("files", [["/etc/passwd"], ["python/sglang/../../../../etc/passwd"], "x"])
def test_verify_refuses_provenance_paths_and_shapes(patched, tmp_path: Path, files):
    record = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    record["entries"][0]["files"] = files
    verify_fails(with_provenance(patched, tmp_path, json.dumps(record).encode()),
                 "is not a c128patch provenance record")


def _with_special_member(src: Path, dest: Path, mode: int) -> Path:
    """A copy of ``src`` plus ``sglang/evil`` stored as a non-regular file (``mode``), RECORD listing it."""

    bad = tampered(src, dest, {"sglang/evil": b"/etc/passwd"})
    with zipfile.ZipFile(bad) as zf:
        infos = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(bad, "w") as zf:
        for info, data in infos:
            if info.filename == "sglang/evil":
                info.external_attr = (mode | 0o777) << 16
            zf.writestr(info, data)
    return bad


@pytest.mark.parametrize("mode, kind", [(0o120000, "a symlink"), (0o020000, "a character device")])
def test_verify_names_a_symlink_or_device_member(patched, tmp_path: Path, mode: int, kind: str):
    verify_fails(_with_special_member(Path(patched.wheel), tmp_path, mode), f"member sglang/evil is {kind}")


def test_verify_names_a_member_that_is_a_file_and_a_folder(patched, tmp_path: Path):
    """``WHEEL`` and ``WHEEL/x`` both members, RECORD listing them: unpacking it was a FileExistsError traceback."""
    src = Path(patched.wheel)
    (wheel,) = [n for n in members(src) if n.endswith(".dist-info/WHEEL")]
    verify_fails(tampered(src, tmp_path, {f"{wheel}/x": b"y"}), f"member {wheel} is a file and the folder of {wheel}/x")


def test_from_wheel_refuses_a_symlink_member(tmp_path: Path, out: Path, wheel_series: Path, upstream_wheel: Path):
    bad = _with_special_member(upstream_wheel, tmp_path, 0o120000)
    refused(["wheel", "--from-wheel", str(bad), "--series", str(wheel_series)], out,
            "member sglang/evil is a symlink, not a regular file")


def test_from_wheel_refuses_a_member_the_release_does_not_hold(tmp_path: Path, out: Path, wheel_series: Path,
                                                               upstream_wheel: Path):
    """A ``.pth`` runs at every interpreter start, ``.data/scripts`` land on PATH: passed through, they were in the
    patched wheel, its RECORD and SBOM listing them as upstream's."""
    bad = tmp_path / upstream_wheel.name
    for member in ("sglang-evil.pth", "sglang/.git/config", "sglang-0.5.23.data/scripts/sglang-x",
                   "sglang/srt/not_in_the_release.py", "sglang-0.5.23.dist-info/extra/RECORD"):
        shutil.copyfile(upstream_wheel, bad)
        with zipfile.ZipFile(bad, "a") as zf:
            zf.writestr(member, "import os; os.system('touch /tmp/pwned')\n")
        says = (f"has an unsafe member name {member!r}" if "/.git/" in member else  # any .git: check_archive's
                f"{bad.name}: member {member} is not a file of sglang 0.5.23's release")
        refused(["wheel", "--from-wheel", str(bad), "--series", str(wheel_series)], out, says)


def test_a_wheel_whose_file_name_claims_other_tags_than_its_wheel_file_is_refused(tmp_path: Path, out: Path,
                                                                                   wheel_series: Path,
                                                                                   upstream_wheel: Path, patched):
    """A manylinux_2_34 build renamed manylinux_2_28 (an older glibc) was patched and labelled so, a wheel
    verify-wheel then refused; a WHEEL ``Tag:`` line that is no tag was a ValueError traceback in verify-wheel."""
    renamed = tmp_path / upstream_wheel.name.replace("manylinux_2_34", "manylinux_2_28")
    renamed.symlink_to(upstream_wheel)  # (a link of the operator's: its target is read)
    refused(["wheel", "--from-wheel", str(renamed), "--series", str(wheel_series)], out,
            "WHEEL differ from its file name's")
    src = Path(patched.wheel)
    (name,) = [n for n in members(src) if n.endswith(".dist-info/WHEEL")]
    verify_fails(tampered(src, tmp_path / "bad", {name: members(src)[name] + b"Tag: garbage\n"}),
                 "the WHEEL file's tags differ from the file name's", "--no-authenticity")


def _with_changed_member(wheel: Path, dest: Path, member: str, text: str, more: dict[str, str] | None = None
                         ) -> Path:
    """``wheel`` with ``member``'s text replaced (and each of ``more``: member path -> text), their RECORD rows
    recomputed (a consistent wheel, not a torn one); its members stored, not deflated again (the release's 39 MB:
    20 s a copy, 4 s stored)."""
    from c128patch.wheel.tools import record_hash

    changed = {member: text.encode(), **{path: new.encode() for path, new in (more or {}).items()}}
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
        record = next(i.filename for i in src.infolist() if i.filename.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            data = changed[info.filename] if info.filename in changed else src.read(info)
            if info.filename == record:
                rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
                rows = [[r[0], record_hash(changed[r[0]]), str(len(changed[r[0]]))] if r and r[0] in changed else r
                        for r in rows]
                out = io.StringIO(newline="")
                csv.writer(out, lineterminator="\n").writerows(rows)
                data = out.getvalue().encode()
            zf.writestr(info, data, compress_type=zipfile.ZIP_STORED)
    return dest


@pytest.mark.parametrize("source", [b"x = " + b"1+" * 200_000 + b"1\n", b"x = " + b"-" * 500_000 + b"1\n"])
def test_verify_compile_all_says_a_module_nested_too_deeply_in_one_line(patched, tmp_path: Path, source: bytes):
    """Helper 142: ``verify-wheel --compile-all`` on a wheel holding a module nested past what compile() recurses
    through was RecursionError's (or the parser's MemoryError's) traceback."""
    bad = tampered(Path(patched.wheel), tmp_path, {"sglang/deep.py": source})
    verify_fails(bad, "sglang/deep.py does not compile: nested too deeply", "--no-authenticity", "--compile-all")


def _cp313(wheel: Path, dest: Path, more: dict[str, str] | None = None) -> Path:
    """``wheel`` as a cp313 wheel of the release: its WHEEL's tag as its file name's (else refused before its
    content); ``more``: other members changed in the same copy (``_with_changed_member``)."""
    name = "sglang-0.5.23.dist-info/WHEEL"
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(name).decode()
    return _with_changed_member(wheel, dest, name, text.replace("cp311-cp311", "cp313-cp313"), more)


def test_from_wheel_refuses_a_release_wheel_whose_content_is_not_the_releases(tmp_path: Path, out: Path,
                                                                             wheel_series: Path, upstream_wheel: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """h107 attack 09: a release wheel with a changed sglang/version.py (RECORD recomputed) came out labelled
    "0.5.23 + series", its provenance recording the release's source tree as if the content were that tree. Its bytes
    are checked against the cache's record of the wheel as downloaded, and its sources against the release's, its
    .dist-info (a Requires-Dist added: h119) against the release wheel's."""
    from c128patch.git import Git
    from c128patch.upstream import releases
    from c128patch.upstream.releases import ReleaseHistory, check_release_content

    sums = {upstream_wheel.name: sha256_file(upstream_wheel)}  # the cache's record, as a download makes it
    monkeypatch.setattr(releases, "_sums", lambda folder: sums)
    with zipfile.ZipFile(upstream_wheel) as zf:
        version_py = zf.read("sglang/version.py").decode()
    evil = version_py + "import os; os.system('id > /tmp/pwned')\n"
    same_name = _with_changed_member(upstream_wheel, tmp_path / upstream_wheel.name, "sglang/version.py", evil)
    refused(["wheel", "--from-wheel", str(same_name), "--series", str(wheel_series)], out,
            f"is not sglang 0.5.23's release wheel {upstream_wheel.name}: its sha256 is")
    # a wheel of the release the cache never downloaded (no record of its bytes): its sources tell
    other = _cp313(same_name, tmp_path / "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl")
    said = refused(["wheel", "--from-wheel", str(other), "--series", str(wheel_series)], out,
                   "is not sglang 0.5.23's release wheel: sglang/version.py differs from the release's sources")
    assert "c128patch wheel --from-release 0.5.23" in said and "c128patch build" in said
    # its sources the release's, its METADATA requiring one more package (pip would install it with the wheel)
    metadata = "sglang-0.5.23.dist-info/METADATA"
    with zipfile.ZipFile(upstream_wheel) as zf:
        text = zf.read(metadata).decode()
    more = text.replace("\nRequires-Dist:", "\nRequires-Dist: evil-typosquat>=6.6\nRequires-Dist:", 1)
    assert more != text
    _cp313(upstream_wheel, other, {metadata: more})  # one copy: the METADATA and WHEEL changed together
    refused(["wheel", "--from-wheel", str(other), "--series", str(wheel_series)], out,
            f"is not sglang 0.5.23's release wheel: {metadata} differs from the release's wheel")
    # its sources and metadata the release's, one more compiled module (imported in the place of scheduler.py)
    _cp313(upstream_wheel, other)
    with zipfile.ZipFile(other, "a") as zf:
        zf.writestr("sglang/srt/managers/scheduler.cpython-313-x86_64-linux-gnu.so", b"\x7fELF")
    refused(["wheel", "--from-wheel", str(other), "--series", str(wheel_series)], out,
            "is not sglang 0.5.23's release wheel: sglang/srt/managers/scheduler differs from the release's wheel")
    # the release's own bytes under that name (only the executable bits may differ across a release's wheels): taken
    shutil.copyfile(upstream_wheel, other)
    git = Git(git_dir=ReleaseHistory().ensure(["0.5.23"]))
    check_release_content(other, git, git.rev_parse("v0.5.23"), "0.5.23")


def test_from_wheel_compares_compiled_files_and_wheel_root_with_the_releases(tmp_path: Path, upstream_wheel: Path):
    """Helper 144: ``_bench.abi3.so`` beside the release's ``_bench.cpython-311-...so`` passed (only module names were
    compared; Python imports the abi3 one where the other is missing or fails), and so did a WHEEL saying
    ``Root-Is-Purelib: true`` (WHEEL was skipped whole: pip installs such a wheel into purelib)."""
    from c128patch.git import Git
    from c128patch.upstream.releases import ReleaseHistory, _metadata, check_release_content

    name = "sglang-0.5.23.dist-info/WHEEL"

    def cp313(dest: Path, root: str = "false", extra: str = "") -> Path:  # stored, not deflated: fast
        with zipfile.ZipFile(upstream_wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == name:
                    data = data.decode().replace("cp311-cp311", "cp313-cp313").replace(
                        "Root-Is-Purelib: false", f"Root-Is-Purelib: {root}").encode()
                info.compress_type = zipfile.ZIP_STORED
                zf.writestr(info, data)
            if extra:
                zf.writestr(extra, b"\x7fELF")
        return dest

    git = Git(git_dir=ReleaseHistory().ensure(["0.5.23"]))
    other = cp313(tmp_path / "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl",
                  extra="sglang/srt/rust_extensions/_bench.abi3.so")
    with pytest.raises(C128Error, match="sglang/srt/rust_extensions/_bench differs from the release's wheel"):
        check_release_content(other, git, git.rev_parse("v0.5.23"), "0.5.23")
    want, have = _metadata(upstream_wheel), _metadata(cp313(other, root="true"))  # what check_release_content compares
    assert sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k)) == [f"{name} Root-Is-Purelib"]


def test_a_truncated_wheel_is_one_line(tmp_path: Path, out: Path, wheel_series: Path, upstream_wheel: Path):
    from c128patch.upstream.releases import iter_wheel_sources, wheel_timestamp

    cut = tmp_path / upstream_wheel.name
    cut.write_bytes(upstream_wheel.read_bytes()[: upstream_wheel.stat().st_size // 2])
    refused(["wheel", "--from-wheel", str(cut), "--series", str(wheel_series)], out, "a truncated download?")
    for read in (wheel_timestamp, lambda w: list(iter_wheel_sources(w))):  # as the release cache reads its wheels
        with pytest.raises(C128Error, match="not a whole wheel .* it is downloaded again"):
            read(cut)


def test_every_reader_of_a_wheel_says_a_truncated_or_corrupt_one_in_one_line(tmp_path: Path):
    from c128patch.fit.env import wheel_requirements
    from c128patch.smoke.trees import unpack_wheel
    from c128patch.upstream.releases import WheelZip

    whole, name = tmp_path / "sglang-0.0.1-py3-none-any.whl", "sglang/__init__.py"
    with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(name, "".join(f"x{i} = {i}\n" for i in range(2000)))
    cut = tmp_path / "cut" / whole.name
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes()[:200])
    for read in (wheel_requirements, lambda w: unpack_wheel(w, tmp_path / "out"), lambda w: InWheel(w).__enter__()):
        with pytest.raises(C128Error, match="is not a whole wheel") as exc:
            read(cut)
        assert str(cut) in exc.value.message and "\n" not in exc.value.message
    data = bytearray(whole.read_bytes())
    data[30 + len(name) + 40] ^= 0xFF  # inside the member's deflated bytes
    whole.write_bytes(bytes(data))
    with WheelZip(whole) as zf, pytest.raises(C128Error, match=f"member {name} cannot be read .* fetch it again"):
        zf.read(name)


@pytest.mark.parametrize("member", ["sglang/../../x.py", "sglang/.git/hooks/post-checkout", "sglang/a\nb.py"])
def test_smoke_unpacks_a_wheels_members_only_through_the_confinement_rule(tmp_path: Path, member: str):
    from c128patch.smoke.trees import unpack_wheel

    wheel = tmp_path / "sglang-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
        zf.writestr(member, "x = 1\n")
    with pytest.raises(C128Error, match=f"unsafe path in --wheel {wheel.name}: "):
        unpack_wheel(wheel, tmp_path / "out")
    assert not (tmp_path / "x.py").exists() and not list((tmp_path / "out").rglob("post-checkout"))


@pytest.mark.parametrize("how", ["bomb", "symlink"])
def test_smoke_unpacks_no_zip_bomb_and_no_special_member(tmp_path: Path, how: str):
    """Helper 142: ``smoke kernel --wheel`` unpacked a 1000:1 member whole (a 1 GiB one from a 1 MiB wheel: a disk
    filled) and a symlink member as a file: the size, ratio and member checks of --from-wheel, verify-wheel now."""
    from c128patch.smoke.trees import unpack_wheel

    wheel = tmp_path / "sglang-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("sglang/__init__.py", "")
        if how == "bomb":
            zf.writestr("sglang/bomb.bin", b"\0" * (16 << 20))
        else:
            info = zipfile.ZipInfo("sglang/link.py")
            info.external_attr = 0o120777 << 16
            zf.writestr(info, "/etc/passwd")
    with pytest.raises(C128Error, match="a zip bomb" if how == "bomb" else "member sglang/link.py is a symlink"):
        unpack_wheel(wheel, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_verify_refuses_an_edited_provenance_and_sbom_claiming_the_series(patched, tmp_path: Path,
                                                                         wheel_series: Path):
    """The entry claims a gate it does not have, in both the provenance and the SBOM, RECORD recomputed:
    the wheel is consistent with itself, but not with the series it claims by name and version."""
    src = Path(patched.wheel)
    (sbom,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    record = json.loads(members(src)["sglang/c128patch_provenance.json"])
    assert record["entries"][0]["name"] == "test-patch" and not record["entries"][0]["gate"]
    record["entries"][0]["gate"] = "SGLANG_OPT_IN"
    doc = members(src)[sbom].decode()
    assert '"name": "c128patch:entry:1:gate",\n          "value": "none"' in doc
    doc = doc.replace('"name": "c128patch:entry:1:gate",\n          "value": "none"',
                      '"name": "c128patch:entry:1:gate",\n          "value": "SGLANG_OPT_IN"')
    bad = tampered(src, tmp_path, {"sglang/c128patch_provenance.json": json.dumps(record).encode(),
                                   sbom: doc.encode()})
    verify_wheel(bad, authenticity=False)  # no anchor: consistent with itself
    with pytest.raises(C128Error, match="entry 'test-patch': its file, gate, kind or overlay's place is not series .* "
                                        "edited"):
        verify_wheel(bad, authenticity=False, known=load_series(wheel_series))
    with pytest.raises(C128Error, match=f"entry 'test-patch': its gate 'SGLANG_OPT_IN' is not {wheel_series}'s"):
        verify_wheel(bad, load_series(wheel_series), authenticity=False)  # h152: --series took it
    verify_wheel(src, authenticity=False, known=load_series(wheel_series))


def test_an_overlay_moved_to_another_module_is_not_the_series(patched, tmp_path: Path, wheel_series: Path,
                                                              upstream_wheel: Path):
    """h152: the overlay's file placed at another module (`sglang/srt/c128_test_overlay.py`), its provenance target and
    files and its SBOM diff said so, RECORD recomputed: `verify-wheel --series` (authenticity too) said "upstream 0.5.23
    + series test 1", exit 0: an overlay's file is hashed, where it lies was checked against nothing of the series."""
    src = Path(patched.wheel)
    (sbom,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    record, doc = (json.loads(members(src)[n]) for n in ("sglang/c128patch_provenance.json", sbom))
    (i,) = [i for i, e in enumerate(record["entries"]) if e["kind"] == "overlay"]
    old, new = record["entries"][i]["target"], "python/sglang/srt/c128_test_overlay.py"
    record["entries"][i].update(target=new, files=[new])
    text = doc["metadata"]["component"]["pedigree"]["patches"][i]["diff"]["text"]
    text["content"] = text["content"].replace(old, new)
    bad = tampered(src, tmp_path, {"sglang/c128patch_provenance.json": json.dumps(record).encode(),
                                   sbom: json.dumps(doc).encode(), old.removeprefix("python/"): None,
                                   new.removeprefix("python/"): members(src)[old.removeprefix("python/")]})
    verify_wheel(bad, authenticity=False)  # no anchor: consistent with itself
    verify_fails(bad, f"entry 'test-overlay': its overlay's place '{new}' is not {wheel_series}'s", "--series",
                 str(wheel_series), "--upstream-wheel", str(upstream_wheel))
    with pytest.raises(C128Error, match="entry 'test-overlay': its file, gate, kind or overlay's place is not series"):
        verify_wheel(bad, authenticity=False, known=load_series(wheel_series))


def test_a_wheel_leaving_out_an_entry_is_not_the_series_given(patched, tmp_path: Path, wheel_series: Path,
                                                               upstream_wheel: Path):
    """h152: the overlay entry taken out of the provenance and the SBOM and its file out of the wheel, RECORD
    recomputed: `verify-wheel --series` (authenticity too) said "upstream 0.5.23 + series test 1", exit 0, of a wheel
    lacking an entry of that series (its digest, which vouches for every entry, was all it compared)."""
    src = Path(patched.wheel)
    (sbom,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    record, doc = (json.loads(members(src)[n]) for n in ("sglang/c128patch_provenance.json", sbom))
    (i,) = [i for i, e in enumerate(record["entries"]) if e["kind"] == "overlay"]
    assert i == len(record["entries"]) - 1  # the last: no SBOM row to renumber
    target = record["entries"].pop(i)["target"].removeprefix("python/")
    component = doc["metadata"]["component"]
    del component["pedigree"]["patches"][i]
    component["properties"] = [p for p in component["properties"]
                               if not p["name"].startswith(f"c128patch:entry:{i + 1}:")]
    bad = tampered(src, tmp_path, {"sglang/c128patch_provenance.json": json.dumps(record).encode(),
                                   sbom: json.dumps(doc).encode(), target: None})
    verify_wheel(bad, authenticity=False)  # no anchor: consistent with itself
    verify_fails(bad, f"made from {wheel_series} by its digest, but lists no entry 'test-overlay'", "--series",
                 str(wheel_series), "--upstream-wheel", str(upstream_wheel))


def test_a_layer_row_of_the_provenance_cannot_take_an_entry_of_the_series_it_claims(patched, wheel_series: Path):
    """A wheel claiming the series (name, version, digest) lists one of its entries under a made-up layer: that row
    was not checked against the series (an outside check passed a wheel whose overlay was edited this way)."""
    from c128patch.wheel.verify import _check_known

    known, iw = load_series(wheel_series), SimpleNamespace(wheel=Path(patched.wheel))
    good = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    _check_known(iw, good, known)
    layer = {"name": "x", "version": "1", "base": "v0.5.23", "digest": "ab" * 32}
    claimed = {**good, "entries": [{**good["entries"][0], "gate": "SGLANG_OPT_IN"}, *good["entries"][1:]],
               "layers": [{**layer, "entries": ["test-patch"]}]}
    with pytest.raises(C128Error, match="layer 'x' lists entries not named '<layer>/<entry>'"):
        _check_known(iw, claimed, known)
    moved = {**good, "entries": [{**good["entries"][0], "name": "x/test-patch"}, *good["entries"][1:]],
             "layers": [{**layer, "entries": ["x/test-patch"]}]}
    with pytest.raises(C128Error, match="claims series test 1, but lists no entry 'test-patch'"):
        _check_known(iw, moved, known)


def test_a_layer_record_listing_other_entries_is_not_the_layer_given():
    """Helper 179: with ``--layer``, only a layer record's name, version and digest were compared: a provenance (RECORD
    recomputed) listing one of our entries as the layer's, or dropping its entries (what doctor says the build
    carries), passed ``verify-wheel --layer`` as the layer given (without ``--layer`` it was refused)."""
    from c128patch.series.layers import layer_rows, stack
    from c128patch.wheel.verify import _check_series

    series = stack(load_series(REPO_ROOT), [REPO_ROOT / "docs" / "examples" / "acme-layer"])
    (row,) = layer_rows(series)
    iw, base = SimpleNamespace(wheel=Path("w.whl")), {"series": {"digest": series.ours.digest()}, "entries": []}
    with pytest.raises(C128Error, match="lists no entry"):  # (past the layers: the record's entries are left out)
        _check_series(iw, {**base, "layers": [row]}, series)
    for entries in (row["entries"][:1], ["c128-dspark-online-env", *row["entries"][1:]]):
        with pytest.raises(C128Error, match="its record of layer acme lists other entries than .*acme-layer has"):
            _check_series(iw, {**base, "layers": [{**row, "entries": entries}]}, series)


def test_a_wheel_claiming_the_series_may_leave_out_only_an_entry_the_series_records_merged(patched, wheel_series):
    """Helper 93's attack: the entry moved from "entries" to "dropped" under our exact label: every check passed and
    the wheel lacked a fix. Our digest vouches for every entry; one left out only where the series records it merged
    upstream. A "dropped" that is not a list of records is one line, not a TypeError."""
    from c128patch.wheel.verify import _check_known

    known, iw = load_series(wheel_series), SimpleNamespace(wheel=Path(patched.wheel))
    good = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    first = good["entries"][0]["name"]
    left = {**good, "entries": good["entries"][1:], "dropped": [{"name": first, "status": "dropped-as-merged"}]}
    with pytest.raises(C128Error, match=f"leaves out entry '{first}', which that series records no upstream merge"):
        _check_known(iw, left, known)
    known.entries[0].merged_in = "0" * 40  # the series says upstream holds it: leaving it out is what apply does
    _check_known(iw, left, known)
    for bad in (5, [5], "x"):
        with pytest.raises(C128Error, match="entries or dropped entries are not a list of records"):
            _check_known(iw, {**good, "dropped": bad}, known)


def test_an_overlays_diff_may_add_its_one_file_and_nothing_else(patched, tmp_path: Path, wheel_series: Path):
    """Helper 95's attack: a second file section in an overlay's SBOM diff (a payload in another module of the wheel)
    and that file added to the entry's files, RECORD recomputed: every check passed, --series too, since an overlay's
    diff is not hashed (a git diff of the file as built)."""
    import difflib

    from c128patch.wheel.tools import WheelMismatch
    from c128patch.wheel.verify import _check_series

    src = Path(patched.wheel)
    (sbom,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    record, doc = (json.loads(members(src)[n]) for n in ("sglang/c128patch_provenance.json", sbom))
    victim = "sglang/srt/environ.py"
    old = members(src)[victim].decode()
    new = old + "import os; os.system('touch /tmp/PWNED')\n"
    payload = f"diff --git a/python/{victim} b/python/{victim}\n" + "".join(difflib.unified_diff(
        old.splitlines(True), new.splitlines(True), f"a/python/{victim}", f"b/python/{victim}"))
    (i,) = [i for i, e in enumerate(record["entries"]) if e["kind"] == "overlay"]
    record["entries"][i]["files"].append(f"python/{victim}")
    doc["metadata"]["component"]["pedigree"]["patches"][i]["diff"]["text"]["content"] += payload
    # the payload on top of the patch entry's edit: the patch's diff still reverse-applies beneath it
    bad = tampered(src, tmp_path, {"sglang/c128patch_provenance.json": json.dumps(record).encode(),
                                   sbom: json.dumps(doc).encode(), victim: new.encode()})
    for extra in ((), ("--series", str(wheel_series))):
        verify_fails(bad, "overlay 'test-overlay': its diff or files name more than the new file", *extra)
    record["entries"].append({**record["entries"][0], "name": "evil"})  # an entry the series has not: exit 1, not 2
    with pytest.raises(WheelMismatch, match=f"entry 'evil' is not one of {wheel_series}"):
        _check_series(SimpleNamespace(wheel=src), record, load_series(wheel_series))


@pytest.mark.parametrize("claim", [{"name": "TEST"}, {"version": "01"}, {"name": "Test", "version": "1.0"},
                                   {"name": "other", "version": "9"}])
def test_a_wheel_claims_the_series_in_any_spelling_its_label_hides_or_by_its_digest(patched, wheel_series, claim):
    """Helper 95: our digest under the name in another case, or version 04 (the wheel's label prints 4, and leaves the
    name out): the same file name as ours, and verify-wheel said OK without checking it against the series."""
    from c128patch.wheel.verify import _check_known

    known, iw = load_series(wheel_series), SimpleNamespace(wheel=Path(patched.wheel))
    good = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    renamed = {**good, "series": {**good["series"], **claim}}
    if claim.get("version") == "1.0":  # not the label's spelling of 1: a claim only by the digest
        renamed["series"]["digest"] = "ab" * 32
        _check_known(iw, renamed, known)
        return
    with pytest.raises(C128Error, match=r"claims series test 1 as '.*' '.*' \(the provenance was edited\)"):
        _check_known(iw, renamed, known)
    forged = {**renamed, "series": {**renamed["series"], "digest": "ab" * 32}}
    if claim.get("name") == "other":  # neither name nor version: another series, unless it takes our digest
        _check_known(iw, forged, known)
    else:
        with pytest.raises(C128Error, match="claims series test 1 as"):
            _check_known(iw, forged, known)


@pytest.mark.parametrize("claim", [{"name": "evil", "digest": "prefix"}, {"name": "test\u200b"},
                                   {"name": "test ", "version": "1"}, {"version": "1.0", "digest": "prefix"}])
def test_a_wheel_claims_the_series_by_the_digest_its_label_shows_or_a_name_that_reads_as_it(
        patched, wheel_series, claim):
    """Helper 100: another name (evil, or ours with a zero-width space or a trailing space) over a digest whose first
    8 characters are ours: the wheel's label (``+c128.1.<8>``) and file name are ours, and verify-wheel said OK."""
    from c128patch.wheel.verify import _check_known

    known, iw = load_series(wheel_series), SimpleNamespace(wheel=Path(patched.wheel))
    good = json.loads(members(Path(patched.wheel))["sglang/c128patch_provenance.json"])
    digest = known.digest()[:8] + "f" * 56 if claim.get("digest") == "prefix" else "ab" * 32
    forged = {**good, "series": {**good["series"], **claim, "digest": digest}}
    with pytest.raises(C128Error, match=r"claims series test 1 (as '.*' '.*' \(the provenance was edited\)|, but its "
                                        rf"digest f*{known.digest()[:8]}f+ is not that series' \({known.digest()}\))"):
        _check_known(iw, forged, known)


def test_verify_refuses_deeply_nested_provenance(patched, tmp_path: Path):
    verify_fails(with_provenance(patched, tmp_path, b"[" * 100_000 + b"]" * 100_000), "nested too deeply")


def test_verify_refuses_a_provenance_holding_an_integer_past_pythons_digit_limit(patched, tmp_path: Path):
    """``json.loads`` raises a plain ValueError for an integer of more than 4300 digits: one line, not a traceback."""
    verify_fails(with_provenance(patched, tmp_path, b'{"zz": 1' + b"0" * 5000 + b"}"), "is not valid JSON (Exceeds")


def test_verify_refuses_a_wrong_shaped_sbom(patched, tmp_path: Path):
    src = Path(patched.wheel)
    (name,) = [n for n in members(src) if n.endswith("sboms/c128patch.cdx.json")]
    doc = json.loads(members(src)[name])
    doc["metadata"]["component"]["pedigree"] = ["not", "an", "object"]
    verify_fails(tampered(src, tmp_path, {name: json.dumps(doc).encode()}), "SBOM has the wrong shape")


# -- --from-wheel input: duplicates, zip bombs, bad METADATA, bad SOURCE_DATE_EPOCH, full disk ----


def synthetic_wheel(path: Path, extra: dict[str, bytes]) -> Path:
    """A minimal sglang-named wheel (tests about zip structure only, not sglang content)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("sglang/__init__.py", "")
        for name, data in extra.items():
            zf.writestr(name, data)
        zf.writestr("sglang-0.5.23.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
        zf.writestr("sglang-0.5.23.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("sglang-0.5.23.dist-info/RECORD", "")
    return path


def test_from_wheel_refuses_duplicates(tmp_path: Path, out: Path, wheel_series: Path, upstream_wheel: Path):
    dup = tmp_path / upstream_wheel.name
    shutil.copy(upstream_wheel, dup)
    with pytest.warns(UserWarning), zipfile.ZipFile(dup, "a") as zf:
        zf.writestr("sglang/srt/environ.py", "import os; os.system('true')\n")
    refused(["wheel", "--from-wheel", str(dup), "--series", str(wheel_series)], out,
            "duplicate archive member 'sglang/srt/environ.py'")


def test_from_wheel_caps_the_unpacked_size(tmp_path: Path, out: Path, wheel_series: Path, monkeypatch):
    from c128patch.wheel import tools

    bomb = synthetic_wheel(tmp_path / "sglang-0.5.23-py3-none-any.whl", {"sglang/zeros.json": bytes(64 << 20)})
    line = refused(["wheel", "--from-wheel", str(bomb), "--series", str(wheel_series)], out, "unpacks to 64 MiB")
    assert "the limits are 2 GiB in total and 100:1" in line
    monkeypatch.setattr(tools, "MAX_RATIO", 10**6)
    monkeypatch.setattr(tools, "MAX_UNPACKED", 32 << 20)
    refused(["wheel", "--from-wheel", str(bomb), "--series", str(wheel_series)], out, "the limits are 0 GiB in total")


def test_real_wheels_pass_the_caps():
    from c128patch.wheel.tools import check_archive

    for version in ("0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        wheel = wheel_for(version)
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            check_archive(infos, wheel)
        from c128patch.wheel import tools
        assert sum(i.file_size for i in infos) * 10 < tools.MAX_UNPACKED
        assert sum(i.file_size for i in infos) < tools.MAX_RATIO * wheel.stat().st_size / 10  # 10x margin


@pytest.mark.parametrize("names, says", [
    (["sglang/caf\u00e9.py", "sglang/cafe\u0301.py"], "are one file on some file systems"),  # NFC and NFD
    (["sglang/version.py", "sglang/version.py."], "are one file on some file systems"),
    (["sglang/version.py", "sglang/version.py "], "are one file on some file systems"),
    (["sglang/A.py", "sglang/a.py"], "are one file on some file systems"),
    (["sglang/.GIT/hooks/x"], "unsafe member name"), (["sglang/GIT~1/config"], "unsafe member name"),
    (["sglang/x.py::$DATA"], "unsafe member name"), (["sglang/a\u2028b.py"], "unsafe member name"),
    (["sglang/\u202ey.py"], "unsafe member name"),
    (["sglang/srt/environ.py", "sglang-0.5.23.data/purelib/sglang/srt/environ.py"], "are one file on some file"),
    (["sglang/x.py", "sglang-0.5.23.data/platlib/sglang/X.py"], "are one file on some file"),
    (["sglang/srt/a.py", "\u017fglang/srt/a.py"], "are one file on some file"),  # long s: casefold, not lower
], ids=["nfc-nfd", "trailing-dot", "trailing-space", "case", "dot-git-upper", "git-8.3", "ntfs-stream",
        "line-separator", "bidi", "data-purelib", "data-platlib", "long-s"])
def test_check_archive_refuses_names_a_file_system_folds_together_or_to_git(tmp_path: Path, names, says):
    """Helper 95 (and 100: .data/purelib, the long s): these passed check_archive, so verify-wheel --no-authenticity
    took them."""
    from c128patch.wheel.tools import check_archive

    with pytest.raises(C128Error, match=says):
        check_archive([zipfile.ZipInfo(n) for n in names], tmp_path / "x.whl")


def _stream(wheel: Path, name: str) -> bytes:
    """A member's compressed bytes as the archive stores them (after its local header)."""
    import struct

    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(name)
    data = wheel.read_bytes()
    at = info.header_offset + 30 + sum(struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30]))
    return data[at: at + info.compress_size]


class _Trailing:
    """A deflater that leaves bytes after the stream's end (zipfile reads the member, CRC and all, and skips them)."""

    def __init__(self, *args: object) -> None:
        import zlib

        self.z = zlib.compressobj(6, zlib.DEFLATED, -15)

    def compress(self, data: bytes) -> bytes:
        return self.z.compress(data)

    def flush(self) -> bytes:
        return self.z.flush() + b"HIDDEN"


def test_saving_copies_an_unchanged_members_deflate_stream_only_when_it_is_exactly_the_content(tmp_path: Path,
                                                                                               monkeypatch):
    """``InWheel.save`` copies a member it did not change as the archive deflated it (the build deflated each one anew,
    ~80 % of a 0.5.23 wheel's build) after reading it in full with its CRC checked, under headers of its own; a stream
    with bytes after its end is deflated anew, a member whose CRC fails is refused, an edited one is deflated anew."""
    import zlib

    text = "".join(f"value_{i} = {i * 7919 % 1000}\n" for i in range(3000)).encode()
    src = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(src, "w") as zf:  # level 1: not what the writer's own deflate (level 6) gives
        zf.writestr(zipfile.ZipInfo("sglang/copied.py", (2001, 2, 3, 4, 5, 6)), text, zipfile.ZIP_DEFLATED, 1)
        zf.writestr("sglang/stored.py", text, zipfile.ZIP_STORED)
        zf.writestr("sglang/edited.py", text, zipfile.ZIP_DEFLATED, 1)
        with monkeypatch.context() as mp:
            mp.setattr(zipfile, "_get_compressor", _Trailing)
            zf.writestr("sglang/hidden.py", text, zipfile.ZIP_DEFLATED)
        for name, body in (("METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"),
                           ("WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"), ("RECORD", "")):
            zf.writestr(f"sglang-0.5.23.dist-info/{name}", body)
    with zipfile.ZipFile(src) as zf:
        assert zf.read("sglang/hidden.py") == text and _stream(src, "sglang/hidden.py").endswith(b"HIDDEN")
    level6 = zlib.compressobj(6, zlib.DEFLATED, -15)
    fresh = level6.compress(text) + level6.flush()
    assert _stream(src, "sglang/copied.py") != fresh  # (else the test could not tell a copy from a new deflate)

    def save(wheel: Path, dest: Path) -> Path:
        with InWheel(wheel) as iw:
            iw.extract(["sglang/edited.py"])
            (iw.root / "sglang/edited.py").write_bytes(text + b"# edited\n")
            return iw.save(dest, Version("0.5.23+c128.1"), 1_000_000_000)

    out = save(src, tmp_path / "a")
    assert _stream(out, "sglang/copied.py") == _stream(src, "sglang/copied.py")  # copied, not deflated again
    assert _stream(out, "sglang/hidden.py") == fresh  # deflated anew: the hidden bytes are not carried
    assert _stream(out, "sglang/stored.py") == fresh
    edited = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert _stream(out, "sglang/edited.py") == edited.compress(text + b"# edited\n") + edited.flush()
    check_record(out)  # every member's RECORD hash and size
    with zipfile.ZipFile(out) as zf:
        assert {n: zf.read(n) for n in ("sglang/copied.py", "sglang/hidden.py", "sglang/stored.py")} == \
            dict.fromkeys(("sglang/copied.py", "sglang/hidden.py", "sglang/stored.py"), text)
        info = zf.getinfo("sglang/copied.py")  # our header: our stamp and mode, not the input's
        assert (info.date_time, info.external_attr >> 16, info.extra) == ((2001, 9, 9, 1, 46, 40), 0o100644, b"")
    assert save(src, tmp_path / "b").read_bytes() == out.read_bytes()  # the same input, the same bytes

    data = bytearray(src.read_bytes())  # the copied member's CRC made wrong (local header and central directory)
    with zipfile.ZipFile(src) as zf:
        info, start = zf.getinfo("sglang/copied.py"), zf.start_dir
    assert data[start + 46: start + 46 + len(info.filename)] == info.filename.encode()  # the first central record
    for at in (info.header_offset + 14, start + 16):
        data[at] ^= 0xFF
    bad = tmp_path / "bad" / src.name
    bad.parent.mkdir()
    bad.write_bytes(bytes(data))
    with pytest.raises(C128Error, match="member sglang/copied.py cannot be read .*Bad CRC-32"):
        save(bad, tmp_path / "c")
    assert not (tmp_path / "c").exists()
    from c128patch.wheel.tools import _WheelWriter

    stream = _stream(src, "sglang/copied.py")
    with _WheelWriter(bad, "w") as wf:  # a stream is never written under another method than deflate
        wf.writestr(zipfile.ZipInfo("sglang/stored.py"), text, stream=stream)
    with zipfile.ZipFile(bad) as zf:
        assert zf.read("sglang/stored.py") == text


@pytest.fixture(scope="module")
def stored_copy(tmp_path_factory: pytest.TempPathFactory, upstream_wheel: Path):
    """The real 0.5.23 wheel's members (read once) and a writer of edited copies (stored: fast)."""
    files = members(upstream_wheel)

    def write(dest_dir: Path, metadata: bytes) -> Path:
        dest_dir.mkdir(parents=True, exist_ok=True)
        path = dest_dir / upstream_wheel.name
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            for name, data in files.items():
                zf.writestr(name, metadata if name.endswith(".dist-info/METADATA") else data)
        return path

    return files["sglang-0.5.23.dist-info/METADATA"], write


@pytest.mark.parametrize("edit,contains", [
    (lambda m: m.replace(b"\nName: sglang\n", b"\n"), "'name' is a required field"),
    (lambda m: m.replace(b"\nVersion: 0.5.23\n", b"\n"), "'version' is a required field"),
    (lambda m: m.replace(b"\nVersion: 0.5.23\n", b"\nVersion: banana\n"), "'banana' is invalid for 'version'"),
])
def test_from_wheel_bad_metadata(stored_copy, tmp_path: Path, out: Path, wheel_series: Path, edit, contains):
    meta, write = stored_copy
    bad = write(tmp_path / "w", edit(meta))
    line = refused(["wheel", "--from-wheel", str(bad), "--series", str(wheel_series)], out, "METADATA cannot be parsed")
    assert contains in line


@pytest.mark.parametrize("epoch,contains", [("4354819200", "after 2107-12-31"), ("1e9", "whole number"),
                                            ("١٢٣", "whole number")])
def test_source_date_epoch_out_of_range(epoch, contains, out: Path, wheel_series: Path, upstream_wheel: Path,
                                        monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
    refused(["wheel", "--from-wheel", str(upstream_wheel), "--series", str(wheel_series)], out, contains)


def test_full_disk_is_one_line(out: Path, wheel_series: Path, upstream_wheel: Path, monkeypatch):
    import errno

    from c128patch.wheel import tools

    def full(self, path: Path, epoch: int) -> None:
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(tools.InWheel, "_write", full)
    refused(["wheel", "--from-wheel", str(upstream_wheel), "--series", str(wheel_series)], out,
            "disk full while patching")


def test_a_full_output_folder_is_named_not_a_temporary_file(out: Path, wheel_series: Path, upstream_wheel: Path,
                                                           monkeypatch):
    """Helper 183: -o on a full 20 MB tmpfs: zipfile's write names no file, and the line said "a temporary file ...
    free space (or set TMPDIR)", where the partial wheel was in -o. Now the -o folder is named."""
    import errno

    from c128patch.wheel import tools

    def full(self, path: Path, epoch: int) -> None:
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")  # (as a zipfile write raises it)

    monkeypatch.setattr(tools.InWheel, "_write", full)
    line = refused(["wheel", "--from-wheel", str(upstream_wheel), "--series", str(wheel_series)], out,
                   "disk full while patching")
    assert f"({out}: No space left on device)" in line and "a temporary file" not in line, line


def test_file_size_limit_is_one_line(tmp_path: Path, wheel_series: Path, upstream_wheel: Path):
    """Under ``ulimit -f`` (10 MB, the patched wheel is 39 MB): one line, exit 2, no partial file in -o."""
    import resource

    out = tmp_path / "out"
    out.mkdir()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (10 << 20, 10 << 20))

    proc = subprocess.run([sys.executable, "-m", "c128patch", "wheel", "--from-wheel", str(upstream_wheel),
                           "--series", str(wheel_series), "-o", str(out)],
                          capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    line = error_line(proc.stderr)  # a heartbeat may come first: the patching is over 10 s on a busy machine
    assert line.startswith("c128patch: error: file size limit reached while patching"), line
    assert list(out.iterdir()) == []


def test_too_few_open_files_for_verify_wheel_is_one_line(patched, wheel_series: Path, tmp_path: Path):
    """Helper 183: ``ulimit -n 12``: verify-wheel's scratch folder's rmtree met EMFILE: OSError's traceback, exit 1.
    Now one line naming the limit, exit 2; the folder left is removed by the next run."""
    import resource

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "c128patch", "verify-wheel", str(patched.wheel), "--series",
                           str(wheel_series)], capture_output=True, text=True, preexec_fn=low, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert error_line(proc.stderr).startswith("c128patch: error: too many open files (Too many open files; the limit, "
                                              "ulimit -n 12, is too low)"), proc.stderr
    again = subprocess.run([sys.executable, "-m", "c128patch", "verify-wheel", str(patched.wheel), "--series",
                            str(wheel_series)], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and list(tmp_path.iterdir()) == [], again.stderr


def test_killed_wheel_leaves_no_partial_file(tmp_path: Path, wheel_series: Path, upstream_wheel: Path):
    """kill -9 just before the finished wheel is renamed into -o: no wheel appears there, and the
    next run removes the killed run's hidden folders (in -o and in TMPDIR); a live run's stay."""
    from support import cli_process

    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    args = ["wheel", "--from-wheel", upstream_wheel, "--series", wheel_series, "-o", out]
    killed = cli_process(args, env={"C128PATCH_FAULT": "kill-at:wheel-write", "TMPDIR": str(tmp)})
    assert killed.returncode == -9, killed.stderr
    assert not list(out.glob("*.whl"))
    (hidden,) = out.iterdir()
    assert hidden.name.startswith(".c128patch-") and list(hidden.glob("*.whl"))  # the partial wheel, hidden
    assert list(tmp.glob("c128patch-wheel-*"))
    live = out / f".c128patch-{os.getpid()}-live"  # a running process's: kept
    live.mkdir()
    again = cli_process(args, env={"TMPDIR": str(tmp)})
    assert again.returncode == 0, again.stderr
    (wheel,) = out.glob("*.whl")
    assert sorted(p.name for p in out.iterdir()) == sorted([wheel.name, live.name])
    assert not list(tmp.glob("c128patch-wheel-*"))


def test_verify_a_wheel_not_made_from_an_upstream_wheel_cannot_be_authenticated(patched, tmp_path: Path):
    """A provenance naming no upstream wheel (a source build's) gets "cannot check authenticity", exit 2."""
    src = Path(patched.wheel)
    record = json.loads(members(src)["sglang/c128patch_provenance.json"])
    record["upstream"]["source"] = "tree"
    bad = tampered(src, tmp_path, {"sglang/c128patch_provenance.json": json.dumps(record).encode()})
    res = run_cli(["verify-wheel", str(bad)])
    assert res.code == 2, (res.code, res.err)
    (line,) = res.err.strip().splitlines()
    assert line.startswith("c128patch: error: cannot check authenticity: ") and "built from source" in line
    assert run_cli(["verify-wheel", str(bad), "--no-authenticity"]).code == 0


def tiny_wheel(dest: Path, extra: dict[str, bytes]) -> Path:
    """A small sglang 0.5.23 wheel holding ``extra``, its RECORD right: only the member checks can refuse it."""
    from c128patch.wheel.authentic import record_hash

    info = "sglang-0.5.23.dist-info"
    files = {"sglang/__init__.py": b"", "sglang/srt/environ.py": b"X = 1\n", **extra,
             f"{info}/METADATA": b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n",
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([[n, record_hash(d), len(d)] for n, d in files.items()]
                                                    + [[f"{info}/RECORD", "", ""]])
    dest.mkdir(parents=True)
    with zipfile.ZipFile(dest / "sglang-0.5.23-py3-none-any.whl", "w") as zf:
        for name, data in {**files, f"{info}/RECORD": text.getvalue().encode()}.items():
            zf.writestr(name, data)
    return dest / "sglang-0.5.23-py3-none-any.whl"


@pytest.mark.parametrize("extra, says", [
    ({"sglang/srt/Environ.py": b"import os\n"}, "members 'sglang/srt/environ.py' and 'sglang/srt/Environ.py' are "
                                                "one file on some file systems (case"),
    ({"sglang/srt/a\nb.py": b""}, "unsafe member name 'sglang/srt/a\\nb.py'"),
    ({"sglang/srt/\x1b]8;;https://evil\x07x.py": b""}, "unsafe member name 'sglang/srt/\\x1b]8;;https://evil\\x07x.py'"),
    # helper 168: a zero-width space, which every report takes out: `environ\u200b.py` was shown as environ.py
    ({"sglang/srt/environ\u200b.py": b""}, "unsafe member name 'sglang/srt/environ\\u200b.py'"),
], ids=["case", "newline", "controls", "zero-width"])
def test_a_member_that_differs_only_in_case_or_holds_a_control_is_refused_by_name(tmp_path: Path, extra, says):
    """On a case-insensitive file system ``Environ.py`` unpacks over ``environ.py``; a newline in a name split the
    refusal into two lines. verify-wheel and wheel --from-wheel refuse both, in one line, before any work."""
    wheel = tiny_wheel(tmp_path / "w", extra)
    verify_fails(wheel, says)
    refused(["wheel", "--from-wheel", str(wheel), "--series", str(REPO_ROOT)], tmp_path / "out", says)


def _stored(members: list[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """(the local records, the central directory) of a stored zip of ``members``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    raw = buf.getvalue()
    at = zipfile.ZipFile(io.BytesIO(raw)).start_dir
    return raw[:at], raw[at:-22]


def _two_directories(kind: str) -> bytes:
    """A wheel of a.py and b.py whose b.py holds a second archive (a.py and zzz-evil.pth: its local record and
    directory), and end records by ``kind``: "zip64" (plain), "locator" (the zip64 locator names a zip64 record in b.py
    pointing to the second directory), "classic" (the classic end record names the second directory)."""
    evil_locals, evil_cd = _stored([("a.py", b"A=1\n"), ("zzz-evil.pth", b"import os\n")])
    evil_local = evil_locals[evil_locals.index(b"PK\x03\x04", 4):]
    content_at = len(_stored([("a.py", b"A=1\n"), ("b.py", b"")])[0])
    second = bytearray(evil_cd)
    struct.pack_into("<L", second, second.index(b"PK\x01\x02", 4) + 42, content_at)  # its evil record: in b.py
    second_at = content_at + len(evil_local)
    fake = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 2, 2, len(second), second_at)
    locals_, cd = _stored([("a.py", b"A=1\n"), ("b.py", evil_local + bytes(second) + fake)])
    cd_at, end64 = len(locals_), len(locals_) + len(cd)
    locator_at = second_at + len(second) if kind == "locator" else end64
    n, size, at = (2, len(second), second_at) if kind == "classic" else (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    return locals_ + cd + struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 2, 2, len(cd), cd_at) + \
        struct.pack("<4sLQL", b"PK\x06\x07", 0, locator_at, 1) + \
        struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, size, at, 0)


def test_a_wheel_with_two_central_directories_is_refused_in_one_line(tmp_path: Path):
    """Helper 156: a second central directory inside a stored member, named by the zip64 locator (zipfile reads the
    zip64 record just before the locator, `unzip -l` the one the locator names) or by the classic end record beside a
    zip64 one (zipfile takes the zip64 values): zipfile lists a.py and b.py, `unzip -l` lists zzz-evil.pth, and
    WheelZip (so verify-wheel and wheel --from-wheel) opened it. So did an end record counting other members than its
    directory, or a comment holding a second end record. Now each is one line; a plain zip64 wheel opens."""
    good = tmp_path / "good.whl"
    good.write_bytes(_two_directories("zip64"))
    with WheelZip(good) as zf:
        assert zf.namelist() == ["a.py", "b.py"]
    plain = tmp_path / "plain.whl"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("a.py", "A=1\n")
        zf.comment = b"built by hand"
    WheelZip(plain).close()
    raw, hidden = plain.read_bytes(), b"".join(_stored([("zzz-evil.pth", b"import os\n")]))
    cases = {"locator": _two_directories("locator"), "classic": _two_directories("classic"),
             "count": raw[:-27] + struct.pack("<2H", 2, 2) + raw[-23:],  # (the end record: 22 bytes, then 13)
             "comment": raw[:-15] + struct.pack("<H", len(hidden)) + hidden}
    reasons = {"locator": "a zip64 locator naming a zip64 end record at", "classic": "a classic end record naming",
               "count": "an end record counting 2 members where its directory lists 1",
               "comment": "an archive comment holding zip records"}
    for kind, data in cases.items():
        bad = tmp_path / f"sglang-0.5.23-py3-none-any-{kind}.whl"
        bad.write_bytes(data)
        if kind in ("locator", "classic"):
            with zipfile.ZipFile(bad) as zf:  # what zipfile sees: the wheel as it was
                assert zf.namelist() == ["a.py", "b.py"]
            if shutil.which("unzip"):
                listed = subprocess.run(["unzip", "-l", str(bad)], capture_output=True, text=True).stdout
                assert "zzz-evil.pth" in listed, listed
        with pytest.raises(C128Error, match=rf"^not a wheel: {re.escape(str(bad))} has {reasons[kind]}") as exc:
            WheelZip(bad)
        assert "\n" not in exc.value.message
    res = run_cli(["verify-wheel", str(tmp_path / "sglang-0.5.23-py3-none-any-locator.whl")])
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "two central directories" in res.err, res.err


def test_a_wheel_over_a_series_files_size_limit_is_patched_and_verified(wheel_series: Path, upstream_wheel: Path,
                                                                         tmp_path: Path, monkeypatch):
    """Helper 159: a wheel was hashed as a file of the series is (``sha256_file``: 64 MiB at most), so an upstream
    wheel over 64 MiB (0.5.23's is 39 MB, 0.5.18's 24 MB; one stored, not deflated, 124 MB) was refused as "series
    file ... over the 64 MiB a patch or overlay may be", as was verify-wheel's upstream wheel and build's result. Here
    the limit is made smaller than the wheel, as a later release's wheel would outgrow it."""
    from c128patch.series import manifest

    monkeypatch.setattr(manifest, "MAX_SERIES_FILE", 1 << 20)  # our patches are far smaller; the wheel is not
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    result = patch_wheel(load_series(wheel_series), upstream_wheel, tmp_path / "dist")
    assert result.upstream_sha256 == hashlib.sha256(upstream_wheel.read_bytes()).hexdigest()
    assert verify_wheel(Path(result.wheel), authenticity=True, upstream_wheel=upstream_wheel).authenticity


def _with_padded_streams(wheel: Path, dest: Path, names: set[str]) -> Path:
    """``wheel`` (its WHEEL's tags made cp313, RECORD's row for it recomputed: ``_cp313``'s copy) with the members
    ``names`` deflated behind eight empty stored blocks whose header padding bits are set: bits every inflater skips,
    the same content."""
    from c128patch.wheel.tools import _Stored, record_hash  # _Stored: zipfile's compressor giving the stream chosen

    tag, record = "sglang-0.5.23.dist-info/WHEEL", "sglang-0.5.23.dist-info/RECORD"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
        wheel_file = src.read(tag).replace(b"cp311-cp311", b"cp313-cp313")
        for old in src.infolist():
            data = wheel_file if old.filename == tag else src.read(old)
            if old.filename == record:
                data = data.replace(record_hash(src.read(tag)).removeprefix("sha256=").encode(),
                                    record_hash(wheel_file).removeprefix("sha256=").encode())
            info = zipfile.ZipInfo(old.filename, old.date_time)
            info.external_attr = old.external_attr
            if old.filename not in names:
                zf.writestr(info, data)
                continue
            info.compress_type = zipfile.ZIP_DEFLATED
            deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
            with zf.open(info, "w") as out:
                out._compressor = _Stored(b"\xf8\x00\x00\xff\xff" * 8 + deflate.compress(data) + deflate.flush())
                out.write(data)
    return dest


def test_a_wheel_checked_by_its_content_only_gives_no_member_stream_to_the_wheel_built(
        wheel_series: Path, upstream_wheel: Path, tmp_path: Path, monkeypatch):
    """Helper 159: ``wheel`` copies an unchanged member's deflate stream (505670a): from a wheel the cache never
    downloaded (a cp313 wheel of the release, checked by its content only) that copied the wheel's own encoding, bits
    every check skips (here empty stored blocks with their padding bits set: 40 chosen bits a member, any number of
    blocks) into the wheel we build and label. Such a wheel's members are deflated anew: the wheel built holds a fresh
    deflate of each."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    names = {"sglang/version.py", "sglang/__init__.py"}
    crafted = _with_padded_streams(upstream_wheel, tmp_path / "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl",
                                   names)
    built = Path(patch_wheel(load_series(wheel_series), crafted, tmp_path / "dist").wheel)
    with zipfile.ZipFile(built) as zf, built.open("rb") as fh:
        for name in names:
            info = zf.getinfo(name)
            fh.seek(info.header_offset + 26)
            skip = sum(struct.unpack("<HH", fh.read(4)))
            stream = fh.read(skip + info.compress_size)[skip:]
            fresh = zlib.compressobj(6, zlib.DEFLATED, -15)
            assert stream == fresh.compress(zf.read(name)) + fresh.flush(), name


def test_a_given_wheel_with_a_corrupt_source_member_is_never_said_to_be_downloaded_again(tmp_path: Path, out: Path,
                                                                                         wheel_series: Path,
                                                                                         upstream_wheel: Path):
    """Helper 159: a --from-wheel wheel the cache never downloaded (its sources compared with the release's) whose
    member fails its CRC printed the cache's fix, "remove it (rm WHEEL) and run again: it is downloaded again": pasted,
    it deleted the operator's own wheel, which nothing downloads again."""
    other = _cp313(upstream_wheel, tmp_path / "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl")
    with zipfile.ZipFile(other) as zf:
        info = zf.getinfo("sglang/srt/environ.py")  # stored: its bytes are its content
    data = bytearray(other.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 100] ^= 0xFF
    other.write_bytes(bytes(data))
    line = refused(["wheel", "--from-wheel", str(other), "--series", str(wheel_series)], out,
                   "member sglang/srt/environ.py cannot be read")
    assert "downloaded again" not in line and "fetch it again" in line and other.exists()


@pytest.mark.parametrize("field, value", [("method", 0), ("flags", 0x1)])
def test_a_local_header_naming_another_method_than_the_directory_is_refused(patched, tmp_path: Path, field, value):
    """Helper 159: a member whose local header says stored (method 0) while the central directory says deflated (or
    that says encrypted) passed verify-wheel and `wheel --from-wheel`: zipfile goes by the directory, a reader going
    from the start would take the deflate stream itself as the member's content."""
    src = Path(patched.wheel)
    bad = tmp_path / src.name
    shutil.copyfile(src, bad)
    with zipfile.ZipFile(bad) as zf:
        info = zf.getinfo("sglang/srt/environ.py")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    with bad.open("r+b") as fh:
        fh.seek(info.header_offset + (8 if field == "method" else 6))
        fh.write(struct.pack("<H", value | (info.flag_bits if field == "flags" else 0)))
    res = run_cli(["verify-wheel", str(bad), "--no-authenticity"])
    assert res.code == 2 and "sglang/srt/environ.py's local header says compression method" in error_line(res.err), \
        res.err


def test_verify_wheels_layer_help_says_what_it_reads(monkeypatch):
    """Helper 159: verify-wheel's --layer help was the shared one ("default: $C128PATCH_LAYERS, else c128patch.toml
    ..., always said"), but verify-wheel reads neither: with $C128PATCH_LAYERS naming another layer than the wheel's, it
    passed, saying nothing. Its help says it takes only the layers given."""
    monkeypatch.setenv("COLUMNS", "200")
    text = " ".join(run_cli(["verify-wheel", "--help"]).text.split())
    assert "default: $C128PATCH_LAYERS" not in text and "$C128PATCH_LAYERS and c128patch.toml are not read here" in text


def test_a_data_descriptor_only_the_local_header_has_hides_no_record(patched, tmp_path: Path, wheel_series: Path,
                                                                     upstream_wheel: Path):
    """Helper 159: h152's hidden record again, through the flags: `environ.py`'s local header says "data descriptor"
    (bit 3) where the central directory does not, its sizes the directory's (grown over a descriptor and a `.pth`'s
    record put after the stream): ``_short_record`` compared the sizes (equal), but `jar t < wheel` inflates to the
    stream's end, reads the descriptor and lists `zzz-evil.pth`; verify-wheel --series with authenticity passed."""
    host = "sglang/srt/environ.py"
    src = Path(patched.wheel)
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo(host)
    record = io.BytesIO()
    with zipfile.ZipFile(record, "w") as zf:
        zf.writestr("zzz-evil.pth", "import os; os.system('true')\n")
    hidden = struct.pack("<4s3L", b"PK\x07\x08", info.CRC, info.compress_size, info.file_size) + \
        record.getvalue()[: record.getvalue().index(b"PK\x01\x02")]
    bad = _hidden_in(src, tmp_path / src.name, host, hidden)
    raw = bytearray(bad.read_bytes())
    at = info.header_offset
    raw[at + 6:at + 8] = struct.pack("<H", struct.unpack("<H", raw[at + 6:at + 8])[0] | 0x08)
    raw[at + 18:at + 22] = struct.pack("<I", info.compress_size + len(hidden))  # the local size: the directory's
    bad.write_bytes(bytes(raw))
    if shutil.which("jar"):
        listed = subprocess.run(["jar", "t"], stdin=open(bad, "rb"), capture_output=True, text=True).stdout
        assert "zzz-evil.pth" in listed.splitlines()
    res = run_cli(["verify-wheel", str(bad), "--series", str(wheel_series), "--upstream-wheel", str(upstream_wheel)])
    assert res.code == 2 and f"{host}'s local header says compression method 8, flags" in error_line(res.err), res.err


@pytest.mark.parametrize("layer, series, says", [
    ("../../x", "4", "layer name '../../x'"), ("acme", "4", ""), ("acme", "4 ", "series version '4 '"),
    ("a\x1bb", "4", "layer name 'a\\x1bb'")])
def test_the_word_that_cannot_go_into_the_wheels_local_label_is_the_one_named(layer, series, says):
    """Helper 163: a wheel's provenance whose layer row is named '../../x' (RECORD recomputed) was refused by
    verify-wheel as "series version '4' cannot go into a PEP 440 local label": the series' own version blamed for
    the layer's name. The error names the word at fault."""
    from c128patch.wheel.patch import record_version

    record = {"upstream": {"version": "0.5.23"}, "series": {"version": series, "digest": "ca046230aa"},
              "layers": [{"name": layer, "digest": "57c98bca11"}]}
    if not says:
        assert str(record_version(record)) == "0.5.23+c128.4.ca046230.acme.57c98bca"
        return
    with pytest.raises(C128Error, match=re.escape(f"{says} cannot go into a PEP 440 local label")):
        record_version(record)
