"""Exit codes of the `peloton` command (docs/cli.md, Exit codes)."""

EXIT_OK = 0
EXIT_ERROR = 1  # an error from the daemon; `job wait`: the job ended FAILED or KILLED
EXIT_USAGE = 2  # bad input
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: `wait`/`--watch`/`-f` could not reach the daemon for the whole grace period
EXIT_TIMEOUT = 124  # `job wait --timeout` expired
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (`peloton job list | head`), as if killed by SIGPIPE
