/*-------------------------------------------------------------------------
 *
 * etcd_floor.c
 *	  Floors for the etcd lock/unlock cycle benchmark: minimal C clients
 *	  outside PostgreSQL, making the fewest etcd gateway requests a fenced
 *	  lock cycle needs, over one kept-alive libcurl connection per holder.
 *
 * MODE selects the client (default "lease"):
 *
 *	 lease	  a lease per cycle, the lock service waits: POST /v3/lease/grant,
 *			  /v3/lock/lock (waits on the server), /v3/kv/range of the
 *			  returned key (its create_revision is the fencing token; etcd 3.4
 *			  needs this read, see the shared notes), then /v3/lease/revoke,
 *			  which deletes the key and so releases the lock.  4 requests.
 *	 session  the uncontended floor: ONE session lease per holder, granted
 *			  before the first cycle (kept alive between cycles, revoked at
 *			  the end); a cycle is /v3/kv/txn creating NAME/<lease hex> under
 *			  the lease if its create_revision is 0, /v3/kv/range of the key
 *			  (the token), /v3/kv/deleterange of the key.  3 requests, 2 raft
 *			  writes.  It never waits for a predecessor, so it is a lock only
 *			  with a single holder: HOLDERS must be 1, and a key already
 *			  there is an error.
 *	 locksvc  etcd's own lock service on a session lease: /v3/lock/lock with
 *			  the session lease (waits on the server), /v3/kv/range of the
 *			  returned key (the token; gone means the lock was lost), then
 *			  /v3/lock/unlock.  3 requests.
 *	 watch	  the etcd Mutex protocol on the client with a synced watch, on a
 *			  session lease: own key NAME/<lease hex> created if absent
 *			  (kv/txn); predecessor = the key under NAME/ with the highest
 *			  create_revision below one's own (kv/range, limit 1); a watch on
 *			  it created without start_revision, so that etcd delivers its
 *			  delete at once; the predecessor ranged again once the watch
 *			  exists; holder when there is none: read the own key back (the
 *			  token), then kv/deleterange.  Uncontended 4 requests.
 *	 sql	  not a floor: lockfence itself, driven from C through libpq so
 *			  that the figure is lockfence's and not a Python driver's.  One
 *			  PostgreSQL session per holder (DSN in $LOCKFENCE_DSN), two
 *			  prepared statements run with the extended protocol, as an
 *			  application's driver does: SELECT key, token FROM
 *			  lockfence.etcd_lock($1, $2), then lockfence.etcd_unlock($1).
 *			  URL is passed to lockfence.etcd_endpoints.
 *
 * Usage: etcd_floor URL NAME HOLDERS START_AT STOP_AT TTL [MODE]
 *	 START_AT / STOP_AT are CLOCK_MONOTONIC seconds (as Python's
 *	 time.monotonic()).  HOLDERS processes are forked; each loops cycles from
 *	 START_AT until STOP_AT and prints one line per cycle on stdout:
 *	   token acquired released latency	(seconds, CLOCK_MONOTONIC)
 *	 "acquired" is taken when the token is known, "released" just before
 *	 the releasing request is sent.  Exit status is non-zero if any holder
 *	 failed.
 *
 * Build: cc -O2 -I$(pg_config --includedir) -o etcd_floor etcd_floor.c \
 *		  $(curl-config --libs) -L$(pg_config --libdir) -lpq
 *
 * IDENTIFICATION
 *	  bench/etcd_floor.c
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <curl/curl.h>
#include <libpq-fe.h>

typedef struct Buf
{
	char		data[65536];
	size_t		len;
} Buf;

static CURL *easy;
static struct curl_slist *hdrs;
static Buf	reply;
static const char *base_url;

/*
 * Current CLOCK_MONOTONIC time in seconds.
 */
static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * libcurl write callback: append to the reply buffer (bounded).
 */
