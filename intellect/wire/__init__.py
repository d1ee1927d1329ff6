"""Wire models: every body that crosses HTTP, the socket bridge or a file between services."""
