"""Communication between the devices of a model-parallel layer, as conjugate pairs (as in Megatron's
tensor_parallel/mappings.py): each op's backward pass is its partner's forward pass, which
TensorFlow's autodiff derives from the device-placed ops below.

    copy_to_devices     forward: the same tensor on every device   backward: sum the gradients
    reduce_from_devices forward: sum the devices' partial results  backward: copy the gradient
    scatter_to_devices  forward: split along an axis, one part per device   backward: gather
    gather_from_devices forward: concatenate the parts on one device        backward: scatter

Between them, `compute_on` runs one device's part of a layer on that device, its backward pass
included: TensorFlow places a tape's gradient ops where `tape.gradient` is called (under a strategy,
the replica's device), not next to their forward ops, so without it every shard's backward pass
would run, and its gradient land, on one device.

>>> import tensorflow as tf
>>> from kdist.layers import mappings
>>> parts = mappings.scatter_to_devices(tf.ones((2, 5)), [3, 2], ["/cpu:0", "/cpu:0"])
>>> [tuple(p.shape) for p in parts], tuple(mappings.gather_from_devices(parts, "/cpu:0").shape)
([(2, 3), (2, 2)], (2, 5))
"""

from __future__ import annotations


def copy_to_devices(x, devices):
    import tensorflow as tf

    copies = []
    for device in devices:
        with tf.device(device):
            copies.append(tf.identity(x))
    return copies


def reduce_from_devices(parts, device):
    import tensorflow as tf

    with tf.device(device):
        return tf.add_n(list(parts))


def scatter_to_devices(x, sizes, devices, axis=-1):
    import tensorflow as tf

    parts = []
    for part, device in zip(tf.split(x, sizes, axis=axis), devices):
        with tf.device(device):
            parts.append(tf.identity(part))
    return parts


def gather_from_devices(parts, device, axis=-1):
    import tensorflow as tf

    with tf.device(device):
        return tf.concat(list(parts), axis=axis)


def compute_on(device, fn, *inputs):
    """`fn(*inputs)` on `device`, forward and backward (the gradients of `inputs` and of the
    variables `fn` reads are computed there too).

    The backward pass may run more than once, as a plain layer's does: a persistent outer tape
    asks for several gradients (with respect to the input, then to the variables), a tape around
    another asks for second-order ones. The inner tape is persistent so that each of these calls
    finds the forward pass it records; it is released with the outer tapes that hold `backward`.
    """
    import tensorflow as tf

    @tf.custom_gradient
    def forward(*tensors):
        with tf.device(device), tf.GradientTape(persistent=True) as tape:
            tape.watch(tensors)
            outputs = fn(*tensors)

        def backward(*upstream, variables=None):
            variables = list(variables or [])
            with tf.device(device):
                grads = tape.gradient(outputs, list(tensors) + variables,
                                      output_gradients=list(upstream))
            return grads[:len(tensors)], grads[len(tensors):]

        return outputs, backward

    return forward(*inputs)
