"""Fuzzed TF_CONFIGs and cluster-spec files: kdist either accepts them consistently or raises
ClusterSpecError naming a field, never another exception and never a hang (hypothesis deadline);
and it accepts what TensorFlow's own resolver accepts, except the documented cases of
`kdist.cluster.strictness` (docs/cluster.md, "Stricter than TensorFlow").

The generated examples run in CI, the same ones every run (derandomized, no database).
"""

import contextlib
import json
import os
import tempfile

import yaml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdist import ClusterSpec, ClusterSpecError, envvars
from kdist.cluster.spec_file import load_spec, read_k8s_spec

# CI: the same 1,000 examples every run (a fixed derivation, no example database). A larger,
# randomized run: KDIST_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py
_RANDOMIZED = os.environ.get("KDIST_FUZZ_EXAMPLES")
EXAMPLES = settings(max_examples=int(_RANDOMIZED or 1000), deadline=2000,
                    derandomize=not _RANDOMIZED, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=False),
                      st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
job_name = st.sampled_from(["chief", "worker", "ps", "evaluator", "master", "trainer", "", "Worker"])
address = st.one_of(
    st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "host", "a.b.svc", "", "[::1]"]),
              st.one_of(st.integers(-1, 70000), st.sampled_from(["\u00b2", "\u0663", "0x50", "8 "]))),
    st.sampled_from(["host", ":1", "h:", "h:port", "h:1:2", " "]), json_leaf)
addresses = st.lists(address, max_size=3)
cluster = st.dictionaries(job_name, st.one_of(
    addresses, addresses.map(lambda a: {str(i): x for i, x in enumerate(a)}), json_value),
    max_size=4)
index = st.one_of(st.integers(-2, 4), st.sampled_from(["0", "1", " 1", "x", 1.0, 1.5, True, None]),
                  json_leaf)
task = st.one_of(st.fixed_dictionaries({"type": st.one_of(job_name, json_leaf), "index": index},
                                       optional={"trial": json_leaf, "indx": st.just(1)}),
                 json_value)
tf_config = st.one_of(
    st.fixed_dictionaries({"cluster": cluster, "task": task},
                          optional={"rpc_layer": st.sampled_from(["grpc", "grpc+verbs", ""]),
                                    "environment": st.sampled_from(["cloud", "google", ""])}),
    st.dictionaries(st.sampled_from(["cluster", "task", "rpc_layer", "bogus"]), json_value),
    json_value)


@EXAMPLES
@given(config=tf_config)
def test_tf_configs_are_accepted_consistently_or_rejected_with_a_field(config):
    try:
        spec = ClusterSpec.from_tf_config(json.dumps(config))
    except ClusterSpecError as err:
        assert err.field.startswith("TF_CONFIG") and "Fix:" in str(err)
        return
    if spec.is_distributed:  # what kdist accepts, TF can read back and kdist re-reads identically
        assert ClusterSpec.from_tf_config(spec.tf_config_json()) == spec


@EXAMPLES
@given(text=st.one_of(st.text(max_size=60), st.integers(1, 20000).map(lambda n: "[" * n + "]" * n),
                      st.integers(1, 20000).map(lambda n: '{"a":' * n + "1" + "}" * n)))
def test_arbitrary_tf_config_text_never_escapes_as_another_error(text):
    try:
        ClusterSpec.from_tf_config(text)
    except ClusterSpecError as err:
        assert "Fix:" in str(err) and "\n" not in str(err)


@contextlib.contextmanager
def tf_config_variable(text):
    with _variable("TF_CONFIG", text):
        yield


