"""The web console (docs/ui.md): its own HTTP listener (`--ui-listen`, loopback by default), plain HTML, CSS and
JavaScript shipped in the wheel (assets/), and JSON endpoints that call the daemon's own public gRPC API with the
caller's credentials, so that permissions, redaction and audit are the API's. The standard library's
http.server and nothing else: no framework, nothing fetched at run time."""