static size_t
collect(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Buf		   *b = userdata;
	size_t		n = size * nmemb;

	if (b->len + n >= sizeof(b->data))
		return 0;
	memcpy(b->data + b->len, ptr, n);
	b->len += n;
	b->data[b->len] = '\0';
	return n;
}

/*
 * POST body to path on the kept-alive handle; exit on any failure.
 */
static const char *
post(const char *path, const char *body)
{
	char		url[512];
	long		code = 0;
	CURLcode	rc;

	snprintf(url, sizeof(url), "%s%s", base_url, path);
	reply.len = 0;
	reply.data[0] = '\0';
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
	rc = curl_easy_perform(easy);
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
	if (rc != CURLE_OK || code != 200)
	{
		fprintf(stderr, "etcd_floor: %s: curl %d, HTTP %ld: %s\n",
				path, (int) rc, code, reply.data);
		exit(1);
	}
	return reply.data;
}

/*
 * Copy the string value of "field":"..." out of a JSON reply.
 */
static int
field(const char *json, const char *name, char *out, size_t outlen)
{
	char		pat[64];
	const char *p;
	const char *e;

	snprintf(pat, sizeof(pat), "\"%s\":\"", name);
	p = strstr(json, pat);
	if (p == NULL)
		return 0;
	p += strlen(pat);
	e = strchr(p, '"');
	if (e == NULL || (size_t) (e - p) >= outlen)
		return 0;
	memcpy(out, p, e - p);
	out[e - p] = '\0';
	return 1;
}

/*
 * Base64 of a short string.
 */
