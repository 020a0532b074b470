"""``wheel --from-release`` takes the release wheel of the serving interpreter and platform.

Real sglang 0.5.23 wheels (cp311 from the cache; cp312 downloaded once into it), real series."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.tags import parse_tag, sys_tags
from packaging.utils import parse_wheel_filename

from c128patch.errors import C128Error
from c128patch.upstream.releases import WheelTarget, fit
from c128patch.wheel.patch import release_wheel
from support import invoke


def test_without_flags_the_release_wheel_fits_this_interpreter(sglang_release_repo: Path):
    wheel = release_wheel("0.5.23")
    assert set(parse_wheel_filename(wheel.name)[3]) & set(sys_tags())


def test_python_tag_patches_that_interpreters_wheel(sglang_release_repo: Path, tmp_path: Path):
    res = invoke("wheel", "--from-release", "0.5.23", "--python-tag", "cp312", "-o", str(tmp_path))
    assert res.code == 0, res.err
    out = res.out
    assert Path(out["upstream_wheel"]).name.startswith("sglang-0.5.23-cp312-cp312-")
    assert Path(out["wheel"]).name.startswith(f"sglang-{out['version']}-cp312-cp312-")


def test_a_python_tag_no_wheel_fits_lists_the_releases_wheels(sglang_release_repo: Path, tmp_path: Path):
    res = invoke("wheel", "--from-release", "0.5.23", "--python-tag", "cp39", "-o", str(tmp_path / "dist"),
                 as_json=False)
    assert res.code == 2
    # (a busy machine: the download's heartbeat lines come first, support.error_line's rule)
    lines = [line for line in res.err.splitlines() if not line.startswith("downloading ")]
    assert lines[0].startswith("c128patch: error: sglang 0.5.23 has no wheel for cp39 / this platform: ")
    assert "  sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl" in lines
    assert lines[-1].startswith("pick one with --python-tag TAG [--platform PLATFORM]")
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("args, message", [
    (["--python-tag", "3.12"], "--python-tag '3.12': expected an interpreter tag such as cp312"),
    (["--platform", "Linux x86"], "--platform 'Linux x86': expected a platform tag"),
], ids=["python-version", "platform-words"])
def test_a_malformed_tag_is_refused(args, message, tmp_path: Path):
    res = invoke("wheel", "--from-release", "0.5.23", *args, "-o", str(tmp_path), as_json=False)
    assert res.code == 2 and res.err.startswith(f"c128patch: error: {message}")


def test_tags_with_from_wheel_are_refused(tmp_path: Path):
    res = invoke("wheel", "--from-wheel", str(tmp_path / "x.whl"), "--python-tag", "cp312", as_json=False)
    assert res.code == 2
    assert res.err.startswith("c128patch: error: --python-tag/--platform choose the wheel of --from-release")


@pytest.mark.parametrize("target, name, fits", [
    (WheelTarget("cp312", "manylinux_2_34_aarch64"), "sglang-0.5.23-cp312-cp312-manylinux_2_34_aarch64.whl", True),
    (WheelTarget("cp312", "manylinux_2_34_aarch64"), "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", False),
    (WheelTarget("cp312", "manylinux_2_34_aarch64"), "sglang-0.5.23-cp311-cp311-manylinux_2_34_aarch64.whl", False),
    (WheelTarget("cp313", None), "sglang-0.5.2-py3-none-any.whl", True),
], ids=["exact", "other-platform", "other-python", "pure-python"])
def test_a_wheel_fits_a_target_by_its_tags(target, name, fits):
    assert (fit(Path(name), target) is not None) is fits


def test_pip_is_asked_for_the_targets_interpreter_and_platform():
    args = WheelTarget("cp312", "manylinux_2_34_aarch64").pip_args()
    assert args == ("--implementation", "cp", "--python-version", "3.12", "--platform", "manylinux_2_34_aarch64")


def test_this_interpreter_is_a_target_pip_needs_no_options_for():
    here = WheelTarget()
    assert here.pip_args() == () and here.rank(next(iter(sys_tags()))) == 0
    assert here.rank(next(iter(parse_tag("cp27-cp27m-win32")))) is None


def test_a_target_refuses_a_tag_in_the_constructor():
    with pytest.raises(C128Error, match="expected an interpreter tag"):
        WheelTarget("python3")


@pytest.mark.parametrize("option, value", [
    ("--python-tag", "cp3" + "1" * 240), ("--python-tag", "cp311\n"), ("--python-tag", "x" * 300),
    ("--python-tag", "cp3\u0661\u0661"), ("--platform", "manylinux_2_34_x86_64\n"), ("--platform", "x" * 300),
], ids=["240-digits", "python-newline", "python-300", "arabic-indic-digits", "platform-newline", "platform-300"])
def test_an_absurd_tag_is_refused_in_one_line_before_any_download(option, value, tmp_path: Path, monkeypatch):
    import c128patch.upstream.releases as releases

    monkeypatch.setattr(releases, "pip_download", lambda *a, **k: pytest.fail("downloaded"))
    res = invoke("wheel", "--from-release", "0.5.23", option, value, "-o", str(tmp_path / "dist"), as_json=False)
    assert res.code == 2 and len(res.err.splitlines()) == 1, res.err
    assert res.err.startswith(f"c128patch: error: {option} ") and "expected a" in res.err and len(res.err) < 200
    assert not (tmp_path / "dist").exists()


def test_a_download_that_fails_for_a_listed_wheel_says_pips_failure_not_no_wheel(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    """Helper 187: a full disk under the cache made pip fail, and `wheel --from-release` said "sglang 0.5.22 has no
    wheel for this interpreter", listing that very wheel, with "pick one with --python-tag" as the fix. A fitting
    wheel the index lists that pip did not bring is pip's failure, said with pip's line."""
    from c128patch.upstream import releases

    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("C128PATCH_WHEELHOUSE", raising=False)
    full = "OSError: [Errno 28] No space left on device"
    monkeypatch.setattr(releases, "_pip_download_into", lambda *a: (False, full))
    name = "sglang-0.5.22-cp312-cp312-manylinux_2_34_x86_64.whl"
    monkeypatch.setattr(releases, "available", lambda version: ([name], "the wheelhouses and an index"))
    said = rf"downloading {name} into the cache .* failed \(pip: {re.escape(full)}\)"
    with pytest.raises(C128Error, match=said) as exc:
        releases.release_wheel_for("0.5.22", WheelTarget("cp312", "manylinux_2_34_x86_64"))
    assert "has no wheel" not in exc.value.message and "\n" not in exc.value.message
    monkeypatch.setattr(releases, "available", lambda version: ([name.replace("x86_64", "aarch64")], "an index"))
    with pytest.raises(C128Error, match="has no wheel for cp312 / manylinux_2_34_x86_64"):  # none fits: as before
        releases.release_wheel_for("0.5.22", WheelTarget("cp312", "manylinux_2_34_x86_64"))
