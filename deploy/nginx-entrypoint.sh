#!/bin/sh
# Entrypoint of the `lb` service (docker-compose.yml): nginx with its error log redacted.
# nginx appends the request line to every error-log message about a request (an unreachable
# gateway, a client closing early, ...), and websocket request lines carry ?token=<bearer
# token>; no nginx setting removes it. So stderr goes through sed, which replaces token values
# before anything reaches the container log. nginx itself stays PID 1 (exec) and receives
# docker's stop signal; the access log format leaves query strings out (deploy/nginx.conf).
set -eu
fifo=/tmp/nginx-stderr
rm -f "$fifo"
mkfifo -m 600 "$fifo"
sed -u -E 's/([?&]token=)[^&" ]*/\1[redacted]/g' <"$fifo" >&2 &
exec nginx -g 'daemon off;' 2>"$fifo"
