"""Security building blocks: a private run directory, CURVE keys, and secret-free logs (the sockets' CURVE
and ZAP gate are :mod:`pilot.wire.curve`).

A login node is shared by hundreds of users, so a pilot is closed by default:

- local clients use ``ipc://`` sockets in a directory only the user can enter (:func:`check_private_dir`);
- agents and remote clients cross the network, so they speak ZeroMQ CURVE (``pilot.wire.curve``) and
  pin the daemon's public key, which a process stealing the port cannot prove;
- a ZAP handler (``pilot.wire.curve.ZapAuthenticator``) admits only the public keys this pilot
  generated, so a connection without the right key is refused in the handshake and never reaches the
  daemon's logic;
- keys live in ``<rundir>/keys`` as 0600 files (:class:`KeyStore`), reach agents through the environment
  or a private file (:func:`credentials_env`, :func:`credentials_from_env`), never a command line, and
  remote clients through a private access file that also names the endpoint (:class:`ClientAccess`);
- log events lose task environments and secret-looking values (:class:`RedactSecrets`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import stat
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import zmq
from zmq.utils import z85

log = structlog.get_logger("pilot.security")

#: ZAP domains: one per socket role, so a remote client's key can never register as an agent.
AGENT_DOMAIN: Final = "pilot.agents"
CLIENT_DOMAIN: Final = "pilot.clients"

#: Environment variables carrying an agent's credentials. They start with ``PILOT_CURVE_``, which
#: ``agent.environment.PRIVATE_PREFIXES`` keeps out of every task's environment.
ENV_SERVER_KEY: Final = "PILOT_CURVE_SERVER_KEY"
ENV_PUBLIC_KEY: Final = "PILOT_CURVE_PUBLIC_KEY"
ENV_SECRET_KEY: Final = "PILOT_CURVE_SECRET_KEY"
ENV_FILE: Final = "PILOT_CURVE_FILE"
CREDENTIAL_VARIABLES: Final = (ENV_SERVER_KEY, ENV_PUBLIC_KEY, ENV_SECRET_KEY, ENV_FILE)
#: Names a remote client's access file (endpoint and keys, 0600; ``pilot credentials --client FILE``).
#: A path, not a secret: the file's mode protects the keys, so it may sit in a job script.
ENV_CLIENT_ACCESS: Final = "PILOT_CREDENTIALS"

ROLES: Final = ("daemon", "agent", "client")


class SecurityError(RuntimeError):
    """Something would expose the pilot to other users; the message names the path and the fix."""


# -- file-system checks --------------------------------------------------------------------------------


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _stat(path: Path, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise SecurityError(f"{what} {path} does not exist") from None


def check_private_dir(path: Path, *, what: str = "run directory") -> None:
    """Refuse a directory others can enter, that is not ours, or that others could swap under us.

    The ipc sockets and key files inside it are protected by nothing else.
    """
    st = _stat(path, what)
    q = shlex.quote(str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise SecurityError(f"{what} {path} is not a directory; remove it or pick another run directory")
    if st.st_uid != os.getuid():
        raise SecurityError(
            f"{what} {path} belongs to {_owner(st.st_uid)}, not to you ({_owner(os.getuid())}), who could "
            f"read or replace its sockets and keys; remove it or pick another run directory "
            f"(--rundir or PILOT_HOME)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SecurityError(
            f"{what} {path} is accessible by other users (mode {stat.filemode(st.st_mode)}, {mode:04o}); "
            f"make it private: chmod 700 {q}"
        )
    parent = path.resolve().parent
    pst = os.stat(parent)
    if pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not pst.st_mode & stat.S_ISVTX:
        raise SecurityError(
            f"{what} {path} sits in {parent}, which other users can write to, so they could replace it; "
            f"run: chmod go-w {shlex.quote(str(parent))}, or pick another run directory"
        )


def check_private_file(path: Path, *, what: str = "key file") -> None:
    """Refuse a key file another user could read (or one that is not ours): it would let them in."""
    st = _stat(path, what)
    if not stat.S_ISREG(st.st_mode):
        raise SecurityError(f"{what} {path} is not a regular file; remove it and run 'pilot up' again")
    if st.st_uid != os.getuid():
        raise SecurityError(
            f"{what} {path} belongs to {_owner(st.st_uid)}, not to you; remove it and run 'pilot up' again "
            f"to generate a new one"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SecurityError(
            f"{what} {path} is readable by other users (mode {stat.filemode(st.st_mode)}, {mode:04o}); "
            f"run: chmod 600 {shlex.quote(str(path))} (and consider the key leaked: remove the keys "
            f"directory to get new ones)"
        )


def make_private_dir(path: Path, *, what: str = "run directory") -> None:
    """Create ``path`` as 0700 if missing, then check it. An existing directory is never chmod-ed:
    silently fixing it would hide that its contents were exposed."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # the umask may have removed owner bits; it never adds any
    check_private_dir(path, what=what)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as 0600 from the first byte (atomic replace; no window where others read)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- keys ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A CURVE key pair, Z85-encoded (40 bytes each). The secret stays out of ``repr``, hence out of logs."""

    public: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def from_secret(cls, secret: bytes) -> KeyPair:
        return cls(zmq.curve_public(secret), secret)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a connecting peer (agent, remote client) needs: the daemon's public key to pin, its own pair."""

    server_public: bytes
    keys: KeyPair