static void
b64(const char *in, char *out)
{
	static const char tbl[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t		n = strlen(in);
	size_t		i;
	char	   *o = out;

	for (i = 0; i < n; i += 3)
	{
		unsigned	v = (unsigned char) in[i] << 16;

		if (i + 1 < n)
			v |= (unsigned char) in[i + 1] << 8;
		if (i + 2 < n)
			v |= (unsigned char) in[i + 2];
		*o++ = tbl[(v >> 18) & 63];
		*o++ = tbl[(v >> 12) & 63];
		*o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
		*o++ = i + 2 < n ? tbl[v & 63] : '=';
	}
	*o = '\0';
}

typedef enum Mode
{
	MODE_LEASE,
	MODE_SESSION,
	MODE_LOCKSVC,
	MODE_WATCH,
	MODE_SQL
} Mode;

/* this holder's session lease (session and locksvc modes) */
static char session_lease[64];
static double last_keepalive;
static int	lease_ttl;

/*
 * Grant a lease of ttl seconds; its decimal ID goes to lease.
 */
static void
grant(int ttl, char *lease, size_t len)
{
	char		body[64];

	snprintf(body, sizeof(body), "{\"TTL\":\"%d\"}", ttl);
	if (!field(post("/v3/lease/grant", body), "ID", lease, len))
		exit(2);
}

/*
 * Renew the session lease between cycles once a third of its TTL has gone
 * by, so that a long run never loses it; outside the timed cycle.
 */
static void
keep_session_alive(void)
{
	char		body[128];
	char		ttl[32];

	if (now() - last_keepalive < lease_ttl / 3.0)
		return;
	snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", session_lease);
	if (!field(post("/v3/lease/keepalive", body), "TTL", ttl, sizeof(ttl)))
	{
		fprintf(stderr, "etcd_floor: session lease %s lost\n", session_lease);
		exit(6);
	}
	last_keepalive = now();
}

/*
 * Read a lock key back: its create_revision (the token) goes to rev.
 * A key that is gone means the lock was lost (etcd 3.4's lock call does
 * not check that the waiter's lease still lives).
 */
static void
read_token(const char *key_b64, char *rev, size_t len)
{
	char		body[4096];

	snprintf(body, sizeof(body), "{\"key\":\"%s\"}", key_b64);
	if (!field(post("/v3/kv/range", body), "create_revision", rev, len))
	{
		fprintf(stderr, "etcd_floor: lock key vanished: lock lost\n");
		exit(4);
	}
}

/*
 * lease mode: grant, lock, read back, revoke.  Returns the release time.
 */
static double
cycle_lease(const char *name_b64, int ttl, char *rev, size_t revlen,
			double *t_acq)
{
	char		body[4096];
	char		lease[64];
	char		key[512];
	double		t_rel;

	grant(ttl, lease, sizeof(lease));
	snprintf(body, sizeof(body), "{\"name\":\"%s\",\"lease\":\"%s\"}",
			 name_b64, lease);
	if (!field(post("/v3/lock/lock", body), "key", key, sizeof(key)))
		exit(3);
	read_token(key, rev, revlen);
	*t_acq = now();
	t_rel = now();
	snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", lease);
	post("/v3/lease/revoke", body);
	return t_rel;
}

/*
 * session mode: create NAME/<lease hex> under the session lease if absent,
 * read it back, delete it.  key_b64 is that key, fixed for the holder.
 */
static double
cycle_session(const char *key_b64, char *rev, size_t revlen, double *t_acq)
{
	char		body[4096];
	double		t_rel;

	snprintf(body, sizeof(body),
			 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\"}],"
			 "\"success\":[{\"request_put\":{\"key\":\"%s\",\"lease\":\"%s\"}}],"
			 "\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
			 key_b64, key_b64, session_lease, key_b64);
	if (strstr(post("/v3/kv/txn", body), "\"succeeded\":true") == NULL)
	{
		fprintf(stderr, "etcd_floor: session key already there: %s\n", reply.data);
		exit(7);
	}
	read_token(key_b64, rev, revlen);
	*t_acq = now();
	t_rel = now();
	snprintf(body, sizeof(body), "{\"key\":\"%s\"}", key_b64);
	post("/v3/kv/deleterange", body);
	return t_rel;
}

/*
 * locksvc mode: lock on the session lease, read back, unlock.
 */
static double
cycle_locksvc(const char *name_b64, char *rev, size_t revlen, double *t_acq)
{
	char		body[4096];
	char		key[512];
	double		t_rel;

	snprintf(body, sizeof(body), "{\"name\":\"%s\",\"lease\":\"%s\"}",
			 name_b64, session_lease);
	if (!field(post("/v3/lock/lock", body), "key", key, sizeof(key)))
		exit(3);
	read_token(key, rev, revlen);
	*t_acq = now();
	t_rel = now();
	snprintf(body, sizeof(body), "{\"key\":\"%s\"}", key);
	post("/v3/lock/unlock", body);
	return t_rel;
}

/*
 * A watch stream's state, filled in by its write callback.  A watch on one
 * key sees few messages, so the stream is kept whole and searched again.
 */
typedef struct WatchState
{
	Buf			buf;
	int			created;
	int			deleted;
	int			failed;
} WatchState;

static CURLM *multi;

/*
 * libcurl write callback of a watch stream: note "created", a DELETE event
 * and a cancel or error.  (Events on one key: a PUT has no "type" field.)
 */
static size_t
watch_collect(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	WatchState *w = userdata;

	if (collect(ptr, size, nmemb, &w->buf) == 0)
		return 0;
	w->created = w->created || strstr(w->buf.data, "\"created\":true") != NULL;
	w->deleted = w->deleted || strstr(w->buf.data, "\"type\":\"DELETE\"") != NULL;
	w->failed = w->failed || strstr(w->buf.data, "\"canceled\":true") != NULL ||
		strstr(w->buf.data, "\"error\"") != NULL;
	return size * nmemb;
}

/*
 * Drive the watch transfer until *flag is set; exit if the stream fails or
 * ends first.
 */
static void
watch_until(WatchState *w, int *flag)
{
	for (;;)
	{
		int			running = 0;

		curl_multi_perform(multi, &running);
		if (*flag)
			return;
		if (w->failed || running == 0)
		{
			fprintf(stderr, "etcd_floor: watch failed or ended: %s\n", w->buf.data);
			exit(8);
		}
		curl_multi_poll(multi, NULL, 0, 1000, NULL);
	}
}

/*
 * Start a watch on key_b64 on a connection of its own, WITHOUT
 * start_revision: etcd starts it at the current revision and keeps it
 * among its synced watchers, which get each event as it is written (a
 * watch from a past revision is "unsynced" and is caught up only at etcd's
 * 100 ms sync tick).  Returns once etcd has answered "created": from then
 * on no delete of the key is missed.
 */
static CURL *
watch_start(const char *key_b64, WatchState *w, char *body, size_t bodylen)
{
	char		url[512];
	CURL	   *h = curl_easy_init();

	memset(w, 0, sizeof(*w));
	snprintf(url, sizeof(url), "%s/v3/watch", base_url);
	snprintf(body, bodylen, "{\"create_request\":{\"key\":\"%s\"}}", key_b64);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, watch_collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
	curl_multi_add_handle(multi, h);
	watch_until(w, &w->created);
	return h;
}

static void
watch_stop(CURL *h)
{
	curl_multi_remove_handle(multi, h);
	curl_easy_cleanup(h);
}

/*
 * watch mode: the etcd Mutex protocol on the client, with a synced watch.
 * Own key NAME/<lease hex> on the session lease (created if absent); the
 * predecessor is the key under NAME/ with the highest create_revision
 * below one's own; watch it, then range it again (a delete just before the
 * watch existed is not missed): gone, or re-created with another
 * create_revision (a session reuses its key for its next lock, which then
 * queues behind us: waiting for it would deadlock), look again; else wait
 * for its DELETE event and look again.  Holder when there is none; then
 * read the own key back (gone: lock lost) and delete it to release.
 */
static double
cycle_watch(const char *pfx_b64, const char *end_b64, const char *key_b64,
			char *rev, size_t revlen, double *t_acq)
{
	char		body[4096];
	char		wbody[4096];
	char		own[64];
	char		pred[1024];
	char		pred_rev[64];
	char		again[64];
	const char *r;
	double		t_rel;

	snprintf(body, sizeof(body),
			 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\"}],"
			 "\"success\":[{\"request_put\":{\"key\":\"%s\",\"lease\":\"%s\"}}],"
			 "\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
			 key_b64, key_b64, session_lease, key_b64);
	r = post("/v3/kv/txn", body);
	/* a txn with one put: its header revision is the key's create_revision */
	if (!field(r, strstr(r, "\"succeeded\":true") ? "revision" : "create_revision",
			   own, sizeof(own)))
		exit(3);

	for (;;)
	{
		WatchState w;
		CURL	   *h;

		snprintf(body, sizeof(body),
				 "{\"key\":\"%s\",\"range_end\":\"%s\",\"max_create_revision\":\"%lld\","
				 "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}",
				 pfx_b64, end_b64, atoll(own) - 1);
		r = post("/v3/kv/range", body);
		if (strstr(r, "\"kvs\"") == NULL)
			break;
		if (!field(r, "key", pred, sizeof(pred)) ||
			!field(r, "create_revision", pred_rev, sizeof(pred_rev)))
			exit(3);
		h = watch_start(pred, &w, wbody, sizeof(wbody));
		snprintf(body, sizeof(body), "{\"key\":\"%s\"}", pred);
		if (field(post("/v3/kv/range", body), "create_revision", again, sizeof(again)) &&
			strcmp(again, pred_rev) == 0)
			watch_until(&w, &w.deleted);
		watch_stop(h);
	}

	read_token(key_b64, rev, revlen);
	if (strcmp(rev, own) != 0)
	{
		fprintf(stderr, "etcd_floor: own key re-created while waiting: lock lost\n");
		exit(4);
	}
	*t_acq = now();
	t_rel = now();
	snprintf(body, sizeof(body), "{\"key\":\"%s\"}", key_b64);
	post("/v3/kv/deleterange", body);
	return t_rel;
}

static PGconn *pg;

/*
 * sql mode: run a prepared statement; exit on anything but one row.
 */
static PGresult *
sql_exec(const char *stmt, int nparams, const char *const *params)
{
	PGresult   *res = PQexecPrepared(pg, stmt, nparams, params, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		fprintf(stderr, "etcd_floor: %s: %d rows: %s", stmt, PQntuples(res),
				PQresultErrorMessage(res));
		exit(8);
	}
	return res;
}

/*
 * sql mode: prepare a statement; exit if that fails.
 */
static void
sql_prepare(const char *stmt, const char *query, int nparams)
{
	PGresult   *res = PQprepare(pg, stmt, query, nparams, NULL);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "etcd_floor: preparing %s: %s", stmt,
				PQresultErrorMessage(res));
		exit(8);
	}
	PQclear(res);
}

