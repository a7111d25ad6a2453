#!/usr/bin/env bash
# capture-seeds.sh: (re)capture the fuzzers' seed corpora from a real etcd.
#
# Starts the installed etcd (3.4) on 127.0.0.1 free ports in a temporary
# directory, sends it through its gRPC gateway the requests lockfence sends
# (same paths, same body shapes, the lock key of fuzz/fuzz_common.h), and
# keeps what it answers:
#   corpus/reply/   reply bodies (successes, error bodies, the auth answer)
#   corpus/http/    whole HTTP answers as they come off the socket (status
#                   line, headers, chunked or Content-Length framing)
#   corpus/watch/   the byte stream of a watch: created, then a DELETE
# The corpora in the tree were made with this script; run it again only to
# refresh them (the harnesses' fixed requests must still match).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here/corpus}
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cport=$(free_port)
pport=$(free_port)
etcd --name fuzz --data-dir "$tmp/data" \
	--listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
	--listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
	--initial-cluster "fuzz=http://127.0.0.1:$pport" >"$tmp/etcd.log" 2>&1 &
pid=$!
url=http://127.0.0.1:$cport
for _ in $(seq 100); do curl -sf "$url/version" >/dev/null 2>&1 && break; sleep 0.1; done

mkdir -p "$out/reply" "$out/http" "$out/watch"
b64() { printf '%s' "$1" | base64 -w0; }

# The values of fuzz/fuzz_common.h
lease=7587869521853040000
lease_hex=$(printf '%x' "$lease")
name=lf/fuzz
key=$(b64 "$name/$lease_hex")
other=$(b64 "$name/694d8a1b2c3d4e00")
prefix=$(b64 "$name/")
prefix_end=$(b64 "lf/fuzz0")
token=

# call NAME PATH BODY: keep the body and the raw HTTP answer
call() {
	local n=$1 path=$2 body=$3
	curl -s -i --raw ${token:+-H "Authorization: $token"} -H 'Content-Type: application/json' \
		-H 'Expect:' -X POST --data-binary "$body" "$url$path" >"$out/http/$n.http"
	body_of "$out/http/$n.http" >"$out/reply/$n.json"
}

# body_of FILE: the body of a raw HTTP answer, chunked framing removed
body_of() {
	python3 - "$1" <<'PY'
import sys
raw = open(sys.argv[1], 'rb').read()
head, _, body = raw.partition(b'\r\n\r\n')
if b'transfer-encoding: chunked' in head.lower():
    out = b''
    while body:
        line, _, body = body.partition(b'\r\n')
        n = int(line.split(b';')[0] or b'0', 16)
        if n == 0:
            break
        out += body[:n]
        body = body[n + 2:]
    body = out
sys.stdout.buffer.write(body)
PY
}

call lease_grant /v3/lease/grant "{\"TTL\":\"30\",\"ID\":\"$lease\"}"
call lease_grant_dup /v3/lease/grant "{\"TTL\":\"30\",\"ID\":\"$lease\"}"
call lease_keepalive /v3/lease/keepalive "{\"ID\":\"$lease\"}"
call lock_txn_created /v3/kv/txn "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"$key\",\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"$key\",\"value\":\"\",\"lease\":\"$lease\"}},{\"request_range\":{\"key\":\"$prefix\",\"range_end\":\"$prefix_end\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}],\"failure\":[{\"request_range\":{\"key\":\"$key\"}},{\"request_range\":{\"key\":\"$prefix\",\"range_end\":\"$prefix_end\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}]}"
call lock_txn_exists /v3/kv/txn "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"$key\",\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"$key\",\"value\":\"\",\"lease\":\"$lease\"}},{\"request_range\":{\"key\":\"$prefix\",\"range_end\":\"$prefix_end\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}],\"failure\":[{\"request_range\":{\"key\":\"$key\"}},{\"request_range\":{\"key\":\"$prefix\",\"range_end\":\"$prefix_end\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}]}"
call range_key /v3/kv/range "{\"key\":\"$key\"}"
call range_prefix /v3/kv/range "{\"key\":\"$prefix\",\"range_end\":\"$prefix_end\"}"
call range_empty /v3/kv/range "{\"key\":\"$other\"}"
call bad_json /v3/kv/range '{"key":'
call bad_b64 /v3/kv/range '{"key":"@@@"}'
call lease_keepalive_unknown /v3/lease/keepalive '{"ID":"1"}'
call lease_revoke_unknown /v3/lease/revoke '{"ID":"1"}'
call status /v3/maintenance/status '{}'

# The watch stream: created, then the DELETE of the watched key.
curl -s -N --raw -i -X POST -H 'Expect:' --data-binary "{\"create_request\":{\"key\":\"$key\"}}" \
	--max-time 3 "$url/v3/watch" >"$tmp/watch.http" &
wpid=$!
sleep 1
call unlock_txn /v3/kv/txn "{\"compare\":[{\"target\":\"LEASE\",\"key\":\"$key\",\"lease\":\"$lease\"}],\"success\":[{\"request_delete_range\":{\"key\":\"$key\"}}],\"failure\":[{\"request_range\":{\"key\":\"$key\"}}]}"
wait $wpid || true
cp "$tmp/watch.http" "$out/http/watch_stream.http"
# the body as lockfence's write callback gets it: chunked framing removed
curl -s -N -X POST -H 'Expect:' --data-binary "{\"create_request\":{\"key\":\"$key\",\"start_revision\":\"1\"}}" \
	--max-time 2 "$url/v3/watch" >"$out/watch/created_and_events.stream" || true
call delete_prev /v3/kv/deleterange "{\"key\":\"$key\",\"prev_kv\":true}"
call lease_revoke /v3/lease/revoke "{\"ID\":\"$lease\"}"
curl -s -N -X POST -H 'Expect:' --data-binary '{"create_request":{"key":"AA==","start_revision":"-5"}}' \
	--max-time 2 "$url/v3/watch" >"$out/watch/bad_request.stream" || true

# Authentication: the token answer and the error bodies around it.
call auth_user_add /v3/auth/user/add '{"name":"root","password":"secret"}'
call auth_role_grant /v3/auth/user/grant '{"user":"root","role":"root"}'
call auth_enable /v3/auth/enable '{}'
call auth_bad_password /v3/auth/authenticate '{"name":"root","password":"wrong"}'
call auth_no_user /v3/auth/authenticate '{"name":"nobody","password":"x"}'
call auth_ok /v3/auth/authenticate '{"name":"root","password":"secret"}'
call range_no_token /v3/kv/range "{\"key\":\"$key\"}"
token=$(sed -n 's/.*"token":"\([^"]*\)".*/\1/p' "$out/reply/auth_ok.json")
call range_with_token /v3/kv/range "{\"key\":\"$key\"}"
token=bogus.token
call range_bad_token /v3/kv/range "{\"key\":\"$key\"}"

# Remove empty captures (a request etcd did not answer).
find "$out" -type f -empty -delete
ls "$out"/* | wc -l
