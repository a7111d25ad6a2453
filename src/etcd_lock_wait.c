/*-------------------------------------------------------------------------
 *
 * etcd_lock_wait.c
 *	  Waiting for an etcd lock on the client side, as etcd's concurrency
 *	  Mutex does, with a watch that etcd delivers at once.
 *
 * Our key "<name>/<lease hex>" is queued (etcd_lock.c); the lock is ours
 * when no key under "<name>/" has a lower create_revision.  So we wait
 * for the predecessor, the key with the highest create_revision below
 * ours, to be deleted, then look again, until there is none.  The same
 * keys and order as `etcdctl lock` and Go's concurrency.Mutex, so each
 * excludes the other in FIFO order.
 *
 * Why not etcd's lock service (/v3/lock/lock)?  It, and any client that
 * watches the predecessor from a past revision, leaves the watch among
 * etcd's "unsynced" watchers, which etcd serves only every 100 ms: each
 * hand-on takes up to 100 ms, whatever the machine does.  A watch
 * created without a start revision starts at the current revision and is
 * synced: etcd delivers the delete as it applies it.  A delete that
 * happens before the watch exists would then be missed, so once etcd
 * confirms the watch ("created") we read the predecessor again, and wait
 * on the watch only if it is still there.
 *
 * Every read of the predecessor also reads our own key, in the same
 * transaction, so a waiter whose key or lease is gone learns it at once
 * (LF003) instead of waiting on, and the read that finds no predecessor
 * also proves that our key is the holder: it exists, under our lease,
 * with the create_revision it was queued with (the token), and no key is
 * older.  A waiter whose lease expired while it waited thus never gets a
 * token (etcd 3.4's lock service answered "locked" then).
 *
 * The wait keeps our lease alive every third of its TTL, and after each
 * renewal reads the queue again: no watch of ours reports our own key
 * deleted by someone else, nor a watch whose member silently stopped
 * delivering.  When a
 * keepalive to the member the watch is on fails, that member may hang or
 * be cut off, and would never deliver the delete: the watch is dropped
 * and set up again through the next endpoint.  Our key stays, so the
 * waiter keeps its place in the queue.
 *
 * IDENTIFICATION
 *	  src/etcd_lock_wait.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "etcd.h"
#include "lockfence.h"
#include "metrics.h"

/* What the watch stream told us so far (watch_poll) */
typedef enum WatchNews
{
	WATCH_NOTHING,				/* nothing new */
	WATCH_CREATED,				/* etcd confirmed the watch */
	WATCH_RECHECK,				/* time to read the queue again */
	WATCH_DELETED,				/* the predecessor was deleted */
	WATCH_FAILED				/* the stream ended or reported an error */
} WatchNews;

/* State of one wait (etcd_lock_wait). */
typedef struct LockWait
{
	const char *name;
	const char *key;			/* our key */
	int64		lease;			/* our lease */
	int64		my_rev;			/* create_revision of our key */
	MemoryContext cxt;			/* lives as long as the wait */
	char	   *pred;			/* predecessor watched; NULL: look it up */
	EtcdHttpReq *watch_req;		/* watch stream on pred */
	const char *watch_ep;		/* endpoint of watch_req */
	size_t		consumed;		/* bytes of the stream already read */
	TimestampTz watch_started;	/* when watch_req was sent */
	bool		created;		/* etcd confirmed the watch */
	const char *watch_error;	/* why the last watch failed */
	bool		watch_malformed;	/* ... because of a malformed reply */
	bool		recheck;		/* read the queue again (after a renewal) */
	EtcdHttpReq *ka_req;		/* keepalive in flight */
	const char *ka_ep;			/* endpoint of ka_req */
	TimestampTz ka_sent_at;		/* when ka_req was sent */
	TimestampTz next_ka;		/* when to send the next keepalive */
	long		ka_interval_ms;
	TimestampTz deadline;		/* of the wait; 0: none */
	TimestampTz retry_at;		/* when to set up the watch again */
	EtcdRetry	retry;			/* for failed watches */
} LockWait;

/*
 * Send a read of the lock queue.  Like every request of a waiting call, it
 * is cut at the call's deadline (etcd_call_as): a read that etcd does not
 * answer before it (a member that stopped answering, or that cannot be
 * reached) ends the wait with 55P03 at the deadline, not with 08006 or
 * 08001 up to a request timeout later (issue 17, item 15).
 */