/*
 * sql mode: connect, point lockfence at URL, prepare both statements.
 */
static void
sql_connect(void)
{
	const char *dsn = getenv("LOCKFENCE_DSN");
	const char *setting[1] = {base_url};
	PGresult   *res;

	pg = PQconnectdb(dsn ? dsn : "");
	if (PQstatus(pg) != CONNECTION_OK)
	{
		fprintf(stderr, "etcd_floor: %s", PQerrorMessage(pg));
		exit(8);
	}
	res = PQexecParams(pg,
					   "SELECT set_config('lockfence.etcd_endpoints', $1, false)",
					   1, NULL, setting, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "etcd_floor: %s", PQresultErrorMessage(res));
		exit(8);
	}
	PQclear(res);
	sql_prepare("lock",
				"SELECT key, token FROM lockfence.etcd_lock($1, $2::integer)", 2);
	sql_prepare("unlock", "SELECT lockfence.etcd_unlock($1)", 1);
}

/*
 * sql mode: one cycle of lockfence from SQL.
 */
static double
cycle_sql(const char *name, const char *ttl, char *rev, size_t revlen,
		  double *t_acq)
{
	const char *lock_params[2] = {name, ttl};
	const char *unlock_params[1];
	char		key[1024];
	PGresult   *res;
	double		t_rel;

	res = sql_exec("lock", 2, lock_params);
	snprintf(key, sizeof(key), "%s", PQgetvalue(res, 0, 0));
	snprintf(rev, revlen, "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	*t_acq = now();
	t_rel = now();
	unlock_params[0] = key;
	res = sql_exec("unlock", 1, unlock_params);
	if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
	{
		fprintf(stderr, "etcd_floor: etcd_unlock returned %s\n", PQgetvalue(res, 0, 0));
		exit(8);
	}
	PQclear(res);
	return t_rel;
}

/*
 * Set up this process's kept-alive handle.
 */
static void
init_handle(void)
{
	easy = curl_easy_init();
	hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	hdrs = curl_slist_append(hdrs, "Expect:");
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, &reply);
	curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT, 60L);
}

