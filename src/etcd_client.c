/*-------------------------------------------------------------------------
 *
 * etcd_client.c
 *	  One etcd RPC over the JSON gateway: failover, authentication and the
 *	  mapping of failures to SQLSTATEs.
 *
 * etcd_call() posts a JSON body to the current endpoint.  A connection
 * failure, a timed-out attempt, or an answer that only lasts as long as
 * a restart, a leader election or an overload (etcd_transient_failure:
 * "no leader", "request timed out", "leader changed", "too many requests",
 * the gateway's "the client connection is closing", ...) move on to the
 * next endpoint and retry, until the call's own timeout is spent.  Each
 * attempt gets a share of that timeout, so a hung member cannot use all
 * of it when others are listed.  A TLS certificate failure is permanent:
 * the call fails as soon as every endpoint refused once.  When etcd
 * authentication is configured, the token from /v3/auth/authenticate is cached and sent
 * raw in the Authorization header, and fetched again once when etcd says
 * it is no longer valid.  The password is only ever put in the body of
 * the authenticate request, never in a message.
 *
 * A waiting lock call's wait_timeout bounds the whole call, etcd round
 * trips included: the call sets a deadline (etcd_call_deadline_push) that
 * every non-quiet request is cut at, whatever lockfence.etcd_request_timeout
 * allows, and a request cut so ends the call with 55P03 at the deadline
 * (issue 17, item 15).  Quiet requests (cleanup) keep their own budgets.
 *
 * Every 200 reply is checked against the request it answers, as far as
 * etcd's replies identify it (etcd_reply_matches): an HTTP/1.1 connection
 * out of step with its server would otherwise hand us the answer to
 * another request.  A reply that fails the check is malformed (08P01), and
 * the connections are not used again.
 *
 * IDENTIFICATION
 *	  src/etcd_client.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "error_cleanup.h"
#include "etcd.h"
#include "wait_timeout.h"

/*
 * Endpoint requests currently go to, an index into etcd_endpoint_list
 * (reset when the list changes).
 */
static int	cur_endpoint = 0;

/* Cached etcd auth token, in TopMemoryContext. */
static char *auth_token = NULL;

/*
 * The settings generations (etcd_guc.c) cur_endpoint and auth_token were
 * derived under: a change of lockfence.etcd_endpoints starts again from
 * the first endpoint, a change of the credentials drops the token.
 */
static uint64 seen_endpoints_generation = 0;
static uint64 seen_credentials_generation = 0;

/*
 * The deadline of the waiting lock call in progress (its wait_timeout,
 * counted from the call), and the lock it is for; 0 when none.  Set and
 * restored by the call around everything it does (errors included), so a
 * later call without wait_timeout is never cut.
 */
static EtcdCallDeadline call_deadline = {0, NULL, NULL};

/*
 * lockfence.etcd_endpoints changed since cur_endpoint was chosen: start
 * again from the first endpoint.
 */
static void
sync_endpoints(void)
{
	if (seen_endpoints_generation != etcd_endpoints_generation)
	{
		seen_endpoints_generation = etcd_endpoints_generation;
		cur_endpoint = 0;
	}
}

/*
 * Number of configured endpoints (the check hook ensures at least one).
 */
int
etcd_endpoint_count(void)
{
	return etcd_endpoint_list ? etcd_endpoint_list->count : 0;
}

/*
 * The endpoint requests currently go to.
 */
const char *
etcd_current_endpoint(void)
{
	if (etcd_endpoint_count() == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lockfence.etcd_endpoints lists no endpoint")));
	sync_endpoints();
	return etcd_endpoint_list->url[cur_endpoint % etcd_endpoint_list->count];
}

/*
 * Move on to the next endpoint (after a failure).
 */
void
etcd_next_endpoint(void)
{
	int			n = etcd_endpoint_count();

	sync_endpoints();
	if (n > 0)
		cur_endpoint = (cur_endpoint + 1) % n;
}

/*
 * From here until etcd_call_deadline_pop(saved), every non-quiet etcd
 * request is cut at deadline, and one that gets no answer before it ends
 * the call with 55P03, "could not obtain etcd lock <lock_name> within
 * wait_timeout" (etcd_call_deadline_report).  A deadline already in force
 * that comes earlier stays.  lock_name must outlive the pop.
 */
void
etcd_call_deadline_push(TimestampTz deadline, const char *lock_name,
						EtcdCallDeadline *saved)
{
	*saved = call_deadline;
	if (call_deadline.at == 0 || deadline < call_deadline.at)
	{
		call_deadline.at = deadline;
		call_deadline.lock_name = lock_name;
		call_deadline.own_key = NULL;
	}
}

/*
 * The waiting call found that this session already holds a key in its
 * lock's queue (etcd_session_key_on_name), key (which must outlive the
 * pop): from now on a request cut at the
 * deadline raises the 55P03 of a wait on itself
 * (etcd_report_own_lock_timeout), whichever request it was.  Such a call
 * can only end at its deadline, and on a loaded machine the deadline
 * falls during a request (a read of the queue) as easily as between two;
 * "another session holds the lock" would then be wrong.
 */
void
etcd_call_deadline_own_key(const char *key)
{
	if (call_deadline.at != 0)
		call_deadline.own_key = key;
}

/*
 * Restore the deadline in force before the matching push.
 */
void
etcd_call_deadline_pop(const EtcdCallDeadline *saved)
{
	call_deadline = *saved;
}

/*
 * The deadline non-quiet requests are cut at; 0 when none.
 */
TimestampTz
etcd_call_deadline(void)
{
	return call_deadline.at;
}

/*
 * Raise the 55P03 of a call whose wait_timeout passed during a request
 * (what, which failed with failure, on endpoint if known), or before it
 * could be sent (failure NULL).  The same error as a wait that ran out.
 */
void
etcd_call_deadline_report(const char *what, const char *failure,
						  const char *endpoint)
{
	const char *lock_name = call_deadline.lock_name ?
		call_deadline.lock_name : "";

	if (call_deadline.own_key != NULL)
		etcd_report_own_lock_timeout(lock_name, call_deadline.own_key);
	if (failure == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
						lock_name),
				 errdetail("The wait_timeout passed before %s could be sent.",
						   what)));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
					lock_name),
			 endpoint ?
			 errdetail("The wait_timeout passed during %s, which failed: %s (last endpoint tried: %s).",
					   what, failure, endpoint) :
			 errdetail("The wait_timeout passed during %s, which failed: %s.",
					   what, failure)));
	pg_unreachable();
}

