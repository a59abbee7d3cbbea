"""Property tests of the one batching rule: every (B, N) and every dataset size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasmgpu import batching

pytestmark = [pytest.mark.core, pytest.mark.pure]

sizes = st.integers(min_value=1, max_value=600)
replicas = st.integers(min_value=1, max_value=16)


@given(real=sizes, n=replicas)
def test_plan_pads_to_an_even_split(real: int, n: int) -> None:
    plan = batching.plan_batch(real, n)
    assert plan.padded % n == 0
    assert real <= plan.padded < real + n  # never more than N-1 padding rows
    assert plan.per_replica * n == plan.padded
    assert plan.per_replica >= 1  # every replica gets rows, even when real < n
    slices = plan.replica_slices()
    assert [s.stop - s.start for s in slices] == [plan.per_replica] * n
    assert sum(plan.real_rows_per_replica()) == real


@given(real=sizes, n=replicas, whole=st.booleans())
def test_padding_repeats_real_rows_and_is_masked(real: int, n: int, whole: bool) -> None:
    plan = batching.plan_batch(real, n, whole)
    rows = plan.source_rows()
    assert list(rows[:real]) == list(range(real))  # real rows first, in order
    assert rows.min() >= 0 and rows.max() < real  # padding copies real rows
    mask = plan.mask()
    assert mask.sum() == real and set(mask[real:].tolist()) <= {0.0}


@given(real=sizes, n=replicas, whole=st.booleans(), data=st.data())
def test_packed_weights_give_the_real_mean(real: int, n: int, whole: bool,
                                           data: st.DataObject) -> None:
    """sum(scale*mask*w*l) / padded == sum(w*l) / real: the padded mean is the real one."""
    plan = batching.plan_batch(real, n, whole)
    weights = np.asarray(
        data.draw(st.lists(st.floats(0, 4, width=32), min_size=real, max_size=real)), "float32"
    )
    losses = np.asarray(
        data.draw(st.lists(st.floats(0, 10, width=32), min_size=real, max_size=real)), "float64"
    )
    fed_losses = losses[plan.source_rows()]
    loss_weight = batching.loss_weights(plan, weights)
    padded_mean = float((loss_weight * fed_losses).sum()) / plan.padded
    real_mean = float((weights * losses).sum()) / real
    assert padded_mean == pytest.approx(real_mean, rel=1e-5, abs=1e-6)
    # The tracker correction: fed rows / scale counts the step by its `real` rows.
    packed = batching.pack_weights(plan)
    assert plan.padded / packed[0, batching.SCALE] == pytest.approx(real)
    assert packed[:, batching.MASK].sum() == real


@given(real=sizes, n=replicas)
def test_a_whole_plan_gives_every_replica_the_whole_batch(real: int, n: int) -> None:
    """BatchPlan.whole: a batch that does not divide reaches every replica whole, in
    order, only the first replica's copy unmasked; one that divides is split as ever."""
    plan, even = batching.plan_batch(real, n, whole=True), batching.plan_batch(real, n)
    if real % n == 0:
        assert plan.padded == even.padded == real and plan.per_replica == real // n
        return
    assert plan.padded == real * n and plan.per_replica == real
    rows, mask = plan.source_rows(), plan.mask()
    for replica, part in enumerate(plan.replica_slices()):
        assert list(rows[part]) == list(range(real))
        assert set(mask[part].tolist()) == {1.0 if replica == 0 else 0.0}
    assert plan.real_rows_per_replica() == [real] + [0] * (n - 1)
    assert "whole batch on every replica" in plan.describe()
    # In a job of several processes each process feeds its replicas' copies.
    shares = [batching.shard(real, 1, p, n, whole=True) for p in range(n)]
    assert [list(share.source_rows()) for share in shares] == [list(range(real))] * n
    assert [share.packed()[:, batching.MASK].sum() for share in shares] == [real] + [0] * (n - 1)


