"""`python -m meshrl.scheduler.traceview RUN_DIR ...`: the same as `meshrl trace RUN_DIR ...`."""

from meshrl.scheduler.traceview.cli import trace_main

raise SystemExit(trace_main())