/*
 * Raise the 55P03 of a call whose wait_timeout passed while this session
 * held own_key, a key in the queue of lock_name (etcd_session_key_on_name):
 * a session does not reenter its locks, so the wait was on itself, which
 * the message must say (issue 17, item 16).  own_key is a key of the name
 * itself, or of a longer name under it ("<name>/x"), which etcd's queue
 * counts too.
 */
void
etcd_report_own_lock_timeout(const char *lock_name, const char *own_key)
{
	size_t		len = strlen(lock_name);

	/* a key of the name itself: "<name>/<lease hex>", no slash after */
	if (strchr(own_key + len + 1, '/') == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
						lock_name),
				 errdetail("This session already holds the lock, with key \"%s\": a session that locks a name again waits for itself like any other session would.",
						   own_key),
				 errhint("Use the lock this session holds, or release it with lockfence.etcd_unlock('%s') before locking the name again.",
						 own_key)));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain etcd lock \"%s\" within wait_timeout",
					lock_name),
			 errdetail("This session holds the key \"%s\", which is in the queue of \"%s\": a lock waits for every older key under its name and a slash, as with etcd's own clients, so the wait was on this session.",
					   own_key, lock_name),
			 errhint("Release it with lockfence.etcd_unlock('%s') before locking \"%s\", or use names that are not prefixes of one another followed by a slash.",
					 own_key, lock_name)));
	pg_unreachable();
}

/*
 * What a request is, for the 55P03 of a call cut by its wait_timeout.
 */
static const char *
request_label(const char *path)
{
	if (strcmp(path, "/v3/lease/grant") == 0)
		return "a lease grant";
	if (strcmp(path, "/v3/lease/keepalive") == 0)
		return "a lease renewal";
	if (strcmp(path, "/v3/auth/authenticate") == 0)
		return "the authentication";
	return psprintf("the request %s", path);
}

/*
 * Start a retry policy: retries for window_ms, counted from now, or from
 * the first failure of a series when from_first_failure (a lock wait,
 * which may last long before anything fails).
 */
void
etcd_retry_init(EtcdRetry *retry, long window_ms, bool from_first_failure)
{
	retry->n_endpoints = Max(etcd_endpoint_count(), 1);
	retry->failures = 0;
	retry->tls_failures = 0;
	retry->window_ms = window_ms;
	retry->deadline = from_first_failure ? 0 :
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(), window_ms);
}

/*
 * After a failed attempt: may the request be sent again, and when?  It
 * moves to the next endpoint at once, and *retry_at is now, or
 * ETCD_RETRY_PAUSE_MS from now after each full round of failed endpoints.
 * Returns false when no retry fits before the deadline.
 */
bool
etcd_retry_next(EtcdRetry *retry, TimestampTz *retry_at)
{
	TimestampTz now = GetCurrentTimestamp();

	if (retry->failures++ == 0 && retry->deadline == 0)
		retry->deadline = TimestampTzPlusMilliseconds(now, retry->window_ms);
	etcd_next_endpoint();
	if (now >= retry->deadline)
		return false;
	*retry_at = (retry->failures % retry->n_endpoints == 0) ?
		TimestampTzPlusMilliseconds(now, ETCD_RETRY_PAUSE_MS) : now;
	return *retry_at <= retry->deadline;
}

/*
 * After a TLS certificate failure: true when every endpoint has refused
 * once, so that retrying is pointless (certificates do not change).
 */
static bool
etcd_retry_tls_exhausted(EtcdRetry *retry)
{
	return ++retry->tls_failures >= retry->n_endpoints;
}

/*
 * Forget the cached auth token (credentials changed, or etcd rejected it).
 */
static void
etcd_forget_auth_token(void)
{
	if (auth_token)
	{
		explicit_bzero(auth_token, strlen(auth_token));
		pfree(auth_token);
		auth_token = NULL;
	}
}

/*
 * etcd's messages for failures that last only as long as a restart, a
 * leader election or an overload.  etcd reports some of them as HTTP 500,
 * gRPC code 2 (the lock service wraps every error that way), and "too
 * many requests" as HTTP 429, code 8 (which also carries the permanent
 * "database space exceeded"), so the text is what tells them from
 * permanent errors.  "the client connection is closing" and "transport is
 * closing" come from the gateway inside a member that is shutting down or
 * restarting (HTTP 408, code 1): the request may be sent again.
 */
static const char *const transient_texts[] = {
	"etcdserver: request timed out",
	"etcdserver: leader changed",
	"etcdserver: no leader",
	"etcdserver: too many requests",
	"etcdserver: server stopped",
	"etcdserver: timed out waiting for read index response",
	"etcdserver: not enough started members",
	"the client connection is closing",
	"transport is closing",
	NULL
};

