"""The seam between kdist and Keras/TensorFlow: the only package that imports `keras.src` or
`tensorflow.python`, reads a private attribute of theirs, or replaces one of their methods.

- `versions`: the tested range, and what happens outside it;
- `classes`: the patched Keras classes, found by what exists in the running Keras;
- `registry`: `Patch` (a **fix** of an upstream bug, or a **hook** where a feature plugs in), each
  target replaced once by the composition of its active patches;
- `fixes`, `callbacks`: the fixes; `hook_points`: the hooks, which call the connected `hooks.Hooks`
  (kdist's: `kdist.wiring.KdistHooks`);
- `keras_internals`, `tf_internals`: every private attribute kdist reads, as named functions.

The registry's list is `patches.PATCHES`: `patches.install()` is idempotent; `patches.uninstall()`
restores Keras exactly, and each patch can be removed alone (the regression tests show each bug
upstream that way). Where kdist needs them (`kdist.scope()`, `import kdist.callbacks`) it calls
`patches.ensure()`, which leaves out what was uninstalled: a patch taken out stays out. This
package's `__init__` imports nothing, so that importing one of its modules never imports the others.

>>> from kdist.keras_seam import patches
>>> sorted(patches.install())[:2]
['additional_loss_sums_as_one_device', 'after_symbolic_build']
>>> [p.kind for p in patches.PATCHES].count("fix") >= 8
True
"""
