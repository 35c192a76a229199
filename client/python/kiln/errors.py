"""Exceptions raised by the kiln client."""


class SerializeError(ValueError):
    """A graph cannot be written in the kiln.v1 protocol (or read back from it).

    The message names the node concerned and says why.
    """
