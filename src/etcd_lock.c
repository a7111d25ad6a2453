/*-------------------------------------------------------------------------
 *
 * etcd_lock.c
 *	  etcd locks compatible with etcd's concurrency Mutex: acquisition,
 *	  read-back of the fencing token, and release.
 *
 * A lock is a key "<name>/<lease ID in lowercase hex>" created under the
 * session lease of its TTL (etcd_session.c); the holder is the key under
 * "<name>/" with the lowest create_revision.  Acquisition lets etcd's lock service
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
 * and, with interrupts held, deletes our waiter key (revoking the lease
 * if it was granted for this lock).  A lock stays "pending" from its acquisition until its SQL
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

#include "miscadmin.h"
#include "utils/timestamp.h"

#include "etcd.h"
#include "lockfence.h"
#include "metrics.h"

/* State of one wait for the lock service (wait_for_lock). */
typedef struct LockWait
{
	const char *name;
	volatile int64 *lease;		/* updated when queued again */
	int			req_ttl;		/* TTL asked for */
	int		   *ttl;			/* TTL granted */
	char	   *key;			/* our key under *lease */
	EtcdHttpReq *lock_req;		/* lock service request in flight */
	EtcdHttpReq *ka_req;		/* keepalive in flight */
	const char *lock_ep;		/* endpoint of lock_req */
	const char *ka_ep;			/* endpoint of ka_req */
	TimestampTz deadline;		/* of the wait; 0: none */
	TimestampTz next_ka;		/* when to send the next keepalive */
	TimestampTz ka_sent_at;		/* when ka_req was sent */
	TimestampTz retry_at;		/* when to (re)send the lock request */
	long		ka_interval_ms;
	EtcdRetry	retry;			/* for failed lock requests */
} LockWait;

/*
 * Release a lock of ours (key on lease) that was not handed to the SQL
 * caller, after an error, quietly within etcd_cleanup_budget_ms():
 * see etcd_session_release_quietly.  keep_lease: the lease was not
 * granted for this lock (a session lease used before), so only the key
 * is deleted.  Abandons the requests in flight
 * first.  Never raises.
 */