def tensorflow_accepts(text: str) -> bool:
    """Whether TensorFlow takes this TF_CONFIG: its resolver reads the cluster and the task, and
    the check its multi-worker strategies make (`_validate_cluster_spec`) passes."""
    import tensorflow as tf
    from tensorflow.python.distribute import multi_worker_util

    with tf_config_variable(text):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        try:
            spec, task_type, task_id = resolver.cluster_spec(), resolver.task_type, resolver.task_id
            if spec.jobs:
                multi_worker_util._validate_cluster_spec(spec, task_type, task_id)
        except Exception:  # noqa: BLE001 (whatever TensorFlow raises: it refuses)
            return False
    return True


seen_rules: set = set()  # the strictness rules met, by the tests below


@settings(max_examples=int(_RANDOMIZED or 3000), deadline=None, derandomize=not _RANDOMIZED,
          database=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=tf_config)
def test_kdist_refuses_only_what_tensorflow_refuses_or_the_documented_cases(config):
    from kdist.cluster.strictness import STRICTER

    text = json.dumps(config)
    try:
        ClusterSpec.from_tf_config(text)
        refusal = None
    except ClusterSpecError as err:
        refusal = err
    accepted_by_tf = tensorflow_accepts(text)
    if accepted_by_tf and refusal is not None:
        assert refusal.rule in STRICTER, f"TF accepts {text}, kdist refuses it: {refusal}"
        seen_rules.add(refusal.rule)
    assert accepted_by_tf or refusal is not None, f"kdist accepts {text}, which TF refuses"


@pytest.mark.parametrize("text,rule", [
    ("[]", "not_an_object"),
    ('{"task": {"type": "worker", "index": 0}}', "task_without_cluster"),
    ('{"cluster": {"worker": ["h:1"]}}', "cluster_without_task"),
    ('{"cluster": {"chief": ["h:1:2"]}, "task": {}}', "cluster_without_task"),  # hypothesis's
    ('{"cluster": {"worker": ["h:1"]}, "task": []}', "task_not_object"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0, "rank": 1}}',
     "task_key"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": "0"}}',
     "index_not_integer"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": -1}}', "negative_index"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "evaluator", "index": 2}}',
     "evaluator_index"),
    ('{"cluster": {"worker": {"0": "h:1"}}, "task": {"type": "worker", "index": 0}}',
     "job_as_mapping"),
    ('{"cluster": {"worker": ["h:\u00b2"]}, "task": {"type": "worker", "index": 0}}', "address"),
    ('{"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}}',
     "duplicate_address"),
    ('{"cluster": {"ps": ["h:1"], "chief": ["h:2"]}, "task": {"type": "ps", "index": 0}}',
     "ps_without_workers"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}, "rpc_layer": "x"}',
     "rpc_layer"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}, "environment": 1}',
     "environment"),
])
def test_each_documented_case_is_accepted_by_tensorflow_and_refused_by_kdist(text, rule):
    assert tensorflow_accepts(text)
    with pytest.raises(ClusterSpecError) as error:
        ClusterSpec.from_tf_config(text)
    assert error.value.rule == rule and "Fix:" in str(error.value)
    seen_rules.add(rule)


def test_what_tensorflow_accepts_kdist_accepts_too():
    """Cases kdist once refused that TensorFlow takes: an empty job, extra platform keys."""
    for text in ('{"cluster": {"worker": ["h:1"], "ps": []}, "task": {"type": "worker", "index": 0}}',
                 '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0, '
                 '"trial": "1"}, "job": {"id": 3}}'):
        assert tensorflow_accepts(text)
        assert ClusterSpec.from_tf_config(text).task == "worker:0"


count = st.one_of(st.integers(-1, 3), st.integers(-1, 80), st.none(), st.text(max_size=3),
                  # huge and overflowing counts: refused before anything is expanded
                  st.sampled_from([10**5 + 1, 10**9, 2**63, 2**64, 10**30]),
                  st.integers(2, 2**70))
