"""kdist.layers outside any strategy, in this process: Partitioned* exact against the Keras layers
they split, PartitionedEmbedding saved and loaded, ModelParallelDense's own argument errors."""

import keras
import numpy as np
import pytest

import kdist


def test_partitioned_dense_equals_dense_with_the_same_weights():
    x = np.random.default_rng(0).normal(size=(5, 7)).astype("float32")
    keras.utils.set_random_seed(3)
    split = kdist.layers.PartitionedDense(10, num_shards=3, activation="relu")
    keras.utils.set_random_seed(3)
    dense = keras.layers.Dense(10, activation="relu")
    assert np.abs(split(x).numpy() - dense(x).numpy()).max() < 1e-6  # same init, same outputs
    kernel = np.concatenate([k.numpy() for k in split.kernel_shards], axis=1)
    assert np.array_equal(kernel, dense.kernel.numpy())


def test_partitioned_embedding_equals_embedding_and_round_trips_through_keras_files(tmp_path):
    ids = np.random.default_rng(1).integers(0, 50, size=(4, 6))
    keras.utils.set_random_seed(5)
    split = kdist.layers.PartitionedEmbedding(50, 8, num_shards=4)
    keras.utils.set_random_seed(5)
    plain = keras.layers.Embedding(50, 8)
    assert np.array_equal(split(ids).numpy(), plain(ids).numpy())
    model = keras.Sequential([keras.Input((6,), dtype="int32"), split])
    model.save(tmp_path / "embedding.keras")
    loaded = keras.saving.load_model(tmp_path / "embedding.keras")
    assert np.array_equal(loaded(ids).numpy(), model(ids).numpy())
    assert [tuple(s.shape) for s in loaded.layers[0].embedding_shards] == [(13, 8), (13, 8),
                                                                          (12, 8), (12, 8)]


def test_model_parallel_dense_argument_errors():
    devices = ["/cpu:0", "/cpu:0"]  # the same device twice: enough to check arguments
    with pytest.raises(ValueError, match="input_is_split=True is for partition='row'"):
        kdist.layers.ModelParallelDense(4, devices=devices, partition="column",
                                        input_is_split=True)
    row = kdist.layers.ModelParallelDense(4, devices=devices, partition="row", input_is_split=True,
                                          use_bias=False)
    with pytest.raises(ValueError, match="input_is_split: got 3 slices"):
        row([np.ones((2, 2), "float32")] * 3)