void
etcd_lock_release_after_error(int64 lease, const char *key, bool keep_lease)
{
	long		budget = etcd_cleanup_budget_ms();

	HOLD_INTERRUPTS();
	etcd_http_abort_all();
	if (lease > 0 && etcd_session_owns(lease))
		etcd_session_release_quietly(lease, key, budget, keep_lease);
	RESUME_INTERRUPTS();
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
 * Queue again under another lease, after the member that has our lock
 * request stopped answering.  The request cannot simply be sent again
 * under the same lease: when a hung member wakes up, etcd's lock service
 * there sees its client gone and deletes the waiter key it created, which
 * is the same key, so it would silently take away a lock granted through
 * another member meanwhile.  So the old key is deleted at once, so it
 * blocks nobody (by revoking its lease if it carries no other lock of
 * ours), the old lease takes no new locks, and a new session lease is
 * granted, at the price of the place in the queue.  Errors are raised as usual; the caller's
 * cleanup then revokes *lease, and a lease that could not be revoked
 * stays tracked for revocation at exit.  Returns the new key.
 */
static char *
requeue_new_lease(const char *name, volatile int64 *lease, int req_ttl,
				  int *ttl)
{
	int64		old = *lease;
	char	   *old_key = lock_key(name, old);
	bool		fresh;
	bool		deleted;

	etcd_session_retire(old);
	if (etcd_session_lease_shared(old, old_key))
		(void) etcd_lease_delete_key(old, old_key, etcd_request_timeout_ms,
									 false, &deleted);
	else
		(void) etcd_lease_revoke(old, etcd_request_timeout_ms, false);
	*lease = etcd_session_lease(req_ttl, ttl, &fresh);
	elog(DEBUG1, "etcd lock \"%s\": the member holding the lock request did not answer; queued again under lease " INT64_FORMAT " instead of " INT64_FORMAT,
		 name, *lease, old);
	return lock_key(name, *lease);
}


/*
 * A lock request got no HTTP answer: send it again per the retry policy,
 * or raise the error.
 */
static void
lock_wait_transport_failed(LockWait *w, EtcdHttpStatus st)
{
	char	   *err = (char *) etcd_http_error(w->lock_req);
	const char *ep = w->lock_ep;

	etcd_http_finish(w->lock_req);
	w->lock_req = NULL;
	if (st == ETCD_HTTP_TOO_LARGE ||
		(st == ETCD_HTTP_TLS_FAILED && etcd_retry_tls_exhausted(&w->retry)) ||
		!etcd_retry_next(&w->retry, &w->retry_at))
		etcd_report_transport_error("a lock request", st, ep, err);
	elog(DEBUG1, "etcd lock request to %s failed: %s", ep, err);
}

/*
 * The lock service answered an error: a lost lease is a lost lock; an
 * answer etcd_reply_error_action calls transient (or a rejected auth
 * token) sends the request again per the retry policy; anything else is
 * raised.
 */
static void
lock_wait_error_reply(LockWait *w, long code, Jsonb *jb)
{
	EtcdReply	reply;

	if (!etcd_reply_fill_error(&reply, code, jb, w->lock_ep))
		etcd_malformed_reply("a lock request",
							 "The error reply's \"code\" or \"message\" field has the wrong type.");
	if (reply.error_text &&
		strstr(reply.error_text, "lease not found") != NULL)
		report_lock_lost(w->name, w->key,
						 "The lease expired or was revoked before the lock was granted.");
	if (etcd_reply_error_action(&reply, true) != ETCD_ERROR_FINAL &&
		etcd_retry_next(&w->retry, &w->retry_at))
		return;
	etcd_report_reply_error("a lock request", &reply);
}

/*
 * Look at the lock request if it finished.  Returns true when the lock
 * service granted our key.
 */
static bool
lock_wait_check_lock(LockWait *w)
{
	EtcdHttpStatus st;
	long		code;
	char	   *resp;
	int			len;
	Jsonb	   *jb = NULL;
	bool		parsed;
	char	   *got;
	int			got_len;

	st = w->lock_req ? etcd_http_status(w->lock_req) : ETCD_HTTP_RUNNING;
	if (st == ETCD_HTTP_RUNNING)
		return false;
	if (st != ETCD_HTTP_DONE)
	{
		lock_wait_transport_failed(w, st);
		return false;
	}

	code = etcd_http_code(w->lock_req);
	resp = etcd_http_take_body(w->lock_req, &len);
	etcd_reply_context = "/v3/lock/lock";
	etcd_http_finish(w->lock_req);
	w->lock_req = NULL;
	parsed = etcd_parse_reply(resp, len, &jb);
	if (code != 200)
	{
		lock_wait_error_reply(w, code, parsed ? jb : NULL);
		return false;
	}
	if (!parsed)
		etcd_malformed_reply("a lock request",
							 "The reply is not a JSON object.");
	got = etcd_json_bytes(&jb->root, "key", &got_len);
	if (got == NULL || got_len != (int) strlen(w->key) ||
		memcmp(got, w->key, got_len) != 0)
		etcd_malformed_reply("a lock request",
							 "The reply does not name the expected lock key.");
	return true;
}

/*
 * Keep our lease alive while waiting: collect a finished keepalive, send
 * the next one when due.  Returns true when the lock request was queued
 * again under a new lease (the member it waited on hangs).
 */
static bool
lock_wait_keepalive(LockWait *w)
{
	TimestampTz now = GetCurrentTimestamp();

	if (w->ka_req != NULL && etcd_http_status(w->ka_req) != ETCD_HTTP_RUNNING)
	{
		int64		left = etcd_lease_keepalive_finish(w->ka_req);

		if (left == ETCD_KA_GONE)
		{
			/* every lock on the session lease is lost with it */
			etcd_session_lease_lost(*w->lease, "expired or was revoked", false);
			report_lock_lost(w->name, w->key,
							 "The lease of the lock key expired or was revoked while waiting.");
		}
		if (left > 0)
			etcd_session_lease_renewed(*w->lease, w->ka_sent_at);
		elog(DEBUG2, "etcd keepalive of lease " INT64_FORMAT " while waiting: TTL " INT64_FORMAT,
			 *w->lease, left);
		etcd_http_finish(w->ka_req);
		w->ka_req = NULL;
		w->next_ka = TimestampTzPlusMilliseconds(now, left < 0 ? 200 : w->ka_interval_ms);

		/*
		 * The member our lock request waits on did not answer a keepalive
		 * within an interval: it hangs, and would not tell us when the
		 * lock is ours.  Queue again elsewhere, if there is an elsewhere.
		 * (A member that refuses connections is dead: the lock request
		 * fails too, and is sent again under the same lease, as a dead
		 * member deletes nothing.)
		 */
		if (left == ETCD_KA_NO_ANSWER && w->lock_req != NULL &&
			etcd_endpoint_count() > 1 && w->ka_ep != NULL &&
			w->lock_ep != NULL && strcmp(w->ka_ep, w->lock_ep) == 0)
		{
			etcd_http_finish(w->lock_req);
			w->lock_req = NULL;
			w->key = requeue_new_lease(w->name, w->lease, w->req_ttl,
									   w->ttl);
			w->ka_interval_ms = Max(200L, (long) *w->ttl * 1000 / 3);
			now = GetCurrentTimestamp();
			w->next_ka = TimestampTzPlusMilliseconds(now, w->ka_interval_ms);
			etcd_retry_init(&w->retry, etcd_request_timeout_ms, true);
			w->retry_at = now;
			return true;
		}
	}
	if (w->ka_req == NULL && now >= w->next_ka)
	{
		elog(DEBUG2, "etcd keepalive of lease " INT64_FORMAT " sent", *w->lease);
		w->ka_ep = etcd_current_endpoint();
		w->ka_sent_at = now;
		w->ka_req = etcd_lease_keepalive_start(*w->lease, w->ka_interval_ms);
		w->next_ka = TimestampTzPlusMilliseconds(now, w->ka_interval_ms);
	}
	return false;
}

/*
 * How long the wait loop may sleep: until the next keepalive, lock
 * request retry or the wait's deadline, whichever comes first; -1 for
 * no limit, and at least 1 ms otherwise.
 */
static long
lock_wait_sleep_ms(LockWait *w)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep_ms = -1;

	if (w->ka_req == NULL)
		sleep_ms = (long) ((w->next_ka - now) / 1000);
	if (w->lock_req == NULL)
	{
		long		r = Max((long) ((w->retry_at - now) / 1000), 0L);

		if (sleep_ms < 0 || r < sleep_ms)
			sleep_ms = r;
	}
	if (w->deadline != 0)
	{
		long		d = (long) ((w->deadline - now) / 1000);

		if (sleep_ms < 0 || d < sleep_ms)
			sleep_ms = d;
	}
	return sleep_ms == 0 ? 1 : sleep_ms;
}

