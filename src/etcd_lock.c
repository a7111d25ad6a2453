/*-------------------------------------------------------------------------
 *
 * etcd_lock.c
 *	  etcd locks compatible with etcd's concurrency Mutex, and the
 *	  SQL-callable functions lockfence.etcd_*.
 *
 * A lock is a key "<name>/<lease ID in lowercase hex>" created under a
 * lease granted for it; the holder is the key under "<name>/" with the
 * lowest create_revision.  etcd_lock() lets etcd's lock service
 * (/v3/lock/lock) do the waiting, keeping the lease alive meanwhile, so
 * `etcdctl lock NAME` and lockfence exclude each other in FIFO order.
 *
 * The fencing token is the create_revision of our key, read back after
 * the lock service answers: etcd 3.4 answers "locked" even to a waiter
 * whose lease expired while it waited, so a missing key (or one that is
 * not the holder) is reported as a lost lock (LF003), never as a token.
 *
 * Any error during an acquisition (cancel, statement timeout, wait
 * timeout, lost lease, transport failure) abandons the requests in flight
 * and revokes the lease with interrupts held, which deletes our waiter
 * key at once.  Termination is covered by the exit callback in
 * etcd_session.c.
 *
 * IDENTIFICATION
 *	  src/etcd_lock.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/int.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "etcd.h"
#include "lockfence.h"
#include "metrics.h"

/* Time allowed for revoking our lease after a failed acquisition. */
#define ETCD_CLEANUP_MS		1000

/* Pause after every endpoint failed a lock request, before the next round. */
#define ETCD_RETRY_PAUSE_MS	200

/* gRPC codes used here */
#define GRPC_UNKNOWN		2
#define GRPC_NOT_FOUND		5

/* What an acquisition produced. */
typedef struct EtcdLockResult
{
	char	   *key;			/* "<name>/<lease hex>" */
	int64		lease;
	int64		token;			/* create_revision of key */
} EtcdLockResult;

PG_FUNCTION_INFO_V1(lockfence_etcd_lock);
PG_FUNCTION_INFO_V1(lockfence_etcd_try_lock);
PG_FUNCTION_INFO_V1(lockfence_etcd_unlock);
PG_FUNCTION_INFO_V1(lockfence_etcd_keepalive);

/*
 * Raise the error for a lock we no longer hold.
 */
static void
report_lock_lost(const char *name, const char *key, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
			 errmsg("etcd lock \"%s\" was lost", name),
			 errdetail("%s", detail),
			 errhint("Acquire the lock again; no fencing token was issued for key \"%s\".",
					 key)));
}

/*
 * Grant a lease of ttl seconds and track it for cleanup at exit.
 * Returns the lease ID and sets *granted_ttl to the TTL etcd granted.
 */
int64
etcd_lease_grant(int ttl, int *granted_ttl)
{
	EtcdReply	reply;
	int64		id;
	int64		got_ttl = 0;
	char	   *body = psprintf("{\"TTL\":\"%d\"}", ttl);

	if (!etcd_call("/v3/lease/grant", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("a lease grant", &reply);
	if (!etcd_json_int64(&reply.json->root, "ID", &id) || id <= 0)
	{
		char	   *err = etcd_json_string(&reply.json->root, "error");

		if (err && err[0])
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_EXCEPTION),
					 errmsg("etcd refused to grant a lease"),
					 errdetail("etcd answered: %s", err)));
		etcd_malformed_reply("a lease grant", "The reply carries no lease ID.");
	}
	etcd_session_track(id);
	if (!etcd_json_int64(&reply.json->root, "TTL", &got_ttl) || got_ttl <= 0)
		got_ttl = ttl;
	*granted_ttl = (int) Min(got_ttl, (int64) PG_INT32_MAX);
	return id;
}

/*
 * Revoke a lease, deleting every key attached to it.  Returns true when the
 * lease is gone (revoked now, or unknown to etcd already) and stops
 * tracking it.  Quiet calls never raise errors and return false on any
 * failure; other calls raise errors.
 */
bool
etcd_lease_revoke(int64 lease, long timeout_ms, bool quiet)
{
	bool		found;

	return etcd_lease_revoke_found(lease, timeout_ms, quiet, &found);
}

/*
 * etcd_lease_revoke, also telling in *found whether etcd still knew the
 * lease (false: it had expired or was revoked already).
 */
