"""The seam to Keras and TensorFlow (`kdist.keras_seam`): the only package that imports their
internals, reads their private attributes or replaces their methods; one registry of patches,
composed in one order, each removable alone; the generated page that lists them; the tested range
said at import; one frozen options object per scope."""

import ast
import dataclasses
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import kdist
from conftest import QUIET_TF, ROOT
from kdist.keras_seam import classes, page, registry, versions
from kdist.keras_seam import patches as keras_seam
from kdist.wiring.options import TrainingOptions

SEAM = os.path.join("kdist", "keras_seam")
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tensorflow.compiler", "tensorflow.tsl",
                   "tensorflow.core", "xla")
# Documented Python APIs whose names start with an underscore, or attributes of Python's own
# objects that kdist configures: (file, source) -> why.
ALLOWED = {
    ("kdist/ps/serve.py", "os._exit"): "Python's documented exit without cleanup",
    ("kdist/steps/watchdog.py", "os._exit"):
        "Python's documented exit without cleanup (the main thread waits inside TensorFlow)",
    ("kdist/wiring/verify.py", "os._exit"):
        "Python's documented exit without cleanup (a verify run's files are written)",
    ("kdist/__init__.py", "_logger.propagate"): "configuring the standard library's logger",
    ("kdist/ps/training.py", "model.stop_training"):
        "Keras's documented callback protocol: a fit loop resets it, EarlyStopping sets it",
    ("kdist/wiring/verify.py", "self.model.stop_training"):
        "Keras's documented callback protocol: EarlyStopping sets it (kdist verify's last step)",
}


