"""The ASGI application: routing, content negotiation and the REST verbs over the store."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, MutableMapping, MutableSequence
from typing import Any
from urllib.parse import parse_qs

import attrs

from kubesim import (
    discovery,
    errors,
    exec_spdy,
    fieldcheck,
    metrics,
    openapi,
    portforward_session,
    rbac,
    tables,
)
from kubesim.asgi import (
    Query,
    Receive,
    Reply,
    Scope,
    Send,
    accept_form,
    flag,
    json_or_empty,
    json_reply,
    one,
    read_body,
    refuse_websocket,
    send_reply,
)
from kubesim.controllers import Controllers
from kubesim.errors import ApiError
from kubesim.patch import apply_patch
from kubesim.paths import Target, parse_target
from kubesim.podio import (
    check_streamable,
    serve_logs,
    serve_pod_websocket,
    spdy_refused,
)
from kubesim.portforward_session import port_forward_pod
from kubesim.rbac import UserInfo
from kubesim.requests import RecordedRequest, header_map, header_pairs, record
from kubesim.resources import Kind
from kubesim.satoken import service_account_token
from kubesim.selectors import parse_field_selector, parse_label_selector, selector_string
from kubesim.spdy_session import RAW_ACCEPT, RAW_UPGRADE_EXTENSION
from kubesim.store import Store
from kubesim.streaming import SpdySubresource, serve_raw_spdy
from kubesim.watchstream import serve_watch

logger = logging.getLogger("kubesim")

PROTOBUF = "application/vnd.kubernetes.protobuf"
PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")
#: The pod subresources served over SPDY (hyperraw's raw upgrade; see streaming.py).
SPDY_SUBRESOURCES: dict[str, SpdySubresource] = {"exec": exec_spdy.EXEC, "attach": exec_spdy.ATTACH,
                                                   "portforward": portforward_session.PORT_FORWARD}


@attrs.frozen(kw_only=True)
class IssuedToken:
    namespace: str
    name: str
    uid: str
    expires: float


@attrs.frozen(kw_only=True)
class ServerVersion:
    major: str = "1"
    minor: str = "32"
    git_version: str = "v1.32.0"

    def document(self) -> dict[str, Any]:
        return {"major": self.major, "minor": self.minor, "gitVersion": self.git_version,
                "gitCommit": "70d3cc986aa8221cd1dfb1121852688902d3bf53", "gitTreeState": "clean",
                "buildDate": "2024-12-11T17:59:15Z", "goVersion": "go1.23.3", "compiler": "gc",
                "platform": "linux/amd64"}


class KubeApp:
    def __init__(self, store: Store, controllers: Controllers, *, token: str | None,
                 requests: MutableSequence[RecordedRequest], server_address: str = "127.0.0.1:6443",
                 version: ServerVersion | None = None, bookmark_interval: float = 10.0,
                 on_request: Callable[[RecordedRequest], None] | None = None,
                 port_forward_websocket: bool = True) -> None:
        self.store = store
        self.controllers = controllers
        self.token = token
        self.requests = requests
        self.server_address = server_address
        self.version = version or ServerVersion()
        self.bookmark_interval = bookmark_interval
        self.on_request = on_request
        self.metrics = metrics.Metrics()
        # False: no SPDY-in-WebSocket tunnel for port-forward, as API servers before 1.30.
        self.port_forward_websocket = port_forward_websocket
        self.authorizer = rbac.Authorizer(store)
        # The service-account tokens TokenRequest issued: kubesim authenticates those it made.
        self.issued_tokens: dict[str, IssuedToken] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _authenticate(self, scope: Scope, headers: dict[str, str]) -> UserInfo:
        """Who is asking, after impersonation, once RBAC has allowed the request (else 401/403)."""
        recorded = record(scope, headers)
        self.requests.append(recorded)
        if self.on_request is not None:
            self.on_request(recorded)
        caller = self._caller(scope, recorded.bearer_token)
        user = rbac.impersonate(self.authorizer, caller, header_pairs(scope))
        rbac.check(self.authorizer, user, scope.get("method") or "GET", scope.get("path", ""),
                   scope.get("query_string", b"").decode("latin-1"))
        return user

    def _authenticate_or_fail(self, scope: Scope, headers: dict[str, str]) -> UserInfo:
        """`_authenticate`, with a kubesim bug answered as the server answers a panic (a 500 Status)."""
        try:
            return self._authenticate(scope, headers)
        except ApiError:
            raise
        except Exception as exc:
            logger.exception("internal error authorizing %s %s", scope.get("method"), scope.get("path"))
            raise ApiError(500, "InternalError", f"Internal error occurred: {exc!r}") from exc

    def _caller(self, scope: Scope, token: str | None) -> UserInfo:
        if self.token is None or token == self.token:
            return rbac.ADMIN
        if token is None and scope.get("path") in PUBLIC_PATHS:
            return rbac.ANONYMOUS
        issued = self.issued_tokens.get(token or "")
        if issued is not None and issued.expires > time.time():
            account = self.store.find(self.store.kind("", "serviceaccounts"), issued.namespace, issued.name)
            if account is not None and account["metadata"].get("uid") == issued.uid:
                return rbac.service_account_user(issued.namespace, issued.name, issued.uid)
        raise errors.unauthorized()

    # -- HTTP ----------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        try:
            user = self._authenticate_or_fail(scope, headers)
        except ApiError as exc:
            # Refused before the real server's instrumentation: not counted in /metrics.
            await send_reply(send, json_reply(exc.code, exc.status()))
            return
        labels = self._request_labels(scope, scope["method"], headers)
        if labels is None:
            await self._http_authenticated(scope, headers, receive, send, user)
            return
        status = 0
        began = metrics.now()

        async def counting_send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            with self.metrics.in_flight(labels):
                await self._http_authenticated(scope, headers, receive, counting_send, user)
        finally:
            if status:
                self.metrics.observe(labels, status, metrics.now() - began)

    async def _http_authenticated(self, scope: Scope, headers: dict[str, str], receive: Receive,
                                  send: Send, user: UserInfo) -> None:
        started = False

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = started or message.get("type") in ("http.response.start", RAW_ACCEPT)
            await send(message)

        try:
            body = await read_body(receive)
            result = await self._route(scope, headers, body, receive, tracking_send, user)
        except ApiError as exc:
            if started:
                raise
            result = json_reply(exc.code, exc.status())
        except Exception as exc:
            # A kubesim bug: answer as the API server answers a panic, so the client says why.
            logger.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                return
            result = json_reply(500, ApiError(500, "InternalError",
                                              f"Internal error occurred: {exc!r}").status())
        if result is None:
            return  # streamed
        await send_reply(send, result)

    def _request_labels(self, scope: Scope, method: str,
                        headers: dict[str, str]) -> metrics.RequestLabels | None:
        """The /metrics labels of a request, or None for one not counted (an unknown path)."""
        path = scope["path"].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) > 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) > 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return metrics.non_resource_labels(method, path)
        watch = rest[0] == "watch"
        if watch:
            rest = rest[1:]
        if not rest:
            return None
        try:
            target = parse_target(self.store.registry, group, version, rest)
        except ApiError:
            return None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        return metrics.resource_labels(
            method, target, watch=watch or (method == "GET" and flag(query, "watch")),
            dry_run=bool(query.get("dryRun")), content_type=headers.get("content-type", ""))

    def _metrics(self) -> Reply:
        storage = []
        seen = set()
        for kind in self.store.registry:
            if kind.virtual or (kind.group, kind.plural) in seen:
                continue
            seen.add((kind.group, kind.plural))
            name = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
            storage.append((name, self.store.count(kind.group, kind.plural)))
        body = self.metrics.render(storage=storage,
                                   build=metrics.build_labels(self.version.document()))
        return Reply(status=200, body=body, content_type=metrics.CONTENT_TYPE)

    async def _route(self, scope: Scope, headers: dict[str, str], body: bytes,
                     receive: Receive, send: Send, user: UserInfo) -> Reply | None:
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        accept = headers.get("accept", "application/json")
        if path in ("/healthz", "/livez", "/readyz"):
            return Reply(status=200, body=b"ok", content_type="text/plain; charset=utf-8")
        if path == "/version":
            return json_reply(200, self.version.document())
        if path == "/metrics":
            if method not in ("GET", "HEAD"):
                raise errors.method_not_allowed()
            return self._metrics()
        if path == "/":
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/metrics", "/openapi/v2",
                     "/openapi/v3", "/readyz", "/version"]
            paths += [f"/apis/{g}" for g, _ in self.store.registry.groups() if g]
            return json_reply(200, {"paths": sorted(paths)})
        if path.startswith("/openapi"):
            return self._openapi(path, accept)
        parts = path.strip("/").split("/")
        if parts[0] == "api":
            if len(parts) == 1:
                aggregated = discovery.wants_aggregated(accept)
                if aggregated:
                    return self._aggregated(core=True, version=aggregated)
                return json_reply(200, discovery.api_versions(self.server_address))
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            if len(parts) == 1:
                aggregated = discovery.wants_aggregated(accept)
                if aggregated:
                    return self._aggregated(core=False, version=aggregated)
                return json_reply(200, discovery.api_group_list(self.store.registry))
            if len(parts) == 2:
                doc = discovery.api_group(self.store.registry, parts[1])
                if doc is None:
                    raise errors.page_not_found()
                return json_reply(200, doc)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.page_not_found()
        if not rest:
            doc = discovery.api_resource_list(self.store.registry, group, version)
            if doc is None:
                raise errors.page_not_found()
            return json_reply(200, doc)
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        target = parse_target(self.store.registry, group, version, rest)
        if target.subresource in ("exec", "attach", "portforward"):
            # Not a WebSocket: a SPDY attempt (or a plain request). Report what the kubelet would
            # refuse first, so a fallback from a refused WebSocket shows the real reason.
            if target.subresource != "portforward":
                check_streamable(self.store, self.controllers, target, query)
            else:
                port_forward_pod(self.store, target)
            if "spdy/" in headers.get("upgrade", "").lower():
                spdy = SPDY_SUBRESOURCES.get(target.subresource)
                if spdy is None or RAW_UPGRADE_EXTENSION not in (scope.get("extensions") or {}):
                    raise spdy_refused(target.subresource)  # no handler, or KUBESIM_SPDY=0
                await serve_raw_spdy(spdy, self.store, self.controllers, target, query, scope,
                                     receive, send)
                return None
            raise errors.bad_request("Upgrade request required")
        if watch_path or (flag(query, "watch") and method == "GET"):
            await serve_watch(self.store, target, query, accept, receive, send,
                              bookmark_interval=self.bookmark_interval)
            return None
        if target.subresource == "log":
            if method != "GET":
                raise errors.method_not_allowed()
            await serve_logs(self.store, self.controllers, target, query, receive, send)
            return None
        return self._verb(method, target, query, headers, body, accept, user)

    def _aggregated(self, *, core: bool, version: str) -> Reply:
        api_version = f"apidiscovery.k8s.io/{version}"
        doc = discovery.aggregated(self.store.registry, core=core, api_version=api_version)
        content_type = f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
        return json_reply(200, doc, content_type=content_type)

    def _openapi(self, path: str, accept: str) -> Reply:
        registry = self.store.registry
        if path == "/openapi/v2":
            if "json" not in accept and "*/*" not in accept:
                return json_reply(406, ApiError(406, "NotAcceptable",
                                                "only application/json is served for /openapi/v2").status())
            return json_reply(200, openapi.v2_document(registry))
        if path == "/openapi/v3":
            return json_reply(200, openapi.v3_root(registry))
        if path.startswith("/openapi/v3/"):
            gv = openapi.v3_path_to_group_version(path[len("/openapi/v3/"):])
            doc = openapi.v3_document(registry, *gv) if gv else None
            if doc is None:
                raise errors.page_not_found()
            return json_reply(200, doc)
        raise errors.page_not_found()

    # -- verbs ---------------------------------------------------------------------------------

    def _verb(self, method: str, target: Target, query: Query, headers: dict[str, str],
              body: bytes, accept: str, user: UserInfo) -> Reply:
        kind, ns, name, sub = target.kind, target.namespace, target.name, target.subresource
        store = self.store
        dry_run = dry_run_requested(method, query)
        if kind.namespaced and name is not None and not ns:
            raise errors.page_not_found()
        if name is None:
            if method == "GET":
                return self._list(target, query, accept)
            if method == "POST" and kind.virtual:
                return json_reply(201, self._review(kind, headers, body, user))
            if method == "POST":
                obj = self._decode(headers, body)
                warnings = fieldcheck.check(store.registry, kind, obj, one(query, "fieldValidation"))
                created = store.create(kind, ns, obj, dry_run=dry_run)
                return json_reply(201, created, warnings=warnings)
            if method == "DELETE":
                return self._delete_collection(target, query)
            raise errors.method_not_allowed()
        if sub == "scale":
            return self._scale(method, target, query, headers, body)
        if sub in ("binding", "eviction", "token", "finalize") and method in ("POST", "PUT"):
            return self._special(target, headers, body)
        if method == "GET":
            obj = store.get(kind, ns, name)
            return self._renderone(kind, obj, accept)
        if method == "PUT":
            obj = self._decode(headers, body)
            warnings = fieldcheck.check(store.registry, kind, obj, one(query, "fieldValidation"))
            updated = store.update(kind, ns, name, obj, subresource=sub, dry_run=dry_run)
            return json_reply(200, updated, warnings=warnings)
        if method == "PATCH":
            existing = store.get(kind, ns, name)
            content_type = headers.get("content-type", "")
            try:
                patch_body = json.loads(body or b"null")
            except ValueError as exc:
                if content_type.startswith("application/apply-patch"):
                    patch_body = None
                else:
                    raise errors.bad_request(f"error decoding patch: {exc}") from exc
            patched = apply_patch(content_type, existing, patch_body, custom=kind.custom)
            if not isinstance(patched, dict):
                raise errors.bad_request("the patch did not produce an object")
            warnings = fieldcheck.check(store.registry, kind, patched, one(query, "fieldValidation"))
            if sub != "status":
                patched.setdefault("status", existing.get("status"))
            updated = store.update(kind, ns, name, patched, subresource=sub, dry_run=dry_run)
            return json_reply(200, updated, warnings=warnings)
        if method == "DELETE":
            options = json_or_empty(body)
            propagation = one(query, "propagationPolicy") or options.get("propagationPolicy")
            if options.get("orphanDependents") is True:
                propagation = "Orphan"
            pre = options.get("preconditions") or {}
            deleted = store.delete(kind, ns, name, propagation=propagation,
                                   precondition_uid=pre.get("uid"),
                                   precondition_rv=pre.get("resourceVersion"), dry_run=dry_run)
            if kind.plural in ("pods", "namespaces") or kind.custom or deleted["metadata"].get("deletionTimestamp"):
                return json_reply(200, deleted)
            details = {"name": name, "kind": kind.plural, "uid": deleted["metadata"].get("uid")}
            if kind.group:
                details["group"] = kind.group
            return json_reply(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "details": details})
        raise errors.method_not_allowed()

    def _decode(self, headers: dict[str, str], body: bytes) -> dict[str, Any]:
        content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if content_type == PROTOBUF:
            from kubesim import protobuf  # written alongside; imported when first needed

            try:
                return protobuf.decode_protobuf_object(body)
            except protobuf.ProtobufDecodeError as exc:
                if str(exc).startswith("no protobuf decoder for"):
                    # A kind kubesim cannot decode: say so the way the server refuses a type.
                    raise errors.unsupported_media_type(
                        f"{exc}; kubesim decodes protobuf bodies of the kinds kubectl's "
                        "generators create - send this one as application/json") from exc
                raise errors.bad_request(f"the body of the request was in an unknown format: {exc}") from exc
        if content_type in ("application/json", "", "*/*"):
            try:
                obj = json.loads(body)
            except ValueError as exc:
                raise errors.bad_request(f"the body of the request was in an unknown format: {exc}") from exc
            if not isinstance(obj, dict):
                raise errors.bad_request("the body of the request was in an unknown format")
            return obj
        raise errors.unsupported_media_type(
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json, application/yaml, {PROTOBUF}")

    def _review(self, kind: Kind, headers: dict[str, str], body: bytes,
                user: UserInfo) -> dict[str, Any]:
        """Access reviews and whoami, answered for the (impersonated) user the request runs as."""
        try:
            request = self._decode(headers, body)
        except ApiError:
            request = {}  # a protobuf review kubesim cannot decode: the answer does not depend on it
        request = {k: v for k, v in request.items() if k in ("metadata", "spec")}
        request.setdefault("metadata", {})
        spec = request.get("spec") if isinstance(request.get("spec"), dict) else {}
        if kind.kind == "SelfSubjectAccessReview":
            status: dict[str, Any] = self.authorizer.access_review(user, spec)
        elif kind.kind == "SelfSubjectRulesReview":
            status = self.authorizer.rules_review(user, str(spec.get("namespace") or ""))
        else:
            status = {"userInfo": user.document()}
        return {"kind": kind.kind, "apiVersion": kind.api_version, **request, "status": status}

    def _list(self, target: Target, query: Query, accept: str) -> Reply:
        kind = target.kind
        labels = parse_label_selector(one(query, "labelSelector"))
        fields = parse_field_selector(one(query, "fieldSelector"))
        limit_text = one(query, "limit")
        limit = int(limit_text) if limit_text and limit_text.isdigit() and int(limit_text) > 0 else None
        result = self.store.list(
            kind, target.namespace,
            predicate=lambda o: labels(o) and fields(o),
            limit=limit, continue_token=one(query, "continue") or None,
            exact_selector=not (one(query, "labelSelector") or one(query, "fieldSelector")))
        form = accept_form(accept)
        if form == "Table":
            doc = tables.table(kind, result.items, resource_version=result.resource_version,
                               continue_token=result.continue_token,
                               include_object=one(query, "includeObject") or "Metadata")
            return json_reply(200, doc)
        items = result.items
        if not kind.custom:
            for item in items:
                item.pop("apiVersion", None)
                item.pop("kind", None)
        metadata: dict[str, Any] = {"resourceVersion": result.resource_version}
        if result.continue_token:
            metadata["continue"] = result.continue_token
        if result.remaining is not None:
            metadata["remainingItemCount"] = result.remaining
        if form == "PartialObjectMetadata":
            return json_reply(200, {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                    "metadata": metadata,
                                    "items": [tables.partial_metadata(i) for i in items]})
        return json_reply(200, {"kind": kind.list_kind, "apiVersion": kind.api_version,
                                "metadata": metadata, "items": items})

    def _renderone(self, kind: Kind, obj: dict[str, Any], accept: str) -> Reply:
        form = accept_form(accept)
        if form == "Table":
            return json_reply(200, tables.table(kind, [obj]))
        if form == "PartialObjectMetadata":
            return json_reply(200, tables.partial_metadata(obj))
        return json_reply(200, obj)

    def _delete_collection(self, target: Target, query: Query) -> Reply:
        kind = target.kind
        labels = parse_label_selector(one(query, "labelSelector"))
        fields = parse_field_selector(one(query, "fieldSelector"))
        result = self.store.list(kind, target.namespace, predicate=lambda o: labels(o) and fields(o))
        deleted = []
        for item in result.items:
            meta = item["metadata"]
            try:
                deleted.append(self.store.delete(kind, meta.get("namespace"), meta["name"],
                                                 propagation=one(query, "propagationPolicy")))
            except ApiError:
                continue
        return json_reply(200, {"kind": kind.list_kind, "apiVersion": kind.api_version,
                                "metadata": {"resourceVersion": str(self.store.resource_version)},
                                "items": deleted})

    def _scale(self, method: str, target: Target, query: Query,
               headers: dict[str, str], body: bytes) -> Reply:
        kind, ns, name = target.kind, target.namespace, target.name
        assert name is not None
        obj = self.store.get(kind, ns, name)
        scale = _scale_of(obj)
        if method == "GET":
            return json_reply(200, scale)
        if method == "PUT":
            wanted = self._decode(headers, body)
        elif method == "PATCH":
            wanted = apply_patch(headers.get("content-type", ""), scale, json.loads(body or b"null"), custom=False)
        else:
            raise errors.method_not_allowed()
        replicas = (wanted.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid("Scale", "autoscaling", name, [("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0")])
        rv = (wanted.get("metadata") or {}).get("resourceVersion")
        if rv and rv != obj["metadata"]["resourceVersion"]:
            raise errors.conflict(kind.group, kind.plural, name)
        obj.setdefault("spec", {})["replicas"] = replicas
        updated = self.store.update(kind, ns, name, obj)
        return json_reply(200, _scale_of(updated))

    def _special(self, target: Target, headers: dict[str, str], body: bytes) -> Reply:
        kind, ns, name, sub = target.kind, target.namespace, target.name, target.subresource
        assert name is not None
        if sub == "eviction":
            self.store.delete(kind, ns, name)
            return json_reply(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "code": 201})
        if sub == "binding":
            binding = self._decode(headers, body)
            pod = self.store.get(kind, ns, name)
            pod.setdefault("spec", {})["nodeName"] = (binding.get("target") or {}).get("name")
            self.store.update(kind, ns, name, pod)
            return json_reply(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "code": 201})
        if sub == "token":
            account = self.store.get(kind, ns, name)
            request = self._decode(headers, body)
            spec = request.setdefault("spec", {})
            lifetime = int(spec.get("expirationSeconds") or 3600)
            spec["expirationSeconds"] = lifetime
            token, expires = service_account_token(account, spec.get("audiences") or [], lifetime)
            meta = account["metadata"]
            now = time.time()
            self.issued_tokens = {t: i for t, i in self.issued_tokens.items() if i.expires > now}
            self.issued_tokens[token] = IssuedToken(namespace=meta["namespace"], name=meta["name"],
                                                    uid=meta["uid"], expires=time.time() + lifetime)
            return json_reply(201, {**request, "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                                    "status": {"token": token, "expirationTimestamp": expires}})
        if sub == "finalize":
            obj = self._decode(headers, body)
            current = self.store.get(kind, ns, name)
            current["spec"] = obj.get("spec", current.get("spec"))
            return json_reply(200, current)
        raise errors.method_not_allowed()

    # -- WebSocket -----------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        try:
            self._authenticate_or_fail(scope, headers)
        except ApiError as exc:
            await refuse_websocket(scope, send, exc)
            return
        labels = self._request_labels(scope, "GET", headers)
        if labels is None:
            await self._websocket_authenticated(scope, receive, send)
            return
        status = 0
        began = metrics.now()

        async def counting_send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            kind = message.get("type")
            if kind == "websocket.accept" and not status:
                status = 101
            elif kind == "websocket.http.response.start" and not status:
                status = int(message["status"])
            elif kind == "websocket.close" and not status:
                status = 403  # refused before the upgrade, as an ASGI server answers it
            await send(message)

        try:
            with self.metrics.in_flight(labels):
                await self._websocket_authenticated(scope, receive, counting_send)
        finally:
            if status:
                self.metrics.observe(labels, status, metrics.now() - began)

    async def _websocket_authenticated(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            parts = scope["path"].strip("/").split("/")
            if len(parts) != 7 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                raise errors.page_not_found()
            target = parse_target(self.store.registry, "", "v1", parts[2:])
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            if target.subresource == "portforward" and not self.port_forward_websocket:
                # Such a server hands the WebSocket to the kubelet's own WebSocket port-forward,
                # which wants its ports in the query (portforward/websocket.go NewV4Options).
                raise errors.bad_request('query parameter "port" is required')
            await serve_pod_websocket(self.store, self.controllers, target, query, scope, receive, send)
        except ApiError as exc:
            await refuse_websocket(scope, send, exc)


def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    scale_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": scale_meta,
            "spec": {"replicas": spec.get("replicas", 0)},
            "status": {"replicas": status.get("replicas", 0),
                       "selector": selector_string(spec.get("selector")).replace("<none>", "")}}


__all__ = ["KubeApp", "RecordedRequest", "Reply", "ServerVersion", "json_reply"]


#: the options each writing verb's query is decoded into; their validation errors name it
_WRITE_OPTIONS = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions",
                  "DELETE": "DeleteOptions"}


def dry_run_requested(method: str, query: Query) -> bool:
    """Whether a write is a dry run (validated, answered as if done, nothing stored): `dryRun=All`,
    the only value the API server accepts. Any other (a typo, an empty value) is refused as
    ValidateDryRun refuses it, 422 naming the options kind, rather than taken as a real write or
    silently as a dry run."""
    values = query.get("dryRun")
    if not values or method not in _WRITE_OPTIONS:
        return False
    if any(value != "All" for value in values):
        shown = "[]string{" + ", ".join(json.dumps(value) for value in values) + "}"
        raise errors.invalid(_WRITE_OPTIONS[method], "meta.k8s.io", "",
                             [("dryRun", f'Unsupported value: {shown}: supported values: "All"')])
    return True
