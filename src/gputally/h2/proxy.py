"""An HTTP CONNECT proxy for a gRPC client, chosen from the environment as gRPC core chooses it."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .target import Target

__all__ = ["Proxy", "proxy_for", "tunnel"]

log = logging.getLogger("gputally.h2.client")


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy reached with CONNECT: its address and its Basic credentials, if any."""

    host: str
    port: int
    authorization: str | None = None


def proxy_for(target: Target, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy a TCP target is reached through, as gRPC core chooses it: ``grpc_proxy``,
    else ``https_proxy`` / ``HTTPS_PROXY``, else ``http_proxy`` / ``HTTP_PROXY``, unless the
    host matches ``no_proxy`` / ``NO_PROXY`` (a name or a suffix of one, an IP, a CIDR, ``*``)."""
    if target.path is not None:
        return None
    url = next((environ[key] for key in ("grpc_proxy", "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
                if environ.get(key)), "")
    if not url or _no_proxy(target.host, environ.get("no_proxy") or environ.get("NO_PROXY") or ""):
        return None
    parsed = urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname:
        log.warning("ignoring proxy %r: only http:// proxies (CONNECT) are supported", url)
        return None
    authorization = None
    if parsed.username is not None:
        credentials = f"{unquote(parsed.username)}:{unquote(parsed.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(credentials).decode("ascii")
    return Proxy(parsed.hostname, parsed.port or 80, authorization)


def _no_proxy(host: str, rules: str) -> bool:
    host = host.strip("[]").lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for rule in (r.strip().lower() for r in rules.split(",")):
        if not rule:
            continue
        if rule == "*":
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(rule.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        rule = rule.lstrip(".")
        if host == rule or host.endswith("." + rule):
            return True
    return False


async def tunnel(proxy: Proxy, target: Target) -> socket.socket:
    """A socket to ``target`` through ``proxy``'s HTTP CONNECT (the caller bounds the time)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
        authority = target.authority
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if proxy.authorization:
            request += f"Proxy-Authorization: {proxy.authorization}\r\n"
        await loop.sock_sendall(sock, (request + "\r\n").encode("latin-1"))
        # Byte by byte: what follows the answer's head is the server's, and must stay unread.
        answer = bytearray()
        while not answer.endswith(b"\r\n\r\n"):
            byte = await loop.sock_recv(sock, 1)
            if not byte or len(answer) > 16384:
                raise OSError(f"proxy {proxy.host}:{proxy.port} closed or sent no CONNECT answer")
            answer += byte
        line = bytes(answer.split(b"\r\n", 1)[0])
        status = line.split()
        if len(status) < 2 or status[1] != b"200":
            raise OSError(f"proxy {proxy.host}:{proxy.port} refused CONNECT {authority}: "
                          f"{line.decode('latin-1')[:100]}")
    except BaseException:
        sock.close()
        raise
    return sock
