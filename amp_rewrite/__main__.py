from amp_rewrite.cli import main

raise SystemExit(main())
