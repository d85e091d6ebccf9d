"""A Django project in one file: sync and async views under deadlines.django.

    pip install 'deadlines[django]' uvicorn
    python examples/services/django_service.py --port 8002            # ASGI, under uvicorn

    curl -H 'x-request-timeout-ms: 800' localhost:8002/budget          # the view's budget
    curl localhost:8002/report                                         # 504 after 0.5 s

/report is an async view that takes longer than its route's limit: it is cancelled at
the deadline and answered 504. Under WSGI (``get_wsgi_application()`` with waitress or
gunicorn) the same middleware gives sync views their deadline and the 504.
"""

from __future__ import annotations

import argparse
import asyncio

import django
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

import deadlines
from deadlines.django import Limits


def budget(request: HttpRequest) -> JsonResponse:
    """A sync view: the time it has left."""
    return JsonResponse({"left": deadlines.remaining()})


async def report(request: HttpRequest) -> HttpResponse:
    """An async view slower than its route's budget: cancelled at the deadline."""
    await asyncio.sleep(5)
    return HttpResponse("never sent")


urlpatterns = [path("budget", budget), path("report", report)]

settings.configure(
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    SECRET_KEY="example-only",
    MIDDLEWARE=["deadlines.django.DeadlineMiddleware"],
    DEADLINES={
        "default": 2.0,
        "maximum": 10.0,
        "routes": {"/report": Limits(default=0.5, maximum=0.5)},
    },
)
django.setup()


def main() -> None:
    """Serve the project's ASGI application on loopback until interrupted."""
    import uvicorn
    from django.core.asgi import get_asgi_application

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8002)
    args = parser.parse_args()
    uvicorn.run(get_asgi_application(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