/*
 * The one classification of etcd's error answers: is this one after which
 * the request should be sent again (on the next endpoint, within the
 * call's budget)?  HTTP 503 / gRPC code 14 (unavailable), HTTP 504 / code 4
 * (the gateway's deadline passed) and HTTP 408 / code 1 (the gateway's
 * connection to its member was canceled: a restart), or one of etcd's
 * restart, election and overload messages whatever the code.  Everything
 * else (bad request, permission, lease not found, space exceeded, ...) is
 * final.  Failures without an answer (refused or reset connections,
 * timeouts) are retried too, except TLS certificate failures and replies
 * too large (call_transport_failed).
 */
static bool
etcd_transient_failure(long http_code, int grpc_code, const char *error_text)
{
	int			i;

	if (http_code == 503 || http_code == 504 || http_code == 408 ||
		grpc_code == GRPC_UNAVAILABLE || grpc_code == GRPC_DEADLINE_EXCEEDED ||
		grpc_code == GRPC_CANCELED)
		return true;
	if (error_text == NULL)
		return false;
	for (i = 0; transient_texts[i] != NULL; i++)
		if (strstr(error_text, transient_texts[i]) != NULL)
			return true;
	return false;
}

/*
 * Time allowed for one attempt of a call of timeout_ms over n_endpoints
 * endpoints: a fair share of the call's timeout, and at least 3 s when
 * the timeout is long enough (a write can wait that long for a new
 * leader), but never so long that a single hung member can use the
 * whole timeout when there are other members to try: with several
 * endpoints, at least two of them get an attempt.
 */
static long
etcd_attempt_timeout(long timeout_ms, int n_endpoints)
{
	if (n_endpoints <= 1)
		return timeout_ms;
	return Max(timeout_ms / n_endpoints, Min(timeout_ms / 2, 3000L));
}

/*
 * May the current user read the superuser-only etcd settings (the TLS
 * files, the user name)?  As SHOW decides: members of pg_read_all_settings
 * (superusers have every role's privileges).
 */
static bool
etcd_may_read_secret_settings(void)
{
	return has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_SETTINGS);
}

/*
 * libcurl's text with the TLS file names replaced by their settings' names,
 * for a caller who may not read them: "could not load PEM client
 * certificate from /etc/.../x.pem" would show what SHOW refuses.  Applied
 * where the text is taken from libcurl, so that no error, DEBUG message or
 * watch failure carries the names.  Outside a transaction (the exit
 * callback's quiet requests, whose text reaches no client) the text is
 * left as it is: the privilege check reads the catalogs.
 */
const char *
etcd_hide_tls_files(const char *detail)
{
	const char *const names[] = {"lockfence.etcd_cafile",
		"lockfence.etcd_certfile", "lockfence.etcd_keyfile"};
	const char *const values[] = {etcd_cafile, etcd_certfile, etcd_keyfile};
	const char *text = detail;

	if (detail == NULL || !IsTransactionState() ||
		etcd_may_read_secret_settings())
		return detail;
	for (size_t i = 0; i < lengthof(names); i++)
	{
		StringInfoData out;
		const char *rest = text;
		const char *hit;

		if (values[i] == NULL || values[i][0] == '\0')
			continue;
		initStringInfo(&out);
		while ((hit = strstr(rest, values[i])) != NULL)
		{
			appendBinaryStringInfo(&out, rest, hit - rest);
			appendStringInfoString(&out, names[i]);
			rest = hit + strlen(values[i]);
		}
		appendStringInfoString(&out, rest);
		text = out.data;
	}
	return text;
}

/*
 * Raise the error for a request that got no usable HTTP answer.
 */
pg_noreturn static void
etcd_report_transport_error(const char *what, EtcdHttpStatus st,
							const char *endpoint, const char *detail)
{
	switch (st)
	{
		case ETCD_HTTP_CONNECT_FAILED:
			ereport(ERROR,
					(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
					 errmsg("could not connect to etcd for %s", what),
					 errdetail("Last endpoint tried: %s: %s", endpoint,
							   detail ? detail : "no detail"),
					 errhint("Check lockfence.etcd_endpoints, and for https the TLS settings lockfence.etcd_cafile, lockfence.etcd_certfile and lockfence.etcd_keyfile.")));
			break;
		case ETCD_HTTP_TLS_FAILED:
			ereport(ERROR,
					(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
					 errmsg("could not establish a TLS connection to etcd for %s", what),
					 errdetail("Last endpoint tried: %s: %s", endpoint,
							   detail ? detail : "no detail"),
					 errhint("Check the TLS settings lockfence.etcd_cafile, lockfence.etcd_certfile and lockfence.etcd_keyfile.")));
			break;
		case ETCD_HTTP_TIMED_OUT:
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("etcd did not answer %s in time", what),
					 errdetail("Last endpoint tried: %s: %s", endpoint,
							   detail ? detail : "no detail"),
					 errhint("Check etcd's health, or raise lockfence.etcd_request_timeout.")));
			break;
		case ETCD_HTTP_TOO_LARGE:
			ereport(ERROR,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("reply from etcd to %s is too large", what),
					 errdetail("Replies are limited to %d bytes; endpoint: %s.",
							   ETCD_MAX_REPLY_BYTES, endpoint)));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("communication with etcd failed during %s", what),
					 errdetail("Last endpoint tried: %s: %s", endpoint,
							   detail ? detail : "no detail")));
			break;
	}
	pg_unreachable();
}

/*
 * Does an error answer say that our auth token is not (or no longer)
 * valid?  The lock service reports it as code 2 with etcd's message.
 */
static bool
etcd_reply_auth_invalid(EtcdReply *reply)
{
	return reply->grpc_code == GRPC_UNAUTHENTICATED ||
		reply->http_code == 401 ||
		(reply->error_text &&
		 (strstr(reply->error_text, "invalid auth token") ||
		  strstr(reply->error_text, "revision of auth store is old")));
}

/*
 * Raise the error for an error answer from etcd.
 */
