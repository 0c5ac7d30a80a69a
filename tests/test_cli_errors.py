"""Bad input on the command line: one `kdist: error: <flag>: ...` line, the documented exit code
(docs/launcher.md "Exit codes"), never a traceback, no process left behind."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, run_kdist

MWMS = "cluster_specs/k8s-mwms.yaml"
PLAN = ["--model", "examples/plan_model.py:mlp", "--per-replica-batch", "8", "--replicas", "2",
        "--bandwidth", "1Gbit", "--host-cost", "0"]
NOT_EXECUTABLE = os.path.join(ROOT, "README.md")
BINARY = os.path.join(ROOT, "examples", "data", "uci_digits.npz")
EXAMPLES = os.path.join(ROOT, "examples")

# (argv, exit code, text the one-line message must contain: the flag or field)
CASES = [
    # launch: the program
    (["launch", "--workers", "2", "--", "/nonexistent/prog"], 127, "/nonexistent/prog"),
    (["launch", "--workers", "2", "--", "no-such-program-kdist"], 127, "no-such-program-kdist"),
    (["launch", "--workers", "2", "--", NOT_EXECUTABLE], 126, "README.md"),
    (["launch", "--workers", "2", "--", EXAMPLES], 126, "examples"),
    (["launch", "--workers", "2"], 2, "command"),
    (["launch", "--workers", "2", "--"], 2, "command"),
    # launch: counts
    (["launch", "--workers", "-1", "--", "true"], 2, "--workers"),
    (["launch", "--workers", "", "--", "true"], 2, "--workers"),
    (["launch", "--workers", "two", "--", "true"], 2, "--workers"),
    (["launch", "--workers", "1.5", "--", "true"], 2, "--workers"),
    (["launch", "--workers", "0", "--", "true"], 2, "--workers"),
    (["launch", "--workers", "100000", "--", "true"], 2, "--workers"),
    (["launch", "--ps", "-2", "--", "true"], 2, "--ps"),
    (["launch", "--max-restarts", "-1", "--", "true"], 2, "--max-restarts"),
    (["launch", "--max-restarts", "x", "--", "true"], 2, "--max-restarts"),
    # launch: durations
    (["launch", "--timeout", "-5", "--", "true"], 2, "--timeout"),
    (["launch", "--timeout", "0", "--", "true"], 2, "--timeout"),
    (["launch", "--timeout", "nan", "--", "true"], 2, "--timeout"),
    (["launch", "--timeout", "inf", "--", "true"], 2, "--timeout"),
    (["launch", "--timeout", "soon", "--", "true"], 2, "--timeout"),
    (["launch", "--grace", "-1", "--", "true"], 2, "--grace"),
    (["launch", "--grace", "nan", "--", "true"], 2, "--grace"),
    # launch: spec files
    (["launch", "--spec", "/nonexistent.json", "--", "true"], 2, "/nonexistent.json"),
    (["launch", "--spec", EXAMPLES, "--", "true"], 2, "examples"),
    (["launch", "--spec", BINARY, "--", "true"], 2, "uci_digits.npz"),
    (["launch", "--spec", "cluster_specs/local-ps.json", "--workers", "2", "--", "true"], 2,
     "--spec"),
    (["launch", "--bogus"], 2, "--bogus"),
    # validate
    (["validate", "/nonexistent.json"], 2, "/nonexistent.json"),
    (["validate", BINARY], 2, "uci_digits.npz"),
    (["validate", NOT_EXECUTABLE], 2, "README.md"),
    (["validate"], 2, "spec"),
    # tf-config
    (["tf-config", "--spec", MWMS, "--task", "worker"], 2, "--task"),
    (["tf-config", "--spec", MWMS, "--task", "worker:x"], 2, "--task"),
    (["tf-config", "--spec", MWMS, "--task", "worker:99"], 2, "task.index"),
    (["tf-config", "--spec", MWMS, "--task", ""], 2, "--task"),
    (["tf-config", "--spec", MWMS, "--task", "worker:0", "--namespace", "Bad_NS"], 2,
     "--namespace"),
    (["tf-config", "--spec", MWMS, "--task", "worker:0", "--namespace", ""], 2, "--namespace"),
    (["tf-config", "--spec", MWMS, "--task", "worker:0", "--host-pattern", "{nope}"], 2,
     "--host-pattern"),
    # format fields beyond the placeholders: no attribute, index, conversion or format spec
    (["tf-config", "--spec", "cluster_specs/k8s-ps.yaml", "--task", "worker:0", "--host-pattern",
      "{role}-{index}{role[x]}"], 2, "--host-pattern: {role[x]} in"),
    (["tf-config", "--spec", "cluster_specs/k8s-ps.yaml", "--task", "worker:0", "--host-pattern",
      "{role}{index}{role.x}"], 2, "--host-pattern: {role.x} in"),
    (["tf-config", "--spec", MWMS, "--task", "worker:0", "--host-pattern",
      "{role!r}-{index:>99999999}"], 2, "--host-pattern: {role!r} in"),
    (["tf-config", "--spec", MWMS, "--task", "worker:0", "--host-pattern", "{role}-{index"], 2,
     "--host-pattern"),
    (["tf-config", "--spec", "/nonexistent.yaml", "--task", "worker:0"], 2, "/nonexistent.yaml"),
    (["tf-config", "--task", "worker:0"], 2, "--spec"),
    # k8s render
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--output", "/nonexistent/dir/f.yaml"],
     2, "--output"),
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--output", EXAMPLES], 2, "--output"),
    # special files: a kernel file, a device, a symlink
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--output", "/proc/version"], 2,
     "--output: '/proc/version' cannot be written"),
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--output", "/dev/full"], 2,
     "--output: '/dev/full' is not a regular file"),
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--output", "/dev/stdout"], 2,
     "--output: '/dev/stdout' is a symlink"),
    (["launch", "--summary", "/dev/stdout", "--", "true"], 2, "--summary: '/dev/stdout' is a"),
    (["k8s", "render", "--spec", MWMS, "--image", "i:1", "--format", "helm"], 2, "--format"),
    (["k8s", "render", "--spec", "cluster_specs/local-2-workers.json", "--image", "i:1"], 2,
     "command"),
    (["k8s", "render", "--spec", BINARY, "--image", "i:1"], 2, "uci_digits.npz"),
    (["k8s"], 2, "k8s"),
    # k8s simulate: the program is checked before any namespace is made
    (["k8s", "simulate", "--spec", MWMS, "--", "/nonexistent/prog"], 127, "/nonexistent/prog"),
    (["k8s", "simulate", "--spec", MWMS, "--", NOT_EXECUTABLE], 126, "README.md"),
    (["k8s", "simulate", "--spec", MWMS, "--timeout", "-1", "--", "true"], 2, "--timeout"),
    # exec
    (["exec", "--", "/nonexistent/prog"], 127, "/nonexistent/prog"),
    (["exec", "--", NOT_EXECUTABLE], 126, "README.md"),
    (["exec"], 2, "command"),
    (["exec", "--", "true"], 2, "KDIST_CLUSTER"),
    # plan (each mistake found before anything is measured)
    (["plan", *PLAN[:1], "nonexist:fn", *PLAN[2:]], 2, "nonexist"),
    (["plan", *PLAN[:1], "examples/README-missing.py:fn", *PLAN[2:]], 2, "--model"),
    (["plan", *PLAN[:1], NOT_EXECUTABLE + ":fn", *PLAN[2:]], 2, "--model"),
    (["plan", *PLAN[:1], "examples/plan_model.py:nope", *PLAN[2:]], 2, "nope"),
    (["plan", *PLAN[:1], "examples/plan_model.py", *PLAN[2:]], 2, "--model"),
    (["plan", *PLAN, "--per-replica-batch", "0"], 2, "--per-replica-batch"),
    (["plan", *PLAN, "--per-replica-batch", "-3"], 2, "--per-replica-batch"),
    (["plan", *PLAN, "--replicas", "0"], 2, "--replicas"),
    (["plan", *PLAN, "--replicas", "many"], 2, "--replicas"),
    (["plan", *PLAN, "--bandwidth", "fast"], 2, "--bandwidth"),
    (["plan", *PLAN, "--bandwidth", "-1Gbit"], 2, "--bandwidth"),
    (["plan", *PLAN, "--latency", "-5us"], 2, "--latency"),
    (["plan", *PLAN, "--compression", "zip"], 2, "compression"),
    (["plan", *PLAN, "--compression", "powersgd:x"], 2, "compression"),
    (["plan", *PLAN, "--host-cost", "-1"], 2, "--host-cost"),
    (["plan", *PLAN, "--host-cost", "nan"], 2, "--host-cost"),
    (["plan", *PLAN, "--base-batch", "0"], 2, "--base-batch"),
    (["plan", *PLAN, "--plot", "/nonexistent/dir/p.png"], 2, "--plot"),
    (["plan", *PLAN, "--bandwidth", "1.2.3Gbit"], 2, "--bandwidth"),
    (["plan", *PLAN, "--bandwidth", "1e999Gbit"], 2, "--bandwidth"),
    (["plan", *PLAN, "--bandwidth", "\u00b2Gbit"], 2, "--bandwidth"),
    (["plan", *PLAN, "--latency", "1.2.3us"], 2, "--latency"),
    (["plan", *PLAN, "--latency", "1e999s"], 2, "--latency"),
    (["plan", *PLAN[:1], "tests/fixtures/bad_models.py:raises", *PLAN[2:]], 2,
     "--model: tests/fixtures/bad_models.py:raises raised RuntimeError: the data path"),
    (["plan", *PLAN[:1], "tests/fixtures/bad_models.py:not_a_model", *PLAN[2:]], 2,
     "returned str, not a Keras model"),
    (["plan", *PLAN[:1], "tests/fixtures/bad_models.py:no_input_shape", *PLAN[2:]], 2,
     "without input shapes"),
    (["tf-config", "--spec", MWMS, "--task", "worker:\u00b2"], 2, "--task"),
]


@pytest.mark.parametrize("argv,code,named", CASES, ids=lambda v: " ".join(v)[:60]
                         if isinstance(v, list) else str(v))
def test_bad_input_gets_one_clear_line_and_the_documented_code(argv, code, named):
    result = run_kdist(argv, timeout=120)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == code, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("kdist: error:")]
    assert len(errors) == 1 and named in errors[0], result.stderr
    if code == 2:
        assert "Fix:" in errors[0] or ": use " in errors[0] or "write" in errors[0], errors[0]


@pytest.mark.parametrize("flag,value", [("--bandwidth", "fast"), ("--latency", "-5us"),
                                        ("--host-cost", "nan"), ("--plot", "/nonexistent/d/p.png")])
def test_a_plans_flag_is_refused_before_tensorflow_starts(tmp_path, flag, value):
    """kdist plan reads its flags before it starts TensorFlow (seconds): here any import of
    TensorFlow fails loudly, and the mistyped flag is still the one named."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        "raise ImportError('kdist plan imported TensorFlow before reading its flags')\n")
    result = run_kdist(["plan", *PLAN, flag, value], timeout=60,
                       env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("kdist: error:")]
    assert len(errors) == 1 and flag in errors[0], result.stderr


