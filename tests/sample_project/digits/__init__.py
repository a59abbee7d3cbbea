"""A small classifier trained on 2 GPUs with Keras 2.3's multi_gpu_model."""
import kerasmgpu.keras23  # noqa: F401  - Keras 2.3.1 on Python 3.9+: before any `import keras`
