"""`kdist plan`: the step-time model max(t1, t2) / t1 + t2 turned into numbers for your model.

With n replicas each computing a per-replica batch b in time t1 (measured here, on this machine)
and exchanging the gradients in time t2 (computed: a ring all-reduce sends 2(n-1)/n of the
gradient bytes per worker in 2(n-1) messages; a compressor shrinks the bytes; top-k all-gathers;
each byte also costs the host's CPU the time a real all-reduce on this machine's loopback takes
per byte, measured by `measure_host_cost`; a compressor's own CPU time, compressing, summing
and decompressing, measured by `measure_compression`, adds to t1), one synchronous step costs

    t1 + t2        when the exchange starts after the backward pass (Keras + tf.distribute: the
                   optimizer all-reduces the finished gradients; the default, as measured by
                   benchmarks/planner_validation.py), or
    max(t1, t2)    with perfect overlap of computation and communication (``overlap=True``).

Throughput is n b / step and scaling efficiency t1 / step. The recommendation is the classic
trade-off: a batch large enough that the step is not spent communicating (t1 >= t2) or on per-step
overhead, and no larger than convergence needs. Concretely, the smallest measured per-replica batch
whose throughput is within 10% of the best measured (`NEAR_BEST`), at most `max_global_batch`
(the largest global batch your model still converges at, when you know it), with the linear
learning-rate scaling (plus warm-up) that goes with its global batch. Each t1 is the best of several
timings; their spread is reported, and a t1 that falls as the batch grows is named (noise, or a
per-step cost that hides the compute).

    kdist plan --model examples/plan_model.py:mlp --per-replica-batch 64 \\
        --replicas 8 --bandwidth 1Gbit --latency 50us --compression powersgd:4

One module per concern: `units` (what the command line reads), `user_model` (loading the user's
model), `measure` (t1 and the host cost, on this machine), `cost_model` (t2, the step, the
recommendation), `planning` (all of it for a range of batches, and the plot).
"""

from kdist.planner.cost_model import (NEAR_BEST, CompressionCost, Estimate, Plan,
                                      communication_time, estimate, gradient_bytes, recommend,
                                      wire_bytes)
from kdist.planner.measure import (measure_compression, measure_compute, measure_compute_time,
                                   measure_host_cost)
from kdist.planner.planning import plan, plot
from kdist.planner.units import (parse_bandwidth, parse_compression, parse_host_cost,
                                 parse_latency)
from kdist.planner.user_model import load_model_function

__all__ = ["NEAR_BEST", "CompressionCost", "Estimate", "Plan", "communication_time", "estimate",
           "gradient_bytes", "load_model_function", "measure_compression", "measure_compute",
           "measure_compute_time", "measure_host_cost",
           "parse_bandwidth", "parse_compression", "parse_host_cost", "parse_latency", "plan",
           "plot", "recommend", "wire_bytes"]
