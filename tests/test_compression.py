"""Gradient compression: correctness under MirroredStrategy (2 logical CPUs, one fresh process)."""

import json
import math

import pytest

from conftest import run_python, run_report



@pytest.fixture(scope="module")
def report():
    return run_report(["tests/programs/compression_checks.py"], timeout=400)


def test_no_compression_is_plain_keras_bit_for_bit(report):
    assert report["no_compression_bit_for_bit"] is True


def test_topk_ratio_1_fp16_and_bf16_sum_like_plain_keras(report):
    differences = report["sum_vs_plain"]
    assert differences["topk_ratio_1"] < 1e-6  # every entry: the exact sum
    assert 1e-7 < differences["fp16"] < 2e-3  # half precision: rounded, and only that much
    assert 1e-6 < differences["bf16"] < 2e-2  # bfloat16's 8-bit mantissa


def test_variants_and_a_custom_compressor_train(report):
    variants = report["variants"]
    for name, result in variants.items():
        assert result["loss"][-1] < result["loss"][0], name
    assert variants["powersgd_cold"]["state"] == ["q", "residual"]
    assert variants["powersgd_no_feedback"]["state"] == ["q"]  # no residual kept
    assert variants["topk_no_feedback"]["state"] == []
    assert variants["custom"]["state"] == [] and variants["custom"]["ratio"] > 1.9


def test_powersgd_is_exact_on_gradients_of_rank_at_most_r(report):
    assert report["powersgd_rank_r_error"] < 1e-5


def test_one_dimensional_and_poorly_compressible_tensors_go_uncompressed(report):
    assert report["should_compress"] == {
        "powersgd_bias": False, "powersgd_thin": False, "powersgd_low_rate": False,
        "powersgd_kernel": True, "topk_bias": False, "fp16_bias": True}


def test_start_step_warm_up_is_uncompressed_then_compression_starts(report):
    assert report["warmup_equal_to_plain"] is True
    assert report["compressed_after_warmup_differs"] is True
    before, after = report["warmup_ratio_logs"]
    assert before == 1.0 and after > 5


def test_error_feedback_residuals_and_q_are_checkpointed(report):
    assert report["state_shapes"] == {"residual": [[32, 48]], "q": [[48, 2]]}
    assert report["residual_nonzero"] is True
    assert report["state_restored"] is True  # save_weights / load_weights


def test_compressor_state_comes_back_through_the_stock_callbacks(report):
    assert report["state_restored_model_checkpoint"] is True  # ModelCheckpoint(.keras) + load_model
    assert report["state_restored_backup_and_restore"] is True


def test_any_keras_optimizer_trains_with_every_compressor(report):
    assert len(report["optimizers"]) == 12 and all(report["optimizers"].values())


def test_sparse_gradients_never_crash(report):
    assert report["sparse"] == {"PowerSGD": True, "TopK": True, "BF16": True}


def test_fp16_overflow_is_an_error_not_inf(report):
    assert report["fp16_overflow"] is True


def test_aggregate_every_k_equals_a_k_times_larger_batch(report):
    assert report["aggregate_every_max_diff"] < 1e-5
    assert report["aggregate_every_iterations"] == 24  # 2 epochs x 12 micro-steps
    assert "use one way to accumulate" in report["accumulation_clash"]


def test_nominal_ratios_for_the_784_1024_1024_10_mlp(report):
    ratios = report["nominal_ratio"]
    assert ratios["FP16"] == 2.0
    assert ratios["PowerSGD"] == pytest.approx(86.2, abs=0.1)
    assert ratios["TopK"] == pytest.approx(47.4, abs=0.1)


@pytest.mark.parametrize("name", ["plain", "fp16", "aggregate_every"])
def test_buckets_sum_like_one_batch_last_layer_first(report, name):
    """bucket_bytes: one collective per bucket, issued last layer first; the same sums as Keras's
    one batch, alone, through a compressor and with aggregate_every."""
    run = report["buckets"][name]
    assert run["trained"] > 1e-3  # the weights moved...
    assert run["max_diff"] == 0.0  # ...exactly as with one batch (2 replicas: a + b either way)
    assert run["traced"] == [[3], [2], [1], [0]]  # head bias, head kernel, hidden bias, kernel


def test_buckets_fill_up_to_bucket_bytes(report):
    assert report["buckets_grouped"] == [[3, 2], [1, 0]]


def test_topk_sparsity_warm_up_sends_the_scheduled_ratios(report):
    """TopK(0.1, warmup=(0.25, 0.125), warmup_steps=3): steps 0-2 send a quarter of each
    kernel's entries, 3-5 an eighth, then a tenth (value + index per entry; biases go whole)."""
    sent = report["topk_warmup_bytes"]
    assert len(sent) == 12
    assert len(set(sent[0:3])) == len(set(sent[3:6])) == len(set(sent[6:])) == 1
    assert sent[0] > sent[3] > sent[6]
    kernels = 8 * (32 * 48 + 48 * 1)  # value + int32 index for every entry, biases 4 * (48 + 1)
    assert sent[0] == pytest.approx(0.25 * kernels + 4 * 49, abs=16)
    assert sent[6] == pytest.approx(0.1 * kernels + 4 * 49, abs=16)
    assert report["topk_warmup_ratio_1_vs_plain"] < 1e-5  # every entry sent: plain Keras's sums


def test_topk_float16_values_keep_their_rounding_as_residual(report):
    half = report["topk_float16"]
    assert half["dtype"] == "float16" and half["payload_bytes"] == 6 * 12
    assert half["rounding_kept"] > 0  # 1 + 1e-3 noise is not a float16 number...
    assert half["feedback_exact"] < 1e-6  # ...and sent + residual is the gradient again
    assert report["topk_float16_trains"]