bool
etcd_lease_revoke_found(int64 lease, long timeout_ms, bool quiet,
						bool *found)
{
	EtcdReply	reply;
	char	   *body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);

	*found = false;
	if (etcd_call("/v3/lease/revoke", body, timeout_ms, quiet, &reply))
	{
		*found = true;
		etcd_session_untrack(lease);
		return true;
	}
	if (reply.grpc_code == GRPC_NOT_FOUND || reply.http_code == 404)
	{
		etcd_session_untrack(lease);
		return true;
	}
	if (!quiet)
		etcd_report_reply_error("a lease revocation", &reply);
	return false;
}

/*
 * Renew a lease once.  Returns false when the lease no longer exists,
 * else true with *ttl set to its remaining time to live.
 */
bool
etcd_lease_keepalive(int64 lease, int64 *ttl)
{
	EtcdReply	reply;
	JsonbContainer *result;
	char	   *body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);

	if (!etcd_call("/v3/lease/keepalive", body, etcd_request_timeout_ms,
				   false, &reply))
	{
		if (reply.grpc_code == GRPC_NOT_FOUND || reply.http_code == 404)
			return false;
		etcd_report_reply_error("a lease keepalive", &reply);
	}
	result = etcd_json_object(&reply.json->root, "result");
	if (result == NULL)
		etcd_malformed_reply("a lease keepalive",
							 "The reply carries no \"result\" object.");
	/* etcd omits zero values: no TTL means the lease is gone */
	if (!etcd_json_int64(result, "TTL", ttl) || *ttl <= 0)
		return false;
	return true;
}

/*
 * The lock key for a name and lease, as etcd's Mutex builds it.
 */
static char *
lock_key(const char *name, int64 lease)
{
	return psprintf("%s/%llx", name, (unsigned long long) lease);
}

/*
 * Base64 of the first key after every key starting with prefix.
 */
static char *
prefix_end_b64(const char *prefix)
{
	int			len = strlen(prefix);
	char	   *end = pnstrdup(prefix, len);

	/* prefix ends with '/', so incrementing the last byte cannot wrap */
	end[len - 1]++;
	return etcd_b64_encode(end, len);
}

/*
 * Read back our key and the holder of the name in one transaction.
 * Returns true with *token set to our key's create_revision when our key
 * is the holder.  Raises LF003 when our key is gone or belongs to another
 * lease.  When another key is ahead of ours, raises LF003 too, unless
 * queued_ok, in which case it returns false.
 */
