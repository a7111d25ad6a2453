/*-------------------------------------------------------------------------
 *
 * etcd_client.c
 *	  One etcd RPC over the JSON gateway: failover, authentication and the
 *	  mapping of failures to SQLSTATEs.
 *
 * etcd_call() posts a JSON body to the current endpoint.  A connection
 * failure, a timed-out attempt, or an answer that only lasts as long as
 * a leader election ("no leader", "request timed out", "leader changed":
 * HTTP 503 / gRPC code 14, or HTTP 500 / code 2 with those messages) move
 * on to the next endpoint and retry, until the call's own timeout is
 * spent.  Each attempt gets a share of that timeout, so a hung member
 * cannot use all of it when others are listed.  A TLS certificate failure
 * is permanent: the call fails as soon as every endpoint refused once.  When etcd authentication
 * is configured, the token from /v3/auth/authenticate is cached and sent
 * raw in the Authorization header, and fetched again once when etcd says
 * it is no longer valid.  The password is only ever put in the body of
 * the authenticate request, never in a message.
 *
 * IDENTIFICATION
 *	  src/etcd_client.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "etcd.h"

/* gRPC status codes etcd reports */
#define GRPC_INVALID_ARGUMENT	3
#define GRPC_DEADLINE_EXCEEDED	4
#define GRPC_NOT_FOUND			5
#define GRPC_PERMISSION_DENIED	7
#define GRPC_FAILED_PRECONDITION 9
#define GRPC_UNAVAILABLE		14
#define GRPC_UNAUTHENTICATED	16

/* Pause after every endpoint failed once, before trying them again. */
#define ETCD_RETRY_PAUSE_MS		200

/* Parsed copy of lockfence.etcd_endpoints, in TopMemoryContext. */
static char *parsed_from = NULL;
static char **endpoints = NULL;
static int	n_endpoints = 0;
static int	cur_endpoint = 0;

/* Cached etcd auth token, in TopMemoryContext. */
static char *auth_token = NULL;

static void parse_endpoints(void);

/*
 * (Re)parse the endpoint list when the setting changed.
 */
static void
parse_endpoints(void)
{
	MemoryContext old;
	char	   *copy;
	char	   *tok;
	char	   *save;
	int			i;

	if (parsed_from && strcmp(parsed_from, etcd_endpoints) == 0)
		return;

	if (parsed_from)
	{
		for (i = 0; i < n_endpoints; i++)
			pfree(endpoints[i]);
		pfree(endpoints);
		pfree(parsed_from);
		parsed_from = NULL;
	}

	old = MemoryContextSwitchTo(TopMemoryContext);
	copy = pstrdup(etcd_endpoints);
	endpoints = palloc(sizeof(char *) * (strlen(copy) / 2 + 1));
	n_endpoints = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
	{
		char	   *p;

		while (*tok == ' ')
			tok++;
		for (p = tok + strlen(tok); p > tok && (p[-1] == ' ' || p[-1] == '/'); p--)
			p[-1] = '\0';
		if (*tok)
			endpoints[n_endpoints++] = pstrdup(tok);
	}
	pfree(copy);
	parsed_from = pstrdup(etcd_endpoints);
	MemoryContextSwitchTo(old);

	if (n_endpoints == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lockfence.etcd_endpoints lists no endpoint")));
	cur_endpoint = 0;
}

/*
 * Number of configured endpoints.
 */
int
etcd_endpoint_count(void)
{
	parse_endpoints();
	return n_endpoints;
}

/*
 * The endpoint requests currently go to.
 */
const char *
etcd_current_endpoint(void)
{
	parse_endpoints();
	return endpoints[cur_endpoint % n_endpoints];
}

/*
 * Move on to the next endpoint (after a failure).
 */
void
etcd_next_endpoint(void)
{
	parse_endpoints();
	cur_endpoint = (cur_endpoint + 1) % n_endpoints;
}

/*
 * Forget the cached auth token (credentials changed, or etcd rejected it).
 */
void
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
 * etcd's messages for failures that last only as long as a leader election
 * or an overload.  etcd reports some of them as HTTP 500, gRPC code 2 (the
 * lock service wraps every error that way), so the text is what tells them
 * from permanent errors.
 */
static const char *const transient_texts[] = {
	"etcdserver: request timed out",
	"etcdserver: leader changed",
	"etcdserver: no leader",
	"etcdserver: too many requests",
	"etcdserver: server stopped",
	"etcdserver: timed out waiting for read index response",
	NULL
};

/*
 * Is this answer one after which another endpoint should be tried?  HTTP
 * 503 / gRPC code 14, or one of etcd's election and overload messages
 * whatever the code.
 */
bool
etcd_transient_failure(long http_code, int grpc_code, const char *error_text)
{
	int			i;

	if (http_code == 503 || grpc_code == GRPC_UNAVAILABLE)
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
long
etcd_attempt_timeout(long timeout_ms, int n_endpoints)
{
	if (n_endpoints <= 1)
		return timeout_ms;
	return Max(timeout_ms / n_endpoints, Min(timeout_ms / 2, 3000L));
}

/*
 * Raise the error for a request that got no usable HTTP answer.
 */
void
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
bool
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
									reply->error_text) ||
			 reply->grpc_code == GRPC_DEADLINE_EXCEEDED)
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
 * Fill in grpc_code and error_text from an error reply's JSON, if any.
 */
