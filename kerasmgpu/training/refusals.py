"""The refusals of compile losses and metrics that the engine cannot compute as one
device does: functions of one value per batch (`adapters.metric_values`), the user's
metrics whose state is not a sum over rows (`adapters.metric_states`), values added with
`add_metric` that are not a mean over the rows and variables a layer assigns in its step
that do not combine over replicas (`training.tried_layers`), where each replica runs its
own step. Raised before any weight moves (`ParallelState.
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
            "loss", ", ".join(found), "losses whose value for a row is computed from that "
            "row alone, where each replica runs its own step (TensorFlow, PyTorch): a loss "
            "of the whole batch - one value for it, or rows compared with the batch's other "
            "rows (in-batch negatives, a batch statistic) - computed over each replica's "
            "share is another loss and gradient than one device's (Keras 3 on TensorFlow "
            "reported 3x one device's loss), and no padding row's weight reaches inside "
            "one value; Keras 3 on JAX computes it over the global batch",
            "reduce over the last axis only (`keras.ops.mean(..., axis=-1)` or "
            "`K.mean(..., axis=-1)`): Keras then averages the rows, which for a mean is the "
            "same loss; a loss that compares rows needs them all: train it with Keras 3 on "
            "JAX, or on one device (gpus=1)", raw=True)
    if one_program:  # found only once a padded batch was traced (no declared outputs)
        allowed = ("such a metric on a model whose outputs are declared (a functional model, "
                   "or one called once before parallelize()): a batch that does not "
                   "divide then goes whole, and no padding row counts in it")
        fix = ("build the model before parallelize(), or use batch sizes and row counts "
               "that divide by the replicas")
    else:
        allowed = ("metrics of one value per row, each computed from its row alone "
                   "(Keras averages them over the rows), or Metric classes whose state is a "
                   "sum over rows, where each replica runs its own step (TensorFlow, "
                   "PyTorch): a function of the whole batch - a square root of a mean, a "
                   "maximum, rows compared with each other - computed over each replica's "
                   "share and averaged is not one device's (plain MirroredStrategy averages "
                   "the replicas' values); Keras 3 on JAX computes it over the global batch")
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


def not_a_mean_refused(found: List[str], what: str = "add_metric") -> ValueError:
    """The refusal of values a layer adds with `add_metric` (or terms with `add_loss`:
    `what`) that are not a mean over the rows (`found`, in words: `training.
    tried_layers`) where each replica runs its own step."""
    if what == "add_loss":
        return bad_value(
            "model", ", ".join(found) + " (a term that is not a mean over the rows)",
            "add_loss terms that are means over the rows, where each replica runs its own "
            "step (TensorFlow, PyTorch): each replica adds its term over its share of the "
            "batch and the replicas' losses are averaged, which is one device's term for "
            "a mean over the rows only (a sum over them: a third of one device's on 3 "
            "replicas)", "divide the term by the batch's rows (a mean: `keras.ops.mean`), "
            "or train with Keras 3 on JAX, where one program computes the global batch",
            raw=True)
    return bad_value(
        "model", ", ".join(found) + " (not a mean over the rows)",
        "add_metric values that are means over the rows, where each replica runs its own "
        "step (tf.keras, tf_keras): each replica computes the value over its share of the "
        "batch and the replicas' values are averaged, which is one device's value for a "
        "mean over the rows only (a maximum read 0.83 where one device's was 0.87)",
        "add a mean over the rows (`tf.reduce_mean(...)`), compute the figure after fit() "
        "with predict() or in a callback, or train with Keras 3 on JAX, where one program "
        "computes the global batch", raw=True)


def assigned_refused(found: List[str], combined: bool) -> ValueError:
    """The refusal of variables a layer's `call` assigns (`found`, in words:
    `training.tried_layers`) where the replicas' updates do not make one device's:
    `combined` - TensorFlow combines them, but these do not combine into the whole
    batch's; else each process keeps its own (torch)."""
    if combined:
        received = ", ".join(found) + " (updated otherwise from a share of the rows)"
        allowed = ("variables a layer assigns in its step that combine over replicas as "
                   "one device's update, where each replica runs its own step "
                   "(TensorFlow): each replica updates them from its share of the batch "
                   "and TensorFlow combines the replicas' values by the variable's "
                   "aggregation (their mean or sum where it says so; with none, Keras's "
                   "default, each keeps its own and the first's is read) - one device's "
                   "update for a moving average of a mean over the rows aggregated by the "
                   "mean, not for a count of rows (a third of one device's on 3 replicas; "
                   "aggregated by the sum, counted once per replica where a batch that "
                   "does not divide goes whole to each) or a maximum")
    else:
        received = ", ".join(found)
        allowed = ("no variable assigned in a layer's step where each process runs its "
                   "own (PyTorch): each process would update its own from its share, and "
                   "rank 0's is kept at each epoch's end")
    return bad_value(
        "model", received, allowed,
        "train with Keras 3 on JAX (one program over the global batch: exact), update "
        "such state outside the step (a callback), or on TensorFlow keep it a moving "
        "average of a mean over the rows made with `add_weight(..., aggregation=\"mean\")`"
        , raw=True)


def mixed_rows_refused(found: List[str], where: str = "TensorFlow, PyTorch"
                       ) -> ValueError:
    """The refusal of layers whose output for a row is read from the batch's other rows
    too (`found`, in words: `training.tried_layers.mixed_rows`) where each replica runs
    its own step (`where`)."""
    return bad_value(
        "model", ", ".join(found), "layers whose output for a row is computed from that "
        f"row alone, where each replica runs its own step ({where}): a layer "
        "reading the batch's other rows (a batch mean or standard deviation, minibatch "
        "discrimination, rows compared with each other) sees only its replica's share "
        "there, and computes other outputs than one device (5e-2 off in weights on 3 "
        "replicas); Keras 3 on JAX computes it over the global batch",
        "compute each row's output from its row alone, or train with Keras 3 on JAX or on "
        "one device (gpus=1); a normalisation over the batch is keras.layers."
        "BatchNormalization, synchronized over the replicas (sync_batchnorm=True)",
        raw=True)

