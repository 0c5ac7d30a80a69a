"""On a GPU (skipped where there is none, never counted as passing there): Mirrored over logical
GPUs split from one, NCCL all-reduce, the equivalence N replicas x b == 1 x N b, mixed precision
with and without compression, the model-parallel Dense over logical GPUs, jit_compile.

The offline bundle (`kdist bundle`) carries TensorFlow and its CUDA 12 libraries to a GPU host
without a package index; `benchmarks/gpu/suite.py` measures the figures there."""

import math

import pytest
import tensorflow as tf

from conftest import run_report

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="no GPU: the GPU suite runs on a GPU host "
                                        "(docs/offline-gpu.md)")]


@pytest.fixture(scope="module")
def report():
    return run_report(["tests/programs/gpu_checks.py"], timeout=600)


def test_mirrored_over_two_logical_gpus_equals_one_device_with_the_global_batch(report):
    assert len(report["gpus"]) == 2 and report["replicas"] == 2
    assert report["equivalence_max_diff"] < 1e-5


def test_nccl_all_reduce_sums_the_replicas(report):
    assert report["nccl_sum"] == 3.0  # 1 + 2


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("compression", [None, "fp16", "powersgd:4"])
def test_mixed_precision_trains_with_and_without_compression(report, policy, compression):
    losses = report["precision"][f"{policy}/{compression}"]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


def test_model_parallel_dense_over_logical_gpus_equals_dense(report):
    assert report["model_parallel_max_diff"] < 1e-4
    assert [d.rsplit(":", 1)[1] for d in report["model_parallel_shard_devices"]] == ["0", "1"]


def test_jit_compile_trains_under_mirrored_on_gpus(report):
    assert all(math.isfinite(loss) for loss in report["jit_losses"])