_KEY_LINE: Final = re.compile(r'^\s*(public-key|secret-key|server-key)\s*=\s*"([^"]*)"\s*$')


def _valid_key(value: bytes) -> bool:
    if len(value) != 40:
        return False
    try:
        return len(z85.decode(value)) == 32
    except (ValueError, KeyError):
        return False


def read_key_file(path: Path) -> dict[str, bytes]:
    """The ``public-key`` / ``secret-key`` / ``server-key`` lines of a ZPL key file (as ``zmq.auth`` writes
    them), after checking that only the user can read it."""
    check_private_file(path)
    found: dict[str, bytes] = {}
    for line in path.read_text().splitlines():
        m = _KEY_LINE.match(line)
        if m:
            value = m.group(2).encode()
            if not _valid_key(value):
                raise SecurityError(f"{path}: {m.group(1)} is not a Z85 CURVE key; remove the file to regenerate it")
            found[m.group(1)] = value
    return found


def _key_file_text(kind: str, keys: Mapping[str, bytes]) -> str:
    lines = [
        f"#   ****  Generated by pilot on {time.strftime('%Y-%m-%d %H:%M:%S')}  ****",
        f"#   ZeroMQ CURVE {kind}",
        "#   Keep this file private (chmod 600); never pass its contents on a command line.",
        "",
        "metadata",
        "curve",
    ]
    lines += [f'    {name} = "{value.decode()}"' for name, value in keys.items()]
    return "\n".join(lines) + "\n"


def write_key_pair(directory: Path, name: str, keys: KeyPair) -> None:
    """``<name>.key`` (public) and ``<name>.key_secret`` (both), 0600, readable by ``zmq.auth.load_certificate``."""
    write_private(directory / f"{name}.key", _key_file_text("Public Certificate", {"public-key": keys.public}))
    write_private(
        directory / f"{name}.key_secret",
        _key_file_text("**Secret** Certificate", {"public-key": keys.public, "secret-key": keys.secret}),
    )


def read_key_pair(path: Path) -> KeyPair:
    """The pair in a ``.key_secret`` file; the public key is recomputed, so a corrupted file is caught."""
    found = read_key_file(path)
    if "secret-key" not in found:
        raise SecurityError(f"{path} holds no secret-key; remove it and run 'pilot up' again to regenerate it")
    keys = KeyPair.from_secret(found["secret-key"])
    if found.get("public-key", keys.public) != keys.public:
        raise SecurityError(f"{path}: its public-key does not match its secret-key; remove the file to regenerate it")
    return keys


