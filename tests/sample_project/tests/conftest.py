# The tests import keras themselves: Keras 2.3.1 on Python 3.9+ needs this first.
import kerasmgpu.keras23  # noqa: F401