static bool
confirm_lock(const char *name, const char *key, int64 lease, bool queued_ok,
			 int64 *token)
{
	StringInfoData body;
	EtcdReply	reply;
	char	   *prefix = psprintf("%s/", name);
	JsonbContainer *root;
	JsonbContainer *r0;
	JsonbContainer *r1;
	JsonbContainer *kv;
	int64		create_rev;
	int64		kv_lease = 0;
	char	   *owner;
	int			owner_len;

	initStringInfo(&body);
	appendStringInfo(&body,
					 "{\"success\":["
					 "{\"request_range\":{\"key\":\"%s\"}},"
					 "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
					 "\"sort_target\":\"CREATE\",\"sort_order\":\"ASCEND\",\"limit\":\"1\"}}]}",
					 etcd_b64_encode(key, strlen(key)),
					 etcd_b64_encode(prefix, strlen(prefix)),
					 prefix_end_b64(prefix));

	if (!etcd_call("/v3/kv/txn", body.data, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("reading back the lock key", &reply);

	root = &reply.json->root;
	if (etcd_json_array_length(root, "responses") != 2)
		etcd_malformed_reply("reading back the lock key",
							 "The transaction reply does not carry two responses.");
	r0 = etcd_json_object(etcd_json_array_object(root, "responses", 0),
						  "response_range");
	r1 = etcd_json_object(etcd_json_array_object(root, "responses", 1),
						  "response_range");
	if (r0 == NULL || r1 == NULL)
		etcd_malformed_reply("reading back the lock key",
							 "The transaction reply does not carry two range responses.");

	if (etcd_json_array_length(r0, "kvs") == 0)
		report_lock_lost(name, key,
						 "The lock key no longer exists: its lease expired or was revoked while waiting.");
	kv = etcd_json_array_object(r0, "kvs", 0);
	if (!etcd_json_int64(kv, "create_revision", &create_rev) || create_rev <= 0)
		etcd_malformed_reply("reading back the lock key",
							 "The lock key has no create_revision.");
	(void) etcd_json_int64(kv, "lease", &kv_lease);
	if (kv_lease != lease)
		report_lock_lost(name, key,
						 psprintf("The lock key is attached to lease " INT64_FORMAT ", not " INT64_FORMAT ".",
								  kv_lease, lease));

	if (etcd_json_array_length(r1, "kvs") == 0)
		etcd_malformed_reply("reading back the lock key",
							 "The range over the lock name found no key.");
	owner = etcd_json_bytes(etcd_json_array_object(r1, "kvs", 0), "key",
							&owner_len);
	if (owner == NULL || owner_len != (int) strlen(key) ||
		memcmp(owner, key, owner_len) != 0)
	{
		if (queued_ok)
			return false;
		report_lock_lost(name, key,
						 "Another key under the lock name has a lower create_revision, so this session is not the holder.");
	}

	*token = create_rev;
	return true;
}

/*
 * Start the lock service request for our lease.
 */
static EtcdHttpReq *
start_lock_request(const char *name, int64 lease)
{
	char	   *url;
	char	   *body;

	url = psprintf("%s/v3/lock/lock", etcd_current_endpoint());
	body = psprintf("{\"name\":\"%s\",\"lease\":\"" INT64_FORMAT "\"}",
					etcd_b64_encode(name, strlen(name)), lease);
	/* no total timeout: the wait is bounded by the caller's deadline */
	return etcd_http_start(url, body, etcd_auth_token(false), 0,
						   etcd_connect_timeout_ms);
}

/*
 * Start a one-shot keepalive of the lease.  It may take at most one
 * keepalive interval: a member that stalls longer is given up for the
 * next endpoint, while the lease still has two intervals left.
 */
static EtcdHttpReq *
start_keepalive_request(int64 lease, long interval_ms)
{
	char	   *url;
	char	   *body;
	long		timeout_ms = Min((long) etcd_request_timeout_ms, interval_ms);

	url = psprintf("%s/v3/lease/keepalive", etcd_current_endpoint());
	body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);
	return etcd_http_start(url, body, etcd_auth_token(false), timeout_ms,
						   Min((long) etcd_connect_timeout_ms, timeout_ms));
}

/* finish_keepalive's answers besides a TTL */
#define KA_FAILED		(-1)	/* an error answer, or no connection */
#define KA_NO_ANSWER	(-2)	/* the member did not answer in time */

/*
 * Look at a finished keepalive.  Raises LF003 when etcd says the lease is
 * gone; returns the TTL left, KA_NO_ANSWER when the member took the
 * request but did not answer in time (it hangs), or KA_FAILED for any
 * other failure (the caller retries soon on the next endpoint either way).
 */
static int64
finish_keepalive(EtcdHttpReq *req, const char *name, const char *key)
{
	char	   *resp;
	int			len;
	Jsonb	   *jb;
	JsonbContainer *result;
	int64		ttl = 0;
	const char *why;

	if (etcd_http_status(req) != ETCD_HTTP_DONE)
	{
		bool		hung = etcd_http_status(req) == ETCD_HTTP_TIMED_OUT;

		etcd_next_endpoint();
		return hung ? KA_NO_ANSWER : KA_FAILED;
	}
	resp = etcd_http_take_body(req, &len);
	etcd_reply_context = "/v3/lease/keepalive";
	if (etcd_http_code(req) != 200)
	{
		char	   *msg = NULL;

		if (etcd_parse_reply(resp, len, &jb))
			msg = etcd_json_string(&jb->root, "message");
		if (etcd_http_code(req) == 404 ||
			(msg && strstr(msg, "lease not found")))
			report_lock_lost(name, key,
							 "The lease of the lock key expired or was revoked while waiting.");
		etcd_next_endpoint();
		return KA_FAILED;
	}
	if (!etcd_parse_reply(resp, len, &jb))
		etcd_malformed_reply("a lease keepalive",
							 "The reply is not a JSON object.");
	if (!etcd_reply_matches("/v3/lease/keepalive", etcd_http_request_body(req),
							jb, &why))
		etcd_malformed_reply("a lease keepalive", why);
	result = etcd_json_object(&jb->root, "result");
	if (result == NULL)
		etcd_malformed_reply("a lease keepalive",
							 "The reply carries no \"result\" object.");
	if (!etcd_json_int64(result, "TTL", &ttl) || ttl <= 0)
		report_lock_lost(name, key,
						 "The lease of the lock key expired or was revoked while waiting.");
	return ttl;
}

/*
 * After a failed lock request: may it be sent again, and when?  The
 * request moves to the next endpoint at once, pausing ETCD_RETRY_PAUSE_MS
 * after each full round of failed endpoints, for as long as
 * lockfence.etcd_request_timeout allows since the first failure in a row.
 */
static bool
lock_retry_allowed(int *failures, TimestampTz *first_failure,
				   TimestampTz *retry_at, int n_endpoints)
{
	TimestampTz now = GetCurrentTimestamp();

	if ((*failures)++ == 0)
		*first_failure = now;
	if (now >= TimestampTzPlusMilliseconds(*first_failure,
										   etcd_request_timeout_ms))
		return false;
	etcd_next_endpoint();
	*retry_at = (*failures % n_endpoints == 0) ?
		TimestampTzPlusMilliseconds(now, ETCD_RETRY_PAUSE_MS) : now;
	return true;
}

/*
 * Queue again under a new lease, after the member that has our lock
 * request stopped answering.  The request cannot simply be sent again
 * under the same lease: when a hung member wakes up, etcd's lock service
 * there sees its client gone and deletes the waiter key it created, which
 * is the same key, so it would silently take away a lock granted through
 * another member meanwhile.  So the old lease is revoked (deleting the old
 * key at once, so it blocks nobody) and a new one granted, at the price
 * of the place in the queue.  Errors are raised as usual; the caller's
 * cleanup then revokes *lease, and a lease that could not be revoked
 * stays tracked for revocation at exit.  Returns the new key.
 */
static char *
requeue_new_lease(const char *name, volatile int64 *lease, int *ttl)
{
	int64		old = *lease;
	int			granted;

	(void) etcd_lease_revoke(old, etcd_request_timeout_ms, false);
	*lease = etcd_lease_grant(*ttl, &granted);
	*ttl = granted;
	elog(DEBUG1, "etcd lock \"%s\": the member holding the lock request did not answer; queued again under lease " INT64_FORMAT " instead of " INT64_FORMAT,
		 name, *lease, old);
	return lock_key(name, *lease);
}

/*
 * Wait for the lock service to grant the lock to our lease, keeping the
 * lease alive every third of its TTL.  wait_ms < 0 waits forever.
 * Returns the key the lock service reports.  *lease and *ttl are updated
 * when the request had to be queued again under a new lease.
 */
static char *
wait_for_lock(const char *name, volatile int64 *lease, int *ttl, long wait_ms)
{
	EtcdHttpReq *lock_req = NULL;
	EtcdHttpReq *ka_req = NULL;
	const char *lock_ep = NULL;	/* endpoint of lock_req */
	const char *ka_ep = NULL;	/* endpoint of ka_req */
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	TimestampTz next_ka;
	long		ka_interval_ms = Max(200L, (long) *ttl * 1000 / 3);
	char	   *key = lock_key(name, *lease);
	int			failures = 0;	/* consecutive failed lock requests */
	TimestampTz first_failure = 0;
	TimestampTz retry_at = 0;	/* when to re-send the lock request */
	int			n_endpoints = etcd_endpoint_count();

	if (wait_ms >= 0)
		deadline = TimestampTzPlusMilliseconds(now, wait_ms);
	next_ka = TimestampTzPlusMilliseconds(now, ka_interval_ms);

	/*
	 * The requests are released by etcd_http_abort_all() in the caller's
	 * error cleanup, or below once finished.
	 */
	for (;;)
	{
		long		sleep_ms = -1;
		EtcdHttpStatus st;

		now = GetCurrentTimestamp();
		if (lock_req == NULL && now >= retry_at)
		{
			lock_ep = etcd_current_endpoint();
			lock_req = start_lock_request(name, *lease);
			if (lock_req == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("could not set up an etcd request")));
		}

		st = lock_req ? etcd_http_status(lock_req) : ETCD_HTTP_RUNNING;
		if (st != ETCD_HTTP_RUNNING)
		{
			long		code = etcd_http_code(lock_req);
			char	   *resp;
			int			len;
			Jsonb	   *jb = NULL;
			bool		parsed;

			if (st != ETCD_HTTP_DONE)
			{
				char	   *err = (char *) etcd_http_error(lock_req);
				const char *ep = lock_ep;

				etcd_http_finish(lock_req);
				lock_req = NULL;
				if (st == ETCD_HTTP_TOO_LARGE ||
					(st == ETCD_HTTP_TLS_FAILED && failures + 1 >= n_endpoints) ||
					!lock_retry_allowed(&failures, &first_failure, &retry_at,
										n_endpoints))
					etcd_report_transport_error("a lock request", st, ep, err);
				elog(DEBUG1, "etcd lock request to %s failed: %s", ep, err);
				continue;
			}

			resp = etcd_http_take_body(lock_req, &len);
			etcd_reply_context = "/v3/lock/lock";
			etcd_http_finish(lock_req);
			lock_req = NULL;
			parsed = etcd_parse_reply(resp, len, &jb);

			if (code == 200)
			{
				char	   *got;
				int			got_len;

				if (!parsed)
					etcd_malformed_reply("a lock request",
										 "The reply is not a JSON object.");
				got = etcd_json_bytes(&jb->root, "key", &got_len);
				if (got == NULL || got_len != (int) strlen(key) ||
					memcmp(got, key, got_len) != 0)
					etcd_malformed_reply("a lock request",
										 "The reply does not name the expected lock key.");
				break;
			}
			else
			{
				EtcdReply	reply;
				int64		gcode = 0;

				memset(&reply, 0, sizeof(reply));
				reply.http_code = code;
				reply.endpoint = lock_ep;
				reply.json = parsed ? jb : NULL;
				if (parsed && etcd_json_int64(&jb->root, "code", &gcode))
					reply.grpc_code = (int) gcode;
				if (parsed)
				{
					reply.error_text = etcd_json_string(&jb->root, "message");
					if (reply.error_text == NULL)
						reply.error_text = etcd_json_string(&jb->root, "error");
				}
				if (reply.error_text &&
					strstr(reply.error_text, "lease not found") != NULL)
					report_lock_lost(name, key,
									 "The lease expired or was revoked before the lock was granted.");
				if (etcd_reply_auth_invalid(&reply))
				{
					elog(DEBUG1, "etcd rejected the auth token (%s); authenticating again",
						 reply.error_text ? reply.error_text : "no message");
					etcd_forget_auth_token();
				}
				if ((etcd_transient_failure(code, reply.grpc_code,
											reply.error_text) ||
					 etcd_reply_auth_invalid(&reply)) &&
					lock_retry_allowed(&failures, &first_failure, &retry_at,
									   n_endpoints))
					continue;
				etcd_report_reply_error("a lock request", &reply);
			}
		}

		/* keep our lease alive while waiting */
		now = GetCurrentTimestamp();
		if (ka_req != NULL && etcd_http_status(ka_req) != ETCD_HTTP_RUNNING)
		{
			int64		left = finish_keepalive(ka_req, name, key);

			elog(DEBUG2, "etcd keepalive of lease " INT64_FORMAT " while waiting: TTL " INT64_FORMAT,
				 *lease, left);
			etcd_http_finish(ka_req);
			ka_req = NULL;
			next_ka = TimestampTzPlusMilliseconds(now, left < 0 ? 200 : ka_interval_ms);

			/*
			 * The member our lock request waits on did not answer a
			 * keepalive within an interval: it hangs, and would not tell
			 * us when the lock is ours.  Queue again elsewhere, if there
			 * is an elsewhere.  (A member that refuses connections is
			 * dead: the lock request fails too, and is sent again under
			 * the same lease above, as a dead member deletes nothing.)
			 */
			if (left == KA_NO_ANSWER && lock_req != NULL && n_endpoints > 1 &&
				ka_ep != NULL && lock_ep != NULL && strcmp(ka_ep, lock_ep) == 0)
			{
				etcd_http_finish(lock_req);
				lock_req = NULL;
				key = requeue_new_lease(name, lease, ttl);
				ka_interval_ms = Max(200L, (long) *ttl * 1000 / 3);
				now = GetCurrentTimestamp();
				next_ka = TimestampTzPlusMilliseconds(now, ka_interval_ms);
				failures = 0;
				retry_at = now;
				continue;
			}
		}
		if (ka_req == NULL && now >= next_ka)
		{
			elog(DEBUG2, "etcd keepalive of lease " INT64_FORMAT " sent", *lease);
			ka_ep = etcd_current_endpoint();
			ka_req = start_keepalive_request(*lease, ka_interval_ms);
			next_ka = TimestampTzPlusMilliseconds(now, ka_interval_ms);
		}

		if (deadline != 0 && now >= deadline)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
							name),
					 errdetail("Another session holds the lock or waits ahead of this one.")));

		if (ka_req == NULL)
			sleep_ms = (long) ((next_ka - now) / 1000);
		if (lock_req == NULL)
		{
			long		r = Max((long) ((retry_at - now) / 1000), 0L);

			if (sleep_ms < 0 || r < sleep_ms)
				sleep_ms = r;
		}
		if (deadline != 0)
		{
			long		d = (long) ((deadline - now) / 1000);

			if (sleep_ms < 0 || d < sleep_ms)
				sleep_ms = d;
		}
		if (sleep_ms == 0)
			sleep_ms = 1;

		if (!etcd_http_wait(sleep_ms))
		{
			if (ProcDiePending && INTERRUPTS_CAN_BE_PROCESSED())
			{
				/*
				 * The FATAL error reaches the client before the exit
				 * callbacks run: remove our waiter key first, so that a
				 * terminated waiter is visibly gone when the client learns
				 * of it.
				 */
				HOLD_INTERRUPTS();
				lockfence_metrics_etcd_acquire_failed();
				etcd_http_abort_all();
				lock_req = ka_req = NULL;
				(void) etcd_lease_revoke(*lease, ETCD_CLEANUP_MS, true);
				RESUME_INTERRUPTS();
			}
			CHECK_FOR_INTERRUPTS();
		}
	}

	if (ka_req)
		etcd_http_finish(ka_req);
	return key;
}

