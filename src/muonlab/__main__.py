from muonlab.cli import main

raise SystemExit(main())
