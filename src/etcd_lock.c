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
 * key at once.  A lock stays "pending" from its acquisition until its SQL
 * function returns it to the caller (etcd_lock_and_fence: until the fence
 * accepted its token); any error before that releases it, so a caller that
 * never learned a key never owns one.  After a cancel or a termination
 * that release is bounded by ETCD_PENDING_RELEASE_MS, so the interrupt
 * takes effect at once even when etcd does not answer; a lease not revoked
 * in time is revoked at exit or expires with its TTL.  Termination is
 * covered by the exit callback in etcd_session.c.
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
PG_FUNCTION_INFO_V1(lockfence_etcd_lock_and_fence);

/* lockfence.fence(), called by etcd_lock_and_fence (fence.c) */
extern Datum lockfence_fence(PG_FUNCTION_ARGS);

/*
 * Revoke a lease quietly during error cleanup (in a PG_CATCH block, with
 * the error still being handled): after a cancel, a statement timeout or
 * a termination within ETCD_PENDING_RELEASE_MS, so the interrupt is not
 * delayed by a member that does not answer; after other errors within
 * ETCD_CLEANUP_MS.  Abandons the requests in flight first.  Never raises.
 */
static void
revoke_after_error(int64 lease)
{
	long		budget = ETCD_CLEANUP_MS;

	if (geterrcode() == ERRCODE_QUERY_CANCELED || ProcDiePending ||
		QueryCancelPending)
		budget = ETCD_PENDING_RELEASE_MS;
	HOLD_INTERRUPTS();
	etcd_http_abort_all();
	if (lease > 0)
	{
		etcd_session_set_pending(lease, false);
		(void) etcd_lease_revoke(lease, budget, true);
	}
	RESUME_INTERRUPTS();
}

/*
 * Release a lock of ours that was not handed to the SQL caller, after an
 * error (see revoke_after_error).
 */
static void
release_after_error(int64 lease)
{
	revoke_after_error(lease != 0 && etcd_session_owns(lease) ? lease : 0);
}

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
				 * of it.  Briefly: if etcd does not answer, the exit
				 * callback tries again with what is left of its budget.
				 */
				HOLD_INTERRUPTS();
				lockfence_metrics_etcd_acquire_failed();
				etcd_http_abort_all();
				lock_req = ka_req = NULL;
				etcd_session_exit_cleanup_begins();
				(void) etcd_lease_revoke(*lease, ETCD_PENDING_RELEASE_MS,
										 true);
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
 * try_only).  Returns false when try_only and the lock is taken.  The
 * lock is returned pending: the caller hands it over with hand_over() once
 * the SQL caller has it, and releases it with release_after_error() if it
 * fails before.
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
	volatile bool got = false;

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
		if (got)
			etcd_session_set_pending(lease, true);
		else
		{
			/* taken: remove our key and lease */
			(void) etcd_lease_revoke(lease, etcd_request_timeout_ms, false);
		}
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		lockfence_metrics_etcd_acquire_failed();
		release_after_error(lease);
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
	return got;
}

/* wait_timeout from which on a wait has no limit: 10,000 years */
#define WAIT_FOREVER_USECS	((int64) 3652425 * USECS_PER_DAY)

/*
 * The SQL caller has the lock now: it is no longer released on errors.
 */
static void
hand_over(EtcdLockResult *res)
{
	etcd_session_set_pending(res->lease, false);
}

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
 * Put the result row of etcd_lock / etcd_try_lock into the tuplestore
 * set up with InitMaterializedSRF, then hand the lock over; if that
 * fails, the lock is released.
 */
static void
return_lock_row(FunctionCallInfo fcinfo, EtcdLockResult *res)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext cxt = CurrentMemoryContext;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	PG_TRY();
	{
		values[0] = CStringGetTextDatum(res->key);
		values[1] = Int64GetDatum(res->lease);
		values[2] = Int64GetDatum(res->token);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		release_after_error(res->lease);
		PG_RE_THROW();
	}
	PG_END_TRY();
	hand_over(res);
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
	InitMaterializedSRF(fcinfo, 0);

	(void) acquire(name, ttl, wait_ms, false, &res);
	return_lock_row(fcinfo, &res);
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
	InitMaterializedSRF(fcinfo, 0);

	got = acquire(name, ttl, 0, true, &res);
	if (got)
		return_lock_row(fcinfo, &res);
	return (Datum) 0;
}