def test_the_documented_exit_code_table_matches_the_codes_tested():
    guide = open(os.path.join(ROOT, "docs", "launcher.md"), encoding="utf-8").read()
    table = guide[guide.index("**Exit codes**"):]
    for code in {c for _, c, _ in CASES} | {0, 75, 124}:
        assert f"\n| {code} |" in table, code
    from kdist import exit_codes

    assert (exit_codes.USAGE, exit_codes.NOT_EXECUTABLE, exit_codes.NOT_FOUND,
            exit_codes.TIMED_OUT, exit_codes.PREEMPTED) == (2, 126, 127, 124, 75)


# Fuzzing the arguments of `launch` and `k8s render` in-process: a kdist error (exit 2/126/127),
# never an exception. The program after -- never exists, so nothing is ever started.
ODD = st.one_of(st.sampled_from(["-1", "0", "1", "2", "nan", "inf", "-inf", "1e309", "", " ", "x",
                                 "1.5", "999999999999", "ml", "Bad_NS", "{role}", "jobs", "tfjob"]),
                st.text(max_size=12))
SPECS = st.sampled_from([os.path.join(ROOT, "cluster_specs", name) for name in (
    "local-ps.json", "k8s-mwms.yaml", "k8s-ps.yaml", "missing.yaml")] + [BINARY, EXAMPLES, ""])
