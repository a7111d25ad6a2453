/*-------------------------------------------------------------------------
 *
 * etcd_lease.c
 *	  etcd lease RPCs: grant, keepalive (one shot, blocking or started in
 *	  the background of a lock wait) and revoke.
 *
 * These are plain network calls: they change no state of this backend.
 * etcd_session.c, which tracks every lease granted until it is revoked
 * (so that the exit callback revokes what is left), wraps the calls that
 * change what it tracks (etcd_session_revoke, etcd_session_keepalive).
 *
 * IDENTIFICATION
 *	  src/etcd_lease.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/timestamp.h"

#include "etcd.h"

/*
 * Time allowed for a quiet release during error cleanup (in a PG_CATCH
 * block, with the error still being handled): after a cancel, a statement
 * timeout or a termination ETCD_PENDING_RELEASE_MS, so the interrupt is
 * not delayed by a member that does not answer; after other errors
 * ETCD_CLEANUP_MS.
 */
long
etcd_cleanup_budget_ms(void)
{
	if (geterrcode() == ERRCODE_QUERY_CANCELED || ProcDiePending ||
		QueryCancelPending)
		return ETCD_PENDING_RELEASE_MS;
	return ETCD_CLEANUP_MS;
}

/*
 * Delete key if it is still attached to lease (one transaction comparing
 * the key's lease).  Returns true when the request succeeded, with
 * *deleted telling whether the key was there; a key that is gone or on
 * another lease is left alone.  *retried (unless NULL) tells whether an
 * earlier attempt went unanswered: a key not found may have been deleted
 * by it.  Quiet calls never raise errors and return false on any failure;
 * other calls raise errors.
 */
bool
etcd_lease_delete_key(int64 lease, const char *key, long timeout_ms,
					  bool quiet, bool *deleted, bool *retried)
{
	char	   *key64 = etcd_b64_encode(key, strlen(key));
	char	   *body;
	EtcdReply	reply;
	JsonbValue *succ;

	*deleted = false;
	body = psprintf("{\"compare\":[{\"target\":\"LEASE\",\"key\":\"%s\",\"lease\":\"" INT64_FORMAT "\"}],"
					"\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
					key64, lease, key64);
	if (!etcd_call("/v3/kv/txn", body, timeout_ms, quiet, &reply))
	{
		if (!quiet)
			etcd_report_reply_error("deleting the lock key", &reply);
		return false;
	}
	/*
	 * etcd omits false: no "succeeded" means the comparison failed.  The
	 * comparison holds only for an existing key on this lease, so it
	 * succeeding means the key was deleted.  (Read without the raising
	 * accessors: quiet calls never raise.)
	 */
	succ = getKeyJsonValueFromContainer(&reply.json->root, "succeeded", 9,
										NULL);
	*deleted = succ != NULL && succ->type == jbvBool && succ->val.boolean;
	if (retried != NULL)
		*retried = reply.retried;
	return true;
}

/*
 * Grant a lease of ttl seconds.  Returns the lease ID and sets
 * *granted_ttl to the TTL etcd granted.  The caller tracks it at once
 * (etcd_session_track), so that it is revoked at exit.
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
	if (!etcd_json_int64(&reply.json->root, "TTL", &got_ttl) || got_ttl <= 0)
		got_ttl = ttl;
	*granted_ttl = (int) Min(got_ttl, (int64) PG_INT32_MAX);
	return id;
}

/*
 * Revoke a lease, deleting every key attached to it.  Returns true when the
 * lease is gone (revoked now, or unknown to etcd already).  Quiet calls
 * never raise errors and return false on any failure; other calls raise
 * errors.
 */
bool
etcd_lease_revoke(int64 lease, long timeout_ms, bool quiet)
{
	EtcdReply	reply;
	char	   *body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);

	if (etcd_call("/v3/lease/revoke", body, timeout_ms, quiet, &reply))
		return true;
	if (reply.grpc_code == GRPC_NOT_FOUND || reply.http_code == 404)
		return true;
	if (!quiet)
		etcd_report_reply_error("a lease revocation", &reply);
	return false;
}

/*
 * Renew a lease once.  Returns false when the lease no longer exists,
 * else true with *ttl set to its remaining time to live and *sent_at to
 * when the request went out (etcd counts the TTL from before its reply).
 */
bool
etcd_lease_keepalive(int64 lease, int64 *ttl, TimestampTz *sent_at)
{
	EtcdReply	reply;
	JsonbContainer *result;
	char	   *body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);

	*sent_at = GetCurrentTimestamp();

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
 * Start a one-shot keepalive of the lease, to run while the caller waits
 * for something else.  It may take at most one keepalive interval: a
 * member that stalls longer is given up for the next endpoint, while the
 * lease still has two intervals left.
 */
EtcdHttpReq *
etcd_lease_keepalive_start(int64 lease, long interval_ms)
{
	char	   *url;
	char	   *body;
	long		timeout_ms = Min((long) etcd_request_timeout_ms, interval_ms);

	url = psprintf("%s/v3/lease/keepalive", etcd_current_endpoint());
	body = psprintf("{\"ID\":\"" INT64_FORMAT "\"}", lease);
	return etcd_http_start(url, body, etcd_auth_token(false), timeout_ms,
						   Min((long) etcd_connect_timeout_ms, timeout_ms));
}

/*
 * Look at a finished keepalive started by etcd_lease_keepalive_start.
 * Returns the TTL left; ETCD_KA_GONE when etcd says the lease is gone;
 * ETCD_KA_NO_ANSWER when the member took the request but did not answer
 * in time (it hangs); ETCD_KA_FAILED for any other failure (the caller
 * retries soon, on the next endpoint either way).  Raises an error for a
 * malformed reply.
 */
int64
etcd_lease_keepalive_finish(EtcdHttpReq *req)
{
	char	   *resp;
	int			len;
	Jsonb	   *jb = NULL;
	JsonbContainer *result;
	int64		ttl = 0;
	const char *why;

	if (etcd_http_status(req) != ETCD_HTTP_DONE)
	{
		bool		hung = etcd_http_status(req) == ETCD_HTTP_TIMED_OUT;

		etcd_next_endpoint();
		return hung ? ETCD_KA_NO_ANSWER : ETCD_KA_FAILED;
	}
	resp = etcd_http_take_body(req, &len);
	etcd_reply_context = "/v3/lease/keepalive";
	if (etcd_http_code(req) != 200)
	{
		EtcdReply	reply;

		if (!etcd_parse_reply(resp, len, &jb))
			jb = NULL;
		(void) etcd_reply_fill_error(&reply, etcd_http_code(req), jb, NULL);
		if (reply.http_code == 404 || reply.grpc_code == GRPC_NOT_FOUND ||
			(reply.error_text && strstr(reply.error_text, "lease not found")))
			return ETCD_KA_GONE;
		etcd_next_endpoint();
		return ETCD_KA_FAILED;
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
	/* etcd omits zero values: no TTL means the lease is gone */
	if (!etcd_json_int64(result, "TTL", &ttl) || ttl <= 0)
		return ETCD_KA_GONE;
	return ttl;
}