static bool
queue_read(const char *body, EtcdReply *reply)
{
	/*
	 * Only a call queued behind another key waits, so the 55P03 also says
	 * what a wait that ran out between two requests says: on a loaded
	 * machine the deadline can fall during a read as easily as between
	 * two.
	 */
	return etcd_call_as("a read of the lock queue (another session holds the lock or waits ahead of this one)",
						"/v3/kv/txn", body, etcd_request_timeout_ms, false,
						reply);
}

/*
 * Read our key and our predecessor in one transaction.  Raises LF003 when
 * our key is gone, on another lease or created again.  Returns the
 * predecessor's key (palloc'd), or NULL when ours is the holder.
 */
static char *
find_predecessor(LockWait *w)
{
	char	   *prefix = psprintf("%s/", w->name);
	char	   *body;
	EtcdReply	reply;
	JsonbContainer *own;
	JsonbContainer *below;
	JsonbContainer *kv;
	int64		kv_lease = 0;
	int64		create_rev;
	char	   *pred;
	int			pred_len;

	body = psprintf("{\"success\":["
					"{\"request_range\":{\"key\":\"%s\"}},"
					"{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
					"\"max_create_revision\":\"" INT64_FORMAT "\","
					"\"sort_target\":\"CREATE\",\"sort_order\":\"DESCEND\",\"limit\":\"1\"}}]}",
					etcd_b64_encode(w->key, strlen(w->key)),
					etcd_b64_encode(prefix, strlen(prefix)),
					etcd_prefix_end_b64(prefix), w->my_rev - 1);
	if (!queue_read(body, &reply))
		etcd_report_reply_error("a read of the lock queue", &reply);

	own = etcd_json_object(etcd_json_array_object(&reply.json->root,
												  "responses", 0),
						   "response_range");
	below = etcd_json_object(etcd_json_array_object(&reply.json->root,
													"responses", 1),
							 "response_range");
	if (own == NULL || below == NULL)
		etcd_malformed_reply("a read of the lock queue",
							 "The transaction reply does not carry two range responses.");

	if (etcd_json_array_length(own, "kvs") == 0)
		etcd_report_lock_lost(w->name, w->key,
							  "The lock key no longer exists: its lease expired or was revoked, or it was deleted, while waiting.");
	kv = etcd_json_array_object(own, "kvs", 0);
	(void) etcd_json_int64(kv, "lease", &kv_lease);
	if (kv_lease != w->lease)
		etcd_report_lock_lost(w->name, w->key,
							  psprintf("The lock key is attached to lease " INT64_FORMAT ", not " INT64_FORMAT ".",
									   kv_lease, w->lease));
	if (!etcd_json_int64(kv, "create_revision", &create_rev) ||
		create_rev != w->my_rev)
		etcd_report_lock_lost(w->name, w->key,
							  "The lock key was deleted and created again while waiting.");

	if (etcd_json_array_length(below, "kvs") == 0)
		return NULL;
	pred = etcd_json_bytes(etcd_json_array_object(below, "kvs", 0), "key",
						   &pred_len);
	if (pred == NULL || pred_len == 0 || memchr(pred, '\0', pred_len) != NULL)
		etcd_malformed_reply("a read of the lock queue",
							 "The predecessor's key is missing or not a string.");
	return pnstrdup(pred, pred_len);
}

/*
 * Stop watching (the stream's connection is closed, not reused).
 */
static void
drop_watch(LockWait *w)
{
	if (w->watch_req)
		etcd_http_finish(w->watch_req);
	w->watch_req = NULL;
	w->created = false;
	w->consumed = 0;
}

/*
 * Forget the predecessor: the next round of the wait looks it up again.
 */
static void
forget_predecessor(LockWait *w)
{
	drop_watch(w);
	if (w->pred)
		pfree(w->pred);
	w->pred = NULL;
}

/*
 * Start watching pred from the current revision (no start_revision: a
 * synced watcher, see the file header).
 */
