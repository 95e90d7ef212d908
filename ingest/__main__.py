"""Allow ``python -m ingest``."""

from ingest.cli import main

raise SystemExit(main())