/*
 * Create our lock key under our lease if it does not exist yet, as the
 * Mutex's TryLock does.  Whether it is the holder is read back afterwards,
 * so retrying this request on another endpoint is harmless.
 */
static void
create_lock_key(const char *name, int64 lease)
{
	char	   *key = lock_key(name, lease);
	char	   *key64 = etcd_b64_encode(key, strlen(key));
	char	   *body;
	EtcdReply	reply;

	body = psprintf("{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\"}],"
					"\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"\",\"lease\":\"" INT64_FORMAT "\"}}]}",
					key64, key64, lease);

	if (!etcd_call("/v3/kv/txn", body, etcd_request_timeout_ms, false,
				   &reply))
	{
		if (reply.error_text && strstr(reply.error_text, "lease not found"))
			report_lock_lost(name, key,
							 "The lease expired before the lock key was created.");
		etcd_report_reply_error("creating the lock key", &reply);
	}
	if (etcd_json_object(&reply.json->root, "header") == NULL)
		etcd_malformed_reply("creating the lock key",
							 "The reply carries no header.");
}

/*
 * Validate the arguments shared by the lock functions.
 */
static void
check_lock_args(const char *name, int ttl)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock name must not be empty")));
	if (len > ETCD_MAX_NAME_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock name is too long"),
				 errdetail("Lock names are limited to %d bytes.",
						   ETCD_MAX_NAME_BYTES)));
	if (ttl < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl_seconds must be at least 1")));
}

