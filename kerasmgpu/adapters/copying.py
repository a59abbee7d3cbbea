"""How an adapter copies a model: the part of `adapters.base.Adapter` that makes the
structural copy kerasmgpu trains (`clone_model`), carries what a layer's config misses
(`layer_state`), and explains a model that cannot be copied.

A mixin of `Adapter`, in a module of its own for length: each Keras line's adapter
overrides `copy_layer`, `build_like` and `layers_of` where its Keras differs.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, ContextManager, List, Optional, Tuple

from kerasmgpu._errors import bad_type, bad_value


def _is_graph_model(model: Any) -> bool:
    """A Sequential or functional model (Keras 3 and tf.keras name their classes so)."""
    return any(cls.__name__ in ("Functional", "Sequential") for cls in type(model).__mro__)


class ModelCopying:
    """`Adapter`'s model copying (see the module doc)."""

    keras: ModuleType

    def layers_of(self, model: Any) -> List[Any]:  # Adapter's own comes first
        raise NotImplementedError

    def clone_model(self, model: Any) -> Any:
        """A structural copy of `model` (weights are copied by the caller; what its
        layers hold besides, `carry_state`)."""
        graph = _is_graph_model(model)
        try:
            if graph:
                # Each layer rebuilt from its config, then given the plain attributes
                # the config misses, before it is called on the copy's graph: an
                # adapted Discretization's bins decide the shapes after it.
                clone = self.keras.models.clone_model(model, clone_function=self._copy_of)
            else:
                clone = self.keras.models.clone_model(model)
            if len(clone.weights) != len(model.weights) and model.weights:
                self.build_like(clone, model)
            if len(clone.weights) != len(model.weights):
                raise ValueError(
                    f"the copy has {len(clone.weights)} weights, the model {len(model.weights)}"
                )
        except (NotImplementedError, TypeError, ValueError, AttributeError) as exc:
            raise self._uncopiable(model, graph, exc) from exc
        # Imported here, not at the top: layer_state needs numpy, and the package's
        # __init__ runs for `kerasmgpu migrate` too (adapters.keras23_names), which runs
        # where only libcst is installed.
        from kerasmgpu.adapters import layer_state

        for layer, copy in self.layer_pairs(model, clone):
            layer_state.carry_attributes(layer, copy)
        return clone

    def _copy_of(self, layer: Any) -> Any:
        from kerasmgpu.adapters import layer_state  # numpy: see clone_model

        if _is_graph_model(layer):
            # A nested Sequential or functional model is copied as the model is, layer by
            # layer: its from_config looks its layers' classes up by name, and a layer
            # class of the user's that is not registered (most are not) is not found -
            # such a model was refused as one that cannot be rebuilt.
            return self.clone_model(layer)
        copy = self.copy_layer(layer)
        layer_state.carry_attributes(layer, copy)
        return copy

    def copy_layer(self, layer: Any) -> Any:
        """A new layer like `layer`, from its config (Keras's own default)."""
        return layer.__class__.from_config(layer.get_config())

    def layer_pairs(self, model: Any, clone: Any) -> List[Tuple[Any, Any]]:
        """Each layer of `model` with its counterpart in `clone` (by position, where
        both are of one class and name)."""
        pairs = list(zip(self.layers_of(model), self.layers_of(clone)))
        return [(a, b) for a, b in pairs
                if type(a) is type(b) and getattr(a, "name", None) == getattr(b, "name", None)]

    def carry_state(self, model: Any, clone: Any) -> None:
        """After the copy took `model`'s weights: what its adapted preprocessing layers
        hold besides (derived tensors, vocabularies), as Keras's saving restores it; then
        refuses a copy whose layer of the user's own class holds a function otherwise
        than the model's (`layer_state.not_carried`): it would train silently with the
        copy's."""
        from kerasmgpu.adapters import layer_state  # numpy: see clone_model

        pairs = self.layer_pairs(model, clone)
        layer_state.carry_adapted([(a, b) for a, b in pairs if layer_state.adaptable(a)])
        for layer, copy in pairs:
            missed = layer_state.not_carried(layer, copy)
            if missed:
                raise bad_value(
                    "model", f"a layer {layer.name!r} ({type(layer).__name__}) whose "
                    f"attribute {', '.join(missed)} the copy this route trains holds "
                    "otherwise (it is remade from the layer's config, not copied)",
                    "attributes a copy can take: variables, plain data (numbers, strings, "
                    "NumPy arrays), tensors, and functions the layer's config remakes alike",
                    "make that function from what the layer's config holds (keep what it "
                    "captures in a weight or a plain attribute), or build and compile the "
                    "model inside `with kerasmgpu.scope():` (no copy is made then)", raw=True)

    def _uncopiable(self, model: Any, graph: bool, exc: Exception) -> Exception:
        # Ours first: the fix must not sit below twenty lines of Keras's message.
        fix = ("build and compile it inside `with kerasmgpu.scope():` and pass it to "
               "parallelize() (no copy is made then)")
        if graph:
            culprit = self._uncopiable_layer(model)
            received = (f"a {type(model).__name__} model whose layer "
                        f"{culprit} cannot be rebuilt from its get_config()"
                        if culprit else f"a {type(model).__name__} model that cannot be copied")
            error = bad_type(
                "model", received,
                "layers that from_config(get_config()) rebuilds (a layer holding another "
                "layer, as an output projection tied to an Embedding, needs its "
                "get_config() and from_config() to rebuild what it holds)",
                fix + ", or give that layer a get_config() and from_config() that rebuild it",
                raw=True)
        else:
            error = bad_type(
                "model",
                f"a subclassed model that cannot be copied ({type(model).__qualname__})",
                "a Sequential or functional model, or a subclassed model whose get_config() "
                "and from_config() rebuild it",
                fix + ", or implement get_config()",
                raw=True,
            )
        detail = " ".join(str(exc).split())
        error.args = (f"{error.args[0]}\n(What Keras said when copying it: "
                      f"{type(exc).__name__}: {detail[:400]})",)
        return error

    def _uncopiable_layer(self, model: Any) -> Optional[str]:
        # Nested graph models are copied layer by layer (`_copy_of`): their layers are
        # tried, as `layers_of` lists them too.
        for layer in self.layers_of(model)[1:]:
            if _is_graph_model(layer):
                continue
            try:
                self.copy_layer(layer)
            except Exception:
                return f"{layer.name!r} ({type(layer).__name__})"
        return None

    def compiled_as(self, template: Any, replica: Any) -> ContextManager[None]:
        """Compile `replica` inside this to train what `template`'s own compile left
        trainable, where a Keras line fixes that at compile (tf.keras / tf_keras). Keras 3
        reads the trainable flags when it makes a step, which kerasmgpu copies before
        every training call: nothing to do."""
        return contextlib.nullcontext()

    def build_like(self, clone: Any, model: Any) -> None:
        """Build a subclassed clone for the shapes the original was built for."""
        raise NotImplementedError