void
etcd_report_reply_error(const char *what, EtcdReply *reply)
{
	int			code;
	const char *text = reply->error_text ? reply->error_text : "no message";

	/* the lock service wraps every error as code 2: look at the text too */
	if (etcd_reply_auth_invalid(reply) ||
		(reply->error_text && strstr(reply->error_text, "user name is empty")))
		code = ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
	else if (reply->grpc_code == GRPC_PERMISSION_DENIED ||
			 reply->http_code == 403 ||
			 (reply->error_text && strstr(reply->error_text, "permission denied")))
		code = ERRCODE_INSUFFICIENT_PRIVILEGE;
	else if (etcd_transient_failure(reply->http_code, reply->grpc_code,
									reply->error_text))
		code = ERRCODE_CONNECTION_FAILURE;
	else
		code = ERRCODE_CONNECTION_EXCEPTION;

	ereport(ERROR,
			(errcode(code),
			 errmsg("etcd rejected %s", what),
			 errdetail("etcd answered HTTP %ld, code %d: %s (endpoint %s).",
					   reply->http_code, reply->grpc_code, text,
					   reply->endpoint ? reply->endpoint : "unknown")));
	pg_unreachable();
}

/*
 * The one parser of etcd's error answers: fill in *reply from an HTTP
 * status and the reply's JSON (NULL if the body is not a JSON object):
 * grpc_code from "code", error_text from "message" or else "error".
 * Never raises an error: returns false when a field etcd's error replies
 * carry has the wrong type (a malformed reply).
 */
bool
etcd_reply_fill_error(EtcdReply *reply, long http_code, Jsonb *jb,
					  const char *endpoint)
{
	JsonbContainer *root;
	int64		code = 0;
	char	   *text = NULL;
	EtcdFieldStatus st;

	memset(reply, 0, sizeof(EtcdReply));
	reply->http_code = http_code;
	reply->endpoint = endpoint;
	reply->json = jb;
	if (jb == NULL)
		return true;
	root = &jb->root;
	st = etcd_json_get_int64(root, "code", &code);
	if (st == ETCD_FIELD_BAD || code < PG_INT32_MIN || code > PG_INT32_MAX)
		return false;
	if (st == ETCD_FIELD_OK)
		reply->grpc_code = (int) code;
	if (etcd_json_get_string(root, "message", &text) == ETCD_FIELD_BAD)
		return false;
	if (text == NULL &&
		etcd_json_get_string(root, "error", &text) == ETCD_FIELD_BAD)
		return false;
	reply->error_text = text;
	return true;
}

/*
 * What to do after an error answer.  An auth token etcd no longer accepts
 * is dropped (when may_reauth) so that the next attempt authenticates
 * again; a failure that lasts only as long as a leader election is
 * retried; anything else is final.
 */
static EtcdErrorAction
etcd_reply_error_action(EtcdReply *reply, bool may_reauth)
{
	if (may_reauth && etcd_reply_auth_invalid(reply))
	{
		elog(DEBUG1, "etcd rejected the auth token (%s); authenticating again",
			 reply->error_text ? reply->error_text : "no message");
		etcd_forget_auth_token();
		return ETCD_ERROR_REAUTH;
	}
	if (etcd_transient_failure(reply->http_code, reply->grpc_code,
							   reply->error_text))
		return ETCD_ERROR_RETRY;
	return ETCD_ERROR_FINAL;
}

/*
 * Decode a base64 key field of an object; NULL when absent or invalid.
 */
static char *
key_field(JsonbContainer *c, const char *field, int *len)
{
	char	   *b64;

	if (c == NULL ||
		etcd_json_get_string(c, field, &b64) != ETCD_FIELD_OK)
		return NULL;
	return etcd_b64_decode(b64, len);
}

/*
 * Byte-wise comparison of two keys, as etcd orders them.
 */
static int
key_cmp(const char *a, int alen, const char *b, int blen)
{
	int			r = memcmp(a, b, Min(alen, blen));

	if (r != 0)
		return r;
	return (alen > blen) - (alen < blen);
}

/*
 * The JSON object (or array) stored under key in c, or NULL.
 */
static JsonbContainer *
container_field(JsonbContainer *c, const char *key, bool array)
{
	JsonbValue *v;

	if (c == NULL || !JsonContainerIsObject(c))
		return NULL;
	v = getKeyJsonValueFromContainer(c, key, strlen(key), NULL);
	if (v == NULL || v->type != jbvBinary)
		return NULL;
	if (array ? !JsonContainerIsArray(v->val.binary.data) :
		!JsonContainerIsObject(v->val.binary.data))
		return NULL;
	return v->val.binary.data;
}

/*
 * Is the member key of c absent or null?
 */
static bool
field_absent(JsonbContainer *c, const char *key)
{
	JsonbValue *v = getKeyJsonValueFromContainer(c, key, strlen(key), NULL);

	return v == NULL || v->type == jbvNull;
}

/*
 * Does every key-value pair in the array kvs_field of resp lie in the
 * range the request req (key, range_end) asked for?  etcd's replies carry
 * the keys, so a reply to another request is told apart here.
 */