/*
 * One holder: loop cycles between start_at and stop_at.
 */
static void
holder(Mode mode, const char *name, const char *name_b64,
	   double start_at, double stop_at, int ttl)
{
	char		rev[64];
	char		line[256];
	char		key[512];
	char		key_b64[1024];
	char		pfx_b64[1024];
	char		end_b64[1024];
	char		ttl_text[32];

	init_handle();
	lease_ttl = ttl;
	snprintf(ttl_text, sizeof(ttl_text), "%d", ttl);
	if (mode == MODE_SQL)
		sql_connect();
	else if (mode != MODE_LEASE)
	{
		/* the session lease is granted before the run, as a session's is */
		grant(ttl, session_lease, sizeof(session_lease));
		last_keepalive = now();
		snprintf(key, sizeof(key), "%s/%llx", name,
				 (unsigned long long) strtoll(session_lease, NULL, 10));
		b64(key, key_b64);
		/* the prefix NAME/ and its range end NAME0 ('/' + 1 is '0') */
		snprintf(key, sizeof(key), "%s/", name);
		b64(key, pfx_b64);
		key[strlen(key) - 1] = '0';
		b64(key, end_b64);
		multi = curl_multi_init();
	}

	while (now() < start_at)
		usleep(1000);

	for (;;)
	{
		double		t0 = now();
		double		t_acq = 0;
		double		t_rel = 0;

		if (t0 >= stop_at)
			break;

		if (mode == MODE_LEASE)
			t_rel = cycle_lease(name_b64, ttl, rev, sizeof(rev), &t_acq);
		else if (mode == MODE_SESSION)
			t_rel = cycle_session(key_b64, rev, sizeof(rev), &t_acq);
		else if (mode == MODE_LOCKSVC)
			t_rel = cycle_locksvc(name_b64, rev, sizeof(rev), &t_acq);
		else if (mode == MODE_SQL)
			t_rel = cycle_sql(name, ttl_text, rev, sizeof(rev), &t_acq);
		else
			t_rel = cycle_watch(pfx_b64, end_b64, key_b64, rev, sizeof(rev), &t_acq);

		/* one write per line: atomic on the shared pipe */
		snprintf(line, sizeof(line), "%s %.6f %.6f %.6f\n",
				 rev, t_acq, t_rel, now() - t0);
		if (write(STDOUT_FILENO, line, strlen(line)) < 0)
			exit(5);
		if (mode != MODE_LEASE && mode != MODE_SQL)
			keep_session_alive();
	}

	if (mode == MODE_SQL)
		PQfinish(pg);
	else if (mode != MODE_LEASE)
	{
		char		body[128];

		snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", session_lease);
		post("/v3/lease/revoke", body);
	}
	curl_easy_cleanup(easy);
	curl_slist_free_all(hdrs);
}

