"""GPU tests run inside a lent machine's short lease, where a part's time limit can end pytest
before its summary: a failure's report is printed the moment the test fails, not only at the end
(on 2026-11-26 a sleep-mode failure's reason was lost that way), with what the test printed."""

import sys


def pytest_runtest_logreport(report):
    if report.failed:
        printed = report.capstdout[-3000:] if report.capstdout else ""
        print(
            f"\n--- {report.nodeid} ({report.when}) failed:\n{report.longreprtext}\n{printed}---",
            file=sys.stderr,
            flush=True,
        )