/*
 * Acquire the named lock (waiting, or only if free at once when
 * try_only).  Returns false when try_only and the lock is taken.
 *
 * On any error, requests in flight are abandoned and the lease is
 * revoked with interrupts held, so nothing of ours is left in etcd.
 */
static bool
acquire(const char *name, int ttl, long wait_ms, bool try_only,
		EtcdLockResult *res)
{
	int			granted_ttl;
	volatile int64 lease = 0;
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz started = GetCurrentTimestamp();
	bool		got = false;

	check_lock_args(name, ttl);

	PG_TRY();
	{
		char	   *key;

		lease = etcd_lease_grant(ttl, &granted_ttl);
		if (try_only)
		{
			key = lock_key(name, lease);
			create_lock_key(name, lease);
		}
		else
			key = wait_for_lock(name, &lease, &granted_ttl, wait_ms);

		got = confirm_lock(name, key, lease, try_only, &res->token);
		res->key = key;
		res->lease = lease;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		HOLD_INTERRUPTS();
		lockfence_metrics_etcd_acquire_failed();
		etcd_http_abort_all();
		if (lease != 0 && etcd_session_owns(lease))
			(void) etcd_lease_revoke(lease, ETCD_CLEANUP_MS, true);
		RESUME_INTERRUPTS();
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (got)
	{
		long		secs;
		int			usecs;

		etcd_session_mark_acquired(res->lease, res->key);
		TimestampDifference(started, GetCurrentTimestamp(), &secs, &usecs);
		lockfence_metrics_etcd_acquired(secs + usecs / 1000000.0);
	}
	else
	{
		/* taken: remove our key and lease (errors here are reported) */
		(void) etcd_lease_revoke(res->lease, etcd_request_timeout_ms, false);
	}
	return got;
}

/* wait_timeout from which on a wait has no limit: 10,000 years */
#define WAIT_FOREVER_USECS	((int64) 3652425 * USECS_PER_DAY)

/*
 * Convert wait_timeout to milliseconds; -1 for NULL (wait forever).
 * 10,000 years or more (including +infinity) also waits forever: no lock
 * wait outlasts that, and a deadline much further away would not fit in a
 * timestamp.  The span is computed without overflow: an interval of more
 * than about 292,000 years used to wrap around to a short or negative one.
 */
static long
wait_timeout_ms(FunctionCallInfo fcinfo, int argno)
{
	Interval   *span;
	int64		days;
	int64		usecs;
	bool		overflow;

	if (PG_ARGISNULL(argno))
		return -1;
	span = PG_GETARG_INTERVAL_P(argno);
	days = (int64) span->month * DAYS_PER_MONTH + span->day;
	overflow = pg_mul_s64_overflow(days, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, span->time, &usecs);
	if (overflow)
	{
		/* the sign of the exact sum, from an approximation that cannot overflow */
		double		approx = (double) days * USECS_PER_DAY + (double) span->time;

		usecs = approx < 0 ? -1 : PG_INT64_MAX;
	}
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_timeout must not be negative")));
	if (usecs >= WAIT_FOREVER_USECS || usecs / 1000 > (int64) LONG_MAX / 2)
		return -1;
	return (long) (usecs / 1000);
}

/*
 * Return the result row (or none) of etcd_lock / etcd_try_lock.
 */
static void
return_lock_row(FunctionCallInfo fcinfo, bool got, EtcdLockResult *res)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	InitMaterializedSRF(fcinfo, 0);
	if (!got)
		return;
	values[0] = CStringGetTextDatum(res->key);
	values[1] = Int64GetDatum(res->lease);
	values[2] = Int64GetDatum(res->token);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * The (name, ttl_seconds) arguments shared by etcd_lock and etcd_try_lock.
 */
static void
lock_args(FunctionCallInfo fcinfo, char **name, int *ttl)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("name and ttl_seconds must not be null")));
	*name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	*ttl = PG_GETARG_INT32(1);
}

