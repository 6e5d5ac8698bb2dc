"""Serve the AG-UI browser example on the Threadline server's own origin (no CORS, no bundler)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The pinned client libraries of the test suite (`npm ci --prefix tests/js`), served as ES modules.
NODE_MODULES = ROOT / "tests" / "js" / "node_modules"


class ModuleFiles(StaticFiles):
    """Static files that also resolve `./x` to `./x.js`: rxjs's ES build imports without the
    extension, which bundlers and Node add and a browser does not.

    `no-cache`: a tab revalidates each module (a 304 by ETag) instead of trusting a heuristic
    lifetime, so an `npm ci` that changes the pinned versions is seen on the next load.
    """

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            response = await super().get_response(path, scope)
        except HTTPException as exc:
            if exc.status_code != 404 or path.endswith(".js"):
                raise
            response = await super().get_response(f"{path}.js", scope)
        response.headers["cache-control"] = "no-cache"
        return response


def create_example_app(settings: object | None = None) -> object:
    """Threadline's app, plus the page at /agui/ and the client modules at /node_modules/."""
    from server.app import create_app

    app = create_app(settings)  # type: ignore[arg-type]
    app.router.routes += [
        Mount("/agui", StaticFiles(directory=HERE, html=True), name="agui_example"),
        Mount("/node_modules", ModuleFiles(directory=NODE_MODULES), name="node_modules"),
    ]
    return app


@click.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8000, type=int)
def main(host: str, port: int) -> None:
    """Run Threadline (embedded defaults, demo agent) with the example page."""
    import uvicorn

    from runtime import Role
    from server.cli import _create_token
    from server.logs import setup_logging, uvicorn_log_config
    from server.settings import Settings

    if not (NODE_MODULES / "@ag-ui" / "client").is_dir():
        sys.exit("run `npm ci --prefix tests/js` first: the page loads @ag-ui/client from there")
    settings = Settings(host=host, port=port)
    setup_logging(settings.log_level)
    token = asyncio.run(_create_token(settings, "dev", Role.USER, [settings.dev_scope]))
    print(f"Open http://{host}:{port}/agui/#token={token}", flush=True)
    # The page is ~380 module requests: at uvicorn's default level every one is an access line.
    # Logging as `threadline serve` does (THREADLINE_LOG_LEVEL, tokens redacted) keeps a quiet
    # run quiet; whoever starts this with a pipe on stdout must still read it (or use a file).
    uvicorn.run(
        create_example_app(settings),  # type: ignore[arg-type]
        host=host,
        port=port,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(),
    )


if __name__ == "__main__":
    main()
