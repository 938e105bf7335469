"""Safe XML in, exact XML out, with line numbers for every element.

Input is untrusted (anyone's job file), so it is parsed by defusedxml with DTDs, entity declarations
and external references forbidden (no billion-laughs, no XXE), under size, depth and element-count
limits. Each element keeps the line it started on, so every later error can name the line and the
tag. A document that is not well-formed is refused with the line, the tag found and the element
still open.

Output is written here rather than by ElementTree so that text XML normalises on reading (carriage
returns, tabs and newlines in attributes) is escaped as character references and survives a round
trip, and characters XML cannot carry at all are refused by name instead of producing a broken file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from pilot.model.sss.errors import SssError

MAX_BYTES: Final = 16 * 1024 * 1024
MAX_DEPTH: Final = 32
MAX_ELEMENTS: Final = 500_000


@dataclass(slots=True)
class XmlElement:
    """One parsed element: tag, attributes, its own text (direct character data), children, position."""

    tag: str
    attrib: dict[str, str]
    line: int
    column: int
    text: str = ""
    children: list[XmlElement] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"<{self.tag}>"


class _Limit(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


class _Builder:
    """The parser's target: builds :class:`XmlElement` trees and keeps the stack of open elements."""

    def __init__(self) -> None:
        self.parser: DefusedXMLParser | None = None
        self.stack: list[XmlElement] = []
        self.root: XmlElement | None = None
        self.count = 0
        self._text: list[list[str]] = []

    def _pos(self) -> tuple[int, int]:
        assert self.parser is not None
        p = self.parser.parser
        return p.CurrentLineNumber, p.CurrentColumnNumber + 1

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        line, col = self._pos()
        self.count += 1
        if self.count > MAX_ELEMENTS:
            raise _Limit(f"more than {MAX_ELEMENTS} elements; split the submission", line)
        if len(self.stack) >= MAX_DEPTH:
            raise _Limit(f"<{tag}> is nested more than {MAX_DEPTH} deep", line)
        el = XmlElement(tag, dict(attrib), line, col)
        if self.stack:
            self.stack[-1].children.append(el)
        elif self.root is None:
            self.root = el
        self.stack.append(el)
        self._text.append([])

    def end(self, tag: str) -> None:
        el = self.stack.pop()
        el.text = "".join(self._text.pop())

    def data(self, data: str) -> None:
        if self._text:
            self._text[-1].append(data)

    def close(self) -> XmlElement | None:
        return self.root


def parse(data: str | bytes, *, what: str = "XML") -> XmlElement:
    """The root element of ``data``. Raises :class:`SssError` naming the line and the tag."""
    if len(data) > MAX_BYTES:
        raise SssError(f"{what} is {len(data)} bytes; the limit is {MAX_BYTES}: split the submission")
    if not data.strip():
        raise SssError(f"{what} is empty: it holds no element")
    builder = _Builder()
    parser = DefusedXMLParser(target=builder, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    builder.parser = parser
    try:
        parser.feed(data)
        parser.close()
    except _Limit as exc:
        raise SssError(f"{what} is too large: {exc}", line=exc.line) from None
    except DefusedXmlException as exc:
        line = parser.parser.CurrentLineNumber
        raise SssError(
            f"{what} may not contain a DTD, entity declarations or external references ({type(exc).__name__}); "
            "remove the <!DOCTYPE ...> and write the values out",
            line=line,
        ) from None
    except ParseError as exc:
        raise _not_well_formed(exc, data, builder, what) from None
    except (LookupError, UnicodeError, ValueError) as exc:
        # expat hands the text to Python codecs: a str with a lone surrogate, or bytes declaring an encoding
        # Python does not know (LookupError), cannot decode, or expat cannot use (multi-byte: ValueError).
        line = parser.parser.CurrentLineNumber
        raise SssError(f"{what} is not text this reader can decode ({exc}); write it as UTF-8", line=line) from None
    if builder.root is None:
        raise SssError(f"{what} is empty: it holds no element")
    return builder.root


_TAG_AT: Final = re.compile(r"<\s*(/?)\s*([^\s/>]+)")


def _not_well_formed(exc: ParseError, data: str | bytes, builder: _Builder, what: str) -> SssError:
    line, column = exc.position
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    lines = text.splitlines()
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    reason = str(exc).split(":")[0]
    start = src.rfind("<", 0, column + 1)
    m = _TAG_AT.match(src, start) if start >= 0 else None
    found = f"<{m.group(1)}{m.group(2)}>" if m else None
    open_el = builder.stack[-1] if builder.stack else None
    msg = f"{what} is not well-formed: {reason}"
    if reason.startswith("mismatched tag") and found and open_el is not None:
        msg += f": {found} found while <{open_el.tag}> (opened on line {open_el.line}) is still open"
        parent = builder.stack[-2] if len(builder.stack) > 1 else None
        if parent is not None and parent.tag == open_el.tag:
            msg += (
                f"; the <{open_el.tag}> on line {open_el.line} looks like the closing tag of the one on line "
                f"{parent.line}: write </{open_el.tag}>"
            )
        else:
            msg += f"; close it with </{open_el.tag}> first"
        return SssError(msg, element=found, line=line)
    if open_el is not None and not found:
        msg += f" (inside <{open_el.tag}> opened on line {open_el.line})"
    return SssError(msg + f", column {column + 1}", element=found, line=line)


# -- writing -------------------------------------------------------------------------------------------

_BAD_CHARS: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _check(text: str, where: str) -> None:
    m = _BAD_CHARS.search(text)
    if m:
        raise SssError(f"holds character U+{ord(m.group()):04X}, which XML cannot carry; remove it", element=where)


def escape_text(text: str, where: str) -> str:
    _check(text, where)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")


def escape_attr(text: str, where: str) -> str:
    _check(text, where)
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("\r", "&#13;")
        .replace("\n", "&#10;")
        .replace("\t", "&#9;")
    )


@dataclass(slots=True)
class Node:
    """An element to write: text for leaves, children for containers."""

    tag: str
    attrib: Iterable[tuple[str, str]] = ()
    text: str = ""
    children: list[Node] = field(default_factory=list)


def write(root: Node, *, indent: str = "  ") -> str:
    """``root`` as an indented XML document (no declaration, as the spec's examples)."""
    out: list[str] = []
    _write(root, out, 0, indent)
    return "".join(out)


def _write(node: Node, out: list[str], depth: int, indent: str) -> None:
    pad = indent * depth
    where = f"<{node.tag}>"
    attrs = "".join(f' {k}="{escape_attr(v, where)}"' for k, v in node.attrib)
    if node.children:
        out.append(f"{pad}<{node.tag}{attrs}>\n")
        for child in node.children:
            _write(child, out, depth + 1, indent)
        out.append(f"{pad}</{node.tag}>\n")
    elif node.text:
        out.append(f"{pad}<{node.tag}{attrs}>{escape_text(node.text, where)}</{node.tag}>\n")
    else:
        out.append(f"{pad}<{node.tag}{attrs}></{node.tag}>\n")
