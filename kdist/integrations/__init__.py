"""kdist inside the engines users already run. Each module imports its engine only when used, so
`import kdist` never imports them; install the engine with its extra (``pip install ".[ray]"``).

- `kdist.integrations.ray`: Ray Train's `TensorflowTrainer` (metrics, checkpoints and resume).
"""
