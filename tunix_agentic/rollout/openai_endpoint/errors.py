"""What the recorded episodes refuse, as typed errors: the store and the offers know no HTTP.

:class:`~tunix_agentic.rollout.openai_endpoint.store.EpisodeStore` and
:class:`~tunix_agentic.rollout.openai_endpoint.offers.EpisodeOffers` raise these, each
message naming what was refused; the HTTP layer alone picks the status (the endpoint's
:func:`~tunix_agentic.rollout.openai_endpoint.protocol.refusal`: 404, 409, 413, 429; the
node's claim route, :mod:`~tunix_agentic.rollout.service.node_http`: 429). Nothing here
imports JAX.
"""

from __future__ import annotations


class EpisodeError(Exception):
    """An episode operation the store or the offers refuse; the message says why."""


class EpisodeUnknown(EpisodeError):
    """No such episode: never opened, expired, or the token is not its token (404)."""


class EpisodeClosed(EpisodeError):
    """The episode is closed or withdrawn, or was closed with another reward (409)."""


class EpisodeEmpty(EpisodeError):
    """The episode holds no call a reward could close (409)."""


class EpisodeFull(EpisodeError):
    """The episode would hold more calls, token ids or info bytes than its limits (413)."""


class TooManyOpen(EpisodeError):
    """Opening one more episode would pass the open-episode cap, overall or per client
    (429): the client may try again once it closed some."""


class TooManyClaims(EpisodeError):
    """The client holds as many claimed members as one client may (429)."""
