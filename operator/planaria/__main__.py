"""`python -m planaria`: the same as the `planaria` command."""

from planaria.cli import main

raise SystemExit(main.main())