/*
 * Sleep until a request progresses or sleep_ms pass, serving interrupts.
 */
static void
lock_wait_idle(LockWait *w, long sleep_ms)
{
	if (etcd_http_wait(sleep_ms))
		return;
	if (ProcDiePending && INTERRUPTS_CAN_BE_PROCESSED())
	{
		/*
		 * The FATAL error reaches the client before the exit callbacks
		 * run: remove our waiter key first, so that a terminated waiter
		 * is visibly gone when the client learns of it.  Briefly: if etcd
		 * does not answer, the exit callback tries again with what is
		 * left of its budget.
		 */
		HOLD_INTERRUPTS();
		lockfence_metrics_etcd_acquire_failed();
		etcd_http_abort_all();
		w->lock_req = w->ka_req = NULL;
		etcd_session_exit_cleanup_begins();
		(void) etcd_lease_revoke(*w->lease, ETCD_PENDING_RELEASE_MS, true);
		RESUME_INTERRUPTS();
	}
	CHECK_FOR_INTERRUPTS();
}

/*
 * Wait for the lock service to grant the lock to our lease, keeping the
 * lease alive every third of its TTL (and at once if renew_now).
 * wait_ms < 0 waits forever.
 * Returns the key the lock service reports.  *lease and *ttl are updated
 * when the request had to be queued again under a new lease.  The
 * requests are released by etcd_http_abort_all() in the caller's error
 * cleanup, or here once finished.
 */