static void
read_error_fields(EtcdReply *reply)
{
	JsonbContainer *root;
	int64		code = 0;

	if (reply->json == NULL)
		return;
	root = &reply->json->root;
	if (etcd_json_int64(root, "code", &code))
		reply->grpc_code = (int) code;
	reply->error_text = etcd_json_string(root, "message");
	if (reply->error_text == NULL)
		reply->error_text = etcd_json_string(root, "error");
}

/*
 * One exchange with the current endpoint.  Waits until the request
 * finishes or the deadline passes.  Returns the transport status; on
 * ETCD_HTTP_DONE, fills reply->http_code and the raw body.
 */
static EtcdHttpStatus
exchange(const char *path, const char *body, const char *token,
		 TimestampTz deadline, long attempt_ms, bool quiet,
		 char **resp, int *resp_len, long *http_code, char **errtext)
{
	char	   *url = psprintf("%s%s", etcd_current_endpoint(), path);
	long		left_ms;
	long		connect_ms;
	EtcdHttpReq *volatile req = NULL;
	volatile EtcdHttpStatus st = ETCD_HTTP_RUNNING;

	left_ms = (long) ((deadline - GetCurrentTimestamp()) / 1000);
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

			wait_ms = (long) ((deadline - GetCurrentTimestamp()) / 1000);
			if (wait_ms <= 0)
				break;
			if (!etcd_http_wait(wait_ms) && !quiet)
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
			*errtext = (char *) etcd_http_error(req);
	}
	PG_FINALLY();
	{
		etcd_http_finish(req);
	}
	PG_END_TRY();

	return st;
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
 * Transport failures and malformed replies raise errors, unless quiet,
 * in which case they return false with reply->http_code = 0.  Quiet calls
 * never raise errors of their own and ignore interrupts; they are for
 * cleanup with interrupts held.
 */
