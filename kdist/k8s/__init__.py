"""Kubernetes: manifests from a cluster-spec file (`render`; JobSet and Kubeflow Trainer v2 in
`jobset`; what is restarted in `restarts`), TF_CONFIG in a pod (`pod`, for `kdist exec`), and a
rehearsal of the rendered pods on this machine (`simulate`, over `netlab`'s emulated hosts).

No TensorFlow import here.

>>> from kdist.k8s import render
>>> render.host("demo", "worker", 1, "ml")
'demo-worker-1.demo.ml.svc'
"""
