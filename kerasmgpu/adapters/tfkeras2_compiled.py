"""tf.keras 2.x / tf_keras: what a compile records beyond its arguments, and an
optimizer's slots (part of `tfkeras2`).

Verified on the releases `tfkeras2` names (tf.keras 2.12, 2.15 and tf_keras 2.16, 2.21
run here). What is read:

* `model._compiled_trainable_state`: a WeakKeyDictionary {layer: trainable} of each
  layer's flag at compile, which fit and train_on_batch restore around every step
  (`RespectCompiledTrainableState`) - what a model trains is what was trainable when it
  was compiled, whatever the flags are by then (`compiled_as`).
* A legacy optimizer's `_create_all_weights(var_list)` (`keras.optimizers.legacy`,
  OptimizerV2: what `import keras` gives as `keras.optimizers.Adam` on 2.12), which has
  no `build` (`build_optimizer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Iterator, List

from kerasmgpu.adapters.tfkeras2_losses import TfKeras2Losses


class TfKeras2Compiled(TfKeras2Losses):
    """`TfKeras2`'s compile records and optimizer slots (see the module doc)."""

    @contextlib.contextmanager
    def compiled_as(self, template: Any, replica: Any) -> Iterator[None]:
        # Each layer's flag at the template's compile is what it trains: a GAN's
        # discriminator compiled, then frozen to build the combined model, trains in its
        # own calls. The replica is compiled under those flags, then given its own back.
        recorded = getattr(template, "_compiled_trainable_state", None)
        ours, theirs = self.layers_of(template), self.layers_of(replica)
        if not isinstance(recorded, Mapping) or len(ours) != len(theirs):
            yield
            return
        now = [bool(layer.trainable) for layer in theirs]
        for layer, copy in zip(ours, theirs):  # outer layers first: setting one sets its inner
            if layer in recorded and bool(copy.trainable) != bool(recorded[layer]):
                copy.trainable = recorded[layer]
        try:
            yield
        finally:
            for copy, flag in zip(theirs, now):
                if bool(copy.trainable) != flag:
                    copy.trainable = flag

    def build_optimizer(self, optimizer: Any, variables: List[Any]) -> None:
        # A legacy optimizer's `_create_all_weights` makes each slot once, as `build`.
        if callable(getattr(optimizer, "build", None)):
            optimizer.build(variables)
            return
        create = getattr(optimizer, "_create_all_weights", None)
        if callable(create):
            create(variables)
