"""The one error of bad input, raised by every wing and printed by the CLI as one line naming the file,
the key and what is valid."""
from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, message: str):
        self.source, self.key, self.message = source, key, message
        super().__init__(f"{source}: {key}: {message}")