static char *
wait_for_lock(const char *name, volatile int64 *lease, int req_ttl, int *ttl,
			  long wait_ms, bool renew_now)
{
	LockWait	w;
	TimestampTz now = GetCurrentTimestamp();

	memset(&w, 0, sizeof(w));
	w.name = name;
	w.lease = lease;
	w.req_ttl = req_ttl;
	w.ttl = ttl;
	w.key = lock_key(name, *lease);
	w.ka_interval_ms = Max(200L, (long) *ttl * 1000 / 3);
	/* a session lease used before is renewed now, with the lock request */
	w.next_ka = renew_now ? now :
		TimestampTzPlusMilliseconds(now, w.ka_interval_ms);
	if (wait_ms >= 0)
		w.deadline = TimestampTzPlusMilliseconds(now, wait_ms);
	etcd_retry_init(&w.retry, etcd_request_timeout_ms, true);

	for (;;)
	{
		if (w.lock_req == NULL && GetCurrentTimestamp() >= w.retry_at)
		{
			w.lock_ep = etcd_current_endpoint();
			w.lock_req = start_lock_request(name, *lease);
			if (w.lock_req == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("could not set up an etcd request")));
		}
		if (lock_wait_check_lock(&w))
			break;
		if (w.lock_req == NULL && GetCurrentTimestamp() >= w.retry_at)
			continue;
		if (lock_wait_keepalive(&w))
			continue;
		if (w.deadline != 0 && GetCurrentTimestamp() >= w.deadline)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
							name),
					 errdetail("Another session holds the lock or waits ahead of this one.")));
		lock_wait_idle(&w, lock_wait_sleep_ms(&w));
	}

	if (w.ka_req)
		etcd_http_finish(w.ka_req);
	return w.key;
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
void
etcd_lock_check_args(const char *name, int ttl)
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
 * The session lease for a lock of ttl seconds, renewed if it was used
 * before (so that every lock on it lives ttl seconds from now on).  If etcd says it is gone, every lock on it is lost (LF003 for
 * each); one that carried no lock is replaced by a new lease.
 */
static int64
renewed_session_lease(int ttl, int *granted_ttl, bool *fresh)
{
	int64		lease = etcd_session_lease(ttl, granted_ttl, fresh);
	int64		left;

	if (*fresh || etcd_lease_keepalive(lease, &left))
		return lease;
	etcd_session_lease_lost(lease, "expired or was revoked", false);
	return etcd_session_lease(ttl, granted_ttl, fresh);
}

/*
 * A try-lock found the name taken: remove our key, by revoking the lease
 * if it was granted for this call, else by deleting the key alone.
 */
static void
remove_queued_key(int64 lease, const char *key, bool fresh)
{
	bool		deleted;

	if (!fresh)
		(void) etcd_lease_delete_key(lease, key, etcd_request_timeout_ms,
									 false, &deleted);
	else
		(void) etcd_lease_revoke(lease, etcd_request_timeout_ms, false);
}

/*
 * Acquire the named lock (waiting, or only if free at once when
 * try_only).  Returns false when try_only and the lock is taken.  The
 * lock is returned pending: the caller hands it over with etcd_lock_hand_over() once
 * the SQL caller has it, and releases it with
 * etcd_lock_release_after_error() if it
 * fails before.
 *
 * On any error, requests in flight are abandoned and the lease is
 * revoked with interrupts held, so nothing of ours is left in etcd.
 */