static bool
keys_in_range(JsonbContainer *req, JsonbContainer *resp,
			  const char *kvs_field)
{
	char	   *key;
	char	   *end;
	int			keylen;
	int			endlen = 0;
	JsonbContainer *kvs;
	int			n;
	int			i;

	key = key_field(req, "key", &keylen);
	end = key_field(req, "range_end", &endlen);
	if (key == NULL)
		return false;
	if (field_absent(resp, kvs_field))
		return true;			/* nothing found: etcd omits the array */
	kvs = container_field(resp, kvs_field, true);
	if (kvs == NULL)
		return false;
	n = JsonContainerSize(kvs);
	for (i = 0; i < n; i++)
	{
		JsonbValue *elem = getIthJsonbValueFromContainer(kvs, i);
		char	   *k;
		int			klen;

		if (elem == NULL || elem->type != jbvBinary ||
			!JsonContainerIsObject(elem->val.binary.data))
			return false;
		k = key_field(elem->val.binary.data, "key", &klen);
		if (k == NULL)
			return false;
		if (end == NULL)
		{
			/* a single key */
			if (key_cmp(k, klen, key, keylen) != 0)
				return false;
		}
		else if (key_cmp(k, klen, key, keylen) < 0 ||
				 (!(endlen == 1 && end[0] == '\0') &&
				  key_cmp(k, klen, end, endlen) >= 0))
			return false;		/* range_end "\0" means every key >= key */
	}
	return true;
}

/*
 * Does a transaction reply answer the transaction req: one response per
 * operation of the branch that ran, each of the operation's kind, and
 * range results within the range asked for?
 */
static bool
txn_matches(JsonbContainer *req, JsonbContainer *resp)
{
	static const char *const kinds[][2] = {
		{"request_range", "response_range"},
		{"request_put", "response_put"},
		{"request_delete_range", "response_delete_range"},
		{"request_txn", "response_txn"},
	};
	JsonbValue *succ;
	bool		succeeded = false;
	JsonbContainer *ops;
	JsonbContainer *responses;
	int			nops;
	int			i;

	succ = getKeyJsonValueFromContainer(resp, "succeeded", 9, NULL);
	if (succ != NULL && succ->type == jbvBool)
		succeeded = succ->val.boolean;
	else if (succ != NULL && succ->type != jbvNull)
		return false;
	ops = container_field(req, succeeded ? "success" : "failure", true);
	nops = ops ? JsonContainerSize(ops) : 0;
	if (field_absent(resp, "responses"))
		return nops == 0;
	responses = container_field(resp, "responses", true);
	if (responses == NULL || (int) JsonContainerSize(responses) != nops)
		return false;

	for (i = 0; i < nops; i++)
	{
		JsonbValue *op = getIthJsonbValueFromContainer(ops, i);
		JsonbValue *r = getIthJsonbValueFromContainer(responses, i);
		int			k;

		if (op == NULL || op->type != jbvBinary ||
			r == NULL || r->type != jbvBinary)
			return false;
		for (k = 0; k < (int) lengthof(kinds); k++)
		{
			JsonbContainer *rq = container_field(op->val.binary.data,
												 kinds[k][0], false);
			JsonbContainer *rs;

			if (rq == NULL)
				continue;
			rs = container_field(r->val.binary.data, kinds[k][1], false);
			if (rs == NULL)
				return false;
			if (k == 0 && !keys_in_range(rq, rs, "kvs"))
				return false;
			if (k == 2 && !keys_in_range(rq, rs, "prev_kvs"))
				return false;
			break;
		}
	}
	return true;
}

/*
 * Does a 200 reply answer the request that was sent (and not some other
 * request on the same connection)?  Checked as far as etcd's replies carry
 * what identifies the request: the lease ID of a keepalive, the keys of a
 * range, a delete (with prev_kv) or the operations of a transaction.  A
 * revocation reply carries only a header, so anything else in it means it
 * answers another request.  Never raises an error; *why tells what did not
 * match.
 */
bool
etcd_reply_matches(const char *path, const char *request_body, Jsonb *jb,
				   const char **why)
{
	JsonbContainer *root = &jb->root;
	Jsonb	   *reqjb = NULL;
	JsonbContainer *req;

	*why = NULL;
	if (strcmp(path, "/v3/lease/revoke") == 0)
	{
		JsonbIterator *it = JsonbIteratorInit(root);
		JsonbValue	v;
		JsonbIteratorToken tok;

		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (tok == WJB_KEY &&
				!(v.val.string.len == 6 &&
				  memcmp(v.val.string.val, "header", 6) == 0))
			{
				*why = "The reply to a lease revocation carries fields of another reply.";
				return false;
			}
		}
		return true;
	}
	if (strcmp(path, "/v3/lease/keepalive") != 0 &&
		strcmp(path, "/v3/kv/range") != 0 &&
		strcmp(path, "/v3/kv/deleterange") != 0 &&
		strcmp(path, "/v3/kv/txn") != 0)
		return true;			/* nothing in the reply names the request */

	if (!etcd_parse_reply_from(request_body, strlen(request_body), NULL, NULL,
							   &reqjb, NULL))
		return true;			/* not ours to judge */
	req = &reqjb->root;

	if (strcmp(path, "/v3/lease/keepalive") == 0)
	{
		JsonbContainer *result = container_field(root, "result", false);
		int64		want = 0;
		int64		got = 0;

		(void) etcd_json_get_int64(req, "ID", &want);
		if (result == NULL)
			*why = "The keepalive reply carries no \"result\" object.";
		else if (etcd_json_get_int64(result, "ID", &got) != ETCD_FIELD_OK ||
				 got != want)
			*why = psprintf("The keepalive reply is for lease " INT64_FORMAT ", not " INT64_FORMAT ".",
							got, want);
	}
	else if (strcmp(path, "/v3/kv/range") == 0)
	{
		if (!keys_in_range(req, root, "kvs"))
			*why = "The range reply carries keys outside the range asked for.";
	}
	else if (strcmp(path, "/v3/kv/deleterange") == 0)
	{
		if (!keys_in_range(req, root, "prev_kvs"))
			*why = "The delete reply carries keys outside the range asked for.";
	}
	else if (!txn_matches(req, root))
		*why = "The transaction reply does not answer the operations sent.";

	return *why == NULL;
}

