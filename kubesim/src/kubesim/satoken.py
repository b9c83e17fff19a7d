"""Service-account tokens: the JWT-shaped (unsigned) token kubesim issues for the TokenRequest
API (`kubectl create token`) and projects into containers
(`/var/run/secrets/kubernetes.io/serviceaccount/token`)."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

from kubesim import timefmt

#: the projected token's lifetime (the admission plugin's default `expirationSeconds`, 3607)
PROJECTED_LIFETIME = 3607


def service_account_token(account: dict[str, Any], audiences: list[str], lifetime: int) -> tuple[str, str]:
    """A JWT-shaped (unsigned) token with the claims a projected service-account token has."""
    meta = account["metadata"]
    issued = int(time.time())
    claims = {
        "aud": audiences or ["https://kubernetes.default.svc.cluster.local"],
        "exp": issued + lifetime, "iat": issued, "nbf": issued,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": f"system:serviceaccount:{meta['namespace']}:{meta['name']}",
        "kubernetes.io": {"namespace": meta["namespace"],
                          "serviceaccount": {"name": meta["name"], "uid": meta.get("uid", "")}},
    }

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'none', 'kid': 'kubesim'})}.{part(claims)}.kubesim"
    return token, timefmt.rfc3339(datetime.fromtimestamp(issued + lifetime, UTC))
