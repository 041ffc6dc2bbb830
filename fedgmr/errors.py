"""Exception types raised by FedGMR.

Every error a user can cause (bad config, malformed data, invalid client update)
derives from :class:`FedGMRError`, so applications can catch them in one place.
"""

from __future__ import annotations


class FedGMRError(Exception):
    """Base class of all FedGMR errors."""


class ConfigError(FedGMRError, ValueError):
    """A configuration key or value is invalid. The message names the key."""


class DatasetFormatError(FedGMRError, ValueError):
    """Data files are missing or malformed. The message names the expected layout."""


class InvalidUpdateError(FedGMRError, ValueError):
    """A client update was rejected (wrong shape, non-finite, outside its mask, ...)."""
