"""Run a Keras 2.3 project on the TensorFlow that Python >= 3.9 installs: import this first.

    import kerasmgpu.keras23          # before `import keras` (and anything that imports it)
    import keras
    from kerasmgpu.legacy import multi_gpu_model

Standalone Keras 2.3.1 (2019) does not import on today's TensorFlow and Python:
TensorFlow 2.x runs eagerly, `tf.keras` is another package, and Python 3.10 dropped the
`collections` aliases Keras 2.3 uses. Importing this module prepares TensorFlow and
Python before Keras 2.3 imports and patches Keras 2.3 right after it has (graph mode,
h5py 3 strings); `kerasmgpu.adapters.keras23_runtime` lists each patch and why.

Install (Python 3.9 - 3.11, the Pythons TensorFlow 2.15 supports):

    pip install tensorflow==2.15.1 numpy==1.26.4 keras-applications==1.0.8 \\
        keras-preprocessing==1.1.2 pyyaml scipy h5py
    pip install --no-deps keras==2.3.1   # --no-deps: TensorFlow 2.15 asks for keras 2.15

Verified on keras 2.3.1, tensorflow 2.15.1, numpy 1.26.4, h5py 3.16, Python 3.11. The
`kerasmgpu` command applies the same patches by itself when Keras 2.3 is installed.
Importing this module with another Keras installed is an ImportError; after `import
keras`, a `TooLateError`.
"""

from kerasmgpu.adapters import keras23_runtime as _runtime

_runtime.install()
