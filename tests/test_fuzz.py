"""Fuzzed TF_CONFIGs and cluster-spec files: kdist either accepts them consistently or raises
ClusterSpecError naming a field, never another exception and never a hang (hypothesis deadline).

3 x 1,000 generated examples run in CI, the same ones every run (derandomized, no database).
"""

import json
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdist import ClusterSpec, ClusterSpecError
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
              st.integers(-1, 70000)),
    st.sampled_from(["host", ":1", "h:", "h:port", "h:1:2", " "]), json_leaf)
cluster = st.dictionaries(job_name, st.one_of(st.lists(address, max_size=3), json_value), max_size=4)
task = st.one_of(st.fixed_dictionaries({"type": st.one_of(job_name, json_leaf),
                                        "index": st.one_of(st.integers(-1, 4), json_leaf)}),
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
@given(text=st.text(max_size=60))
def test_arbitrary_tf_config_text_never_escapes_as_another_error(text):
    try:
        ClusterSpec.from_tf_config(text)
    except ClusterSpecError as err:
        assert "Fix:" in str(err)


count = st.one_of(st.integers(-1, 3), st.integers(-1, 80), st.none(), st.text(max_size=3))
roles = st.dictionaries(job_name, st.one_of(count, st.booleans(), st.floats(allow_nan=False),
                                            st.fixed_dictionaries({"count": st.integers(-1, 3)})),
                        max_size=4)
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
    json_value)


@EXAMPLES
@given(content=spec_file, as_yaml=st.booleans())
def test_spec_files_load_or_fail_with_a_field(content, as_yaml):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "spec.yaml" if as_yaml else "spec.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(content) if as_yaml else json.dumps(content))
        for read in (load_spec, read_k8s_spec):
            try:
                read(path)
            except ClusterSpecError as err:
                assert "Fix:" in str(err)
