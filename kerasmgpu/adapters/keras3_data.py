"""Keras 3's own data rules, as data/ asks for them (every backend alike).

Verified on the releases of `env.versions.KERAS3_VERIFIED` (3.3 - 3.15). Read from
`keras.src.trainers.data_adapters`: `data_adapter_utils.class_weight_to_sample_weights`
and `tf_dataset_adapter.make_class_weight_map_fn`, Keras's own `class_weight` rule;
`generator_data_adapter.peek_and_restore` and `NUM_BATCHES_FOR_TENSOR_SPEC`, the
batches every new iterator of a generator starts with (`generator_replays`). A Python
source is handed to Keras as a public `keras.utils.PyDataset` (`python_dataset`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters.base import Adapter, class_weight_error
from kerasmgpu.adapters.python_dataset import batches_class


class Keras3Data(Adapter):
    """The data part of the Keras 3 adapter (`keras3.Keras3`): weights, generators and
    the PyDataset a Python source becomes."""

    def _data_adapters(self, name: str) -> Any:
        try:
            return importlib.import_module(f"keras.src.trainers.data_adapters.{name}")
        except ImportError as exc:
            raise self.fail(f"`keras.src.trainers.data_adapters.{name}` is missing",
                            "Keras's class_weight rule") from exc

    def check_sample_weight_structure(self, y: Any, sample_weight: Any) -> None:
        # Keras 3 (3.3 - 3.15, `ArrayDataAdapter`): a list, tuple or dict of sample
        # weights must have the structure of the targets (one array per output).
        if not isinstance(sample_weight, (list, tuple, dict)):
            return
        try:
            self.keras.tree.assert_same_structure(y, sample_weight)
        except (ValueError, TypeError) as exc:
            shown = (sorted(sample_weight) if isinstance(sample_weight, dict)
                     else f"{len(sample_weight)} arrays")
            raise bad_value(
                "sample_weight", f"weights for {shown}",
                "one sample_weight array per output in y, in y's structure (Keras 3 refuses "
                "others)", "give every output a weight (ones where it has none)",
                raw=True) from exc

    def generator_replays(self) -> int:
        # Keras 3.4+ (`generator_data_adapter.peek_and_restore` returns a function; 3.3
        # returns one chain): every iterator Keras makes of a generator's dataset starts
        # with the first `NUM_BATCHES_FOR_TENSOR_SPEC` batches it peeked, then reads on
        # (checked in the sources of 3.3, 3.10, 3.12 and 3.15; measured on 3.15).
        adapter = self._data_adapters("generator_data_adapter")
        peek = getattr(adapter, "peek_and_restore", None)
        count = getattr(self._data_adapters("data_adapter_utils"),
                        "NUM_BATCHES_FOR_TENSOR_SPEC", None)
        if peek is None or not isinstance(count, int):
            raise self.fail("`peek_and_restore` or `NUM_BATCHES_FOR_TENSOR_SPEC` is missing",
                            "how Keras reads a generator again")
        _, restore = peek(iter(()))
        return count if callable(restore) else 0

    def class_weigher(self, class_weight: Any, kind: str
                      ) -> Optional[Callable[[Any, Any], Any]]:
        # Keras 3 (3.3 - 3.15): `class_weight_to_sample_weights` gives a class the dict
        # does not list weight 1; arrays and PyDatasets refuse sample weights beside it,
        # arrays a nested target; generators refuse class_weight (`get_data_adapter`).
        if class_weight is None:
            return None
        if kind == "generator":
            raise class_weight_error(
                class_weight, "arrays, a tf.data.Dataset or a PyDataset: Keras 3 takes no "
                "class_weight with a Python generator",
                "yield (x, y, sample_weight) batches, or read the data through a "
                "keras.utils.PyDataset")
        to_weights = getattr(self._data_adapters("data_adapter_utils"),
                             "class_weight_to_sample_weights", None)
        if to_weights is None:
            raise self.fail("`class_weight_to_sample_weights` is missing", "class_weight")

        def weigh(y: Any, sample_weight: Any) -> Any:
            if sample_weight is not None:
                raise class_weight_error(
                    class_weight, "`class_weight` or `sample_weight`, not both (Keras 3 "
                    "refuses both at once)", "fold the class weights into `sample_weight`")
            if kind == "arrays" and isinstance(y, (list, tuple, dict)):
                raise class_weight_error(
                    class_weight, "a model with a single output (one target array)",
                    "weight each output's samples with `sample_weight` instead")
            return to_weights(y, class_weight)

        return weigh

    def class_weight_map_fn(self, class_weight: Any) -> Optional[Callable[..., Any]]:
        if class_weight is None:
            return None
        make = getattr(self._data_adapters("tf_dataset_adapter"), "make_class_weight_map_fn",
                       None)
        if make is None:
            raise self.fail("`make_class_weight_map_fn` is missing", "class_weight")
        map_fn: Callable[..., Any] = make(class_weight)
        return map_fn

    # --- Python sources (data.arrays, data.python) ------------------------------------------

    def python_dataset(self, source: Any, workers: int = 1, use_multiprocessing: bool = False,
                       max_queue_size: int = 10) -> Any:
        """`source` as a `keras.utils.PyDataset` (public since 3.0) read with these options."""
        return batches_class(self.keras.utils.PyDataset)(
            source, workers=workers, use_multiprocessing=use_multiprocessing,
            max_queue_size=max_queue_size)

    # Keras 3's steps take Python batches one at a time (see `Adapter`).
    even_batches_run_plain = True
