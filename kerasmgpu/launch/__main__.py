"""`python -m kerasmgpu.launch` is `kerasmgpu launch`."""

from kerasmgpu.launch import main

raise SystemExit(main())