@pytest.mark.parametrize("threads,warned", [(1, True), (2, False)])
def test_buckets_warn_when_tensorflow_runs_one_op_at_a_time(threads, warned):
    """With one inter-op thread a bucket's all-reduce waits for every backward op: the buckets
    only add collectives (benchmarks/results/overlap.md: slower on fast links), so kdist says so."""
    result = run_python(["-c", f"""
import tensorflow as tf, kdist
tf.config.threading.set_inter_op_parallelism_threads({threads})
with kdist.scope(bucket_bytes=1 << 20):
    pass
"""], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("bucket_bytes with 1 inter-op thread" in result.stderr) is warned, result.stderr[-3000:]
    assert ("set_inter_op_parallelism_threads" in result.stderr) is warned


def test_topk_sums_densely_where_that_moves_fewer_bytes(report):
    """60% of the entries on 2 replicas: all-gathering 2 payloads (value + index) would move more
    than a dense all-reduce, so kdist scatters and all-reduces them: no all-gather traced, the
    same weights as the all-gather route, dense bytes in the logs."""
    route = report["topk_route"]
    assert route["gather"]["route"] == "all_gather" and route["gather"]["gathered_tensors"] > 0
    assert route["dense"]["route"] == "all_reduce" and route["dense"]["gathered_tensors"] == 0
    assert route["max_diff"] == 0.0 and route["trained"]
    assert route["dense"]["bytes"] == 4 * (32 * 48 + 48 + 48 + 1)  # float32, every entry
    assert route["gather"]["bytes"] == 8 * (math.ceil(0.6 * 32 * 48) + math.ceil(0.6 * 48)) + 4 * 49


def test_topk_clip_norm_clips_each_replica_to_clip_norm_over_sqrt_n(report):
    clip = report["topk_clip"]
    assert clip["unclipped_vs_hand"] < 1e-5  # the hand-taken replica gradients are Keras's
    assert min(clip["replica_norms"]) > 0.05  # both replicas clipped...
    assert clip["clipped_vs_hand"] < 1e-6  # ...each to 0.05 / sqrt(2), then summed
    assert clip["step_norm"] <= 2 * 0.05 / math.sqrt(2) + 1e-6  # two clipped gradients


@pytest.mark.parametrize("compression,warned", [("fp16", True), (None, False)])
def test_compression_between_replicas_of_one_process_says_it_saves_little(compression, warned):
    """Mirrored over 2 logical CPUs: the gradients never leave the process, so kdist says that
    compression saves little there, and how to weigh it for a real link."""
    result = run_python(["-c", f"""
import kdist
kdist.split_cpu(2)
with kdist.scope(compression={compression!r}):
    pass
"""], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    said = "kdist: compression FP16 with every replica on one host (this process)"
    assert (said in result.stderr) is warned, result.stderr[-3000:]
    assert ("kdist plan --compression NAME --bandwidth LINK" in result.stderr) is warned


def test_compression_across_hosts_says_nothing(caplog):
    """Tasks on two hosts exchange over a network, where compression may pay: no warning."""
    import types

    from kdist.cluster import ClusterSpec
    from kdist.compression import FP16, one_host

    strategy = types.SimpleNamespace(num_replicas_in_sync=2)
    apart = ClusterSpec({"worker": ["node-a:2222", "node-b:2222"]}, "worker", 0)
    together = ClusterSpec({"worker": ["node-a:2222", "node-a:2223"]}, "worker", 0)
    with caplog.at_level("WARNING", logger="kdist"):
        one_host.warn_if_one_host(FP16(), strategy, apart)
        assert not caplog.records
        one_host.warn_if_one_host(FP16(), strategy, together)
    assert "on one host (node-a)" in caplog.text


def test_a_new_compressor_is_one_file_and_one_registry_line():
    """tests/programs/halve_compressor.py plus its line in the registry: kdist.scope takes it by
    name on 2 replicas and trains exactly as with BF16 (the same arithmetic); the names that
    errors and `kdist plan --help` list include it; an argument it does not take is refused."""
    result = run_python(["-c", """
import json, sys
sys.path.insert(0, "tests/programs")
import kdist, keras, numpy as np
from kdist import model_state
from kdist.compression import registry
registry.COMPRESSORS["halve"] = "halve_compressor:Halve"  # the one line

kdist.split_cpu(2)
x = np.random.default_rng(0).normal(size=(256, 16)).astype("float32")
y = x @ np.arange(16, dtype="float32").reshape(16, 1)

def trained(compression):
    keras.utils.set_random_seed(0)
    with kdist.scope(compression=compression):
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    return model, history["loss"]

halve, losses = trained("halve")
bf16, _ = trained("bf16")
try:
    registry.from_name("halve:2")
    refused = ""
except kdist.validators.UsageError as err:
    refused = str(err)
print(json.dumps({
    "compressor": type(model_state.exchange_of(halve.optimizer).compressor).__name__,
    "by_name": type(registry.from_name("halve")).__name__,
    "learned": losses[-1] < losses[0],
    "as_bf16": max(float(np.abs(a - b).max()) for a, b in zip(halve.get_weights(),
                                                              bf16.get_weights())),
    "listed": registry.spelled(), "refused": refused}))
"""], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["by_name"] == report["compressor"] == "Halve" and report["learned"], report
    assert report["as_bf16"] == 0.0, report
    assert report["listed"].endswith("topk:RATIO or halve"), report
    assert "'halve:2': halve takes no argument" in report["refused"], report
