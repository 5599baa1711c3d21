"""The frozen app's entry point: the window (``--smoke-test`` and ``--demo`` pass through); with
MTP_TUNER_DRY_RUN_CHILD set, the memory dry run's child (app.core.engines.dry_run: a frozen app
takes no ``python -c``), which answers on stdout and ends."""

import os
import sys

if __name__ == "__main__":
    if os.environ.get("MTP_TUNER_DRY_RUN_CHILD") == "1":
        from app.core.engines.dry_run import child_main

        child_main()
        sys.exit(0)
    from app.gui.main import main

    sys.exit(main())
