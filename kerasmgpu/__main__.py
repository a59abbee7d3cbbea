"""`python -m kerasmgpu` is the `kerasmgpu` command."""

from kerasmgpu.cli import main

raise SystemExit(main())
