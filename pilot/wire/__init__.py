"""The one layer daemon, agents and clients share: the frame codec (:mod:`.codec`, re-exported here, so
``from pilot import wire`` then ``wire.encode``), the typed messages (:mod:`.messages`), what a client
reads (:mod:`.to_client`), the socket loop (:mod:`.transport`), where TCP endpoints bind
(:mod:`.addresses`), and CURVE and ZAP (:mod:`.curve`)."""

from pilot.wire.codec import (
    AGENT_KINDS,
    CLIENT_KINDS,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    TO_AGENT_KINDS,
    TO_CLIENT_KINDS,
    Kind,
    Message,
    ProtocolError,
    decode,
    encode,
    field,
    int_list,
    opt_field,
    str_list,
)

__all__ = [
    "AGENT_KINDS",
    "CLIENT_KINDS",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "TO_AGENT_KINDS",
    "TO_CLIENT_KINDS",
    "Kind",
    "Message",
    "ProtocolError",
    "decode",
    "encode",
    "field",
    "int_list",
    "opt_field",
    "str_list",
]
