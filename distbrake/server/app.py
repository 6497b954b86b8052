"""The ASGI app of `distbrake serve` (see the package's doc for the endpoints).

Why Starlette and uvicorn: the smallest well-kept ASGI pair (no validation
framework, no ORM), both typed, both already in most Python services'
environments; uvicorn serves HTTP/1.1 keep-alive well enough for a hook
endpoint that answers in a fraction of a millisecond plus the brake's step.

Every check runs the brake (any sync brake: a `FileBrake`, or a `DistributedBrake`
on Redis) in Starlette's thread pool, so a slow backend never blocks the event
loop; the brake's own timeout bounds each check. Request bodies are capped
(413); a bad body is a 400 whose message names the problem, never a value.
With a token, every endpoint but /healthz requires `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..core import PreparedCall, Verdict
from ..errors import BrakeUnavailableError, DistbrakeError, LoopBrakeError
from ..filebrake import FileBrake
from ..hosts import HOSTS, HookInputError, host, shown
from ..hosts.run import decide, not_handled, read_payload, refused, warned
from .steps import StepQueue

__all__ = ["DEFAULT_MAX_BODY", "create_app"]

DEFAULT_MAX_BODY = 1024 * 1024
ENDPOINTS = ("check", "observe", *(f"hooks/{name}" for name in HOSTS), "docker/before", "docker/after")
HEALTH_PROBE = "distbrake-serve-healthz"  # a session id no one uses: /healthz reads it


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(
    brake: Any, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY, backend: str = "",
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """The app over `brake` (a sync brake); `token`: the bearer token every endpoint but /healthz requires."""
    server = _Server(brake, token, max_body, backend, registry if registry is not None else CollectorRegistry())
    routes = [
        Route("/v1/check", server.endpoint("check", server.check), methods=["POST"]),
        Route("/v1/observe", server.endpoint("observe", server.observe), methods=["POST"]),
        *(Route(f"/v1/hooks/{name}", server.endpoint(f"hooks/{name}", server.hook_endpoint(name)), methods=["POST"])
          for name in HOSTS),
        *(Route(f"/docker/{step}", server.endpoint(f"docker/{step}", server.docker_endpoint(step)), methods=["POST"])
          for step in ("before", "after")),
        Route("/healthz", server.healthz, methods=["GET"]),
        Route("/metrics", server.metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes)


Body = Callable[[Request], Awaitable[tuple[Response, str]]]


class _Server:
    """The endpoints' shared state: the brake, the token, the body cap, the metrics."""

    def __init__(self, brake: Any, token: str | None, max_body: int, backend: str, registry: CollectorRegistry):
        self.brake, self.max_body, self.backend, self.registry = brake, max_body, backend, registry
        # a streak file: checks batched by one thread (steps.py); any other brake: one thread-pool call per check
        self.steps = StepQueue(brake.store, brake.cycles) if isinstance(brake, FileBrake) else None
        self.expected = f"Bearer {token}".encode() if token else None
        self.requests = Counter("distbrake_serve_requests", "Requests by endpoint and outcome.",
                                ["endpoint", "outcome"], registry=registry)
        self.latency = Histogram(
            "distbrake_serve_request_seconds", "Time to answer, by endpoint.", ["endpoint"], registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )

    async def check_call(self, tool: str, args: Any, session: str, call_id: str | None) -> Verdict:
        """The brake's check of one call, off the event loop; raises as `brake.check` does."""
        brake = self.brake
        if self.steps is None:
            verdict: Verdict = await run_in_threadpool(brake.check, tool, args, session_id=session,
                                                       call_id=call_id)
            return verdict
        call = brake.prepare(tool, args, session, call_id)
        if brake.switch.pending is not None:  # the kill switch (a step reads it too; an exempt tool only here)
            brake.switch.consult(call)
        if isinstance(call, Verdict):  # an exempt tool
            return call
        counted = await self.steps.step(call)
        judged: Verdict = brake.judge(call, counted, "in-process")
        return judged

    def authorized(self, request: Request) -> bool:
        if self.expected is None:
            return True
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), self.expected)

    def endpoint(self, name: str, body: Body) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            start = time.perf_counter()
            if not self.authorized(request):
                self.requests.labels(name, "unauthorized").inc()
                return _unauthorized()
            try:
                response, outcome = await body(request)
            except BadRequest as error:
                response, outcome = JSONResponse(_error("BAD_REQUEST", str(error)), error.status), "bad_request"
            self.requests.labels(name, outcome).inc()
            self.latency.labels(name).observe(time.perf_counter() - start)
            return response

        return run

    async def read(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object: at most max_body bytes (413), JSON (400)."""
        limit = self.max_body
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise BadRequest(413, f"the body is larger than {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(413, f"the body is larger than {limit} bytes")
            chunks.append(chunk)
        try:
            return read_payload(b"".join(chunks), limit)
        except HookInputError as error:
            raise BadRequest(400, str(error).replace("the event", "the body")) from None

    def docker_endpoint(self, step: str) -> Body:
        """Docker MCP Gateway's `before:http:` / `after:http:` interceptor (`gateways/docker.py`): always a 200,
        empty to let the call through, else the `CallToolResult` that replaces it (the gateway reads any body
        as a result, so an oversized body is cut and answered by the interceptor's own bad-input rule)."""
        from ..gateways.docker import DockerInterceptor
        from ..gateways.sessions import GatewaySessions

        sessions = GatewaySessions(require_session=self.brake.settings.require_session)
        interceptor = DockerInterceptor(self.brake, sessions)
        answer = interceptor.before if step == "before" else interceptor.after

        async def run(request: Request) -> tuple[Response, str]:
            chunks, size = [], 0
            async for chunk in request.stream():
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_body:
                    break
            body = await answer(b"".join(chunks))
            media = "application/json" if body else None
            return Response(body, 200, media_type=media), "refused" if body else "allowed"

        return run

    def hook_endpoint(self, name: str) -> Body:
        agent = host(name)

        async def answer(request: Request) -> tuple[Response, str]:
            payload = await self.read(request)
            try:
                event = agent.parse(payload)
            except HookInputError as error:
                raise BadRequest(400, str(error)) from None
            if event is None:
                raise BadRequest(400, not_handled(payload))
            scope = request.query_params.get("scope", "session")
            session = event.run if scope == "run" and event.run else event.session
            try:
                if event.phase == "post":
                    decision = await run_in_threadpool(decide, self.brake, event, session)
                else:
                    try:
                        decision = warned(await self.check_call(event.tool, event.args, session, event.call_id))
                    except (LoopBrakeError, BrakeUnavailableError) as error:
                        decision = refused(error)
            except Exception as error:  # the backend failed past its policy (a file it cannot write, ...)
                what = str(error) if isinstance(error, DistbrakeError) else type(error).__name__
                return JSONResponse(_error("BRAKE_ERROR", shown(what, 300)), 503), "unavailable"
            reply = agent.allow(event.event) if decision is None else agent.answer(event.event, decision)
            outcome = "allowed" if decision is None else OUTCOMES[decision.verb]
            return Response(reply.stdout or "{}", media_type="application/json"), outcome

        return answer

    async def check(self, request: Request) -> tuple[Response, str]:
        tool, args, session, call_id = _call(await self.read(request))
        try:
            verdict = await self.check_call(tool, args, session, call_id)
        except LoopBrakeError as error:
            outcome = "halted" if error.kind == "halt" else "denied"
            return JSONResponse({"allowed": False, "error": _refusal(error)}), outcome
        except BrakeUnavailableError as error:
            return JSONResponse(_error("BRAKE_UNAVAILABLE", shown(error, 300)), 503), "unavailable"
        except DistbrakeError as error:  # arguments JSON cannot express, a missing session, ...
            raise BadRequest(400, shown(error, 300)) from None
        except Exception as error:  # the backend failed past its policy (a file it cannot write, ...)
            return JSONResponse(_error("BRAKE_ERROR", type(error).__name__), 503), "unavailable"
        return JSONResponse(_verdict(verdict)), "warned" if verdict.warning else "allowed"

    async def observe(self, request: Request) -> tuple[Response, str]:
        body = await self.read(request)
        tool, args, session, call_id = _call(body)
        if call_id is None:
            raise BadRequest(400, "'call_id' is required: the observation names the call it follows")
        if "result" not in body:
            raise BadRequest(400, "the body has no 'result' field")
        brake = self.brake

        def run() -> bool:
            call = brake.prepare(tool, args, session, call_id)
            if not isinstance(call, PreparedCall) or not call.rules.progress:
                return False
            brake.observe(Verdict(0, call.max_repeats, call.hash_prefix, session, tool, observe_token=call),
                          body["result"])
            return True

        try:
            observed = await run_in_threadpool(run)
        except DistbrakeError as error:
            raise BadRequest(400, shown(error, 300)) from None
        return JSONResponse({"observed": observed}), "observed" if observed else "ignored"

    async def healthz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.brake.inspect, HEALTH_PROBE)
        except Exception as error:
            body = {"status": "unavailable", "backend": self.backend, "error": type(error).__name__}
            return JSONResponse(body, 503)
        return JSONResponse({"status": "ok", "backend": self.backend})

    async def metrics(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


OUTCOMES = {"warn": "warned", "deny": "denied", "halt": "halted", "allow": "allowed"}


def _unauthorized() -> Response:
    return JSONResponse(_error("UNAUTHORIZED", "a bearer token is required"), 401,
                        headers={"WWW-Authenticate": "Bearer"})


def _call(body: dict[str, Any]) -> tuple[str, Any, str, str | None]:
    tool, session, call_id = body.get("tool"), body.get("session"), body.get("call_id")
    if not isinstance(tool, str) or not tool:
        raise BadRequest(400, "'tool' must be a non-empty string")
    if not isinstance(session, str) or not session:
        raise BadRequest(400, "'session' must be a non-empty string")
    if len(session) > 4096 or len(tool) > 4096:
        raise BadRequest(400, "'tool' and 'session' are at most 4,096 characters")
    if call_id is not None and (not isinstance(call_id, str) or len(call_id) > 4096):
        raise BadRequest(400, "'call_id' must be a string of at most 4,096 characters, or null")
    return tool, body.get("args", {}), session, call_id


def _verdict(verdict: Verdict) -> dict[str, Any]:
    return {
        "allowed": True, "count": verdict.count, "max_repeats": verdict.max_repeats,
        "hash_prefix": verdict.hash_prefix, "session": verdict.session_id, "tool": verdict.tool_name,
        "warning": verdict.warning, "would_deny": verdict.would_deny, "replayed": verdict.replayed,
        "exempt": verdict.exempt, "decided_by": verdict.decided_by,
    }


def _refusal(error: LoopBrakeError) -> dict[str, Any]:
    return {
        "code": error.code, "kind": error.kind, "message": str(error), "tool": error.tool_name,
        "count": error.count, "max_repeats": error.max_repeats, "hash_prefix": error.hash_prefix,
        "session": error.session_id,
    }


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


