/*-------------------------------------------------------------------------
 *
 * fuzz_reply.c
 *	  Fuzz harness: an etcd reply body, as etcd_call() reads it.
 *
 * The input is the body of an HTTP answer.  It goes through
 * call_answered() (etcd_client.c, included for its static functions) as
 * the answer to one of the requests lockfence sends (the paths and body
 * shapes of fuzz/capture-seeds.sh; which one follows from the input's
 * length), with HTTP status 200 and with an error status:
 * etcd_parse_reply_from (untame_reply, pg_parse_json, jsonb_in),
 * etcd_reply_matches (the request/reply pairing checks), the error-body
 * parser etcd_reply_fill_error and etcd_reply_error_action.  A reply taken
 * as a success is then read the way lockfence's callers read theirs (the
 * etcd_json_* readers, base64 keys, the auth token).  The quiet variant
 * must never raise; the loud one only "malformed reply" (08P01).
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_reply.c
 *
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"

#include "../src/etcd_client.c"

typedef struct FuzzRequest
{
	const char *path;
	const char *body;
} FuzzRequest;

static const FuzzRequest requests[] = {
	{"/v3/lease/grant", "{\"TTL\":\"30\"}"},
	{"/v3/lease/keepalive", "{\"ID\":\"7587869521853040000\"}"},
	{"/v3/lease/revoke", "{\"ID\":\"7587869521853040000\"}"},
	{"/v3/kv/range", "{\"key\":\"" FUZZ_KEY_B64 "\"}"},
	{"/v3/kv/range", "{\"key\":\"" FUZZ_PREFIX_B64 "\",\"range_end\":\"" FUZZ_PREFIX_END_B64 "\"}"},
	{"/v3/kv/range", "{\"key\":\"" FUZZ_PREFIX_B64 "\",\"range_end\":\"AA==\"}"},
	{"/v3/kv/deleterange", "{\"key\":\"" FUZZ_KEY_B64 "\",\"prev_kv\":true}"},
	{"/v3/kv/txn",
		"{\"compare\":[{\"target\":\"CREATE\",\"key\":\"" FUZZ_KEY_B64 "\",\"create_revision\":\"0\"}],"
		"\"success\":[{\"request_put\":{\"key\":\"" FUZZ_KEY_B64 "\",\"value\":\"\",\"lease\":\"7587869521853040000\"}},"
		"{\"request_range\":{\"key\":\"" FUZZ_PREFIX_B64 "\",\"range_end\":\"" FUZZ_PREFIX_END_B64 "\","
		"\"sort_target\":\"CREATE\",\"sort_order\":\"ASCEND\",\"limit\":\"1\"}}],"
		"\"failure\":[{\"request_range\":{\"key\":\"" FUZZ_KEY_B64 "\"}},"
		"{\"request_range\":{\"key\":\"" FUZZ_PREFIX_B64 "\",\"range_end\":\"" FUZZ_PREFIX_END_B64 "\","
		"\"sort_target\":\"CREATE\",\"sort_order\":\"ASCEND\",\"limit\":\"1\"}}]}"},
	{"/v3/kv/txn",
		"{\"compare\":[{\"target\":\"LEASE\",\"key\":\"" FUZZ_KEY_B64 "\",\"lease\":\"7587869521853040000\"}],"
		"\"success\":[{\"request_delete_range\":{\"key\":\"" FUZZ_KEY_B64 "\",\"prev_kv\":true}}],"
		"\"failure\":[{\"request_range\":{\"key\":\"" FUZZ_KEY_B64 "\"}}]}"},
	{"/v3/auth/authenticate", "{\"name\":\"root\",\"password\":\"secret\"}"},
	{"/v3/maintenance/status", "{}"},
};

static const long error_codes[] = {400, 401, 403, 404, 500, 503};

/* The key-value pairs of an array field, read as lockfence reads them. */
static void
read_kvs(JsonbContainer *c, const char *field)
{
	int			n = etcd_json_array_length(c, field);
	int			i;

	for (i = 0; i < n; i++)
	{
		JsonbContainer *kv = etcd_json_array_object(c, field, i);
		int64		v;
		int			len;
		char	   *key;

		key = etcd_json_bytes(kv, "key", &len);
		if (key != NULL)
			FUZZ_CHECK(len >= 0 && key[len] == '\0');
		(void) etcd_json_bytes(kv, "value", &len);
		(void) etcd_json_int64(kv, "create_revision", &v);
		(void) etcd_json_int64(kv, "mod_revision", &v);
		(void) etcd_json_int64(kv, "version", &v);
		(void) etcd_json_int64(kv, "lease", &v);
	}
}