@dataclass(frozen=True, slots=True)
class KeyStore:
    """The pilot's CURVE keys in ``<rundir>/keys``: generated at the first ``pilot up``, loaded on restart
    (agents of a surviving allocation keep working), refused if another user could read them.

    ``daemon`` is the server pair; ``agent`` is shared by every agent of this pilot; ``client`` is for
    remote clients. Extra remote clients are admitted by dropping their public ``*.key`` files in
    ``keys/authorized/``.
    """

    path: Path
    daemon: KeyPair
    agent: KeyPair
    client: KeyPair
    authorized_clients: Mapping[bytes, str] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> KeyStore:
        make_private_dir(path, what="key directory")
        pairs: dict[str, KeyPair] = {}
        for role in ROLES:
            secret_file = path / f"{role}.key_secret"
            if secret_file.exists():
                pairs[role] = read_key_pair(secret_file)
                public_file = path / f"{role}.key"
                if not public_file.exists() or read_key_file(public_file).get("public-key") != pairs[role].public:
                    write_key_pair(path, role, pairs[role])
            else:
                pairs[role] = KeyPair.generate()
                write_key_pair(path, role, pairs[role])
                log.info("generated CURVE key pair", role=role, public=pairs[role].public.decode())
        authorized = path / "authorized"
        make_private_dir(authorized, what="authorized keys directory")
        extra: dict[bytes, str] = {}
        for f in sorted(authorized.glob("*.key")):
            public = read_key_file(f).get("public-key")
            if public is None:
                raise SecurityError(f"{f} holds no public-key line; fix or remove it")
            extra[public] = f"authorized/{f.stem}"
        return cls(path, pairs["daemon"], pairs["agent"], pairs["client"], extra)

    def policy(self) -> dict[str, dict[bytes, str]]:
        """Per ZAP domain, the public keys let in and the user id each gets."""
        return {
            AGENT_DOMAIN: {self.agent.public: "agent"},
            CLIENT_DOMAIN: {self.client.public: "client", **self.authorized_clients},
        }

    def agent_credentials(self) -> Credentials:
        return Credentials(self.daemon.public, self.agent)

    def client_credentials(self) -> Credentials:
        return Credentials(self.daemon.public, self.client)

    def write_credentials_file(self, role: str) -> Path:
        """``<role>.credentials`` (0600): everything an ``agent`` or a remote ``client`` needs in one file,
        for batch systems that show a job's environment to others, or to copy to another host."""
        creds = {"agent": self.agent_credentials, "client": self.client_credentials}[role]()
        path = self.path / f"{role}.credentials"
        write_credentials(path, creds)
        return path


def read_client_credentials(keys_dir: Path) -> Credentials:
    """A local client's credentials for the daemon's tcp endpoint, from the run directory's keys (read
    only: a client never generates keys; a missing file means no pilot was started there)."""
    server = read_key_file(keys_dir / "daemon.key").get("public-key")
    if server is None:
        raise SecurityError(f"{keys_dir / 'daemon.key'} holds no public-key; restart the pilot to regenerate it")
    return Credentials(server, read_key_pair(keys_dir / "client.key_secret"))


# -- handing credentials to agents --------------------------------------------------------------------


def credentials_env(creds: Credentials) -> dict[str, str]:
    """Variables to put in the batch job's environment (never on its command line: ``ps`` shows that to
    everyone; ``/proc/<pid>/environ`` is readable only by the user)."""
    return {
        ENV_SERVER_KEY: creds.server_public.decode(),
        ENV_PUBLIC_KEY: creds.keys.public.decode(),
        ENV_SECRET_KEY: creds.keys.secret.decode(),
    }


def credentials_file_env(path: Path) -> dict[str, str]:
    """The variable pointing an agent at a credentials file written by :func:`write_credentials`."""
    return {ENV_FILE: str(path)}


def write_credentials(path: Path, creds: Credentials) -> None:
    write_private(
        path,
        _key_file_text(
            "Client Credentials",
            {"server-key": creds.server_public, "public-key": creds.keys.public, "secret-key": creds.keys.secret},
        ),
    )


