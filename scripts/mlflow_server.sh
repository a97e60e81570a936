#!/usr/bin/env bash
# A team's MLflow tracking server in a folder of its own: PostgreSQL (Debian's package) holding a
# `prunebench` database (runs) and a `prunebench_auth` database (users, permissions), and
# `mlflow server` on it with basic auth and proxied artifacts (clients upload and download through
# the server; the files live under DIR/artifacts). Nothing system-wide is touched; DIR keeps the
# data across stop/start.
#   MLFLOW_AUTH_ADMIN_PASSWORD=... scripts/mlflow_server.sh start DIR [PORT]   # prints MLFLOW_TRACKING_URI=...
#   scripts/mlflow_server.sh stop DIR
# HOST (default 127.0.0.1) is the address the server listens on: HOST=0.0.0.0 for a team on other
# machines. PYTHON is the interpreter with mlflow[auth] and psycopg (default: python3). The admin
# password has no default: MLflow creates the admin user with it on the first start.
# PostgreSQL refuses to run as root: under root it runs as the `postgres` user.
set -euo pipefail
usage="usage: [MLFLOW_AUTH_ADMIN_PASSWORD=...] mlflow_server.sh start|stop DIR [PORT]"
cmd=${1:?$usage}
dir=$(realpath -m "${2:?$usage}")
PYTHON=${PYTHON:-python3}
HOST=${HOST:-127.0.0.1}

pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
as_db_owner() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=postgres --regid=postgres --init-groups "$@"; else "$@"; fi; }

stop() {
  if [ -s "$dir"/mlflow.pid ]; then
    pid=$(cat "$dir"/mlflow.pid)
    # the server was started in a session of its own: its uvicorn workers end with it
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$dir"/mlflow.pid
  fi
  if [ -s "$dir"/pg/postmaster.pid ]; then
    as_db_owner "$pg_bin"/pg_ctl stop -D "$dir"/pg -m fast -w >/dev/null
  fi
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "$usage" >&2; exit 2; }
[ -x "$pg_bin/initdb" ] || { echo "mlflow_server.sh: PostgreSQL is not installed (apt-get install postgresql; or set PG_BIN)" >&2; exit 3; }
[ -n "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ] || { echo "mlflow_server.sh: set MLFLOW_AUTH_ADMIN_PASSWORD (the admin's password; there is no default)" >&2; exit 2; }
"$PYTHON" -c 'import flask_wtf, psycopg' 2>/dev/null || { echo "mlflow_server.sh: $PYTHON lacks mlflow[auth] or psycopg (pip install -e '.[server]')" >&2; exit 3; }

free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secret() { "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(32))'; }
mkdir -p "$dir"
# the database owner must reach DIR/pg; nobody else may list DIR (it holds the password files)
chmod 711 "$dir"
umask 077
if [ ! -s "$dir"/pg/PG_VERSION ]; then
  rm -rf "$dir"/pg && mkdir "$dir"/pg
  free_port > "$dir"/pg.port
  # the database password: in a libpq password file, so it is on no command line and in no URI
  password=$(secret)
  echo "127.0.0.1:$(cat "$dir"/pg.port):*:prunebench:$password" > "$dir"/pgpass
  echo "$password" > "$dir"/initdb.pw
  if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"/pg "$dir"/initdb.pw; fi
  as_db_owner "$pg_bin"/initdb -D "$dir"/pg -U prunebench --auth=scram-sha-256 --pwfile="$dir"/initdb.pw \
    -E UTF8 --locale=C.UTF-8 > "$dir"/initdb.log
  rm -f "$dir"/initdb.pw
  secret > "$dir"/flask_secret  # the auth app's CSRF key, the same across restarts
fi
pg_port=$(cat "$dir"/pg.port)
as_db_owner "$pg_bin"/pg_ctl start -D "$dir"/pg -w -l "$dir"/pg/server.log \
  -o "-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories=$dir/pg" >/dev/null
export PGPASSFILE="$dir"/pgpass
for db in prunebench prunebench_auth; do
  if ! "$pg_bin"/psql -h 127.0.0.1 -p "$pg_port" -U prunebench -d postgres -tAc "select 1 from pg_database where datname = '$db'" | grep -q 1; then
    "$pg_bin"/createdb -h 127.0.0.1 -p "$pg_port" -U prunebench "$db"
  fi
done

# SQLAlchemy 2.1 reads postgresql:// as psycopg 3; the driver is named so no other one is guessed
db_uri="postgresql+psycopg://prunebench@127.0.0.1:$pg_port"
cat > "$dir"/basic_auth.ini <<EOF
[mlflow]
# every signed-in team member may read and log runs in every experiment; the anonymous get nothing
default_permission = EDIT
database_uri = $db_uri/prunebench_auth
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# a sign-in checked once a minute per worker, not at every request (each check hashes the password,
# and every job sends a heartbeat): a changed or revoked password takes up to 60 s to apply
auth_cache_ttl_seconds = 60
EOF
port=${3:-$(cat "$dir"/port 2>/dev/null || echo 5000)}
echo "$port" > "$dir"/port
mkdir -p "$dir"/artifacts
# MLflow's server-side job runner (its GenAI jobs: seven huey processes beside the web workers) has
# nothing to do for runs that prunebench logs; MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true turns it back on
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
MLFLOW_AUTH_CONFIG_PATH="$dir"/basic_auth.ini MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$dir"/flask_secret) \
  setsid "$PYTHON" -m mlflow server --backend-store-uri "$db_uri/prunebench" --app-name basic-auth \
  --serve-artifacts --artifacts-destination "$dir"/artifacts --host "$HOST" --port "$port" \
  --workers "${WORKERS:-2}" >> "$dir"/mlflow.log 2>&1 < /dev/null &
echo $! > "$dir"/mlflow.pid
url="http://127.0.0.1:$port"
for _ in $(seq 3000); do
  if curl -sf "$url/health" >/dev/null 2>&1; then echo "MLFLOW_TRACKING_URI=$url"; exit 0; fi
  kill -0 "$(cat "$dir"/mlflow.pid)" 2>/dev/null || break
  sleep 0.1
done
echo "mlflow_server.sh: the server did not answer at $url; log in $dir/mlflow.log" >&2
tail -n 30 "$dir"/mlflow.log >&2 || true
stop
exit 1