# keys YAML allows and JSON does not: numbers, booleans, None, mixed with strings
odd_key = st.one_of(st.text(max_size=6), st.integers(-2, 3), st.booleans(), st.none())
mixed_keys = st.dictionaries(odd_key, json_leaf, min_size=1, max_size=4)
roles = st.dictionaries(st.one_of(job_name, odd_key), st.one_of(
    count, st.booleans(), st.floats(allow_nan=False),
    st.fixed_dictionaries({"count": st.integers(-1, 3)}),
    st.fixed_dictionaries({"count": count}).flatmap(
        lambda fixed: mixed_keys.map(lambda extra: {**extra, **fixed}))), max_size=4)
spec_file = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["job", "Bad_Name", "", "x" * 70]),
                           "roles": roles},
                          optional={"port": st.one_of(st.integers(-1, 70000), json_leaf),
                                    "image": json_leaf, "command": json_value,
                                    "restart_policy": st.sampled_from(["Never", "OnFailure", "x"]),
                                    "backoff_limit": st.one_of(st.integers(-2, 5), json_leaf),
                                    "host": json_leaf, "resources": json_value}),
    st.fixed_dictionaries({"cluster": cluster}, optional={"name": json_leaf}),
    st.dictionaries(st.text(max_size=8), json_value, max_size=4),
    mixed_keys.map(lambda extra: {"roles": {"worker": 2}, **extra}),
    json_value)
# YAML and JSON that do not parse, many lines of it
broken_text = st.one_of(st.text(max_size=60), st.sampled_from([
    "roles: {worker: 2\n  ps: [1\n", "roles:\n\t- worker\n", "{\"roles\": {\"worker\": 2,}}",
    "a: b: c\n", "roles: [&x 1, *y]\n", "- - - [\n"]))