# --output only ever names files in the test's own directory (or one that does not exist)
OUTPUTS = st.sampled_from(["out.yaml", "sub/out.yaml", "/nonexistent/d/f.yaml", "", "."])
LAUNCH_FLAGS = {"--workers": ODD, "--ps": ODD, "--timeout": ODD, "--grace": ODD,
                "--max-restarts": ODD, "--min-workers": ODD, "--spec": SPECS}
RENDER_FLAGS = {"--spec": SPECS, "--image": ODD, "--namespace": ODD, "--format": ODD,
                "--output": OUTPUTS}
NUMBERS = st.one_of(ODD, st.sampled_from(["1.2.3", "1e999", "1..2", ".5", "5.", "\u00b2", "1_000"]))
PLAN_FLAGS = {"--bandwidth": NUMBERS.map(lambda n: n + "Gbit"), "--latency": NUMBERS.map(
    lambda n: n + "us"), "--host-cost": NUMBERS, "--compression": ODD, "--base-batch": ODD,
    "--replicas": ODD, "--per-replica-batch": ODD,
    "--model": st.sampled_from(["examples/plan_model.py:nope", "tests/fixtures/bad_models.py:raises",
                                "tests/fixtures/bad_models.py:not_a_model", "nope:fn", "x.py:f",
                                "tests/fixtures/bad_models.py:no_input_shape", ":", ""])}


