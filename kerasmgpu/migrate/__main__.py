"""`python -m kerasmgpu.migrate ...`, the same as `kerasmgpu migrate ...`."""

from kerasmgpu.migrate import main

raise SystemExit(main())
