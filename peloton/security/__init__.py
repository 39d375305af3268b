"""Security: who calls (`identity.py`, `auth.py` on the public API, `component_auth.py` between components), how
often (`ratelimit.py`), over what TLS (`certs.py`), and as which Unix identity their tasks run (`run_as.py`,
`unix_accounts.py`)."""