/*
 * Parse the lease ID from a lock key "<name>/<lease hex>", as etcd's Mutex
 * builds it (lowercase hex without leading zeros, a non-empty name);
 * 0 if key does not have that form.
 */
static int64
lease_from_key(const char *key)
{
	const char *slash = strrchr(key, '/');
	const char *hex;
	char	   *end;
	unsigned long long v;

	if (slash == NULL || slash == key)
		return 0;
	hex = slash + 1;
	if (hex[0] == '\0' || hex[0] == '0' || strlen(hex) > 16)
		return 0;
	if (strspn(hex, "0123456789abcdef") != strlen(hex))
		return 0;
	errno = 0;
	v = strtoull(hex, &end, 16);
	if (errno != 0 || *end != '\0' || v == 0 ||
		v > (unsigned long long) PG_INT64_MAX)
		return 0;
	return (int64) v;
}

/*
 * Refuse to unlock a key that is not an etcd lock key.
 */
static void
report_not_lock_key(const char *key, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("etcd key \"%s\" is not a lock key", key),
			 errdetail("%s", detail),
			 errhint("To delete any other key and revoke the lease it is attached to, with every key on that lease, call etcd_unlock(key, force => true).")));
}

/*
 * The NOTICE and result for a lock key that no longer exists.
 */
static Datum
unlock_gone(const char *key, const char *detail)
{
	ereport(NOTICE,
			(errmsg("etcd lock key \"%s\" does not exist", key),
			 errdetail("%s", detail)));
	PG_RETURN_BOOL(false);
}

/*
 * Revoke the lease of a lock key that was just deleted.  A lease of this
 * session that merely carries the key (it holds another lock key) is left
 * alone.  If the revocation fails (cancel included), it is tried again
 * quietly before the error propagates: the caller asked for the release.
 */
