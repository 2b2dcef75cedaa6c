"""The trust boundary of the serving plugins: which hints may move another tenant's cache.

A probability in a request's body is set by whoever sends the request, so by default it is
ignored; it is used only through vLLM's orchestrator channel (`kv_hints`), with a valid
`lpc_signature` (HMAC-SHA256 under `hint_key`, `sign_hint`), or when the operator trusts every
client (`trust_request_hints`). Conversation ids are namespaced by the request's tenant.

Why and how: docs/design.md, "The trust boundary".
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from lpc.integrations.request_hints import MAX_CONVERSATION_ID_CHARS, RequestHints

KV_HINT_ACTION = "lpc-release"
KV_HINT_VERSION = "1"
_SIGNATURE_DOMAIN = "lpc-hint-v1"


def tenant_of(request: Any) -> str:
    """The request's tenant as the prefix cache separates them: its `cache_salt` and LoRA
    adapter ("" for neither: the requests that share the cache unsalted)."""
    parts = []
    salt = getattr(request, "cache_salt", None)
    if isinstance(salt, str) and salt:
        parts.append(f"salt={salt}")
    lora = getattr(request, "lora_request", None)
    name = getattr(lora, "lora_name", None) if lora is not None else None
    if isinstance(name, str) and name:
        parts.append(f"lora={name}")
    return "|".join(parts)


def namespaced(tenant: str, conversation_id: str) -> str:
    """A conversation id no other tenant can name (unchanged for the unsalted tenant)."""
    return f"{tenant}/{conversation_id}" if tenant else conversation_id


def _message(probability: float, conversation_id: str | None, tenant: str) -> bytes:
    return "\x1f".join(
        (_SIGNATURE_DOMAIN, repr(float(probability)), conversation_id or "", tenant)
    ).encode("utf-8")


def sign_hint(key: str, probability: float, conversation_id: str | None, tenant: str) -> str:
    """The `lpc_signature` a router attaches to a request's `lpc_probability` (hex)."""
    digest = hmac.new(key.encode("utf-8"), _message(probability, conversation_id, tenant), "sha256")
    return digest.hexdigest()


@dataclass(frozen=True)
class KvHint:
    """LPC's action in vLLM's orchestrator channel, validated (None fields: not given)."""

    probability: float | None = None
    conversation_id: str | None = None


def kv_hint_of(request: Any) -> KvHint | None:
    """LPC's action in the request's `kv_hints` envelope (None: none, or malformed: a bad
    trusted hint is dropped like a bad body hint, never fails the request)."""
    envelope = getattr(request, "kv_hints", None)
    actions = getattr(envelope, "actions", None)
    if not actions:
        return None
    for action in actions:
        if (
            getattr(action, "action_type", None) != KV_HINT_ACTION
            or getattr(action, "action_version", None) != KV_HINT_VERSION
        ):
            continue
        payload = getattr(action, "payload", None)
        if not isinstance(payload, Mapping):
            return None
        probability = payload.get("probability")
        if not (
            isinstance(probability, int | float)
            and not isinstance(probability, bool)
            and math.isfinite(probability)
            and 0.0 <= probability <= 1.0
        ):
            probability = None
        conversation = payload.get("conversation_id")
        if not (
            isinstance(conversation, str) and 0 < len(conversation) <= MAX_CONVERSATION_ID_CHARS
        ):
            conversation = None
        return KvHint(None if probability is None else float(probability), conversation)
    return None


@dataclass(frozen=True)
class HintTrust:
    """What a release may use of a request's hints (`trust_request_hints`, `hint_key`)."""

    trust_request_hints: bool = False
    hint_key: str | None = None

    def signed(self, hints: RequestHints, tenant: str) -> bool:
        """Whether the body's probability carries a valid signature under `hint_key`."""
        if self.hint_key is None or hints.signature is None or hints.probability is None:
            return False
        expected = sign_hint(self.hint_key, hints.probability, hints.conversation_id, tenant)
        return hmac.compare_digest(expected, hints.signature)

    def apply(self, request: Any, hints: RequestHints) -> tuple[RequestHints, bool]:
        """The hints a release may use, and whether a body probability was dropped as
        untrusted. The conversation: the orchestrator's, else vLLM's `session_id`, else the
        body's, namespaced by tenant; the probability: the orchestrator's, else the body's if
        signed or all clients are trusted, else none (the model's or the fallback p). The
        hints carry the tenant (the release counts its pinned blocks against it)."""
        tenant = tenant_of(request)
        kv_hint = kv_hint_of(request)
        session = getattr(request, "session_id", None)
        if not (isinstance(session, str) and 0 < len(session) <= MAX_CONVERSATION_ID_CHARS):
            session = None
        conversation = (
            (kv_hint.conversation_id if kv_hint is not None else None)
            or session
            or hints.conversation_id
        )
        body_trusted = self.trust_request_hints or self.signed(hints, tenant)
        probability = kv_hint.probability if kv_hint is not None else None
        dropped = False
        if probability is None and hints.probability is not None:
            if body_trusted:
                probability = hints.probability
            else:
                dropped = True
        if (
            probability == hints.probability
            and conversation == hints.conversation_id
            and not tenant
            and not dropped
        ):
            return hints, False
        return (
            replace(
                hints,
                probability=probability,
                conversation_id=None if conversation is None else namespaced(tenant, conversation),
                tenant=tenant,
            ),
            dropped,
        )
