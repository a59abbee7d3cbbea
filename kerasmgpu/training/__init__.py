"""The parallel model (`model`) and the step hooks that keep padding out (`steps`)."""
