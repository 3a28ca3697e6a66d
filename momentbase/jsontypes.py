"""The type of a JSON object as the library reads and writes it (records, manifests, reports).

``json.load`` returns, and ``json.dump`` takes, objects whose values are any JSON value (str,
int, float, bool, None, list, dict). The library checks each field where it reads one (with a
one-line error naming the file and the field), so the values are typed ``Any``: a recursive
union would make every reader cast what it has just checked.
"""

from __future__ import annotations

from typing import Any

#: a JSON value (str, int, float, bool, None, list or dict of them), as ``json.load`` gives it
JsonValue = Any  # Any: JSON values, checked field by field where they are read

#: a JSON object: ``json.load``'s dict, or a dict about to be ``json.dump``-ed
JsonObject = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