/*
 * A quiet call runs in error cleanup with interrupts held, and its budget
 * may be a full second (ETCD_CLEANUP_MS, after an error other than a
 * cancel).  A cancel or termination that arrives meanwhile cannot be
 * served until the cleanup ends, so it cuts what is left of the budget
 * down to ETCD_PENDING_RELEASE_MS, as if the cleanup had started after
 * it: an interrupt takes effect at once whatever etcd does (issue 17,
 * item 15: a termination during such a cleanup reached the client a
 * second late when a member had stopped answering).
 */
static void
quiet_deadline_for_interrupts(TimestampTz *deadline)
{
	TimestampTz cut;

	if (!(ProcDiePending || QueryCancelPending))
		return;
	cut = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									  ETCD_PENDING_RELEASE_MS);
	if (cut < *deadline)
		*deadline = cut;
}

/*
 * One exchange with the current endpoint.  Waits until the request
 * finishes or the deadline passes.  Returns the transport status; on
 * ETCD_HTTP_DONE, fills reply->http_code and the raw body.
 */
static EtcdHttpStatus
exchange(const char *path, const char *body, const char *token,
		 TimestampTz *deadline, long attempt_ms, bool quiet,
		 char **resp, int *resp_len, long *http_code, char **errtext)
{
	char	   *url = psprintf("%s%s", etcd_current_endpoint(), path);
	long		left_ms;
	long		connect_ms;
	EtcdHttpReq *volatile req = NULL;
	volatile EtcdHttpStatus st = ETCD_HTTP_RUNNING;

	if (quiet)
		quiet_deadline_for_interrupts(deadline);
	left_ms = wait_ms_until(*deadline);
	if (left_ms < 1)
		left_ms = 1;
	attempt_ms = Min(attempt_ms, left_ms);
	connect_ms = Min((long) etcd_connect_timeout_ms, attempt_ms);

	req = etcd_http_start(url, body, token, attempt_ms, connect_ms);
	if (req == NULL)
	{
		*errtext = pstrdup("could not set up the request");
		return ETCD_HTTP_FAILED;
	}

	PG_TRY();
	{
		while ((st = etcd_http_status(req)) == ETCD_HTTP_RUNNING)
		{
			long		wait_ms;

			wait_ms = wait_ms_until(*deadline);
			if (wait_ms <= 0)
				break;
			if (etcd_http_wait(wait_ms))
				continue;
			if (quiet)
				quiet_deadline_for_interrupts(deadline);
			else
				CHECK_FOR_INTERRUPTS();
		}
		if (st == ETCD_HTTP_RUNNING)
		{
			st = ETCD_HTTP_TIMED_OUT;
			*errtext = pstrdup("the call's timeout expired");
		}
		else if (st == ETCD_HTTP_DONE)
		{
			*resp = etcd_http_take_body(req, resp_len);
			*http_code = etcd_http_code(req);
		}
		else
			*errtext = (char *) etcd_hide_tls_files(etcd_http_error(req));
	}
	PG_FINALLY();
	{
		etcd_http_finish(req);
	}
	PG_END_TRY();

	return st;
}

/* What etcd_call does after an HTTP answer (call_answered) */
typedef enum CallStep
{
	CALL_SUCCEEDED,				/* a 200 reply to this request */
	CALL_FAILED,				/* return false with the reply */
	CALL_RETRY,					/* transient: per the retry policy */
	CALL_REAUTH					/* the auth token was dropped: send again */
} CallStep;

/*
 * Look at an HTTP answer to etcd_call's request and fill in *reply.  A
 * malformed reply (or one to another request) raises an error, unless
 * quiet: then the connections are dropped and *reply is cleared.
 */
static CallStep
call_answered(const char *path, const char *body, const char *endpoint,
			  char *resp, int resp_len, long http_code, bool may_reauth,
			  bool quiet, EtcdReply *reply)
{
	Jsonb	   *jb = NULL;
	const char *why = NULL;
	bool		parsed;

	parsed = etcd_parse_reply_from(resp, resp_len, path, endpoint, &jb, &why);
	if (http_code == 200 && parsed && etcd_reply_matches(path, body, jb, &why))
	{
		memset(reply, 0, sizeof(EtcdReply));
		reply->http_code = http_code;
		reply->endpoint = endpoint;
		reply->json = jb;
		return CALL_SUCCEEDED;
	}
	if (!etcd_reply_fill_error(reply, http_code, parsed ? jb : NULL,
							   endpoint) || http_code == 200)
	{
		if (why == NULL)
			why = "The error reply's \"code\" or \"message\" field has the wrong type.";
		if (quiet)
		{
			etcd_http_forget_connections();
			memset(reply, 0, sizeof(EtcdReply));
			return CALL_FAILED;
		}
		etcd_malformed_reply(path, psprintf("%s Endpoint: %s.", why, endpoint));
	}
	switch (etcd_reply_error_action(reply, may_reauth))
	{
		case ETCD_ERROR_REAUTH:
			return CALL_REAUTH;
		case ETCD_ERROR_RETRY:
			return CALL_RETRY;
		default:
			return CALL_FAILED;
	}
}

/*
 * etcd_call's attempt got no HTTP answer.  A reply too large, or a TLS
 * failure on every endpoint, is final: raised, or if quiet, true is
 * returned.  Otherwise the failure is remembered in *last_st and
 * *last_err for the final error (and an earlier error answer in *reply
 * forgotten), unless it is the call's own timeout expiring after an
 * earlier, more telling failure.
 */
