"""Compression measured on the wire: 2 real MultiWorkerMirrored workers on loopback.

tests/programs/wire_job.py reads the loopback byte counter around training steps of the
784-1024-1024-10 MLP for each compressor, and trains each on the UCI digits for the same epochs
(deterministic: no shuffling, same seed).
"""

import json
import sys

import pytest

from conftest import run_kdist

TARGETS = {"fp16": 1.95, "powersgd_r4": 50.0, "topk_1pct": 30.0}  # times fewer bytes than none
# Test accuracy points each may lose against none after the same 8 epochs. TopK's sparse steps
# take another path on each CPU: 0.9583 against 0.9556 with AVX-512, 0.9389 against 0.9556
# without (the other two matched none on both).
POINTS_LOST = {"fp16": 0.01, "powersgd_r4": 0.01, "topk_1pct": 0.02}


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    out = tmp_path_factory.mktemp("wire")
    # In a network namespace of its own: the loopback counter then counts this job's bytes only.
    # 6 measured steps: the bytes a fit sends once (its epoch's end) are shared by more steps (over
    # 3 steps, uncompressed traffic measured 1.005 and once, in CI, 1.028 times the ring bound)
    result = run_kdist(["launch", "--workers", "2", "--timeout", "500", "--private-network", "--",
                        sys.executable, "tests/programs/wire_job.py", str(out), "6", "8"], timeout=540)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    return dict(json.load(open(out / "wire.json")), output=result.stdout + result.stderr)


def test_uncompressed_traffic_is_a_ring_all_reduce(wire):
    assert wire["parameters"] == 1_863_690
    ratio = wire["results"]["none"]["bytes_per_step"] / wire["ring_lower_bound_bytes"]
    assert 1.0 <= ratio <= 1.02  # the ring bound plus gRPC framing: the README's goal


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_compressors_send_fewer_bytes_than_targeted(wire, name):
    reduction = wire["results"]["none"]["bytes_per_step"] / wire["results"][name]["bytes_per_step"]
    assert reduction >= TARGETS[name], f"{name}: {reduction:.1f}x"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_accuracy_close_to_uncompressed(wire, name):
    baseline = wire["results"]["none"]["digits_accuracy"]
    assert baseline > 0.93
    assert wire["results"][name]["digits_accuracy"] >= baseline - POINTS_LOST[name]


def test_each_worker_hears_that_compression_saves_little_on_one_host(wire):
    """Both workers are on 127.0.0.1: each compressing scope (the job enters two per compressor)
    says on each worker that compression saves little there, and how to weigh it for a real
    link; the uncompressed scopes say nothing."""
    for name in ("FP16", "PowerSGD", "TopK"):
        said = [line for line in wire["output"].splitlines()
                if f"kdist: compression {name} with every replica on one host (127.0.0.1)" in line]
        assert len(said) == 4, (name, wire["output"][-3000:])
        assert all("kdist plan --compression" in line for line in said)
        assert {line.partition("]")[0][-1] for line in said} == {"0", "1"}  # [worker-0], -1
    assert wire["output"].count("with every replica on one host") == 12
