"""The supported-version contract on the installed stack: `kdist doctor`, refusal of a Keras or
TensorFlow older than the range at `kdist.scope()`, the version-variant tables, and `.ci/compat`'s
bad input. The stacks themselves are tested by `.ci/compat STACK` (the `compat` tier)."""

import configparser
import os
import re
import subprocess

import pytest

from conftest import ROOT, run_kdist, run_python


def test_doctor_names_the_versions_the_verdict_and_every_workaround():
    import keras
    import tensorflow as tf

    from kdist.keras_seam.patches import PATCHES

    result = run_kdist(["doctor", "--verbose"], timeout=120)  # --verbose: every workaround
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok       versions: kdist 0.1.0, Python " in result.stdout
    assert f"TensorFlow {tf.__version__}, Keras {keras.__version__}; supported\n" in result.stdout
    for patch in PATCHES:
        assert re.search(rf"^  {patch.name} +(installs|not needed|skipped)", result.stdout, re.M)


@pytest.mark.parametrize("package,old", [("keras", "3.4.1"), ("tensorflow", "2.16.2")])
def test_scope_refuses_a_release_older_than_the_range_with_the_oldest_that_works(package, old):
    """A Keras/TF too old is refused at kdist.scope(), before any patch or strategy, by name."""
    program = (f"import {package}; {package}.__version__ = {old!r}\n"
               "import kdist\n"
               "try:\n"
               "    with kdist.scope(): pass\n"
               "except kdist.keras_seam.versions.UnsupportedVersion as err:\n"
               "    print('refused:', err)\n")
    result = run_python(["-c", program], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    name = {"keras": "Keras", "tensorflow": "TensorFlow"}[package]
    oldest = {"keras": "3.5.0", "tensorflow": "2.17.0"}[package]
    assert f"refused: {name} {old} is older than the oldest {name} kdist supports, {oldest}" \
        in result.stdout


def test_setup_cfg_declares_the_registry_range():
    from kdist.keras_seam import versions as registry

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    tf_range = f">={registry._minor(registry.TF_RANGE[0])},<{registry._next_minor(registry.TF_RANGE[1])}"
    keras_range = f">={registry._minor(registry.KERAS_RANGE[0])}," \
        f"<{registry._next_minor(registry.KERAS_RANGE[1])}"
    assert config["kdist"]["tested_tensorflow"] == tf_range
    assert config["kdist"]["tested_keras"] == keras_range
    assert f"tensorflow{tf_range}" in config["options"]["install_requires"].split()
    # TF brings Keras (keras or keras-nightly): requiring one by name would install both
    assert not [line for line in config["options"]["install_requires"].split()
                if line.startswith("keras")]


def test_every_stack_in_the_matrix_is_inside_the_range():
    from kdist.keras_seam import versions as registry

    for line in open(os.path.join(ROOT, ".ci", "stacks")):
        if line.strip() and not line.startswith("#"):
            pins = dict(pin.split("==") for pin in line.split()[1:3])
            keras_pin = pins.get("keras") or pins["keras-nightly"]
            assert registry.in_range(pins["tensorflow"], registry.TF_RANGE), line
            assert registry.in_range(keras_pin, registry.KERAS_RANGE), line


def test_a_version_table_without_the_running_keras_is_a_clear_error():
    from kdist.keras_seam.versions import for_running_keras

    with pytest.raises(RuntimeError, match=r"no adapter for Keras .* \(written for 3\.0\.0\.\.3\.4\.99\)"):
        for_running_keras({("3.0.0", "3.4.99"): "old"})


def test_compat_refuses_an_unknown_stack_and_lists_the_known_ones():
    result = subprocess.run([os.path.join(ROOT, ".ci", "compat"), "tf1.15"], capture_output=True,
                            text=True, timeout=30, cwd=ROOT)
    assert result.returncode == 2
    assert "unknown stack 'tf1.15'" in result.stderr and "tf2.17-keras3.5" in result.stderr
