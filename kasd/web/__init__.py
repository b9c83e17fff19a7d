"""kasd's web app on the API port (``listeners.api``): the REST API of environments (GitLab's
``/api/v4/projects/:project/environments`` and kasd's ``/api/kasd/v1/…``), its OpenAPI document,
browser sign-in (a signed session cookie and a CSRF token), CORS for configured origins, and the
live graph as server-sent events, and the dashboard (``kasd.web.dashboard``: static pages under
``/-/dashboard/``); and the in-cluster services' routes (``kasd.web.services``: a plan for the proxy's
request pipeline, served before the app). One ASGI app (``kasd.web.app.mount``) serves it and, on the same
port, the job-token calls of ``kasd.restapi.RestApi`` unchanged.

May import: ``kasd.authz`` (tokens, directory, policy: pure), ``kasd.seams`` (the proxy's reading of a bearer token), ``kasd.restapi`` (to route to it),
``kasd.asgiport`` (the app's type), ``kasd.k8sproxy`` (``services``: the pipeline, its exchange and
status values), ``kasd.store.protocol`` (its failure), ``kasd.config``, ``routing.retry`` (HTTP's safe methods, one list), and ``routing.local`` (``wiring``: what
``kasd.server`` plugs in), ``tunnelhttp.head`` (an impersonation; a refusal's code), ``tunnelhttp.kinds``, ``wire.session``, starlette, trio, attrs, pyyaml,
cryptography (HKDF), the standard library. What it consumes from the rest of kasd (the store's
environments, the live views of ``kasd.environments``, the connected agents, the graph of
``kasd.envgraph``) comes in through the Protocols of ``kasd.web.seams``.
"""

from kasd.environments.values import Viewer
from kasd.web.app import WebApp, WebSettings, mount
from kasd.web.session import session_key

__all__ = ["Viewer", "WebApp", "WebSettings", "mount", "session_key"]
