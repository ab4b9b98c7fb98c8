from flopwatch.cli import main

raise SystemExit(main())
