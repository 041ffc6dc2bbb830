"""Exception types raised by FedGMR.

Every error a user can cause (bad config, malformed data, invalid client update, a
damaged run directory) derives from :class:`FedGMRError`, so applications can catch
them in one place. Each class carries the exit code the ``fedgmr`` CLI returns for it:

====  ==========================================================
code  meaning
====  ==========================================================
0     success
1     any other FedGMR error
2     bad config value, unknown key or bad command-line usage
3     run directory: existing run, locked, damaged or mismatched checkpoint
4     data files missing or malformed
5     the run failed: no update could be aggregated
6     your code given with ``--import`` (or a sweep's ``imports:``) failed to import
130   interrupted (Ctrl-C); resume with ``--resume``
====  ==========================================================
"""

from __future__ import annotations


class FedGMRError(Exception):
    """Base class of all FedGMR errors."""

    exit_code: int = 1


class ConfigError(FedGMRError, ValueError):
    """A configuration key or value is invalid. The message names the key."""

    exit_code = 2


class RunDirError(FedGMRError):
    """A run directory cannot be used: it holds another run, is locked by a running
    process, or its checkpoint is missing, damaged or does not match its config."""

    exit_code = 3


class DatasetFormatError(FedGMRError, ValueError):
    """Data files are missing or malformed. The message names the expected layout."""

    exit_code = 4


class RunFailedError(FedGMRError):
    """The run could not make progress (for example, every client update was rejected)."""

    exit_code = 5


class InvalidUpdateError(FedGMRError, ValueError):
    """A client update was rejected (wrong shape, non-finite, outside its mask, ...)."""


class RegistryError(FedGMRError, ValueError):
    """A name is already registered to a different object (pass ``replace=True`` to replace it)."""


class PluginError(FedGMRError):
    """Your code (``--import``, a sweep file's ``imports:``) could not be imported. The
    message names the module and the exception it raised."""

    exit_code = 6