static void
start_watch(LockWait *w, const char *pred)
{
	char	   *url;
	char	   *body;

	w->pred = MemoryContextStrdup(w->cxt, pred);
	w->watch_ep = etcd_current_endpoint();
	url = psprintf("%s/v3/watch", w->watch_ep);
	body = psprintf("{\"create_request\":{\"key\":\"%s\"}}",
					etcd_b64_encode(pred, strlen(pred)));
	/* no total timeout: the stream lasts as long as the wait */
	w->watch_req = etcd_http_start(url, body, etcd_auth_token(false), 0,
								   etcd_connect_timeout_ms);
	if (w->watch_req == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not set up an etcd request")));
	w->watch_started = GetCurrentTimestamp();
	w->created = false;
	w->consumed = 0;
}

/*
 * Non-raising accessors for watch messages (watch_message): a member of
 * c, which must be absent, null or of the given kind; *bad is set when it
 * is present with another type.
 */
static JsonbContainer *
msg_container(JsonbContainer *c, const char *key, bool array, bool *bad)
{
	JsonbValue *v;

	if (c == NULL)
		return NULL;
	v = getKeyJsonValueFromContainer(c, key, strlen(key), NULL);
	if (v == NULL || v->type == jbvNull)
		return NULL;
	if (v->type != jbvBinary ||
		(array ? !JsonContainerIsArray(v->val.binary.data) :
		 !JsonContainerIsObject(v->val.binary.data)))
	{
		*bad = true;
		return NULL;
	}
	return v->val.binary.data;
}

static bool
msg_bool(JsonbContainer *c, const char *key, bool *bad)
{
	JsonbValue *v = getKeyJsonValueFromContainer(c, key, strlen(key), NULL);

	if (v == NULL || v->type == jbvNull)
		return false;
	if (v->type != jbvBool)
	{
		*bad = true;
		return false;
	}
	return v->val.boolean;
}

static char *
msg_string(JsonbContainer *c, const char *key, bool *bad)
{
	char	   *s = NULL;

	if (c != NULL && etcd_json_get_string(c, key, &s) == ETCD_FIELD_BAD)
		*bad = true;
	return s;
}

/*
 * A malformed watch message: the watch fails, as any failed watch does
 * (retried through the next endpoint, the waiter keeping its place in
 * the queue; 08P01 once the retries are spent).
 */
static WatchNews
watch_malformed(LockWait *w, const char *why)
{
	w->watch_error = psprintf("the watch stream carried a malformed message: %s",
							  why);
	w->watch_malformed = true;
	return WATCH_FAILED;
}

/*
 * Read one message of the watch stream.  Only a DELETE of the key we
 * watch counts as a delete: anything else in the events is ignored (a
 * lock key is never written again).  A message that is not a well-formed
 * watch result (not JSON, no "result" object, a field of the wrong type,
 * an event key that is not base64) ends the watch, whatever part of it is
 * wrong: never raises an error.
 */
static WatchNews
watch_message(LockWait *w, const char *msg, int len)
{
	Jsonb	   *jb;
	JsonbContainer *result;
	JsonbContainer *events;
	bool		bad = false;
	bool		canceled;
	bool		created;
	int			n;
	int			i;

	etcd_reply_context = "/v3/watch";
	/* the parser wants a string of exactly len bytes */
	if (!etcd_parse_reply(pnstrdup(msg, len), len, &jb) ||
		(result = msg_container(&jb->root, "result", false, &bad)) == NULL)
	{
		w->watch_error = "the watch stream carried a message that is not a watch result";
		w->watch_malformed = true;
		return WATCH_FAILED;
	}
	canceled = msg_bool(result, "canceled", &bad);
	created = msg_bool(result, "created", &bad);
	events = msg_container(result, "events", true, &bad);
	if (bad)
		return watch_malformed(w, "a field of the result has the wrong type");
	if (canceled)
	{
		char	   *reason = msg_string(result, "cancel_reason", &bad);

		w->watch_error = psprintf("etcd canceled the watch%s%s",
								  reason ? ": " : "", reason ? reason : "");
		w->watch_malformed = false;
		return WATCH_FAILED;
	}
	n = events ? JsonContainerSize(events) : 0;
	for (i = 0; i < n; i++)
	{
		JsonbValue *elem = getIthJsonbValueFromContainer(events, i);
		JsonbContainer *ev;
		JsonbContainer *kv;
		char	   *type;
		char	   *key64;
		char	   *key;
		int			key_len;

		if (elem == NULL || elem->type != jbvBinary ||
			!JsonContainerIsObject(elem->val.binary.data))
			return watch_malformed(w, "an event is not an object");
		ev = elem->val.binary.data;
		type = msg_string(ev, "type", &bad);
		kv = msg_container(ev, "kv", false, &bad);
		if (bad)
			return watch_malformed(w, "a field of an event has the wrong type");
		/* etcd omits the zero value of the type: PUT */
		if (type == NULL || strcmp(type, "DELETE") != 0)
			continue;
		key64 = msg_string(kv, "key", &bad);
		if (bad || key64 == NULL)
			return watch_malformed(w, "a DELETE event carries no key");
		key = etcd_b64_decode(key64, &key_len);
		if (key == NULL)
			return watch_malformed(w, "the key of a DELETE event is not valid base64");
		if (key_len == (int) strlen(w->pred) &&
			memcmp(key, w->pred, key_len) == 0)
			return WATCH_DELETED;
	}
	if (created && !w->created)
	{
		w->created = true;
		return WATCH_CREATED;
	}
	return WATCH_NOTHING;
}

/*
 * Read what the watch stream brought since the last look: its messages
 * are JSON objects, one per line.
 */
static WatchNews
watch_poll(LockWait *w)
{
	EtcdHttpStatus st = etcd_http_status(w->watch_req);
	const char *data;
	size_t		len;

	data = etcd_http_peek_body(w->watch_req, &len);
	while (w->consumed < len)
	{
		const char *start = data + w->consumed;
		const char *nl = memchr(start, '\n', len - w->consumed);
		WatchNews	news;

		if (nl == NULL)
			break;
		w->consumed += nl - start + 1;
		if (nl == start)
			continue;
		news = watch_message(w, start, nl - start);
		if (news != WATCH_NOTHING)
			return news;
	}
	w->watch_malformed = (st == ETCD_HTTP_TOO_LARGE);
	if (st != ETCD_HTTP_RUNNING)
	{
		w->watch_error = st == ETCD_HTTP_DONE ?
			psprintf("the watch stream ended (HTTP %ld)",
					 etcd_http_code(w->watch_req)) :
			etcd_hide_tls_files(etcd_http_error(w->watch_req));
		return WATCH_FAILED;
	}

	/*
	 * A member that takes the watch but never confirms it may hang, and
	 * would not deliver the delete either.
	 */
	if (!w->created &&
		GetCurrentTimestamp() >= TimestampTzPlusMilliseconds(w->watch_started,
															 etcd_request_timeout_ms))
	{
		w->watch_error = "etcd did not confirm the watch within lockfence.etcd_request_timeout";
		return WATCH_FAILED;
	}
	return WATCH_NOTHING;
}

/*
 * Look up the predecessor and watch it, or return false when there is
 * none (the lock is ours).
 */
static bool
watch_predecessor(LockWait *w)
{
	char	   *pred = find_predecessor(w);

	if (pred == NULL)
		return false;
	start_watch(w, pred);
	return true;
}

/*
 * Act on news from the watch.  Returns false when the predecessor is gone
 * and none is left (the lock is ours).
 */
static bool
watch_news(LockWait *w, WatchNews news)
{
	char	   *pred;

	switch (news)
	{
		case WATCH_NOTHING:
			break;
		case WATCH_CREATED:
		case WATCH_RECHECK:

			/*
			 * Deletes from now on will be delivered; one that came before
			 * would not.  Look again: keys below ours only ever go away,
			 * so the predecessor is the same, an older one, or none.
			 * Looking again after each renewal also catches our own key
			 * deleted by someone else, which no watch of ours reports.
			 */
			if (news == WATCH_CREATED)
				etcd_retry_init(&w->retry, etcd_request_timeout_ms, true);
			w->recheck = false;
			pred = find_predecessor(w);
			if (pred != NULL && strcmp(pred, w->pred) == 0)
				break;
			forget_predecessor(w);
			if (pred == NULL)
				return false;
			start_watch(w, pred);
			break;
		case WATCH_DELETED:
			forget_predecessor(w);
			return watch_predecessor(w);
		case WATCH_FAILED:
			elog(DEBUG1, "etcd lock \"%s\": watch on %s failed: %s",
				 w->name, w->watch_ep, w->watch_error);
			forget_predecessor(w);
			if (!etcd_retry_next(&w->retry, &w->retry_at))
				ereport(ERROR,
						(errcode(w->watch_malformed ?
								 ERRCODE_PROTOCOL_VIOLATION :
								 ERRCODE_CONNECTION_FAILURE),
						 errmsg("could not watch the predecessor of etcd lock \"%s\"",
								w->name),
						 errdetail("Last failure, from %s: %s.", w->watch_ep,
								   w->watch_error)));
			break;
	}
	return true;
}

/*
 * Keep our lease alive while waiting: collect a finished keepalive, send
 * the next one when due.  A keepalive that fails on the member the watch
 * is on drops the watch, to be set up again through the next endpoint.
 */
static void
wait_keepalive(LockWait *w)
{
	TimestampTz now = GetCurrentTimestamp();

	if (w->ka_req != NULL && etcd_http_status(w->ka_req) != ETCD_HTTP_RUNNING)
	{
		int64		left = etcd_lease_keepalive_finish(w->ka_req);

		etcd_http_finish(w->ka_req);
		w->ka_req = NULL;
		if (left == ETCD_KA_GONE)
		{
			/* every lock on the session lease is lost with it */
			etcd_session_lease_lost(w->lease, "expired or was revoked", false);
			etcd_report_lock_lost(w->name, w->key,
								  "The lease of the lock key expired or was revoked while waiting.");
		}
		elog(DEBUG2, "etcd keepalive of lease " INT64_FORMAT " while waiting: TTL " INT64_FORMAT,
			 w->lease, left);
		if (left > 0)
		{
			etcd_session_lease_renewed(w->lease, w->ka_sent_at);
			w->recheck = w->created;
		}
		else if (w->pred != NULL && w->watch_ep == w->ka_ep &&
				 etcd_endpoint_count() > 1)
			forget_predecessor(w);
		/* the next renewal is due a third of the TTL after this one */
		w->next_ka = left < 0 ? TimestampTzPlusMilliseconds(now, 200) :
			TimestampTzPlusMilliseconds(w->ka_sent_at, w->ka_interval_ms);
	}
	if (w->ka_req == NULL && now >= w->next_ka)
	{
		w->ka_ep = etcd_current_endpoint();
		w->ka_sent_at = now;
		w->ka_req = etcd_lease_keepalive_start(w->lease, w->ka_interval_ms);
		w->next_ka = TimestampTzPlusMilliseconds(now, w->ka_interval_ms);
	}
}

/*
 * How long the wait may sleep: until the next keepalive, watch retry or
 * the wait's deadline, whichever comes first; -1 for no limit, and at
 * least 1 ms otherwise.
 */
static long
wait_sleep_ms(LockWait *w)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz until = 0;

	if (w->ka_req == NULL)
		until = w->next_ka;
	if (w->pred == NULL)
	{
		/*
		 * No watch: the next attempt is due at retry_at, at once if that
		 * is 0 or past (a keepalive that failed on the watch's member
		 * just dropped it).  Sleeping on would leave the wait blind, and
		 * its keepalives unsent, until its lease expired.
		 */
		TimestampTz retry_at = Max(w->retry_at, now);

		if (until == 0 || retry_at < until)
			until = retry_at;
	}
	if (w->pred != NULL && !w->created)
	{
		TimestampTz confirm_by =
			TimestampTzPlusMilliseconds(w->watch_started,
										etcd_request_timeout_ms);

		if (until == 0 || confirm_by < until)
			until = confirm_by;
	}
	if (w->deadline != 0 && (until == 0 || w->deadline < until))
		until = w->deadline;
	if (until == 0)
		return -1;
	return Max((long) ((until - now) / 1000), 1L);
}

