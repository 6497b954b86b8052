"""`distbrake serve`: the brake over HTTP (Starlette on uvicorn, the `server` extra).

    POST /v1/hooks/claude-code   Claude Code's `type: "http"` hook (one endpoint for a whole team)
    POST /v1/hooks/{codex,gemini,cursor}
                                 the same hook events, for `curl`-style command hooks
    POST /v1/check               {"tool", "args", "session", "call_id"} -> the verdict
    POST /v1/observe             {"tool", "args", "session", "call_id", "result"} (progress-aware tools)
    GET  /healthz                the backend answers (200) or not (503)
    GET  /metrics                Prometheus text format

Imported only by `distbrake serve` and by code that asks for it: `import
distbrake` never loads Starlette.
"""

from __future__ import annotations

from .app import DEFAULT_MAX_BODY, create_app

__all__ = ["DEFAULT_MAX_BODY", "create_app"]