@EXAMPLES
@given(content=spec_file, as_yaml=st.booleans())
def test_spec_files_load_or_fail_with_a_field(content, as_yaml):
    """Never a traceback, unbounded memory or time (hypothesis's deadline): a spec loads, or
    fails with one line naming the field and the fix."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "spec.yaml" if as_yaml else "spec.json")
        try:
            text = yaml.safe_dump(content) if as_yaml else json.dumps(content)
        except TypeError:  # JSON has no non-string keys: YAML then
            path, text = os.path.join(folder, "spec.yaml"), yaml.safe_dump(content)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for read in (load_spec, read_k8s_spec):
            try:
                read(path)
            except ClusterSpecError as err:
                assert "Fix:" in str(err) and "\n" not in str(err), str(err)


@EXAMPLES
@given(text=broken_text, suffix=st.sampled_from([".yaml", ".json"]))
def test_unparsable_spec_files_fail_in_one_line_with_the_place(text, suffix):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "spec" + suffix)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            load_spec(path)
        except ClusterSpecError as err:
            assert "Fix:" in str(err) and "\n" not in str(err), str(err)


pattern = st.one_of(st.text(alphabet="{}[].!:>0123456789rolexindjbmsapc-", max_size=24),
                    st.sampled_from(["{role}{index}{role[x]}", "{role.__class__}", "{index:>9999}",
                                     "{role!r}{index}", "{job}-{role}-{index}", "{{role}}{index}",
                                     "{0}{1}", "{}{role}{index}", "{role}{index}{namespace}"]))


@EXAMPLES
@given(host_pattern=pattern)
def test_host_patterns_fill_in_or_fail_in_one_line(host_pattern):
    """--host-pattern: only {job}, {role}, {index} and {namespace}, plain: no attribute or item
    access, conversion or format spec reaches str.format."""
    from kdist.k8s import render

    spec = read_k8s_spec("cluster_specs/k8s-ps.yaml")
    try:
        cluster = render.kubernetes_cluster(spec, "ml", host_pattern)
    except ClusterSpecError as err:
        assert err.field == "--host-pattern" and "\n" not in str(err)
        return
    assert all(len(address) < 200 for addresses in cluster.jobs.values() for address in addresses)


def test_the_documented_cases_are_each_seen_and_listed_in_the_docs():
    """Every strictness case is one the fuzzing above met (no dead rule), and the table of
    docs/cluster.md is the one the code holds."""
    from kdist.cluster import strictness

    assert seen_rules == set(strictness.STRICTER), set(strictness.STRICTER) - seen_rules
    guide = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "cluster.md"),
                 encoding="utf-8").read()
    assert strictness.table() in guide, "docs/cluster.md: paste kdist.cluster.strictness.table()"


# ------------------------------------------------------------------ environment variables
env_text = st.one_of(st.sampled_from(["", " ", "0", "1", "-1", "nan", "inf", "1e999", "2.5", "x",
                                      "\u00b2", "8888", "70000", "chief=1,worker=1", "worker=\u00b2",
                                      "worker=2,", "=2", "ps=1,worker=1", "{}", "[]", '"w"', "null",
                                      '{"worker": ["h:1"]}', "node[1-2]", "2(x2)", "1,1"]),
                     # an environment variable holds no NUL and no lone surrogate
                     st.text(st.characters(blacklist_characters="\x00",
                                           blacklist_categories=("Cs",)), max_size=16))
SLURM = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
         envvars.SLURM_PORT, envvars.SLURM_ROLES)
POD = (envvars.CLUSTER, envvars.TASK_TYPE, "JOB_COMPLETION_INDEX", envvars.ROLES, envvars.PORT,
       envvars.JOB_INDEX, envvars.JOBSET_NAME, envvars.NAMESPACE, envvars.REPLICATED_JOB)
ENV_EXAMPLES = settings(max_examples=int(_RANDOMIZED or 700), deadline=None,
                        derandomize=not _RANDOMIZED, database=None,
                        suppress_health_check=[HealthCheck.too_slow])


def one_line_or_nothing(read):
    """`read()` succeeds or raises kdist's one-line error (a ValueError naming the field and the
    fix); anything else fails the test with its traceback."""
    from kdist.validators import UsageError

    try:
        read()
    except UsageError as err:
        assert "Fix:" in str(err) and "\n" not in str(err), str(err)


@ENV_EXAMPLES
@given(values=st.fixed_dictionaries({}, optional={name: env_text for name in SLURM}))
def test_slurm_variables_end_in_a_cluster_or_one_line(values):
    from kdist.cluster import slurm

    environ = {**values, "SLURM_PROCID": values.get("SLURM_PROCID", "0")}
    with contextlib.ExitStack() as stack:
        for name in SLURM:
            stack.enter_context(_variable(name, environ.get(name)))
        one_line_or_nothing(lambda: slurm.in_slurm_step() and slurm.cluster_from_slurm())


@ENV_EXAMPLES
@given(values=st.fixed_dictionaries({}, optional={name: env_text for name in POD}))
def test_pod_variables_end_in_a_tf_config_or_one_line(values):
    from kdist.k8s import pod

    one_line_or_nothing(lambda: pod.tf_config(values))


@ENV_EXAMPLES
@given(text=env_text, name=st.sampled_from(["KDIST_CHIEF_GRACE", "KDIST_CHIEF_START_TIMEOUT",
                                            "KDIST_STRATEGY", "KDIST_STARTUP_TIMEOUT"]))
def test_duration_and_strategy_variables_end_in_a_value_or_one_line(text, name):
    import importlib

    from kdist import startup

    scope = importlib.import_module("kdist.scope")  # the module (kdist.scope is the function)
    serve = importlib.import_module("kdist.ps.serve")
    with _variable(name, text):
        if name == "KDIST_STRATEGY":
            one_line_or_nothing(lambda: scope._requested_name("auto"))
        elif name == "KDIST_STARTUP_TIMEOUT":
            one_line_or_nothing(startup.startup_timeout)
        else:
            one_line_or_nothing(lambda: serve._seconds(None, name, 10.0))


@contextlib.contextmanager
def _variable(name, value):
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
