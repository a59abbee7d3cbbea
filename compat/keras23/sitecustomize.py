"""Loaded at interpreter start in the `keras23` tox env only (PYTHONPATH=compat/keras23).

Installs the Keras 2.3.1 runtime patches of `keras23_compat` lazily: nothing is
imported until the first `import keras`.
"""

import keras23_compat

keras23_compat.install()
