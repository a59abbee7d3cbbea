"""User input -> padded global batches (`feeds`), each `(x, bundle)` (`bundle`)."""
