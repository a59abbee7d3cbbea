"""The class Keras reads a Python source of batches through: `keras.utils.PyDataset`
(Keras 3) or `keras.utils.Sequence` (the Keras 2 lines), as each adapter's
`python_dataset` makes it. data/ hands over a plain object (a length, batches by index,
maybe `on_epoch_end`) and never names the Keras base class.
"""

from __future__ import annotations

from typing import Any, Dict


class SourceBatches:
    """What Keras reads of a Python source of batches, mixed into the line's own base
    class by `batches_class`: the source's length, its batches by index, its epoch end."""

    def __init__(self, source: Any, **reader: Any) -> None:
        self.source = source
        super().__init__(**reader)  # PyDataset's reader options; Sequence takes none

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return self.source[index]

    def on_epoch_end(self) -> None:
        if hasattr(self.source, "on_epoch_end"):
            self.source.on_epoch_end()


_BATCHES_CLASSES: Dict[type, type] = {}


def batches_class(base: type) -> type:
    """`SourceBatches` on `base` (`keras.utils.PyDataset` or `Sequence`), one class per
    base: Keras reads an instance as its own kind of dataset."""
    made = _BATCHES_CLASSES.get(base)
    if made is None:
        made = type("SourceBatches", (SourceBatches, base), {"__module__": __name__})
        _BATCHES_CLASSES[base] = made
    return made
