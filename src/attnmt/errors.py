"""Errors caused by the user's input (config, data, files), not by a bug.

The CLI catches these and prints their message alone, without a traceback, so each
message must name what is wrong and where (config key, file and line, dataset name).
"""


class UserError(Exception):
    """Base class: a mistake in what the user gave us."""


class ConfigError(UserError, ValueError):
    """A config key is unknown, mistyped or inconsistent. The message names the key."""


class DataError(UserError, ValueError):
    """A data source is missing or malformed. The message names the file/line or dataset."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, unreadable or incompatible with the requested use."""