bool
etcd_lock_acquire(const char *name, int ttl, long wait_ms, bool try_only,
				  EtcdLockResult *res)
{
	int			granted_ttl;
	volatile int64 lease = 0;
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz started = GetCurrentTimestamp();
	volatile bool got = false;
	bool		fresh;

	etcd_lock_check_args(name, ttl);
	lease = renewed_session_lease(ttl, &granted_ttl, &fresh);
	if (etcd_session_holds_key(lease, lock_key(name, lease)))
	{
		/*
		 * This session already holds the name on its session lease: the
		 * same key cannot carry a second lock.  Contend with it as any
		 * other session would, under a lease of this lock's own, revoked
		 * when the lock is released.
		 */
		lease = etcd_lease_grant(ttl, &granted_ttl);
		etcd_session_track(lease, 0);
		fresh = true;
	}

	PG_TRY();
	{
		char	   *key;

		if (try_only)
		{
			key = lock_key(name, lease);
			create_lock_key(name, lease);
		}
		else
			key = wait_for_lock(name, &lease, ttl, &granted_ttl, wait_ms,
								false);

		got = confirm_lock(name, key, lease, try_only, &res->token);
		res->key = key;
		res->lease = lease;
		res->fresh_lease = fresh;
		if (got)
			etcd_session_lock_acquired(lease, key, res->token);
		else
			remove_queued_key(lease, key, fresh);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		lockfence_metrics_etcd_acquire_failed();
		etcd_lock_release_after_error(lease, lock_key(name, lease), !fresh);
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (got)
	{
		long		secs;
		int			usecs;

		TimestampDifference(started, GetCurrentTimestamp(), &secs, &usecs);
		lockfence_metrics_etcd_acquired(secs + usecs / 1000000.0);
	}
	return got;
}


/*
 * The SQL caller has the lock now: it is no longer released on errors,
 * but, if xact_scope, when the transaction that took it ends.
 */
void
etcd_lock_hand_over(EtcdLockResult *res, bool xact_scope)
{
	etcd_session_lock_handed_over(res->key, xact_scope);
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
static bool
unlock_gone(const char *key, const char *detail)
{
	ereport(NOTICE,
			(errmsg("etcd lock key \"%s\" does not exist", key),
			 errdetail("%s", detail)));
	return false;
}

/*
 * Revoke the lease of a lock key that was just deleted.  A lease of this
 * session is left alone: it is the session lease of our other locks.  If the revocation fails (cancel included), it is tried again
 * quietly before the error propagates: the caller asked for the release.
 */
static void
revoke_released_lease(const char *key, int64 lease)
{
	MemoryContext cxt = CurrentMemoryContext;

	if (lease <= 0)
		return;
	if (etcd_session_owns(lease))
	{
		/* our session lease: keep it for our other locks */
		etcd_session_lock_released(key);
		return;
	}
	PG_TRY();
	{
		(void) etcd_lease_revoke(lease, etcd_request_timeout_ms, false);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		etcd_lease_revoke_after_error(lease);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * Unlock a key this session holds: delete it, in one request that
 * compares its lease, and keep the session lease for the next lock.
 */
static bool
unlock_own_key(const char *key, int64 lease)
{
	MemoryContext cxt = CurrentMemoryContext;
	bool		deleted = false;

	PG_TRY();
	{
		(void) etcd_lease_delete_key(lease, key, etcd_request_timeout_ms,
									 false, &deleted);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		etcd_lock_release_after_error(lease, key, true);
		PG_RE_THROW();
	}
	PG_END_TRY();
	etcd_session_lock_released(key);
	if (!deleted)
		return unlock_gone(key, "The lock was lost when its lease expired.");
	return true;
}

/*
 * Unlock another holder's lock key "<name>/<lease hex>": in one
 * transaction, delete the key if it is attached to the lease its name
 * ends in, else read it; then revoke that lease.  A key attached to
 * another lease (or to none) is not a lock key and is refused.
 */
static bool
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
	return true;
}

/*
 * Unlock with force: delete any key, then revoke the lease it was
 * attached to, with every other key on that lease.
 */
static bool
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
	return true;
}


/*
 * Release the lock with this key (lockfence.etcd_unlock): delete the key
 * and revoke its lease.  Returns false, with a NOTICE, when the key was
 * already gone.
 *
 * Only lock keys are released, "<name>/<lease hex>" attached to the lease
 * their name ends in (checked by etcd in the same transaction as the
 * deletion): revoking a lease deletes every key on it, so an arbitrary
 * key (application configuration, say) must not be handed to it by
 * mistake.  force deletes any key and revokes its lease.  Both requests
 * are idempotent, so etcd_call retries them on the other endpoints within
 * lockfence.etcd_request_timeout.
 */
bool
etcd_unlock_key(const char *key, bool force)
{
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