def keras_and_tf_attribute_names() -> set[str]:
    """Every attribute name of the Keras and TensorFlow objects kdist's features handle: a
    feature that assigns one of them on another object is replacing Keras's or TF's."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    owners = [keras.Model, keras.layers.Layer, keras.optimizers.Optimizer, keras.callbacks.Callback,
              keras.Variable, keras.metrics.Metric, tf.distribute.Strategy,
              tf.distribute.StrategyExtended, tf.Variable,
              tf.distribute.cluster_resolver.ClusterResolver,
              # instance attributes too (set in __init__, not on the class)
              model, model.optimizer, model.layers[0], keras.callbacks.BackupAndRestore("unused"),
              tf.distribute.get_strategy(), tf.distribute.get_strategy().extended]
    return {name for owner in owners for name in dir(owner)}


def _imported(node) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module]
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and \
            node.args and isinstance(node.args[0], ast.Constant):
        return [str(node.args[0].value)]
    return []


def _is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _foreign_base(cls: ast.ClassDef, local: set[str]) -> bool:
    """Whether `cls` derives from a class defined outside this file (Keras's, TF's)."""
    return any(not (isinstance(base, ast.Name) and base.id in local) for base in cls.bases)


def violations(path: str, source: str, protected: set[str]) -> list[str]:
    """What `source` (the file at `path`, outside the seam) does that only the seam may do."""
    tree = ast.parse(source)
    found = []

    def report(node, what):
        text = ast.unparse(node)
        if (path, text) not in ALLOWED:
            found.append(f"{path}:{node.lineno}: {what}: {text[:80]}")

    local_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        for module in _imported(node):
            if module.startswith(PRIVATE_MODULES) or module.startswith("tensorflow.__internal__"):
                report(node, f"imports the private module {module}")
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
            report(node, "uses a private attribute")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str) and _private(node.args[1].value) and \
                not _is_self(node.args[0]):
            report(node, "reads a private attribute through its name")
        if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "__internal__"):
            report(node, f"uses {node.attr}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "setattr", "delattr", "object.__setattr__", "object.__delattr__") and \
                not (node.args and _is_self(node.args[0])):
            report(node, "replaces an attribute of another object")
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and not _is_self(part.value) and \
                        (_private(part.attr) or part.attr in protected or part.attr == "__class__"):
                    report(part, "replaces an attribute of another object")
    # A subclass of a Keras class reading a private attribute it did not set: Keras's own.
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if not _foreign_base(cls, local_classes):
            continue
        own = {n.name for n in ast.walk(cls) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        own |= {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AugAssign,
                                                                 ast.AnnAssign))
                for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                for t in ast.walk(target) if isinstance(t, ast.Attribute) and _is_self(t.value)}
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and _is_self(node.value) and \
                    _private(node.attr) and node.attr not in own:
                report(node, f"reads {cls.name}'s inherited private attribute")
    return found


def feature_files() -> list[str]:
    files = []
    for top in ("kdist", "strategies"):
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            relative = os.path.relpath(directory, ROOT)
            if relative.startswith(SEAM) or "__pycache__" in relative:
                continue
            files += [os.path.join(relative, n) for n in names if n.endswith(".py")]
    return sorted(files)


def test_no_module_outside_the_seam_touches_keras_or_tf_internals():
    protected = keras_and_tf_attribute_names()
    files = feature_files()
    assert len(files) > 50 and "kdist/exchange/pipeline.py" in files
    found = [v for f in files for v in violations(f, open(os.path.join(ROOT, f)).read(), protected)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("line", [
    "from keras.src import tree",
    "import keras.src.backend.tensorflow.trainer as t",
    "from tensorflow.python.eager import context",
    "importlib.import_module('keras.src.trainers.trainer')",
    "tf.__internal__.distribute.interim.maybe_merge_call(f, s)",
    "step = model._initial_epoch",
    "size = getattr(dataset, '_batch_size', None)",
    "if hasattr(dataset, '_input_dataset'): pass",
    "size = dataset.__dict__['_batch_size']",
    "model.train_function = fast_path",
    "optimizer.apply_gradients = capture",
    "setattr(keras.Model, 'fit', fit)",
    "callback.__class__ = Mine",
    "del optimizer._all_reduce_sum_gradients",
    "class Mine(keras.callbacks.BackupAndRestore):\n    def f(self):\n        return self._weights_path",
])
def test_the_check_fails_when_a_feature_module_does_what_only_the_seam_may(line):
    found = violations("kdist/exchange/pipeline.py", line, keras_and_tf_attribute_names())
    assert found, line
    # and the real file, with that line added, fails the check too
    real = open(os.path.join(ROOT, "kdist", "exchange", "pipeline.py")).read()
    assert violations("kdist/exchange/pipeline.py", real + "\n" + line + "\n",
                      keras_and_tf_attribute_names())


def _class_key(cls) -> str:
    """A class by name and identity (Keras exports several classes as keras.src.backend.Variable)."""
    return f"{cls.__module__}.{cls.__qualname__}@{id(cls):x}"


def test_every_replaced_keras_or_tf_attribute_is_a_registered_patch(tmp_path):
    """At run time too: after kdist trains (compression, balance, a model-parallel layer, the
    stock BackupAndRestore), what differs from Keras and TF as shipped is exactly the targets of
    the active patches."""
    def snapshot():
        """(owner, name) -> id of every function and class member of Keras and TensorFlow, and of
        every module attribute kdist set (a name Keras lacks, such as keras.utils.experimental)."""
        seen, classes_seen = {}, {}
        for name, module in list(sys.modules.items()):
            if not name.startswith(("keras", "tensorflow")) or module is None:
                continue
            for attribute, value in list(vars(module).items()):
                if isinstance(value, type):
                    classes_seen[id(value)] = value
                elif callable(value) or type(value).__module__.startswith("kdist"):
                    seen[(name, attribute)] = id(value)
        for cls in classes_seen.values():
            seen[(_class_key(cls), None)] = 0  # the class existed, even with no method of its own
            for key, member in list(vars(cls).items()):
                if callable(member) or isinstance(member, (staticmethod, classmethod, property)):
                    seen[(_class_key(cls), key)] = id(member)
        return seen

    keras_seam.uninstall()
    shipped = snapshot()
    keras_seam.install()  # taken out above: kdist.scope() installs no withdrawn patch again
    with kdist.scope(compression="fp16", aggregate_every=2):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                  kdist.layers.ModelParallelDense(2, devices=["/cpu:0"] * 2)])
        model.compile("adam", "mse")
    model.fit(np.ones((16, 4)), np.ones((16, 2)), batch_size=4, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    owners = {owner for owner, _ in shipped}  # a member added to a class or module that existed
    changed = {key for key, value in snapshot().items()
               if key[0] in owners and shipped.get(key) != value}
    expected = set()
    for patch in keras_seam.PATCHES:
        if patch.active:
            for target in patch.targets:
                owner = target.resolve()
                module = owner.__name__ if isinstance(owner, type(sys)) else _class_key(owner)
                expected.add((module, target.attribute))
    assert changed == expected


def _chain(method) -> list[str]:
    """The functions a composed method calls, outermost first (each kdist layer wraps the next)."""
    names = []
    while method is not None:
        names.append(os.path.basename(method.__code__.co_filename))
        method = getattr(method, "__wrapped__", None) if "keras_seam" in names[-1] or \
            names[-1] in ("hook_points.py", "fixes.py") else None
    return names


def test_patches_compose_in_registry_order_whatever_the_install_order():
    """`_maybe_symbolic_build` has a fix and a hook: the fix is always innermost, and removing it
    leaves the hook (no install-order dependence, no lost wrapper)."""
    trainer = classes.resolve("Trainer")
    fix, hook = keras_seam.patch("symbolic_build_without_collective"), \
        keras_seam.patch("after_symbolic_build")
    keras_seam.uninstall()
    shipped = trainer._maybe_symbolic_build
    try:
        for order in ((fix, hook), (hook, fix)):
            keras_seam.uninstall()
            for patch in order:
                patch.install()
            assert _chain(trainer._maybe_symbolic_build) == ["hook_points.py", "fixes.py",
                                                             "trainer.py"]
        fix.uninstall()
        assert _chain(trainer._maybe_symbolic_build) == ["hook_points.py", "trainer.py"]
        hook.uninstall()
        assert trainer._maybe_symbolic_build is shipped
    finally:
        keras_seam.install()


def test_a_withdrawn_patch_stays_out_until_installed_by_name(tmp_path):
    """A patch a program uninstalled (to run upstream Keras, as the regression tests and the
    benchmarks' 'fix removed' rows do) is not installed again by kdist.scope() or by the import
    of kdist.callbacks at fit; `install()` brings it back."""
    import importlib.util

    fix = keras_seam.patch("model_files_written_whole")
    fix.uninstall()
    try:
        with kdist.scope(strategy="default", aggregate_every=3):  # a strategy not built yet
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        spec = importlib.util.find_spec("kdist.callbacks")  # its import, run again aside
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
        assert not fix.active and fix.name not in keras_seam.ensure()
    finally:
        keras_seam.install()
    assert fix.active


def test_uninstall_restores_keras_exactly():
    """Every attribute an active patch replaces on this stack (read from the registry, so each
    Keras version checks its own targets) is kdist's while installed and Keras's own after."""
    keras_seam.install()
    targets = {(t.owner, t.attribute): t for patch in keras_seam.PATCHES if patch.active
               for t in patch.targets}
    assert {("Trainer", "fit"), ("BaseTrainer", "compile")} <= set(targets)
    owners = [(target.resolve(), target.attribute) for target in targets.values()]
    keras_seam.uninstall()
    shipped = [vars(owner).get(name) for owner, name in owners]
    keras_seam.install()
    patched = [vars(owner).get(name) for owner, name in owners]
    assert all(p is not s for p, s in zip(patched, shipped))
    assert all("kdist" in (f.__code__.co_filename if hasattr(f, "__code__") else type(f).__module__)
               for f in patched)
    keras_seam.uninstall()
    assert [vars(owner).get(name) for owner, name in owners] == shipped
    keras_seam.install()


def test_loaded_models_are_still_compiled_with_the_patches_installed(tmp_path):
    """Regression: patching compile on a subclass made Keras treat it as custom and skip
    compiling models in load_model."""
    with kdist.scope(compression=kdist.compression.FP16()):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("adam", "mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.compiled and loaded.optimizer.__class__.__name__ == "Adam"


def test_fixes_are_gated_on_the_versions_they_target_and_hooks_apply_everywhere():
    for patch in keras_seam.PATCHES:
        assert patch.why and patch.upstream and patch.targets
        if patch.kind == registry.HOOK:
            assert patch.applies(keras.__version__, tf.__version__)
            continue
        # on the running stack: installed, or known not needed (fixed upstream / not yet broken)
        assert patch.applies(keras.__version__, tf.__version__) != \
            patch.not_needed(keras.__version__, tf.__version__)
        assert not patch.applies("3.17.0", "2.21.0")
        assert not patch.applies("3.15.1", "2.23.0")
        assert not patch.applies("2.15.0", "2.21.0")
    assert keras_seam.patch("loss_scaled_per_replica").applies("3.7.0", "2.17.1")
    assert keras_seam.patch("loss_scaled_per_replica").not_needed("3.8.0")  # keras#20609
    assert keras_seam.patch("metric_variables_synced_on_read").applies("3.9.2", "2.19.1")
    assert keras_seam.patch("metric_variables_synced_on_read").not_needed("3.10.0")  # keras#21072
    assert keras_seam.patch("steps_per_execution_under_mirrored").not_needed("3.6.0")
    assert keras_seam.patch("datasets_from_function_in_fit").applies("3.8.0", "2.18.0")
    assert keras_seam.patch("datasets_from_function_in_fit").not_needed("3.9.0")  # keras#20829


def assign_add_op_types():
    variable = keras.Variable(0.0, name="counter")

    @tf.function
    def increment():
        variable.assign_add(1.0)

    return {op.type for op in increment.get_concrete_function().graph.get_operations()}


def test_upstream_assign_add_is_a_read_modify_write_and_kdist_makes_it_atomic(monkeypatch):
    """Regression evidence for atomic_assign_under_parameter_server: Keras 3's assign_add reads,
    adds and assigns (concurrent PS workers lose updates); kdist's patch emits the variable's own
    AssignAddVariableOp, which the ps applies atomically. When upstream emits it, drop the patch."""
    from kdist.keras_seam import fixes

    patch = keras_seam.patch("atomic_assign_under_parameter_server")
    patch.uninstall()
    try:
        upstream = assign_add_op_types()
    finally:
        patch.install()
    assert {"ReadVariableOp", "AssignVariableOp"} <= upstream
    assert "AssignAddVariableOp" not in upstream
    monkeypatch.setattr(fixes, "is_parameter_server", lambda strategy: True)  # as under PSS
    assert "AssignAddVariableOp" in assign_add_op_types()


def test_upstream_fit_rejects_datasets_from_function_before_keras_3_9():
    """Regression evidence for datasets_from_function_in_fit (keras#20134): Keras <= 3.8's data
    adapters do not recognise strategy.distribute_datasets_from_function's dataset; with kdist's
    fix they do. On Keras >= 3.9 upstream recognises it and the fix is not installed."""
    from keras.src.trainers import data_adapters

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.from_tensor_slices(np.ones((4, 2))).batch(2))
    assert type(distributed).__name__ == "DistributedDatasetsFromFunction"
    patch = keras_seam.patch("datasets_from_function_in_fit")
    keras_seam.install()
    installed = patch.active
    patch.uninstall()
    try:
        upstream = data_adapters.is_tf_dataset(distributed)
    finally:
        if installed:
            patch.install()
    fixed_upstream = versions.in_range(keras.__version__, ("3.9.0", versions.KERAS_RANGE[1]))
    assert upstream == fixed_upstream and installed == (not fixed_upstream)
    assert data_adapters.is_tf_dataset(distributed)


def embedding_step_reads(table_rows=1000, strategy=None):
    """The op types of a traced step (forward, gradient, SGD update) of an Embedding model, and
    the rows it updated (ids looked up: one negative, Keras's "fill" mode); under `strategy`, a
    replica's step (`strategy.run`), where the table is a MirroredVariable."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,), dtype="int32"),
                                  keras.layers.Embedding(table_rows, 4),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(model.trainable_variables)
    ids = np.array([[1, 5, -1], [5, 7, 2]], "int32")

    def replica_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - 1.0))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return gradients[0]

    @tf.function
    def step(ids):
        return strategy.run(replica_step, (ids,))

    gradient = step(ids)
    graph = step.get_concrete_function(ids).graph
    graphs = [graph, *(f.graph for f in graph._functions.values() if hasattr(f, "graph"))]
    ops = {op.type for g in graphs for op in g.get_operations()}
    table_reads = [op.name for g in graphs for op in g.get_operations()
                   if op.type == "ReadVariableOp" and "embedding" in op.name]
    return ops | {"table read whole"} if table_reads else ops, \
        type(strategy.experimental_local_results(gradient)[0]).__name__, \
        model.layers[0].embeddings.numpy()


def test_an_embedding_step_gathers_rows_from_the_variable_not_a_copy_of_the_table():
    """Fix embedding_rows_read_from_the_variable: the lookup gathers from the variable
    (ResourceGather), the same rows, gradient and update as Keras's take; upstream the step
    reads the whole table (ReadVariableOp) and gathers from the copy (GatherV2), which a sparse
    update of the table then makes TensorFlow copy whole (copy on write)."""
    patch = keras_seam.patch("embedding_rows_read_from_the_variable")
    keras_seam.install()
    assert patch.active
    fixed_ops, fixed_gradient, fixed_table = embedding_step_reads()
    patch.uninstall()
    try:
        upstream_ops, upstream_gradient, upstream_table = embedding_step_reads()
    finally:
        patch.install()
    assert "ResourceGather" in fixed_ops and "GatherV2" not in fixed_ops
    assert "GatherV2" in upstream_ops and "ResourceGather" not in upstream_ops
    assert "table read whole" not in fixed_ops and "table read whole" in upstream_ops
    assert fixed_gradient == upstream_gradient == "IndexedSlices"
    np.testing.assert_array_equal(fixed_table, upstream_table)
    assert np.abs(fixed_table - initial_table()).sum(axis=1).nonzero()[0].tolist() \
        == [1, 2, 5, 7, 999]


def test_a_replicas_embedding_step_gathers_rows_from_its_own_copy_of_the_table():
    """The same under a strategy: in a replica's step the table is a MirroredVariable, which
    tf.gather reads whole (then gathers from the copy) and whose Shape reads it whole too; the
    fix gathers from the replica's own copy (measured: a 2-worker recommender step of a
    500,000 x 64 table went from 38.6 to 18-20 ms, its input phase from 20 to 4 ms)."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    patch = keras_seam.patch("embedding_rows_read_from_the_variable")
    keras_seam.install()
    fixed_ops, fixed_gradient, fixed_table = embedding_step_reads(strategy=strategy)
    patch.uninstall()
    try:
        upstream_ops, _, upstream_table = embedding_step_reads(strategy=strategy)
    finally:
        patch.install()
    assert "ResourceGather" in fixed_ops and "GatherV2" not in fixed_ops, fixed_ops
    assert "table read whole" not in fixed_ops
    assert "GatherV2" in upstream_ops and "table read whole" in upstream_ops
    assert fixed_gradient == "IndexedSlices"
    np.testing.assert_array_equal(fixed_table, upstream_table)


def initial_table():
    """The table `embedding_step_reads` starts from."""
    keras.utils.set_random_seed(1)
    layer = keras.layers.Embedding(1000, 4)
    layer.build((None, 3))
    return layer.embeddings.numpy()


def test_a_sparse_update_with_repeated_indices_is_the_same_every_time_once_merged():
    """Fix sparse_updates_merged_under_replicas: TensorFlow's scatter_sub of rows with repeated
    indices sums them in a thread-dependent order (upstream: two of at most 40 identical updates
    differ); merged first (one row per index) the update is the same every time, and the same
    update up to rounding."""
    from kdist.keras_seam import fixes

    rng = np.random.default_rng(0)
    update = tf.IndexedSlices(tf.constant(rng.normal(size=(20480, 64)).astype("float32") * 1e-3),
                              tf.constant(rng.integers(0, 1000, 20480)), tf.constant([1000, 64]))
    start = rng.normal(size=(1000, 64)).astype("float32")

    def applied(value):
        variable = tf.Variable(start)
        variable.scatter_sub(value)
        return variable.numpy()

    first = applied(update)
    assert any(not np.array_equal(applied(update), first) for _ in range(40))  # upstream
    merged = fixes.merged_rows(update)
    once = applied(merged)
    assert all(np.array_equal(applied(merged), once) for _ in range(10))
    np.testing.assert_allclose(once, first, atol=1e-6)
    assert keras_seam.patch("sparse_updates_merged_under_replicas").targets


def test_the_patches_page_is_generated_from_the_registry():
    committed = open(os.path.join(ROOT, "docs", "patches.md"), encoding="utf-8").read()
    assert committed == page.render(), "run: python -m kdist.keras_seam.page > docs/patches.md"
    for patch in keras_seam.PATCHES:
        assert f"| `{patch.name}` | {patch.kind} |" in committed


def test_the_trainer_is_found_by_what_exists_not_by_name():
    """Keras 3.16 renamed TensorFlowTrainer to Trainer: the seam finds it in keras.Model's
    hierarchy by its module, and a Keras without one gets kdist's message, not an AttributeError."""
    assert classes.resolve("Trainer") in keras.Model.__mro__
    assert classes.resolve("Trainer").__module__ == "keras.src.backend.tensorflow.trainer"
    assert classes.resolve("BaseTrainer") in keras.Model.__mro__
    with pytest.raises(classes.SeamError, match="kdist cannot find the class of keras.src.nowhere"):
        classes._in_hierarchy(keras.Model, "keras.src.nowhere")


def test_the_trainer_is_found_in_a_keras_tensorflow_backend_package_too():
    """Keras's pluggable backends (keras-team/keras#23523) may move the TensorFlow trainer into a
    package of its own: a Model whose trainer comes from `keras_tensorflow.trainer` is found."""
    moved = type("Trainer", (), {"__module__": "keras_tensorflow.trainer"})
    model = type("Model", (moved,), {"__module__": "keras.src.models.model"})
    assert classes._in_hierarchy(model, *classes._tf_backend("trainer")) is moved
    assert classes._in_hierarchy(keras.Model, *classes._tf_backend("trainer")) is \
        classes.resolve("Trainer")


def _fake_distribution(folder, name: str, version: str) -> None:
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.parametrize("name,version,said", [
    ("keras", "3.17.0", "Keras 3.17.0 is outside the range kdist is tested with (Keras 3.5-3.16, "
                        "TensorFlow 2.17-2.22)"),
    ("keras", "3.4.1", "Keras 3.4.1 is outside the range"),
    ("tensorflow", "2.23.0", "TensorFlow 2.23.0 is outside the range"),
    ("keras", "3.15.1", None)])
def test_import_says_in_one_line_when_keras_or_tf_is_outside_the_tested_range(tmp_path, name,
                                                                              version, said):
    _fake_distribution(tmp_path, name, version)
    result = subprocess.run([sys.executable, "-c", "import kdist"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, **QUIET_TF,
                                             "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "outside the range" in line]
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1 and said in lines[0] and "kdist doctor" in lines[0], lines


def test_keras_nightly_is_read_as_keras():
    assert "keras-nightly" in versions.KERAS_DISTRIBUTIONS
    assert versions.version("3.16.0.dev2026102704") == (3, 16, 0)
    assert versions.in_range("3.16.0.dev2026102704", versions.KERAS_RANGE)
    assert versions.in_range("2.22.0rc0", versions.TF_RANGE)


# ------------------------------------------------------------------ one frozen options object
@pytest.mark.parametrize("given,expected", [
    ({"compression": "fp16"}, "FP16"), ({"compression": "bf16"}, "BF16"),
    ({"compression": "powersgd:4"}, "PowerSGD"), ({"compression": "topk:0.01"}, "TopK"),
    ({"compression": kdist.compression.PowerSGD(rank=2)}, "PowerSGD"),
    ({"compression": "none"}, "NoneType"), ({"compression": kdist.compression.NoCompression()},
                                             "NoneType")])
def test_compression_is_a_name_or_an_object(given, expected):
    options = TrainingOptions.parse(**given)
    assert type(options.compression).__name__ == expected


def test_training_options_are_frozen_and_bound_once_per_model():
    options = TrainingOptions.parse(compression="powersgd:2", balance=None, ps_sync="async")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.aggregate_every = 3
    from kdist import model_state as state

    with kdist.scope(compression="powersgd:2") as strategy:
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16)])
        model.compile("sgd", "mse")
    outside = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16)])
    outside.compile("sgd", "mse")
    assert state.of(model).options == options and state.of(outside).options == TrainingOptions()
    assert state.exchange_of(model) is not None and state.exchange_of(outside) is None
    assert state.exchange_of(model).compressor is not state.of(model).options.compression  # a copy
    assert strategy is kdist.current_strategy()


