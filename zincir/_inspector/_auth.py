"""Who may act through ``zincir ui --allow-actions``, and the checks every write request passes.

- **One login, by a one-time URL, as a deliberate act.** At start-up the server draws a random
  token (256 bits) and prints ``http://<ip:port>/login?token=…``. Opening it (a GET) only shows
  a page with a **Log in** button; nothing is spent, so a link preview, a prefetch or
  ``curl -I`` (a HEAD, refused anyway) cannot take the session. The button POSTs the token,
  checked like every write (Host and Origin); that first POST gets a session and the token is
  gone: a second use of the URL, from anywhere, is refused.
- **A cookie session.** The session is a random id that only this server instance knows (held
  in memory, never stored), sent back as a cookie ``HttpOnly; SameSite=Strict; Path=/``: no
  script can read it (there is no script anyway), and a browser never sends it with a request
  another site starts. Its name carries the port, so two inspectors on one IP keep theirs apart.
  Logging out (a form with its own CSRF token) forgets the session on the server.
- **A CSRF token per form.** Each form carries an HMAC (a key this instance drew at start-up) of
  the session, the action, the run and the form's target (the call id of an approval): a token
  works for that one form of that one session of this server only.
- **Host and Origin.** The app already answers 421 to a foreign ``Host`` and 403 to
  ``Sec-Fetch-Site: cross-site``; a write is checked again here, and also needs an ``Origin``
  naming exactly the served ``http://ip:port`` (a missing one is refused too).

Everything here compares secrets in constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import urllib.parse
from collections.abc import Callable, Mapping

__all__ = ["Guard", "Refusal"]

_TOKEN_BYTES = 32


class Refusal(Exception):
    """A request the guard refuses: ``status`` (403, or 421 for a foreign Host) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Guard:
    """The login token, the sessions and the CSRF key of one server instance."""

    def __init__(self, served_host: Callable[[], str]) -> None:
        self._served_host = served_host  # known once bound (port 0 picks one)
        self._login_token: str | None = secrets.token_urlsafe(_TOKEN_BYTES)
        self._sessions: set[str] = set()
        self._key = secrets.token_bytes(_TOKEN_BYTES)

    # -- logging in --------------------------------------------------------------------------

    def login_url(self, base_url: str) -> str:
        """The one-time login URL under ``base_url`` (the served ``http://ip:port/``)."""
        token = self._login_token
        if token is None:
            raise RuntimeError("the login URL was used already")
        return f"{base_url}login?{urllib.parse.urlencode({'token': token})}"

    def check_login_token(self, token: str | None) -> None:
        """:class:`Refusal` unless ``token`` is the unused one-time token (nothing is spent)."""
        expected = self._login_token
        if expected is None or token is None or not _same(token, expected):
            raise Refusal(
                403,
                "This login link is not valid here: it was used already, or it belongs to another"
                " zincir ui. Restart zincir ui --allow-actions for a new one.",
            )

    def log_in(self, token: str | None) -> str:
        """Trade the one-time token for a new session id; :class:`Refusal` if it is not the
        token, or it was used already."""
        self.check_login_token(token)
        self._login_token = None  # one time only, whatever happens next
        session = secrets.token_urlsafe(_TOKEN_BYTES)
        self._sessions.add(session)
        return session

    def log_out(self, session: str) -> None:
        """End ``session``: its cookie names nothing any more. The login URL was used up, so
        acting again needs a new server instance (and its new URL)."""
        self._sessions.discard(session)

    @property
    def cookie_name(self) -> str:
        port = self._served_host().rpartition(":")[2]
        return f"zincir_session_{port}"

    def session_of(self, cookies: Mapping[str, str]) -> str | None:
        """The session this request's cookie names, if this instance gave it out."""
        cookie = cookies.get(self.cookie_name)
        if not cookie:
            return None
        for session in self._sessions:  # one login per instance: at most one session
            if _same(cookie, session):
                return session
        return None

    # -- CSRF ------------------------------------------------------------------------------

    def csrf_token(self, session: str, action: str, run_id: str, target: str = "") -> str:
        message = "\x00".join((session, action, run_id, target)).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str, action: str, run_id: str, target: str, token: str | None) -> bool:
        return token is not None and _same(token, self.csrf_token(session, action, run_id, target))

    # -- requests --------------------------------------------------------------------------

    def check_write(self, host: str | None, origin: str | None, cookies: Mapping[str, str]) -> str:
        """The session of a write request whose Host, Origin (each given once, or None) and
        cookie all hold; else :class:`Refusal`. (The CSRF token is checked once the form is read.)"""
        self.check_origin(host, origin)
        session = self.session_of(cookies)
        if session is None:
            raise Refusal(
                403,
                "Log in first: open the one-time login URL that zincir ui --allow-actions printed.",
            )
        return session

    def check_origin(self, host: str | None, origin: str | None) -> None:
        """:class:`Refusal` unless the Host and the Origin (each given once, or None) are both
        the served address: what every POST passes, the login's included."""
        served = self._served_host().lower()
        accepted = {served, served.removesuffix(":80")} if served.endswith(":80") else {served}
        if (host or "").lower() not in accepted:
            raise Refusal(421, "This inspector only answers requests addressed to the address it serves.")
        if origin is None:
            raise Refusal(403, "A write needs an Origin header naming this inspector; this request has none.")
        if origin.lower() not in {f"http://{name}" for name in accepted}:
            raise Refusal(403, "This write comes from another origin than this inspector's: refused.")


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
