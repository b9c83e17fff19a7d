"""kubesim: a simulated Kubernetes API server, faithful enough for real kubectl and client libraries.

A test and demo tool, not part of the product: `kubesim.server.open_kubesim` / `serve_kubesim`
start it from Python, `python -m kubesim` from the command line; docs/kubesim.md says what it
serves. It may import trio, hypercorn, attrs and the standard library (trustme only for the CLI's
`--self-signed`); never `wire` or the product, and not the `kubernetes` client at run time
(`definitions_build` uses it to regenerate `definitions.json`).
"""