static bool
call_transport_failed(const char *path, EtcdHttpStatus st, char *errtext,
					  const char *endpoint, bool quiet, EtcdRetry *retry,
					  EtcdHttpStatus *last_st, char **last_err,
					  EtcdReply *reply)
{
	if (st == ETCD_HTTP_TOO_LARGE ||
		(st == ETCD_HTTP_TLS_FAILED && etcd_retry_tls_exhausted(retry)))
	{
		/* each endpoint failed certificate checks: give up at once */
		if (quiet)
			return true;
		etcd_report_transport_error(path, st, endpoint,
									st == ETCD_HTTP_TOO_LARGE ? NULL : errtext);
	}
	if (st != ETCD_HTTP_TIMED_OUT || *last_err == NULL ||
		GetCurrentTimestamp() < retry->deadline)
	{
		*last_st = st;
		*last_err = errtext;
		reply->http_code = 0;
	}
	return false;
}

/*
 * Wait until a retry is due, serving interrupts unless quiet.
 */
static void
call_pause(TimestampTz until, bool quiet, TimestampTz *deadline)
{
	while (GetCurrentTimestamp() < until)
	{
		long		ms = (long) ((until - GetCurrentTimestamp()) / 1000);

		if (etcd_http_wait(Max(ms, 1L)))
			continue;
		if (!quiet)
			CHECK_FOR_INTERRUPTS();
		else
		{
			quiet_deadline_for_interrupts(deadline);
			if (*deadline < until)
				until = *deadline;
		}
	}
	if (!quiet)
		CHECK_FOR_INTERRUPTS();
}

/*
 * Post body to path and wait for the answer, for at most timeout_ms,
 * failing over between endpoints.
 *
 * Returns true for an HTTP 200 answer with a JSON object body, parsed into
 * reply->json.  An error answer from etcd returns false with reply filled
 * in (http_code, grpc_code, error_text), so callers can handle expected
 * errors such as "lease not found"; etcd_report_reply_error() raises it.
 *
 * Transport failures and malformed replies (including a reply that does
 * not answer this request) raise errors, unless quiet, in which case they
 * return false with reply->http_code = 0.  Quiet calls never raise errors
 * of their own, whatever the reply, and ignore interrupts; they are for
 * cleanup with interrupts held, where an error would replace the one being
 * cleaned up (or, at exit, become FATAL).
 */
bool
etcd_call(const char *path, const char *body, long timeout_ms, bool quiet,
		  EtcdReply *reply)
{
	return etcd_call_as(NULL, path, body, timeout_ms, quiet, reply);
}

/*
 * A non-quiet request made while a call's deadline is in force gets at
 * most what is left of it (see etcd_call_as): shorten *timeout_ms to that,
 * returning true when it did; raise 55P03 if nothing is left.
 */
static bool
cut_to_call_deadline(const char *what, const char *path, long *timeout_ms)
{
	long		left;

	if (call_deadline.at == 0)
		return false;
	left = wait_ms_until(call_deadline.at);
	if (left <= 0)
		etcd_call_deadline_report(what ? what : request_label(path),
								  NULL, NULL);
	if (left >= *timeout_ms)
		return false;
	*timeout_ms = left;
	return true;
}

/*
 * Raise the error of a non-quiet request whose retries ran out: 55P03 if
 * they ran out at the call's deadline (cut), not the request's; else the
 * last error answer, or the last transport failure.
 */
pg_noreturn static void
call_exhausted(const char *what, const char *path, bool cut,
			   EtcdReply *reply, EtcdHttpStatus last_st,
			   const char *last_endpoint, const char *last_err)
{
	if (cut)
		etcd_call_deadline_report(what ? what : request_label(path),
								  last_err ? last_err : "no detail",
								  last_endpoint);
	if (reply->http_code != 0 && reply->http_code != 200)
		etcd_report_reply_error(path, reply);
	etcd_report_transport_error(path, last_st, last_endpoint, last_err);
}

/*
 * etcd_call, for a request described as what (NULL: from its path) in
 * the 55P03 of a call cut by its wait_timeout.
 *
 * A non-quiet request made while a call's deadline is in force
 * (etcd_call_deadline_push) gets at most what is left of it: one that
 * etcd does not answer before it (a member that stopped answering, or
 * cannot be reached; transient errors retried until then) raises 55P03 at
 * the deadline, not 08006 or 08001 up to the request timeout later, and
 * one due after it is not sent.  Other errors are raised as they are.
 *
 * (Over 80 lines, kept whole: the retry loop, whose state (the retry
 * budget, the last failure and its endpoint, whether the token was
 * refreshed once) every branch of an attempt updates; the attempt's
 * answer and failure are judged in call_answered and
 * call_transport_failed.)
 */
