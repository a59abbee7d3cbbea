"""Loaded at interpreter start in the `keras23` tox env only (PYTHONPATH=compat/keras23).

It is the line a Keras 2.3 project puts at the top of its script, `import
kerasmgpu.keras23`, made here for every interpreter the tests start (legacy scripts run
as written, launched workers), so that they all run Keras 2.3.1 as a user would.
Nothing is imported until the first `import keras` but kerasmgpu itself.
"""

import kerasmgpu.keras23  # noqa: F401
