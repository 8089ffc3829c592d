"""The base of the SDK's state enums."""

from __future__ import annotations

import enum


class NamedIntEnum(enum.IntEnum):
    """An IntEnum that prints as its name (``RUNNING``), in ``str()`` and f-strings alike.

    Since Python 3.11 an IntEnum prints as its number; a state printed in a log or an error
    message should say what it is. It still compares equal to the protobuf ``state`` ints.
    """

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)
