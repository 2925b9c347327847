"""Messages count in words: 1 unit, 2 units."""

from vmsched.words import counted


def test_one_is_singular_and_every_other_count_plural():
    assert [counted(n, "unit") for n in (0, 1, 2)] == ["0 units", "1 unit", "2 units"]
    assert counted(1, "host ID") == "1 host ID" and counted(3, "host ID") == "3 host IDs"
    assert counted(2, "index", "indices") == "2 indices"