/* A reply taken as a success, read field by field. */
static void
read_success(JsonbContainer *root)
{
	JsonbContainer *header = etcd_json_object(root, "header");
	JsonbContainer *result = etcd_json_object(root, "result");
	int64		v;
	int			n;
	int			i;
	char	   *token;

	if (header)
		(void) etcd_json_int64(header, "revision", &v);
	read_kvs(root, "kvs");
	read_kvs(root, "prev_kvs");
	(void) etcd_json_int64(root, "count", &v);
	(void) etcd_json_int64(root, "deleted", &v);
	(void) etcd_json_int64(root, "ID", &v);
	(void) etcd_json_int64(root, "TTL", &v);
	(void) etcd_json_bool(root, "succeeded");
	if (result)
	{
		(void) etcd_json_int64(result, "ID", &v);
		(void) etcd_json_int64(result, "TTL", &v);
	}
	n = etcd_json_array_length(root, "responses");
	for (i = 0; i < n; i++)
	{
		JsonbContainer *r = etcd_json_array_object(root, "responses", i);
		JsonbContainer *range = etcd_json_object(r, "response_range");
		JsonbContainer *del = etcd_json_object(r, "response_delete_range");

		(void) etcd_json_object(r, "response_put");
		if (range)
			read_kvs(range, "kvs");
		if (del)
		{
			(void) etcd_json_int64(del, "deleted", &v);
			read_kvs(del, "prev_kvs");
		}
	}
	/* etcd_auth_token's reading of the token */
	if (etcd_json_get_string(root, "token", &token) == ETCD_FIELD_OK)
		FUZZ_CHECK(token != NULL);
}

static void
one_answer(const FuzzRequest *rq, char *body, int len, long code, bool quiet)
{
	EtcdReply	reply;
	volatile CallStep step = CALL_FAILED;

	PG_TRY();
	{
		step = call_answered(rq->path, rq->body, FUZZ_ENDPOINT, body, len,
							 code, true, quiet, &reply);
		if (step == CALL_SUCCEEDED)
		{
			FUZZ_CHECK(code == 200 && reply.json != NULL);
			read_success(&reply.json->root);
		}
		else if (step != CALL_FAILED || reply.json != NULL)
			(void) etcd_reply_auth_invalid(&reply);
	}
	PG_CATCH();
	{
		FUZZ_CHECK(!quiet || step == CALL_SUCCEEDED);
		fuzz_expect_error(ERRCODE_PROTOCOL_VIOLATION);
	}
	PG_END_TRY();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const FuzzRequest *rq;
	long		code;

	if (size > ETCD_MAX_REPLY_BYTES)
		return 0;
	fuzz_begin();

	/*
	 * The request and the error status follow from the length, so that
	 * every seed meets every request as the fuzzer grows and shrinks it.
	 */
	rq = &requests[size % lengthof(requests)];
	code = error_codes[(size / lengthof(requests)) % lengthof(error_codes)];
	/* a fresh copy each time: nothing may depend on an earlier parse */
	one_answer(rq, fuzz_cstring(data, size), (int) size, 200, false);
	one_answer(rq, fuzz_cstring(data, size), (int) size, code, false);
	one_answer(rq, fuzz_cstring(data, size), (int) size, 200, true);
	fuzz_end();
	return 0;
}