def read_credentials(path: Path) -> Credentials:
    found = read_key_file(path)
    missing = [k for k in ("server-key", "secret-key") if k not in found]
    if missing:
        raise SecurityError(f"credentials file {path} lacks {', '.join(missing)}; write it with write_credentials")
    keys = KeyPair.from_secret(found["secret-key"])
    return Credentials(found["server-key"], keys)


_ENDPOINT_LINE: Final = re.compile(r'^\s*endpoint\s*=\s*"([^"]*)"\s*$')


@dataclass(frozen=True, slots=True)
class ClientAccess:
    """A remote client's way in: the daemon's CURVE endpoint for clients and the credentials admitted there.
    One file holds both, so a client on another host needs nothing else from the run directory."""

    endpoint: str
    credentials: Credentials


def write_client_access(path: Path, access: ClientAccess) -> None:
    """The access file (0600 from its first byte): copy it with ``scp -p`` so it stays private."""
    creds = access.credentials
    keys = {"server-key": creds.server_public, "public-key": creds.keys.public, "secret-key": creds.keys.secret}
    text = _key_file_text("Remote Client Access", keys)
    write_private(path, text.replace("\ncurve\n", f'\n    endpoint = "{access.endpoint}"\ncurve\n', 1))


def read_client_access(path: Path) -> ClientAccess:
    """An access file written by :func:`write_client_access`, refused if others could read it."""
    creds = read_credentials(path)
    endpoints = [m.group(1) for line in path.read_text().splitlines() if (m := _ENDPOINT_LINE.match(line))]
    if len(endpoints) != 1 or not endpoints[0].startswith("tcp://"):
        raise SecurityError(
            f"{path} names no tcp:// endpoint; write it again with 'pilot credentials --client {path}' on the "
            f"pilot's host"
        )
    return ClientAccess(endpoints[0], creds)


def credentials_from_env(environ: MutableMapping[str, str] | None = None, *, remove: bool = True) -> Credentials | None:
    """An agent's credentials from its environment (the keys, or ``PILOT_CURVE_FILE``); None when there
    are none (a local pilot over ipc). With ``remove`` the variables leave the process environment, so
    nothing the agent starts inherits them."""
    env = os.environ if environ is None else environ
    try:
        if env.get(ENV_FILE):
            return read_credentials(Path(env[ENV_FILE]))
        given = [v for v in (ENV_SERVER_KEY, ENV_PUBLIC_KEY, ENV_SECRET_KEY) if env.get(v)]
        if not given:
            return None
        if ENV_SERVER_KEY not in given or ENV_SECRET_KEY not in given:
            absent = [v for v in (ENV_SERVER_KEY, ENV_SECRET_KEY) if v not in given]
            raise SecurityError(f"incomplete agent credentials: {', '.join(absent)} not set")
        server, secret = env[ENV_SERVER_KEY].encode(), env[ENV_SECRET_KEY].encode()
        for name, value in ((ENV_SERVER_KEY, server), (ENV_SECRET_KEY, secret)):
            if not _valid_key(value):
                raise SecurityError(f"{name} is not a Z85 CURVE key (40 characters)")
        keys = KeyPair.from_secret(secret)
        public = env.get(ENV_PUBLIC_KEY)
        if public and public.encode() != keys.public:
            raise SecurityError(f"{ENV_PUBLIC_KEY} does not match {ENV_SECRET_KEY}")
        return Credentials(server, keys)
    finally:
        if remove:
            for v in CREDENTIAL_VARIABLES:
                env.pop(v, None)


# -- secrets out of logs ------------------------------------------------------------------------------