@pytest.mark.parametrize("arguments,words", [
    ({"ps_sync": "ksync:2"}, "ps_sync: 'ksync:2' is for ParameterServerStrategy"),
    ({"balance": [1, 2]}, "balance: [1, 2] gives 2 shares for 1 replica"),
    ({"balance": "measure", "aggregate_every": 2}, "balance: given with aggregate_every > 1"),
])
def test_training_options_are_validated_once_against_the_strategy(arguments, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        with kdist.scope(**arguments):
            pass


def test_the_scope_options_reach_compile_through_one_context_variable():
    from kdist.wiring import options as training_options

    assert training_options.active() == TrainingOptions()
    with kdist.scope(compression="bf16", aggregate_every=3):
        assert training_options.active() == TrainingOptions.parse(compression="bf16",
                                                                  aggregate_every=3)
    assert training_options.active() == TrainingOptions()


def test_a_finalised_function_asks_for_its_removal_unless_kdist_turned_it_off():
    """ps_chief_exits_after_a_lost_worker: upstream, a traced function's finalizer asks the
    runtime to remove it from every task it ran on (what hangs a TF 2.22 parameter-server chief
    at exit when a worker died: 1 of 3 runs of tests/programs/ps_job.py here). After kdist's exit
    handler, it no longer does. The patch installs on TF >= 2.22 only."""
    script = textwrap.dedent("""
        import sys, tensorflow as tf
        from tensorflow.python.eager import context
        from kdist.keras_seam import tf_internals
        removed = []
        removing = context.pywrap_tfe.TFE_ContextRemoveFunction  # what reaches the runtime
        context.pywrap_tfe.TFE_ContextRemoveFunction = \
            lambda handle, name: (removed.append(name), removing(handle, name))
        if sys.argv[1] == "kdist":
            tf_internals.skip_remote_function_removal()
        f = tf.function(lambda x: x + 1)
        f(tf.constant(1.0))
        del f
        import gc; gc.collect()
        g = tf.function(lambda x: x * 2)  # still traced and run afterwards
        print(float(g(tf.constant(2.0))), len(removed))
    """)
    counts = {}
    for mode in ("upstream", "kdist"):
        result = subprocess.run([sys.executable, "-c", script, mode], capture_output=True,
                                text=True, timeout=120, env={**os.environ, **QUIET_TF})
        assert result.returncode == 0, result.stderr[-2000:]
        counts[mode] = result.stdout.split()[-2:]
    assert counts["upstream"][0] == counts["kdist"][0] == "4.0"
    assert int(counts["upstream"][1]) > 0 and counts["kdist"][1] == "0"
    patch = keras_seam.patch("ps_chief_exits_after_a_lost_worker")
    assert patch.applies(keras.__version__, "2.22.0") and not patch.applies(keras.__version__,
                                                                             "2.21.0")
    assert patch.why_not_needed(keras.__version__, "2.21.0") == \
        "the bug came with TensorFlow 2.22.0"

