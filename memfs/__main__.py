from memfs.cli.main import main

raise SystemExit(main())
