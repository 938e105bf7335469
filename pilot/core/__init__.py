"""The scheduling core: pure state and a reactor of events, with no sockets, files or clock inside."""