bool
etcd_call_as(const char *what, const char *path, const char *body,
			 long timeout_ms, bool quiet, EtcdReply *reply)
{
	EtcdRetry	retry;
	bool		cut = false;
	long		attempt_ms;
	bool		is_auth = strcmp(path, "/v3/auth/authenticate") == 0;
	bool		refreshed = false;
	EtcdHttpStatus last_st = ETCD_HTTP_FAILED;
	char	   *last_err = NULL;
	const char *last_endpoint = NULL;
	TimestampTz retry_at;

	memset(reply, 0, sizeof(EtcdReply));
	if (!quiet)
		cut = cut_to_call_deadline(what, path, &timeout_ms);
	etcd_retry_init(&retry, timeout_ms, false);
	attempt_ms = etcd_attempt_timeout(timeout_ms, retry.n_endpoints);

	for (;;)
	{
		const char *token = NULL;
		char	   *resp = NULL;
		int			resp_len = 0;
		long		http_code = 0;
		char	   *errtext = NULL;
		EtcdHttpStatus st;

		if (!is_auth)
		{
			token = etcd_auth_token(quiet);
			if (quiet && etcd_user[0] && token == NULL)
				return false;
		}

		last_endpoint = etcd_current_endpoint();
		st = exchange(path, body, token, &retry.deadline, attempt_ms, quiet,
					  &resp, &resp_len, &http_code, &errtext);

		if (st == ETCD_HTTP_DONE)
		{
			switch (call_answered(path, body, last_endpoint, resp, resp_len,
								  http_code,
								  !is_auth && token && !refreshed, quiet,
								  reply))
			{
				case CALL_SUCCEEDED:
					reply->retried = retry.failures > 0;
					return true;
				case CALL_FAILED:
					return false;
				case CALL_REAUTH:
					/* token expired or revoked: fetch a new one, once */
					refreshed = true;
					continue;
				case CALL_RETRY:
					break;
			}
			last_st = ETCD_HTTP_FAILED;
			last_err = psprintf("HTTP %ld: %s", reply->http_code,
								reply->error_text ? reply->error_text : "no message");
		}
		else if (call_transport_failed(path, st, errtext, last_endpoint,
									   quiet, &retry, &last_st, &last_err,
									   reply))
		{
			memset(reply, 0, sizeof(EtcdReply));
			return false;
		}

		/* retry on the next endpoint while time remains */
		elog(DEBUG1, "etcd request %s to %s failed: %s", path, last_endpoint,
			 last_err ? last_err : "unknown error");
		if (!etcd_retry_next(&retry, &retry_at))
			break;
		call_pause(retry_at, quiet, &retry.deadline);
	}

	if (quiet)
	{
		memset(reply, 0, sizeof(EtcdReply));
		return false;
	}
	/*
	 * Cut to the call's deadline, the retries end when the next one would
	 * come after it, which may be well before it (endpoints that refuse
	 * at once, then a pause): a wait_timeout never fires before it passed.
	 */
	if (cut)
		call_pause(retry.deadline, false, &retry.deadline);
	call_exhausted(what, path, cut, reply, last_st, last_endpoint, last_err);
}

/*
 * The authenticate request, for run_with_cleanup: the body and the
 * password it was built from are wiped however the call ends.
 */
typedef struct AuthCall
{
	const char *password;
	StringInfoData body;		/* carries the password */
	bool		quiet;
	EtcdReply	reply;
	bool		ok;
} AuthCall;

static void
auth_call(void *arg)
{
	AuthCall   *a = (AuthCall *) arg;

	/*
	 * Room for the worst case first (escape_json writes at most 6 bytes
	 * per byte): growing the buffer would leave a copy behind in the old one.
	 */
	enlargeStringInfo(&a->body,
					  6 * (strlen(etcd_user) + strlen(a->password)) + 32);
	appendStringInfoString(&a->body, "{\"name\":");
	escape_json(&a->body, etcd_user);
	appendStringInfoString(&a->body, ",\"password\":");
	escape_json(&a->body, a->password);
	appendStringInfoChar(&a->body, '}');
	etcd_password_forget();
	a->ok = etcd_call("/v3/auth/authenticate", a->body.data,
					  etcd_request_timeout_ms, a->quiet, &a->reply);
}

static void
auth_wipe(void *arg)
{
	AuthCall   *a = (AuthCall *) arg;

	etcd_password_forget();
	explicit_bzero(a->body.data, a->body.maxlen);
}

/*
 * The auth token to send, fetching it when etcd authentication is
 * configured and none is cached.  NULL when authentication is off (or,
 * if quiet, when it could not be fetched).
 */
const char *
etcd_auth_token(bool quiet)
{
	AuthCall	a;
	EtcdReply  *reply = &a.reply;
	char	   *token;
	const char *password;

	/* the credentials changed since the token was fetched: drop it */
	if (seen_credentials_generation != etcd_credentials_generation)
	{
		seen_credentials_generation = etcd_credentials_generation;
		etcd_forget_auth_token();
	}
	if (etcd_user == NULL || etcd_user[0] == '\0')
		return NULL;
	if (auth_token)
		return auth_token;
	password = etcd_password(quiet);	/* NULL only when quiet */
	if (password == NULL)
		return NULL;

	/* wiped whatever happens: an error leaves the memory to be reused */
	a.password = password;
	initStringInfo(&a.body);
	a.quiet = quiet;
	a.ok = false;
	lockfence_run_with_cleanup(auth_call, auth_wipe, &a);
	auth_wipe(&a);
	pfree(a.body.data);

	if (!a.ok)
	{
		if (quiet)
			return NULL;
		if (reply->grpc_code == GRPC_INVALID_ARGUMENT ||
			reply->grpc_code == GRPC_FAILED_PRECONDITION ||
			reply->grpc_code == GRPC_UNAUTHENTICATED ||
			reply->grpc_code == GRPC_PERMISSION_DENIED ||
			reply->grpc_code == GRPC_NOT_FOUND)
		{
			/* the user name only for those SHOW would tell it to */
			bool		named = etcd_may_read_secret_settings();

			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PASSWORD),
					 named ?
					 errmsg("etcd authentication failed for user \"%s\"",
							etcd_user) :
					 errmsg("etcd authentication failed for the user of lockfence.etcd_user"),
					 errdetail("etcd answered: %s",
							   reply->error_text ? reply->error_text : "no message"),
					 named ? 0 :
					 errdetail_log("etcd answered: %s; user \"%s\".",
								   reply->error_text ? reply->error_text : "no message",
								   etcd_user),
					 errhint("Check lockfence.etcd_user and lockfence.etcd_password.")));
		}
		etcd_report_reply_error("authentication", reply);
	}

	(void) etcd_json_get_string(&reply->json->root, "token", &token);
	if (token == NULL || token[0] == '\0' || strpbrk(token, "\r\n") != NULL)
	{
		if (quiet)
			return NULL;
		etcd_malformed_reply("authentication",
							 "The reply carries no usable token.");
	}
	auth_token = MemoryContextStrdup(TopMemoryContext, token);
	return auth_token;
}