/*
 * Sleep until a request progresses or sleep_ms pass, serving interrupts.
 */
static void
wait_idle(LockWait *w, long sleep_ms)
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
		w->watch_req = w->ka_req = NULL;
		etcd_session_exit_cleanup_begins();
		(void) etcd_session_revoke(w->lease, ETCD_PENDING_RELEASE_MS, true);
		RESUME_INTERRUPTS();
	}
	CHECK_FOR_INTERRUPTS();
}

/*
 * Hand the lock on with its lease renewed within the last third of its
 * TTL, as after an uncontended lock: a wait whose keepalives failed (the
 * watch's member hung) would otherwise return a lock about to expire.
 */
static void
renew_if_due(LockWait *w)
{
	TimestampTz renewed_at = etcd_session_lease_renewed_at(w->lease);
	int64		left;

	if (GetCurrentTimestamp() <
		TimestampTzPlusMilliseconds(renewed_at, w->ka_interval_ms))
		return;
	if (!etcd_session_keepalive(w->lease, &left))
	{
		etcd_session_lease_lost(w->lease, "expired or was revoked", false);
		etcd_report_lock_lost(w->name, w->key,
							  "The lease of the lock key expired or was revoked while waiting.");
	}
}

/*
 * Raise the error for a wait whose wait_timeout passed.  When this
 * session holds a key in the name's queue already (its lock on the name,
 * or one on a longer name under it), the wait was on itself (a session
 * does not reenter its locks), which the message must say
 * (etcd_report_own_lock_timeout); a request cut at the deadline says the
 * same (etcd_call_deadline_own_key).
 */
