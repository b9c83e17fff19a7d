"""kasd's web app on the API port: the REST API for people, the browser session, SSE, and the
dashboard (``kasd.web.dashboard``: static files only). May import starlette and kasd's own packages."""
