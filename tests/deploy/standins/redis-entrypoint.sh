#!/bin/sh
# Stand-in for the official redis image's entrypoint: `redis-server ...` runs with protected
# mode off (the container network is the boundary), as the redis user.
set -e
if [ "$1" = "redis-server" ]; then
    set -- "$@" --protected-mode no
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
