"""Observability tests: a package, so that its `package` fixtures (four services and a Prometheus scraping
them every second) stop after its last test; in a plain folder pytest keeps them to the end of the session."""