SECRET_WORDS: Final = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MASK: Final = "***"
_SECRET_NAME: Final = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
_SECRET_ASSIGNMENT: Final = re.compile(
    r"""\b([A-Za-z0-9_.-]*(?:KEY|TOKEN|SECRET|PASSWORD)[A-Za-z0-9_.-]*)(=)("[^"]*"|'[^']*'|[^\s,;'"}\]]+)""",
    re.IGNORECASE,
)
_ENV_FIELD: Final = re.compile(r"^(env|environ|environment)$|_(env|environ|environment)$", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """A variable or field whose name says it holds a secret (KEY, TOKEN, SECRET, PASSWORD, any case)."""
    return _names_secret(name)


def _names_secret(text: str) -> bool:
    """``text`` holds one of :data:`SECRET_WORDS` in any case. ASCII text (nearly all) is upper-cased and
    searched, several times faster than the case-blind pattern that other text goes through."""
    if text.isascii():
        upper = text.upper()
        return "KEY" in upper or "TOKEN" in upper or "SECRET" in upper or "PASSWORD" in upper
    return _SECRET_NAME.search(text) is not None


def mask_text(text: str) -> str:
    """``API_TOKEN=abc`` or ``--password=abc`` inside free text (a command line, an error) lose the value."""
    if not _names_secret(text):
        return text
    return _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)


def mask_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if secret_name(k) else mask_text(v)) for k, v in env.items()}


def redact(value: Any) -> Any:
    """``value`` with secret-looking fields masked, recursively; for logs and ``pilot status`` alike."""
    t = type(value)
    if t is str:
        return mask_text(value)
    if t in _PLAIN:
        return value
    if t is dict or isinstance(value, Mapping):
        return {k: (MASK if isinstance(k, str) and secret_name(k) else redact(v)) for k, v in value.items()}
    if t is list:
        return [redact(v) for v in value]
    if t is tuple:
        return tuple(redact(v) for v in value)
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    return value


#: Types that hold nothing to mask or hide (checked by identity first: every log field passes here).
_PLAIN: Final = frozenset({int, float, bool, type(None)})


def _is_environment(name: Any, value: Any) -> bool:
    """A field that holds an environment: named env/environ/environment (or ``*_env``...) and a
    mapping or list. A flag such as ``inherit_environment=True`` is not one."""
    return isinstance(name, str) and isinstance(value, Mapping | list | tuple) and bool(_ENV_FIELD.search(name))


def _hide_environments(value: Any) -> Any:
    t = type(value)
    if t is str or t in _PLAIN:
        return value
    if t is dict or isinstance(value, Mapping):
        return {k: (_env_summary(v) if _is_environment(k, v) else _hide_environments(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide_environments(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_hide_environments(v) for v in value)
    return value


def _env_summary(env: Mapping[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    return f"<{len(env)} variables hidden; debug logging shows them with secrets masked>"


class RedactSecrets:
    """structlog processor: task environments are dropped from events (a summary stays) unless debug
    logging is on; secret-looking values are masked either way, also inside exception text."""

    def __init__(self, *, keep_environments: bool = False) -> None:
        self.keep_environments = keep_environments
        #: What each field name is (the same few names come with every event): 1 a secret's, 2 an
        #: environment's, 0 neither.
        self._names: dict[str, int] = {}

    def _kind(self, name: str) -> int:
        kind = self._names.get(name)
        if kind is None:
            kind = self._names[name] = 1 if secret_name(name) else 2 if _ENV_FIELD.search(name) else 0
        return kind

    def plain_name(self, name: str) -> bool:
        """A field of this name is masked only where its text holds ``NAME=value`` (it is not named as a
        secret's or an environment's)."""
        return self._kind(name) == 0

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        names = self._names
        for k, v in list(event_dict.items()):
            kind = names.get(k)
            if kind is None:
                kind = self._kind(k)
            if kind == 1:
                event_dict[k] = MASK
            elif type(v) in _PLAIN:
                continue
            elif kind == 2 and not self.keep_environments and isinstance(v, Mapping | list | tuple):
                event_dict[k] = _env_summary(v)
            elif type(v) is list and all(type(x) is str for x in v):  # e.g. a job's nodes: no environment
                event_dict[k] = [mask_text(x) for x in v]
            elif isinstance(v, str):
                event_dict[k] = mask_text(v)
            elif isinstance(v, Mapping | list | tuple):
                event_dict[k] = redact(v if self.keep_environments else _hide_environments(v))
        return event_dict
