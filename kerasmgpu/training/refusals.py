"""The refusals of compile losses and metrics that the engine cannot compute as one
device does: functions of one value per batch (`adapters.metric_values`), the user's
metrics whose state is not a sum over rows (`adapters.metric_states`) and values added
with `add_metric` that are not a mean over the rows (`training.added_metrics`), where
each replica runs its own step. Raised before any weight moves (`ParallelState.
tell_batch_metrics`), or at the first step that tells them (`steps.masked_update`)."""

from __future__ import annotations

from typing import List

from kerasmgpu._errors import bad_value


def one_value_refused(found: List[str], one_program: bool, argument: str = "metrics"
                      ) -> ValueError:
    """The refusal of compile metrics (or losses: `argument`) whose value for a batch is
    one number (`found`, in words) where the engine cannot compute them over the whole
    batch."""
    if argument == "loss":
        return bad_value(
            "loss", ", ".join(found), "losses of one value per row, where each replica runs "
            "its own step (TensorFlow, PyTorch): a loss of the whole batch computed over "
            "each replica's share is another loss and gradient than one device's (Keras 3 "
            "on TensorFlow reported 3x one device's loss), and no padding row's weight "
            "reaches inside one value; Keras 3 on JAX computes it over the global batch",
            "reduce over the last axis only (`keras.ops.mean(..., axis=-1)` or "
            "`K.mean(..., axis=-1)`): Keras then averages the rows, which for a mean is the "
            "same loss; or train with Keras 3 on JAX", raw=True)
    if one_program:  # found only once a padded batch was traced (no declared outputs)
        allowed = ("such a metric on a model whose outputs are declared (a functional model, "
                   "or one called once before parallelize()): a batch that does not "
                   "divide then goes whole, and no padding row counts in it")
        fix = ("build the model before parallelize(), or use batch sizes and row counts "
               "that divide by the replicas")
    else:
        allowed = ("metrics of one value per row (Keras averages them over the rows) or "
                   "Metric classes whose state is a sum over rows, where each replica runs "
                   "its own step (TensorFlow, PyTorch): a function of the whole batch - a "
                   "square root of a mean, a maximum - computed over each replica's share "
                   "and averaged is not one device's (plain MirroredStrategy averages the "
                   "replicas' values); Keras 3 on JAX computes it over the global batch")
        fix = ("return one value per row (e.g. `keras.ops.mean(..., axis=-1)`), or use "
               "Keras's metric class (`keras.metrics.RootMeanSquaredError()` for an RMSE, "
               "over every row of the epoch), or train with Keras 3 on JAX")
    return bad_value("metrics", ", ".join(found), allowed, fix, raw=True)


def unsummed_refused(found: List[str]) -> ValueError:
    """The refusal of the user's metrics whose state is not a sum over rows (`found`, in
    words: `adapters.metric_states`) where each replica runs its own step."""
    return bad_value(
        "metrics", ", ".join(found), "metrics whose state variables are sums over rows "
        "(totals, counts - as every Keras metric keeps), where each replica runs its own "
        "step (TensorFlow, PyTorch): the replicas' states are summed before the result is "
        "read, and a sum of states that are not sums - a running maximum, a value per batch "
        "- is not one device's state (a maximum read 2.5x one device's); Keras 3 on JAX "
        "updates a metric once per global batch",
        "keep sums over rows in the metric's variables and compute the rest in result() "
        "(a mean: a total and a count), or compute such a figure after fit() with "
        "predict(), or train with Keras 3 on JAX", raw=True)


def not_a_mean_refused(found: List[str]) -> ValueError:
    """The refusal of values a layer adds with `add_metric` that are not a mean over the
    rows (`found`, in words: `training.added_metrics`) where each replica runs its own
    step."""
    return bad_value(
        "model", ", ".join(found) + " (not a mean over the rows)",
        "add_metric values that are means over the rows, where each replica runs its own "
        "step (tf.keras, tf_keras): each replica computes the value over its share of the "
        "batch and the replicas' values are averaged, which is one device's value for a "
        "mean over the rows only (a maximum read 0.83 where one device's was 0.87)",
        "add a mean over the rows (`tf.reduce_mean(...)`), compute the figure after fit() "
        "with predict() or in a callback, or train with Keras 3 on JAX, where one program "
        "computes the global batch", raw=True)