@given(real=sizes, n=replicas)
def test_a_replicated_plan_feeds_the_batch_once_to_every_device(real: int, n: int) -> None:
    """BatchPlan.whole without copies (one program): a batch that does not divide is fed
    once, unpadded, every device all of it, every row unmasked at scale 1; one that
    divides is split as ever."""
    plan = batching.plan_batch(real, n, whole=True, copies=False)
    if real % n == 0:
        assert not plan.replicated and plan.padded == real and plan.per_replica == real // n
        return
    assert plan.replicated and plan.padded == real and plan.pad == 0
    assert plan.replica_slices() == [slice(0, real)] * n
    assert list(plan.source_rows()) == list(range(real))
    packed = batching.pack_weights(plan)
    assert set(packed[:, batching.MASK].tolist()) == {1.0}
    assert set(packed[:, batching.SCALE].tolist()) == {1.0}
    assert "laid out replicated" in plan.describe()
    share = batching.shard(real, n, 0, 1, whole=True, copies=False)
    assert list(share.source_rows()) == list(range(real))


@given(samples=st.integers(0, 2000), batch=st.integers(1, 300), n=replicas)
@settings(max_examples=200)
def test_an_epoch_covers_every_sample_once(samples: int, batch: int, n: int) -> None:
    sizes_ = batching.batch_sizes(samples, batch)
    assert sum(sizes_) == samples
    assert len(sizes_) == batching.steps_per_epoch(samples, batch)
    assert all(s == batch for s in sizes_[:-1])
    # What the feeds do: fed rows copy `source_rows()`, the packed mask keeps the real ones.
    seen, start = [], 0
    for size in sizes_:
        share = batching.Planner(n).plan(size)
        rows, mask = share.source_rows(), share.packed()[:, batching.MASK]
        assert len(rows) % n == 0  # an even split over the replicas
        seen.extend((start + rows[mask > 0]).tolist())
        start += size
    assert sorted(seen) == list(range(samples))  # nothing dropped, nothing counted twice


@given(samples=st.integers(1, 1500), batch=st.integers(1, 200),
       per_process=st.integers(1, 4), processes=st.integers(1, 4))
@settings(max_examples=150)
def test_process_shards_are_disjoint_and_even(
    samples: int, batch: int, per_process: int, processes: int
) -> None:
    steps = None
    seen = []
    for rank in range(processes):
        shards = batching.epoch_shards(samples, batch, per_process, rank, processes)
        steps = len(shards) if steps is None else steps
        assert len(shards) == steps  # every process takes the same number of steps
        for start, shard in shards:
            rows = shard.source_rows()
            assert len(rows) == shard.plan.padded // processes  # same rows per process
            mask = shard.packed()[:, batching.MASK]
            seen.extend((start + rows[mask > 0]).tolist())
    assert sorted(seen) == list(range(samples))  # disjoint and complete


def test_validation_split_follows_keras() -> None:
    assert batching.validation_split_at(1001, 0.2) == 800
    with pytest.raises(ValueError, match="validation_split"):
        batching.validation_split_at(10, 1.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_counts_are_explained(bad: object) -> None:
    with pytest.raises(ValueError, match="Allowed: an integer >= 1"):
        batching.plan_batch(5, bad)  # type: ignore[arg-type]


def test_describe_says_what_happens() -> None:
    text = batching.plan_batch(50, 3).describe()
    assert "51" not in text or "padding" in text
    assert "3 replicas x 17 rows" in text and "1 padding row" in text


@given(st.integers(1, 500), st.integers(1, 8))
def test_keras23_slices_cover_the_batch_unpadded(real: int, n: int) -> None:
    # Keras 2.3's get_slice: `real // n` rows each, the last replica the rest.
    sizes = batching.sliced_rows(real, n)
    assert len(sizes) == n and sum(sizes) == real
    assert sizes[:-1] == [real // n] * (n - 1) and sizes[-1] >= sizes[0]


def test_describe_split_says_what_the_route_does() -> None:
    assert batching.describe_split(50, 3) == batching.plan_batch(50, 3).describe()
    sliced = batching.describe_split(50, 3, padded=False)
    assert "[16, 16, 18]" in sliced and "last replica takes the remainder" in sliced
    assert "padding" not in sliced
    assert "remainder" not in batching.describe_split(51, 3, padded=False)


def test_planner_refuses_replicas_that_processes_cannot_share() -> None:
    with pytest.raises(ValueError, match="3 replicas cannot be split evenly over 2 processes"):
        batching.Planner(3, 0, 2)
    planner = batching.Planner(4, 1, 2)
    assert planner.replicas_per_process == 2
    share = planner.plan(7)  # 7 rows over 4 replicas: 8 fed, this process feeds 4
    assert (share.plan.replicas, share.rows) == (4, slice(4, 8))