int
main(int argc, char **argv)
{
	char		name_b64[1024];
	int			holders;
	double		start_at;
	double		stop_at;
	int			ttl;
	int			i;
	int			failed = 0;
	Mode		mode = MODE_LEASE;

	if (argc < 7 || argc > 8 || strlen(argv[2]) > 400)
	{
		fprintf(stderr, "usage: %s URL NAME HOLDERS START_AT STOP_AT TTL [lease|session|locksvc|watch|sql]\n",
				argv[0]);
		return 2;
	}
	base_url = argv[1];
	b64(argv[2], name_b64);
	holders = atoi(argv[3]);
	start_at = atof(argv[4]);
	stop_at = atof(argv[5]);
	ttl = atoi(argv[6]);
	if (argc == 8)
	{
		if (strcmp(argv[7], "lease") == 0)
			mode = MODE_LEASE;
		else if (strcmp(argv[7], "session") == 0)
			mode = MODE_SESSION;
		else if (strcmp(argv[7], "locksvc") == 0)
			mode = MODE_LOCKSVC;
		else if (strcmp(argv[7], "watch") == 0)
			mode = MODE_WATCH;
		else if (strcmp(argv[7], "sql") == 0)
			mode = MODE_SQL;
		else
		{
			fprintf(stderr, "%s: unknown mode \"%s\"\n", argv[0], argv[7]);
			return 2;
		}
	}
	if (mode == MODE_SESSION && holders != 1)
	{
		fprintf(stderr, "%s: session mode never waits: HOLDERS must be 1\n", argv[0]);
		return 2;
	}

	curl_global_init(CURL_GLOBAL_ALL);
	for (i = 0; i < holders; i++)
	{
		pid_t		pid = fork();

		if (pid < 0)
		{
			perror("fork");
			return 1;
		}
		if (pid == 0)
		{
			holder(mode, argv[2], name_b64, start_at, stop_at, ttl);
			_exit(0);
		}
	}
	for (i = 0; i < holders; i++)
	{
		int			st;

		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	return failed;
}