bool
etcd_call(const char *path, const char *body, long timeout_ms, bool quiet,
		  EtcdReply *reply)
{
	TimestampTz deadline;
	long		attempt_ms;
	bool		is_auth = strcmp(path, "/v3/auth/authenticate") == 0;
	bool		refreshed = false;
	EtcdHttpStatus last_st = ETCD_HTTP_FAILED;
	char	   *last_err = NULL;
	const char *last_endpoint = NULL;
	int			failures = 0;
	int			tls_failures = 0;
	int			n;

	memset(reply, 0, sizeof(EtcdReply));
	etcd_reply_context = path;
	n = etcd_endpoint_count();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	attempt_ms = etcd_attempt_timeout(timeout_ms, n);

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
		st = exchange(path, body, token, deadline, attempt_ms, quiet,
					  &resp, &resp_len, &http_code, &errtext);

		if (st == ETCD_HTTP_DONE)
		{
			Jsonb	   *jb = NULL;
			bool		parsed = etcd_parse_reply(resp, resp_len, &jb);

			reply->http_code = http_code;
			reply->endpoint = last_endpoint;
			reply->json = parsed ? jb : NULL;

			if (http_code == 200 && parsed)
				return true;
			if (http_code == 200)
			{
				if (quiet)
				{
					reply->http_code = 0;
					return false;
				}
				etcd_malformed_reply(path,
									 psprintf("The reply from %s is not a JSON object.",
											  last_endpoint));
			}

			read_error_fields(reply);

			if (!is_auth && token && !refreshed &&
				etcd_reply_auth_invalid(reply))
			{
				/* token expired or revoked: fetch a new one, once */
				elog(DEBUG1, "etcd rejected the auth token (%s); authenticating again",
					 reply->error_text ? reply->error_text : "no message");
				etcd_forget_auth_token();
				refreshed = true;
				continue;
			}
			if (!etcd_transient_failure(reply->http_code, reply->grpc_code,
										reply->error_text))
				return false;

			last_st = ETCD_HTTP_FAILED;
			last_err = psprintf("HTTP %ld: %s", reply->http_code,
								reply->error_text ? reply->error_text : "no message");
		}
		else if (st == ETCD_HTTP_TOO_LARGE)
		{
			if (quiet)
				return false;
			etcd_report_transport_error(path, st, last_endpoint, NULL);
		}
		else if (st == ETCD_HTTP_TLS_FAILED && ++tls_failures >= n)
		{
			/* each endpoint failed certificate checks: give up at once */
			if (quiet)
			{
				memset(reply, 0, sizeof(EtcdReply));
				return false;
			}
			etcd_report_transport_error(path, st, last_endpoint, errtext);
		}
		else if (st != ETCD_HTTP_TIMED_OUT || last_err == NULL ||
				 GetCurrentTimestamp() < deadline)
		{
			last_st = st;
			last_err = errtext;
			reply->http_code = 0;
		}

		/* retry on the next endpoint while time remains */
		elog(DEBUG1, "etcd request %s to %s failed: %s", path, last_endpoint,
			 last_err ? last_err : "unknown error");
		etcd_next_endpoint();
		if (GetCurrentTimestamp() >= deadline)
			break;
		if (++failures % n == 0)
		{
			/* every endpoint failed: pause before the next round */
			TimestampTz pause_end;

			pause_end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													ETCD_RETRY_PAUSE_MS);
			if (pause_end > deadline)
				break;
			while (GetCurrentTimestamp() < pause_end)
			{
				long		ms;

				ms = (long) ((pause_end - GetCurrentTimestamp()) / 1000);
				if (!etcd_http_wait(Max(ms, 1L)) && !quiet)
					CHECK_FOR_INTERRUPTS();
			}
		}
		else if (!quiet)
			CHECK_FOR_INTERRUPTS();
	}

	if (quiet)
	{
		memset(reply, 0, sizeof(EtcdReply));
		return false;
	}
	if (reply->http_code != 0 && reply->http_code != 200)
		etcd_report_reply_error(path, reply);
	etcd_report_transport_error(path, last_st, last_endpoint, last_err);
	return false;				/* not reached */
}

/*
 * The auth token to send, fetching it when etcd authentication is
 * configured and none is cached.  NULL when authentication is off (or,
 * if quiet, when it could not be fetched).
 */
const char *
etcd_auth_token(bool quiet)
{
	StringInfoData body;
	EtcdReply	reply;
	char	   *token;
	bool		ok;
	const char *password;

	if (etcd_user == NULL || etcd_user[0] == '\0')
		return NULL;
	if (auth_token)
		return auth_token;
	password = etcd_password(quiet);	/* NULL only when quiet */
	if (password == NULL)
		return NULL;

	initStringInfo(&body);
	appendStringInfoString(&body, "{\"name\":");
	escape_json(&body, etcd_user);
	appendStringInfoString(&body, ",\"password\":");
	escape_json(&body, password);
	appendStringInfoChar(&body, '}');

	ok = etcd_call("/v3/auth/authenticate", body.data,
				   etcd_request_timeout_ms, quiet, &reply);
	explicit_bzero(body.data, body.len);
	pfree(body.data);

	if (!ok)
	{
		if (quiet)
			return NULL;
		if (reply.grpc_code == GRPC_INVALID_ARGUMENT ||
			reply.grpc_code == GRPC_FAILED_PRECONDITION ||
			reply.grpc_code == GRPC_UNAUTHENTICATED ||
			reply.grpc_code == GRPC_PERMISSION_DENIED ||
			reply.grpc_code == GRPC_NOT_FOUND)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PASSWORD),
					 errmsg("etcd authentication failed for user \"%s\"",
							etcd_user),
					 errdetail("etcd answered: %s",
							   reply.error_text ? reply.error_text : "no message"),
					 errhint("Check lockfence.etcd_user and lockfence.etcd_password.")));
		etcd_report_reply_error("authentication", &reply);
	}

	token = etcd_json_string(&reply.json->root, "token");
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
