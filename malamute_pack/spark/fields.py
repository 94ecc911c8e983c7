"""
The ``fields`` column: the map a field-style subject carries.

A subject is field-style when it contains ``=`` or ``;`` (``docs/protocol.md``,
"Fields"): ``;``-separated pieces, each ``name=value`` or a bare ``name``
(value null); blanks around names and values are trimmed, a value runs up to
the next ``;`` and may contain ``=``, pieces with an empty name are ignored.
These are the rules of :func:`malamute_pack.matching.fields.subject_criteria`,
which the ``fields:`` patterns match with; that function gives a set of
criteria (every value and every presence), which loses which value a
repeated name had last, so the map is made here with the same rules: a
later value of a name replaces an earlier one, and a bare repeat of a name
keeps its value (so every entry of the map is a criterion the subject
satisfies, and every name it has is a key).

Tests: ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations


def is_field_style(subject: str) -> bool:
    """Whether ``subject`` carries fields (contains ``=`` or ``;``)."""
    return "=" in subject or ";" in subject


def subject_fields(subject: str) -> dict[str, str | None] | None:
    """
    The fields of ``subject`` as name -> value (None for a bare name), in the
    order the names first appear; None when ``subject`` is not field-style.
    """
    if not is_field_style(subject):
        return None
    fields: dict[str, str | None] = {}
    for piece in subject.split(";"):
        name, equals, value = piece.partition("=")
        name = name.strip()
        if not name:
            continue
        if equals:
            fields[name] = value.strip()
        else:
            fields.setdefault(name, None)
    return fields
