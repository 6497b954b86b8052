"""The brake in front of MCP traffic it does not host: `distbrake proxy`, the Docker MCP Gateway interceptor.

`sessions` decides which session a gateway's call belongs to (one rule for
every gateway), `proxy` builds the FastMCP proxy behind the brake (extra
`fastmcp`), `docker` answers docker/mcp-gateway's HTTP interceptor (no
framework: request JSON in, response JSON out). Nothing here is imported by
`import distbrake`.
"""
