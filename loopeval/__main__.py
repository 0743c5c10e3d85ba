from loopeval.cli import main

raise SystemExit(main())
