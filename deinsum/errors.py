"""The one exception type users see."""


class DeinsumError(ValueError):
    """Bad input to deinsum: a one-line message naming what is wrong and where.

    >>> raise DeinsumError("operand 1 ('ja'): index 'j' has size 3, expected 4")
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: operand 1 ('ja'): index 'j' has size 3, expected 4
    """