static void
revoke_released_lease(const char *key, int64 lease)
{
	MemoryContext cxt = CurrentMemoryContext;

	if (lease <= 0 ||
		(etcd_session_owns(lease) && !etcd_session_holds_key(lease, key)))
		return;
	PG_TRY();
	{
		(void) etcd_lease_revoke(lease, etcd_request_timeout_ms, false);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		revoke_after_error(lease);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * Unlock a key this session acquired: its lease was granted for that key
 * alone, so revoking the lease deletes the key too, in one request (a
 * revoke of a lease etcd no longer knows means the key is gone already).
 */
static Datum
unlock_own_key(const char *key, int64 lease)
{
	MemoryContext cxt = CurrentMemoryContext;
	bool		found = false;

	PG_TRY();
	{
		(void) etcd_lease_revoke_found(lease, etcd_request_timeout_ms,
									   false, &found);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		release_after_error(lease);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!found)
		return unlock_gone(key, "The lock was lost when its lease expired.");
	PG_RETURN_BOOL(true);
}

/*
 * Unlock another holder's lock key "<name>/<lease hex>": in one
 * transaction, delete the key if it is attached to the lease its name
 * ends in, else read it; then revoke that lease.  A key attached to
 * another lease (or to none) is not a lock key and is refused.
 */
static Datum
unlock_lock_key(const char *key, int64 lease)
{
	char	   *key64 = etcd_b64_encode(key, strlen(key));
	char	   *body;
	EtcdReply	reply;
	JsonbContainer *root;
	JsonbContainer *resp0;
	JsonbContainer *r;
	bool		succeeded = false;
	int64		kv_lease = 0;

	body = psprintf("{\"compare\":[{\"target\":\"LEASE\",\"key\":\"%s\",\"lease\":\"" INT64_FORMAT "\"}],"
					"\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}],"
					"\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
					key64, lease, key64, key64);
	if (!etcd_call("/v3/kv/txn", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("deleting the lock key", &reply);

	root = &reply.json->root;
	if (etcd_json_array_length(root, "responses") != 1 ||
		(resp0 = etcd_json_array_object(root, "responses", 0)) == NULL)
		etcd_malformed_reply("deleting the lock key",
							 "The transaction reply does not carry one response.");
	/* etcd omits false: no "succeeded" means the comparison failed */
	r = etcd_json_object(resp0, "response_delete_range");
	if (r != NULL)
		succeeded = true;
	else if ((r = etcd_json_object(resp0, "response_range")) == NULL)
		etcd_malformed_reply("deleting the lock key",
							 "The transaction reply carries neither a delete nor a range response.");

	if (!succeeded)
	{
		if (etcd_json_array_length(r, "kvs") == 0)
			return unlock_gone(key,
							   "The lock was already released, or lost when its lease expired.");
		(void) etcd_json_int64(etcd_json_array_object(r, "kvs", 0), "lease",
							   &kv_lease);
		if (kv_lease == 0)
			report_not_lock_key(key,
								"The key is not attached to a lease, while a lock key is attached to the lease its name ends in.");
		report_not_lock_key(key,
							psprintf("The key is attached to lease %llx, not to lease %llx that its name ends in.",
									 (unsigned long long) kv_lease,
									 (unsigned long long) lease));
	}

	revoke_released_lease(key, lease);
	PG_RETURN_BOOL(true);
}

/*
 * Unlock with force: delete any key, then revoke the lease it was
 * attached to, with every other key on that lease.
 */
static Datum
unlock_forced(const char *key)
{
	char	   *body;
	EtcdReply	reply;
	int64		deleted = 0;
	int64		kv_lease = 0;

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
	revoke_released_lease(key, kv_lease);

	if (deleted == 0)
		return unlock_gone(key,
						   "The lock was already released, or lost when its lease expired.");
	PG_RETURN_BOOL(true);
}

/*
 * lockfence.etcd_unlock(key, force DEFAULT false) -> boolean
 *
 * Releases a lock: deletes its key and revokes its lease.  Returns false,
 * with a NOTICE, when the key was already gone.
 *
 * Only lock keys are released, "<name>/<lease hex>" attached to the lease
 * their name ends in (checked by etcd in the same transaction as the
 * deletion): revoking a lease deletes every key on it, so an arbitrary
 * key (application configuration, say) must not be handed to it by
 * mistake.  force => true deletes any key and revokes its lease.  Both
 * requests are idempotent, so etcd_call retries them on the other
 * endpoints within lockfence.etcd_request_timeout.  (Installed 1.1 SQL
 * calls this with the key only: force is then false.)
 */
Datum
lockfence_etcd_unlock(PG_FUNCTION_ARGS)
{
	char	   *key = text_to_cstring(PG_GETARG_TEXT_PP(0));
	bool		force = PG_NARGS() > 1 ? PG_GETARG_BOOL(1) : false;
	int64		lease = lease_from_key(key);

	if (key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock key must not be empty")));
	if (!force && lease == 0)
		report_not_lock_key(key,
							"Lock keys have the form <name>/<lease ID in lowercase hexadecimal>.");

	if (lease > 0 && etcd_session_holds_key(lease, key))
		return unlock_own_key(key, lease);
	if (!force)
		return unlock_lock_key(key, lease);
	return unlock_forced(key);
}

/*
 * lockfence.etcd_lock_and_fence(name, resource, ttl_seconds, wait_timeout)
 *		-> bigint
 *
 * etcd_lock, then lockfence.fence(resource, token, holder => key) in the
 * current transaction; returns the token.  Every argument is checked
 * before etcd is contacted.  Until the fence accepted the token the lock
 * is pending: any error (a rejected token, a cancel or statement timeout
 * while the fence waits for another transaction's fence row, ...)
 * releases it before the error propagates, since the caller never learns
 * the key.
 */
Datum
lockfence_etcd_lock_and_fence(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *resource;
	int			ttl;
	long		wait_ms;
	EtcdLockResult res;
	MemoryContext cxt = CurrentMemoryContext;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("name and ttl_seconds must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	resource = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ttl = PG_GETARG_INT32(2);
	check_lock_args(name, ttl);
	lockfence_validate_resource(resource);
	/* The key, NAME/LEASEHEX, is the fence's holder: it must fit too. */
	if (strlen(name) + 1 + 16 > LOCKFENCE_MAX_HOLDER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("etcd lock name is too long for etcd_lock_and_fence"),
				 errdetail("The lock key, the name followed by \"/\" and up to 16 hexadecimal digits, is the fence's holder, which is limited to %d bytes.",
						   LOCKFENCE_MAX_HOLDER_BYTES)));
	wait_ms = wait_timeout_ms(fcinfo, 3);

	(void) acquire(name, ttl, wait_ms, false, &res);
	PG_TRY();
	{
		(void) DirectFunctionCall3(lockfence_fence,
								   CStringGetTextDatum(resource),
								   Int64GetDatum(res.token),
								   CStringGetTextDatum(res.key));
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		release_after_error(res.lease);
		PG_RE_THROW();
	}
	PG_END_TRY();
	hand_over(&res);
	PG_RETURN_INT64(res.token);
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