static void
report_wait_timeout(LockWait *w)
{
	const char *own = etcd_session_key_on_name(w->name, w->key);

	if (own != NULL)
		etcd_report_own_lock_timeout(w->name, own);
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
					w->name),
			 errdetail("Another session holds the lock or waits ahead of this one.")));
}

/*
 * Wait until our key (created at my_rev under lease, whose TTL is ttl) is
 * the holder: it exists and no key under "<name>/" is older, as one
 * linearizable read found on return.  Keeps the lease alive every
 * third of its TTL, counted from its last renewal.  deadline is the
 * call's (its wait_timeout, which also cuts every request made meanwhile:
 * etcd_call_deadline_push); 0 waits forever.  Raises
 * LF003 when our key or lease goes away, 55P03 when the deadline passes.
 * The requests in flight are released by
 * etcd_http_abort_all() in the caller's error cleanup, or here.
 */
void
etcd_lock_wait(const char *name, const char *key, int64 lease, int64 my_rev,
			   int ttl, TimestampTz deadline)
{
	LockWait	w;
	const char *own;
	MemoryContext oldcxt;
	MemoryContext round_cxt;

	memset(&w, 0, sizeof(w));
	w.name = name;
	w.key = key;
	w.lease = lease;
	w.my_rev = my_rev;
	w.cxt = CurrentMemoryContext;
	w.ka_interval_ms = etcd_renewal_interval_ms(ttl);
	/* the lock call renewed the lease only if due: keep to its schedule */
	w.next_ka =
		TimestampTzPlusMilliseconds(etcd_session_lease_renewed_at(lease),
									w.ka_interval_ms);
	w.deadline = deadline;
	etcd_retry_init(&w.retry, etcd_request_timeout_ms, true);

	/*
	 * Behind a key this session holds, the wait is on ourselves: a request cut
	 * at the deadline must say so too.  A copy, as the session frees its
	 * key when the lock is lost, and the deadline keeps it to the call's
	 * end.
	 */
	own = etcd_session_key_on_name(name, key);
	if (own != NULL)
		etcd_call_deadline_own_key(MemoryContextStrdup(w.cxt, own));

	/* a wait may last for hours: each round's garbage goes at its end */
	round_cxt = AllocSetContextCreate(CurrentMemoryContext,
									  "lockfence etcd lock wait",
									  ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(round_cxt);
	for (;;)
	{
		MemoryContextReset(round_cxt);
		/* before any request: one due after the deadline is not sent */
		if (w.deadline != 0 && GetCurrentTimestamp() >= w.deadline)
			report_wait_timeout(&w);
		if (w.pred == NULL && GetCurrentTimestamp() >= w.retry_at)
		{
			if (!watch_predecessor(&w))
				break;
		}
		else if (w.pred != NULL &&
				 !watch_news(&w, w.recheck ? WATCH_RECHECK : watch_poll(&w)))
			break;
		wait_keepalive(&w);
		wait_idle(&w, wait_sleep_ms(&w));
	}
	MemoryContextSwitchTo(oldcxt);

	drop_watch(&w);
	if (w.ka_req)
		etcd_http_finish(w.ka_req);
	MemoryContextDelete(round_cxt);
	renew_if_due(&w);
}
