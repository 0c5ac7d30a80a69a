"""`kdist bundle`: the round trip of an offline bundle (make, verify, install with no index), and
what a missing or damaged piece, or a dependency left out, says. Real wheels, real pip."""

import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from conftest import run_kdist
from kdist import bundle


def make_wheel(folder, name, requires=()):
    """A tiny pure-Python wheel `name` 1.0 (importable as `name`), built offline."""
    project = folder / f"src-{name}"
    (project / name).mkdir(parents=True)
    (project / name / "__init__.py").write_text(  # random bytes: a few pieces of 2 KiB
        f"VALUE = {name!r}\nDATA = {secrets.token_hex(4000)!r}\n")
    (project / "setup.py").write_text(textwrap.dedent(f"""
        from setuptools import setup
        setup(name={name!r}, version="1.0", packages=[{name!r}],
              install_requires={list(requires)!r})
    """))
    wheels = folder / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(wheels), str(project)], check=True,
                   capture_output=True)
    return wheels


@pytest.fixture
def wheels(tmp_path):
    make_wheel(tmp_path, "kdistbundlea", requires=["kdistbundleb"])
    return make_wheel(tmp_path, "kdistbundleb")


def test_a_bundle_round_trips_through_small_pieces_and_installs_with_no_index(wheels, tmp_path):
    result = run_kdist(["bundle", "make", "--wheels", str(wheels), "--out", str(tmp_path / "b"),
                        "--piece-mib", "0.002"], timeout=120)
    assert result.returncode == 0, result.stderr
    manifest = bundle.read_manifest(str(tmp_path / "b"))
    assert len(manifest["pieces"]) >= 2 and len(manifest["wheels"]) == 2
    assert all(p["bytes"] <= 0.002 * bundle.MIB for p in manifest["pieces"])
    assert "verified" in run_kdist(["bundle", "verify", str(tmp_path / "b")], timeout=60).stdout
    installed = run_kdist(["bundle", "install", str(tmp_path / "b"), "--target",
                           str(tmp_path / "site"), "--requirement", "kdistbundlea"], timeout=120)
    assert installed.returncode == 0, installed.stderr
    check = subprocess.run([sys.executable, "-c", "import kdistbundlea, kdistbundleb; "
                            "print(kdistbundlea.VALUE, kdistbundleb.VALUE)"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert check.stdout.split() == ["kdistbundlea", "kdistbundleb"], check.stderr


@pytest.mark.parametrize("damage,words", [
    (lambda folder: os.remove(folder / "piece-0001.bin"), "missing piece-0001.bin"),
    (lambda folder: (folder / "piece-0000.bin").write_bytes(b"x" * 100), "damaged (size or "
                                                                           "SHA-256) piece-0000.bin"),
    (lambda folder: os.remove(folder / "manifest.json"), "manifest.json: missing"),
])
def test_a_missing_or_damaged_piece_is_named_with_the_fix(wheels, tmp_path, damage, words):
    folder = tmp_path / "b"
    bundle.make(str(wheels), str(folder), piece_mib=0.002)
    damage(folder)
    for verb in (["verify", str(folder)], ["install", str(folder), "--target", str(tmp_path / "s")]):
        result = run_kdist(["bundle", *verb], timeout=60)
        errors = [line for line in result.stderr.splitlines() if line.startswith("kdist: error:")]
        assert result.returncode == 2 and len(errors) == 1, result.stderr
        assert words in errors[0] and "Fix:" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "s" / "kdistbundleb").exists()  # nothing installed from a bad bundle


def test_a_dependency_left_out_of_the_bundle_is_named(tmp_path):
    wheels = make_wheel(tmp_path, "kdistbundlea", requires=["kdistbundleb"])  # b not bundled
    bundle.make(str(wheels), str(tmp_path / "b"), piece_mib=1)
    result = run_kdist(["bundle", "install", str(tmp_path / "b"), "--target",
                        str(tmp_path / "site")], timeout=120)
    assert result.returncode == 2
    assert "missing from the bundle: kdistbundleb" in result.stderr


def test_make_refuses_a_folder_that_is_not_empty_or_holds_no_wheel(wheels, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, words in ((["--wheels", str(wheels), "--out", str(tmp_path / "full")], "not empty"),
                        (["--wheels", str(tmp_path), "--out", str(tmp_path / "o")], "no wheel"),
                        (["--wheels", str(wheels), "--out", str(tmp_path / "o"), "--piece-mib",
                          "0"], "--piece-mib")):
        result = run_kdist(["bundle", "make", *args], timeout=60)
        assert result.returncode == 2 and words in result.stderr, result.stderr


def test_make_downloads_for_another_python_and_platform(tmp_path):
    """`pip download` for a target that is not this machine: a Python 3.12 manylinux host."""
    target = bundle.Target(python="3.12")
    bundle.download(["six==1.17.0"], str(tmp_path / "w"), target)
    assert [n for n in os.listdir(tmp_path / "w")] == ["six-1.17.0-py2.py3-none-any.whl"]
    with pytest.raises(bundle.BundleError, match="pip download: .*Fix: check the requirements"):
        bundle.download(["kdist-no-such-package==9"], str(tmp_path / "w"), target)


def test_the_cuda_sets_hold_what_tensorflow_needs_to_register_a_gpu():
    """TensorFlow's dlopen check (cudart, cuBLAS(+Lt), cuFFT, cuSOLVER, cuSPARSE, cuDNN) and
    nvJitLink (cuSPARSE loads it); NCCL all-reduce adds NCCL and NVRTC."""
    for library in ("cuda-runtime", "cublas", "cufft", "cusolver", "cusparse", "cudnn", "nvjitlink"):
        assert f"nvidia-{library}-cu12" in bundle.CUDA_SETS["minimal"]
    assert set(bundle.CUDA_SETS["nccl"]) - set(bundle.CUDA_SETS["minimal"]) == {
        "nvidia-nccl-cu12", "nvidia-cuda-nvrtc-cu12"}