def _argv(flags):
    pair = st.sampled_from(sorted(flags)).flatmap(lambda f: st.tuples(st.just(f), flags[f]))
    return st.lists(pair, max_size=4).map(lambda pairs: [item for p in pairs for item in p])


def _main_exit_code(argv, capsys):
    from kdist.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(flags=_argv(LAUNCH_FLAGS), command=st.sampled_from([[], ["--", "/nonexistent/kdist-fuzz"]]))
def test_fuzzed_launch_arguments_end_in_a_kdist_error(flags, command, capsys):
    code, output = _main_exit_code(["launch", *flags, *command], capsys)
    assert code in (2, 127), output
    assert "kdist: error:" in output


@FUZZ
@given(flags=_argv(PLAN_FLAGS))
def test_fuzzed_plan_arguments_end_in_a_kdist_error(flags, capsys, monkeypatch):
    """Every model these runs name is a bad one, so none measures anything: each ends in one
    kdist error, whichever flag it names."""
    monkeypatch.chdir(ROOT)
    argv = ["plan", *PLAN[2:8], "--host-cost", "0", "--model",
            "tests/fixtures/bad_models.py:raises", *flags]
    code, output = _main_exit_code(argv, capsys)
    assert code == 2, output
    assert output.count("kdist: error:") == 1 and "Traceback" not in output, output


@FUZZ
@given(flags=_argv(RENDER_FLAGS))
def test_fuzzed_render_arguments_end_in_success_or_a_kdist_error(flags, capsys, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, output = _main_exit_code(["k8s", "render", *flags], capsys)
    assert code in (0, 2), output
    assert code == 0 or "kdist: error:" in output


# ------------------------------------------------------------------ help and typos (issue 46)
@pytest.mark.parametrize("args,usage,hint", [
    (["lanch"], "usage: kdist [-h] [--version] COMMAND", "(did you mean launch?)"),
    (["launch", "--wokers", "2", "--", "true"], "usage: kdist launch [-h]", "(did you mean --workers?)"),
    (["k8s", "rendr"], "usage: kdist k8s [-h] COMMAND", "(did you mean render?)"),
    (["k8s", "render", "--spec", "x", "--imagee", "i"], "usage: kdist k8s render [-h]",
     "(did you mean --image?)"),
])
def test_a_typo_gets_the_commands_usage_and_the_closest_word(args, usage, hint):
    result = run_kdist(args, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith(usage), result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("kdist: error:")]
    assert len(errors) == 1 and hint in errors[0], result.stderr


def test_version_and_the_top_level_help_with_examples():
    from importlib import metadata

    result = run_kdist(["--version"], timeout=30)
    assert result.returncode == 0
    assert result.stdout.startswith(f"kdist {metadata.version('kdist')} (Python ")
    result = run_kdist(["--help"], timeout=30)
    assert "examples:\n    kdist launch --workers 2 -- python train.py" in result.stdout


def test_every_argument_of_every_command_has_help():
    import argparse

    from kdist import cli

    def missing(parser, name):
        for action in parser._actions:
            if action is parser.subcommands:
                for command, sub in action.choices.items():
                    yield from missing(sub, f"{name} {command}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                yield f"{name} {'/'.join(action.option_strings) or action.dest}"

    assert list(missing(cli._parser(), "kdist")) == []
