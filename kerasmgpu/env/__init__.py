"""What is installed and where we run, answered without importing a framework.

`versions` (Keras line, releases, floors), `devices` (listing, `gpus=`, virtual
devices) and `cluster` (rank, world size, chief). Nothing here knows about engines.
"""
