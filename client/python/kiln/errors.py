"""Exceptions raised by the kiln client."""


class SerializeError(ValueError):
    """A graph cannot be written in the kiln.v1 protocol (or read back from it).

    The message names the node concerned and says why.
    """


class KilnError(RuntimeError):
    """kiln could not compile or run a graph and the fallback policy is "error" (KILN_FALLBACK=error)."""


class KilnWarning(UserWarning):
    """A graph runs eagerly (with torch) instead of through kiln; the message says which, why and
    what to do. Issued once per cause."""
