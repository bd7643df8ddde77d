"""`python -m geomjax` runs the command-line interface (see `geomjax._cli`)."""

from ._cli import main

raise SystemExit(main())
