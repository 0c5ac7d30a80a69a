"""kdist.scope(): strategy auto-selection, overrides, reuse, options, batch and LR helpers."""

import json
import logging
import os

import keras
import numpy as np
import pytest

import kdist
from kdist import global_state, strategies
from kdist.strategies import StrategyOptions, registry

W2 = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


@pytest.fixture(autouse=True)
def fresh_process_state():
    """Each test starts as a fresh process would: no strategy built by kdist yet."""
    global_state.clear()
    yield
    global_state.clear()


@pytest.fixture
def kdist_log():
    """Lines logged to the "kdist" logger during the test."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("kdist").addHandler(handler)
    yield lines
    logging.getLogger("kdist").removeHandler(handler)


@pytest.mark.parametrize("cluster,options,gpus,expected", [
    ({}, {}, 0, "default"),
    ({}, {}, 1, "default"),
    ({}, {}, 2, "mirrored"),
    ({}, {"devices": ["/cpu:0", "/cpu:1"]}, 0, "mirrored"),
    ({}, {"devices": ["/cpu:0"]}, 0, "default"),
    ({"worker": ["127.0.0.1:1"]}, {}, 0, "default"),
    (W2, {}, 0, "multi_worker"),
    (W2, {}, 4, "multi_worker"),
    ({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, {}, 0, "multi_worker"),
    ({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, {}, 2,
     "parameter_server"),
])
def test_auto_selection_for_each_tf_config_shape(cluster, options, gpus, expected):
    config = {"cluster": cluster, "task": {"type": next(iter(cluster)), "index": 0}} if cluster else {}
    spec = kdist.ClusterSpec.from_tf_config(config)
    assert strategies.choose(spec, StrategyOptions(**options), num_gpus=gpus) == expected


def test_a_split_cpu_means_mirrored_over_its_logical_devices():
    single = kdist.ClusterSpec.from_tf_config({})
    assert strategies.choose(single, StrategyOptions(), num_gpus=0, num_cpus=2) == "mirrored"
    assert strategies.choose(single, StrategyOptions(), num_gpus=1, num_cpus=2) == "default"
    assert strategies.choose(single, StrategyOptions(), num_gpus=0, num_cpus=1) == "default"


def test_default_scope_trains_and_is_reused():
    with kdist.scope() as first:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(np.ones((8, 3)), np.ones((8, 1)), verbose=0)
    with kdist.scope() as second:
        pass
    assert first is second and kdist.current_strategy() is first
    assert first.num_replicas_in_sync == 1


def test_clearing_the_process_state_forgets_every_strategy_kdist_built():
    import tensorflow as tf

    with kdist.scope(strategy="mirrored", devices=["/cpu:0"]) as built:
        pass
    assert kdist.current_strategy() is built
    assert registry.options_of(built).devices == ("/cpu:0",)
    plan = registry.plan_of(built)  # decided once, at the build
    assert (plan.name, plan.gradients_over_tcp) == ("mirrored", False)
    assert registry.cluster_of(built) is plan.spec is not None
    global_state.clear()
    assert kdist.current_strategy() is tf.distribute.get_strategy()
    assert registry.options_of(built) == StrategyOptions() and registry.cluster_of(built) is None
    assert registry.plan_of(built) is None
    with kdist.scope(strategy="mirrored", devices=["/cpu:0"]) as again:
        pass
    assert again is not built and kdist.current_strategy() is again


def test_scope_logs_one_line_with_strategy_replicas_task(kdist_log):
    kdist.strategy("default", devices=["/cpu:0"])
    kdist.strategy("default", devices=["/cpu:0"])  # reused: not logged again
    assert kdist_log == ["kdist: strategy default (OneDeviceStrategy), 1 replica(s) in sync, "
                         "task local"]


def test_options_that_do_not_apply_are_reported(kdist_log):
    kdist.strategy("default", collective_timeout=30)
    assert "options not used by this strategy: collective_timeout" in kdist_log[0]


def test_environment_overrides_auto(monkeypatch):
    monkeypatch.setenv("KDIST_STRATEGY", "default")
    assert kdist.strategy() is kdist.strategy("default")
    monkeypatch.setenv("KDIST_STRATEGY", "mirrored")
    with pytest.raises(ValueError, match="conflicts with KDIST_STRATEGY='mirrored'"):
        kdist.strategy("default")
    monkeypatch.setenv("KDIST_STRATEGY", "horovod")
    with pytest.raises(ValueError, match="KDIST_STRATEGY: 'horovod' is not a strategy. Fix: use 'auto' or one of"):
        kdist.strategy()


@pytest.mark.parametrize("options,words", [
    ({"device": ["/cpu:0"]}, "unknown option 'device'"),
    ({"all_reduce": "tree"}, "all_reduce='tree'"),
    ({"bytes_per_pack": -1}, "bytes_per_pack: -1"),
    ({"collective_timeout": 0}, "collective_timeout=0"),
    ({"devices": []}, "devices=[]"),
    ({"dead_peer_timeout": 2}, "dead_peer_timeout=2: use a number of seconds >= 3"),
    ({"ps_evaluation": "ps"}, "ps_evaluation='ps': use 'workers'"),
    ({"ps_shard_input": "yes"}, "ps_shard_input='yes': use True"),
])
def test_bad_options_are_rejected(options, words):
    with pytest.raises((TypeError, ValueError)) as info:
        kdist.strategy(**options)
    assert words in str(info.value)


@pytest.mark.parametrize("arguments,error,words", [
    ({"compression": "gzip"}, ValueError, "compression: 'gzip' is not a compressor. Fix: use none, "
                                          "fp16"),
    ({"compression": 3}, ValueError, "compression: 3 is neither a name nor a compressor"),
    ({"compression": "powersgd:x"}, ValueError, "compression: 'powersgd:x'"),
    ({"aggregate_every": 0}, ValueError, "aggregate_every: 0"),
    ({"bucket_bytes": -1}, ValueError, "bucket_bytes: -1"),
])
def test_bad_compression_arguments(arguments, error, words):
    with pytest.raises(error, match=words):
        with kdist.scope(**arguments):
            pass


@pytest.mark.parametrize("make,words", [
    (lambda: kdist.compression.PowerSGD(rank=0), "rank: 0"),
    (lambda: kdist.compression.TopK(ratio=0), "ratio=0"),
    (lambda: kdist.compression.TopK(0.01, momentum=0.9, error_feedback=False), "needs error_feedback"),
    (lambda: kdist.compression.FP16(start_step=-1), "start_step: -1"),
    (lambda: kdist.compression.PowerSGD(min_compression_rate=0.5), "min_compression_rate=0.5"),
])
def test_bad_compressor_arguments(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_missing_device_is_a_clear_error():
    with pytest.raises(ValueError, match="'/gpu:7' does not exist"):
        kdist.strategy("mirrored", devices=["/cpu:0", "/gpu:7"])


@pytest.mark.parametrize("devices, replicas", [(["/gpu:0"], 1), (["/GPU:0", "/gpu:1"], 2),
                                              (["/cpu:0"], 0)])
def test_multi_worker_devices_are_the_first_gpus_each_worker_replicates_over(devices, replicas):
    from kdist.strategies.multi_worker import replica_gpus

    assert replica_gpus(devices) == replicas


@pytest.mark.parametrize("devices", [["/gpu:1"], ["/gpu:0", "/gpu:2"], ["/cpu:1"],
                                     ["/cpu:0", "/gpu:0"]])
def test_multi_worker_devices_it_cannot_honour_are_refused(devices):
    from kdist.strategies.multi_worker import replica_gpus

    with pytest.raises(ValueError, match=r"give \['/gpu:0', \.\.\., '/gpu:k-1'\]"):
        replica_gpus(devices)


def test_multi_worker_after_other_ops_explains_the_ordering_rule(monkeypatch):
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # TF is initialised: collectives can no longer be configured
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": W2, "task": {"type": "worker", "index": 0}}))
    with pytest.raises(RuntimeError, match="must be created before any other TensorFlow operation"):
        kdist.strategy()


def test_parameter_server_strategy_is_built_on_the_chief_only():
    spec = kdist.ClusterSpec({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                              "ps": ["127.0.0.1:3"]}, "worker", 0)
    with pytest.raises(RuntimeError, match="created on the chief only"):
        strategies.build("parameter_server", spec, StrategyOptions())


def test_serve_is_for_parameter_server_clusters_only():
    with pytest.raises(RuntimeError, match="runs the ps and worker tasks of a parameter-server"):
        kdist.serve(kdist.ClusterSpec(W2, "worker", 1))


def test_servers_wait_for_the_chief_to_go():
    import socket
    import threading
    import time

    from kdist.ps.serve import wait_for_chief_to_end

    chief = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{chief.getsockname()[1]}"
    threading.Timer(1.0, chief.close).start()  # the chief finishes after 1 s
    started = time.monotonic()
    wait_for_chief_to_end(address, grace=1.0, poll=0.1)
    assert 1.5 < time.monotonic() - started < 6


def test_global_batch_size_and_learning_rate_follow_replicas():
    strategy = kdist.strategy("default")
    assert kdist.global_batch_size(64) == 64 and kdist.scale_learning_rate(0.1) == 0.1

    class FourReplicas:
        num_replicas_in_sync = 4

    assert kdist.global_batch_size(32, strategy=FourReplicas()) == 128
    assert kdist.scale_learning_rate(0.1, strategy=FourReplicas()) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="per_replica: 0"):
        kdist.global_batch_size(0)
    assert strategy is kdist.current_strategy()


def test_linear_warmup_ramps_then_hands_over():
    after = keras.optimizers.schedules.ExponentialDecay(0.4, decay_steps=10, decay_rate=0.5)
    schedule = kdist.LinearWarmup(0.4, warmup_steps=4, after=after)
    values = [float(schedule(step)) for step in (0, 2, 4, 14)]
    assert values == pytest.approx([0.0, 0.2, 0.4, 0.2])
    restored = kdist.LinearWarmup.from_config(schedule.get_config())
    assert float(restored(14)) == pytest.approx(0.2)
    assert float(kdist.LinearWarmup(1.0, warmup_steps=10, initial=0.5)(20)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="warmup_steps: 0"):
        kdist.LinearWarmup(0.1, warmup_steps=0)


def test_ring_is_refused_under_mirrored_and_options_reach_tf():
    with pytest.raises(ValueError, match="all_reduce='ring' is not available to MirroredStrategy"):
        strategies.build("mirrored", kdist.cluster(), StrategyOptions(all_reduce="ring"))
    options = StrategyOptions(all_reduce="ring", bytes_per_pack=1 << 20,
                              collective_timeout=30).communication_options()
    assert options.bytes_per_pack == 1 << 20 and options.timeout_seconds == 30
    assert options.implementation.name == "RING"


def test_compressors_by_name():
    from kdist.compression import BF16, FP16, PowerSGD, TopK, from_name

    assert isinstance(from_name("fp16"), FP16) and isinstance(from_name("bf16"), BF16)
    assert from_name("powersgd:2").rank == 2 and isinstance(from_name("powersgd"), PowerSGD)
    topk = from_name("topk:0.05", momentum=0.9)
    assert isinstance(topk, TopK) and topk.ratio == 0.05 and topk.momentum == 0.9
    with pytest.raises(ValueError, match="compression: 'gzip' is not a compressor"):
        from_name("gzip")


def test_a_server_whose_chief_never_comes_says_so_and_exits_69_after_its_timeout():
    """KDIST_CHIEF_START_TIMEOUT: a ps that never sees its chief says whom it waits for, then
    gives up (no stuck pod) with the start-up code, 69."""
    import subprocess
    import sys
    import time

    import portpicker

    ports = [portpicker.pick_unused_port() for _ in range(3)]
    tf_config = json.dumps({"cluster": {"chief": [f"127.0.0.1:{ports[0]}"],
                                        "worker": [f"127.0.0.1:{ports[1]}"],
                                        "ps": [f"127.0.0.1:{ports[2]}"]},
                            "task": {"type": "ps", "index": 0}})
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", "import kdist; kdist.serve()"],
                            env={**os.environ, "TF_CONFIG": tf_config, "TF_CPP_MIN_LOG_LEVEL": "2",
                                 "KDIST_CHIEF_START_TIMEOUT": "5"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 69, result.stderr[-2000:]
    chief = f"chief:0 at 127.0.0.1:{ports[0]} (connection refused)"
    assert f"kdist: ps:0 has waited 3 s for the chief: waiting for {chief}" in result.stderr
    assert f"kdist: error: ps:0 gave up after 5 s waiting for the chief: {chief}" in result.stderr
    assert time.monotonic() - started < 40


def test_a_misspelt_scope_option_names_the_one_meant_and_every_option():
    with pytest.raises(TypeError) as info:
        with kdist.scope(compresion="fp16"):
            pass
    message = str(info.value)
    assert "unknown option 'compresion' (did you mean 'compression'?)" in message
    for option in ("compression", "balance", "bucket_bytes", "ps_sync", "check_replicas",
                   "aggregate_every", "all_reduce", "devices"):
        assert f"{option}," in message or message.endswith(option), option
