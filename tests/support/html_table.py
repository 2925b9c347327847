"""Read a table of a server-rendered page as a reader sees it (the standard library's HTML parser)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Cell:
    text: str = ""  # the visible text, whitespace collapsed (an SVG's title is not visible text)
    classes: list[str] = field(default_factory=list)
    bars: int = 0  # <svg class="bar"> in the cell


@dataclass
class Table:
    head: list[str]
    rows: list[list[Cell]]
    row_classes: list[list[str]]

    def by_host(self) -> dict[str, list[Cell]]:
        return {row[0].text: row for row in self.rows}

    def column(self, name: str) -> int:
        """The index of the column whose header starts with ``name``."""
        return next(i for i, head in enumerate(self.head) if head == name or head.split(" ")[0] == name)


class _Reader(HTMLParser):
    def __init__(self, table_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.table_id, self.depth, self.svg = table_id, 0, 0
        self.head: list[str] = []
        self.rows: list[list[Cell]] = []
        self.row_classes: list[list[str]] = []
        self.cell: Cell | None = None
        self.words: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table" and (self.depth or found.get("id") == self.table_id):
            self.depth += 1
        if not self.depth:
            return
        classes = (found.get("class") or "").split()
        if tag == "tr":
            self.rows.append([])
            self.row_classes.append(classes)
        elif tag in ("td", "th"):
            self.cell, self.words = Cell(classes=classes), []
        elif tag == "svg":
            self.svg += 1
            if self.cell is not None and "bar" in classes:
                self.cell.bars += 1

    def handle_endtag(self, tag: str) -> None:
        if not self.depth:
            return
        if tag == "table":
            self.depth -= 1
        elif tag == "svg":
            self.svg -= 1
        elif tag in ("td", "th") and self.cell is not None:
            self.cell.text = " ".join(" ".join(self.words).split())
            if tag == "th" and len(self.rows) == 1:
                self.head.append(self.cell.text)
            else:
                self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None and not self.svg:
            self.words.append(data)


def table(page: str, table_id: str) -> Table:
    """The table ``table_id`` of ``page``: its header and its body rows (AssertionError when it is not there)."""
    reader = _Reader(table_id)
    reader.feed(page)
    assert reader.rows, f"no table {table_id!r} in the page"
    return Table(reader.head, reader.rows[1:], reader.row_classes[1:])