/*
 * lockfence.etcd_lock(name, ttl_seconds, wait_timeout)
 *		-> TABLE(key, lease, token)
 *
 * Blocks until this session holds the named lock, keeping the waiting
 * lease alive.  Returns exactly one row.
 */
Datum
lockfence_etcd_lock(PG_FUNCTION_ARGS)
{
	char	   *name;
	int			ttl;
	long		wait_ms;
	EtcdLockResult res;

	lock_args(fcinfo, &name, &ttl);
	wait_ms = wait_timeout_ms(fcinfo, 2);

	(void) acquire(name, ttl, wait_ms, false, &res);
	return_lock_row(fcinfo, true, &res);
	return (Datum) 0;
}

/*
 * lockfence.etcd_try_lock(name, ttl_seconds) -> TABLE(key, lease, token)
 *
 * One row when the lock was free and is now ours; no row (and nothing of
 * ours left in etcd) when someone else holds or waits for it.
 */
Datum
lockfence_etcd_try_lock(PG_FUNCTION_ARGS)
{
	char	   *name;
	int			ttl;
	EtcdLockResult res;
	bool		got;

	lock_args(fcinfo, &name, &ttl);

	got = acquire(name, ttl, 0, true, &res);
	return_lock_row(fcinfo, got, &res);
	return (Datum) 0;
}

