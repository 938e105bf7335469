"""SSS node XML (``../shared/specs/sss-node-object-3.1.txt``) to :class:`NodeObject` and back.

Several nodes are written inside a ``<Data>`` element, the SSSRMAP envelope the spec names for
passing objects; a single node is written bare, as the spec's examples are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pilot.formats import xml
from pilot.formats.xml import XmlElement
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Property
from pilot.model.sss.node import CATEGORIES, NodeObject

SIMPLE: Final = ("Id", "Name", "Opsys", "Arch", "Description", "State", "Feature")
CONSUMABLES: Final = ("Processors", "Memory", "Disk", "Swap", "Network")
CONSUMABLE_ATTRS: Final = frozenset({"units", "metric", "wallDuration", "consumptionRate"})


def read_nodes(data: str | bytes) -> list[NodeObject]:
    """One ``<Node>`` or several inside ``<Data>``."""
    root = xml.parse(data, what="SSS node XML")
    if root.tag == "Node":
        return [_node(root, "<Node>")]
    if root.tag == "Data":
        return [_node(c, f"<Data>/<Node>[{i + 1}]") for i, c in enumerate(root.children) if c.tag == "Node"]
    raise SssError("the root element must be <Node> (or <Data> holding nodes)", element=f"<{root.tag}>", line=root.line)


def _node(el: XmlElement, path: str) -> NodeObject:
    node = NodeObject(line=el.line)
    for child in el.children:
        cpath = f"{path}/<{child.tag}>"
        if child.tag in SIMPLE:
            _no_attrs(child, cpath, frozenset())
            node.properties.append(Property(child.tag, child.text.strip(), (), (), child.line))
        elif child.tag == "Extension":
            _no_attrs(child, cpath, frozenset({"name", "type"}))
            if "name" not in child.attrib:
                raise SssError("needs a name= attribute", element=cpath, line=child.line)
            node.properties.append(Property(child.tag, child.text, _sorted(child), (), child.line))
        elif child.tag in CATEGORIES:
            props = [_consumable(c, f"{cpath}/<{c.tag}>") for c in child.children]
            setattr(node, child.tag.lower(), props)
        else:
            raise SssError(
                f"<{child.tag}> is not a Node property this pilot understands", element=cpath, line=child.line
            )
    if node.id is None:
        raise SssError("has no <Id>: a node must name itself", element=path, line=el.line)
    return node


def _consumable(el: XmlElement, path: str) -> Property:
    if el.tag not in (*CONSUMABLES, "Resource"):
        raise SssError(f"<{el.tag}> is not a consumable resource", element=path, line=el.line)
    allowed = CONSUMABLE_ATTRS | ({"name", "type"} if el.tag == "Resource" else set())
    _no_attrs(el, path, frozenset(allowed))
    if el.tag == "Resource" and "name" not in el.attrib:
        raise SssError("needs a name= attribute", element=path, line=el.line)
    try:
        float(el.text)
    except ValueError:
        raise SssError(f"{el.text.strip()!r} is not a number", element=path, line=el.line) from None
    return Property(el.tag, el.text.strip(), _sorted(el), (), el.line)


def _no_attrs(el: XmlElement, path: str, allowed: frozenset[str]) -> None:
    for name in el.attrib:
        if name not in allowed:
            raise SssError(f"attribute {name}= is not understood", element=path, line=el.line)


def _sorted(el: XmlElement) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(el.attrib.items()))


def write_nodes(nodes: Sequence[NodeObject]) -> str:
    """One node bare, several inside ``<Data>``."""
    if len(nodes) == 1:
        return xml.write(_node_out(nodes[0]))
    return xml.write(xml.Node("Data", children=[_node_out(n) for n in nodes]))


def _node_out(n: NodeObject) -> xml.Node:
    children = [xml.Node(p.name, p.attributes, p.value) for p in n.properties]
    for cat in CATEGORIES:
        props = getattr(n, cat.lower())
        if props is not None:
            children.append(xml.Node(cat, children=[xml.Node(p.name, p.attributes, p.value) for p in props]))
    return xml.Node("Node", children=children)