/*
 * Parse the lease ID from a Mutex key's last component; 0 if none.
 */
static int64
lease_from_key(const char *key)
{
	const char *slash = strrchr(key, '/');
	char	   *end;
	unsigned long long v;

	if (slash == NULL || slash[1] == '\0' || strlen(slash + 1) > 16)
		return 0;
	if (strspn(slash + 1, "0123456789abcdef") != strlen(slash + 1))
		return 0;
	errno = 0;
	v = strtoull(slash + 1, &end, 16);
	if (errno != 0 || *end != '\0' || v > (unsigned long long) PG_INT64_MAX)
		return 0;
	return (int64) v;
}

/*
 * lockfence.etcd_unlock(key) -> boolean
 *
 * Deletes the lock key and revokes its lease.  Returns false, with a
 * NOTICE, when the key was already gone.
 *
 * For a key this backend acquired, its lease was granted for that key
 * alone, so revoking the lease deletes the key too: one request instead
 * of two (a revoke of a lease etcd no longer knows means the key is gone
 * already).  Other keys (another session's, an etcdctl holder's) are
 * deleted first, and the lease they were attached to is revoked then.
 * Both requests are idempotent, so etcd_call retries them on the other
 * endpoints within lockfence.etcd_request_timeout.
 */
Datum
lockfence_etcd_unlock(PG_FUNCTION_ARGS)
{
	char	   *key = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *body;
	EtcdReply	reply;
	int64		deleted = 0;
	int64		kv_lease = 0;
	int64		own_lease = lease_from_key(key);

	if (key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock key must not be empty")));

	if (own_lease > 0 && etcd_session_holds_key(own_lease, key))
	{
		bool		found;

		(void) etcd_lease_revoke_found(own_lease, etcd_request_timeout_ms,
									   false, &found);
		if (!found)
		{
			ereport(NOTICE,
					(errmsg("etcd lock key \"%s\" does not exist", key),
					 errdetail("The lock was lost when its lease expired.")));
			PG_RETURN_BOOL(false);
		}
		PG_RETURN_BOOL(true);
	}

	body = psprintf("{\"key\":\"%s\",\"prev_kv\":true}",
					etcd_b64_encode(key, strlen(key)));
	if (!etcd_call("/v3/kv/deleterange", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("deleting the lock key", &reply);

	(void) etcd_json_int64(&reply.json->root, "deleted", &deleted);
	if (deleted > 0 && etcd_json_array_length(&reply.json->root, "prev_kvs") > 0)
		(void) etcd_json_int64(etcd_json_array_object(&reply.json->root,
													  "prev_kvs", 0),
							   "lease", &kv_lease);

	/*
	 * Revoke the lease the key was attached to.  A lease of ours whose hex
	 * merely appears in the key is left alone: it carries another key, a
	 * lock this session still holds.
	 */
	if (kv_lease > 0)
		(void) etcd_lease_revoke(kv_lease, etcd_request_timeout_ms, false);

	if (deleted == 0)
	{
		ereport(NOTICE,
				(errmsg("etcd lock key \"%s\" does not exist", key),
				 errdetail("The lock was already released, or lost when its lease expired.")));
		PG_RETURN_BOOL(false);
	}
	PG_RETURN_BOOL(true);
}

/*
 * lockfence.etcd_keepalive(lease) -> bigint
 *
 * Renews a lease once and returns its remaining TTL in seconds; LF003 if
 * the lease is gone.
 */
Datum
lockfence_etcd_keepalive(PG_FUNCTION_ARGS)
{
	int64		lease = PG_GETARG_INT64(0);
	int64		ttl = 0;

	if (lease <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid etcd lease ID " INT64_FORMAT, lease)));
	if (!etcd_lease_keepalive(lease, &ttl))
	{
		etcd_session_untrack(lease);
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("etcd lease " INT64_FORMAT " has expired or was revoked",
						lease),
				 errdetail("Locks held under this lease are lost."),
				 errhint("Acquire the lock again.")));
	}
	PG_RETURN_INT64(ttl);
}

/*
 * Module initialization for the etcd functions: called from _PG_init.
 */
void
lockfence_etcd_init(void)
{
	etcd_guc_init();
	etcd_session_init();
}
