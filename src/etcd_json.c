/*-------------------------------------------------------------------------
 *
 * etcd_json.c
 *	  Parsing etcd's JSON replies, and base64 for keys and values.
 *
 * A reply is first validated with PostgreSQL's JSON lexer (pg_parse_json,
 * which reports errors as values instead of raising them), then converted
 * to jsonb, whose containers are searched for the fields we need.  Every
 * field is checked for its type: anything unexpected is a malformed reply
 * (SQLSTATE 08P01), never a crash or a wrong value.
 *
 * IDENTIFICATION
 *	  src/etcd_json.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/base64.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"

#include "etcd.h"

/* Request whose reply is being read, for error messages (static string). */
const char *etcd_reply_context = "a request";

/*
 * Raise the error for a reply we cannot understand.  what names the
 * request; NULL means the one in etcd_reply_context.
 */
void
etcd_malformed_reply(const char *what, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("malformed reply from etcd to %s",
					what ? what : etcd_reply_context),
			 detail ? errdetail_internal("%s", detail) : 0));
}

/*
 * Parse a reply body into jsonb.  Returns false (without raising an error)
 * when the body is not a valid JSON object in the database encoding.
 */
bool
etcd_parse_reply(const char *body, int len, Jsonb **result)
{
	JsonLexContext *lex;
	char	   *copy;
	Datum		d;
	Jsonb	   *jb;

	if (len <= 0 || (int) strlen(body) != len)
		return false;			/* empty, or a NUL byte inside */
	if (!pg_verifymbstr(body, len, true))
		return false;

	copy = pnstrdup(body, len);
	/* need_escapes: rejects \u0000 and escapes the encoding cannot hold */
	lex = lf_make_json_lex_context(copy, len, GetDatabaseEncoding(), true);
	if (pg_parse_json(lex, &nullSemAction) != JSON_SUCCESS)
		return false;

	/*
	 * Valid JSON can still be refused by jsonb (a number beyond numeric's
	 * range, nesting beyond the stack limit).  Such a reply is malformed
	 * like any other, and callers that must not raise (cleanup at exit)
	 * rely on that.  Only these errors are caught: jsonb_in holds no
	 * resources, and anything else (a cancel, say) goes on up.
	 */
	{
		MemoryContext oldcxt = CurrentMemoryContext;
		volatile Datum parsed = (Datum) 0;
		bool		refused = false;

		PG_TRY();
		{
			parsed = DirectFunctionCall1(jsonb_in, CStringGetDatum(copy));
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(oldcxt);
			edata = CopyErrorData();
			if (ERRCODE_TO_CATEGORY(edata->sqlerrcode) != ERRCODE_DATA_EXCEPTION &&
				edata->sqlerrcode != ERRCODE_STATEMENT_TOO_COMPLEX &&
				edata->sqlerrcode != ERRCODE_PROGRAM_LIMIT_EXCEEDED)
				PG_RE_THROW();
			FlushErrorState();
			FreeErrorData(edata);
			refused = true;
		}
		PG_END_TRY();
		if (refused)
			return false;
		d = parsed;
	}
	jb = DatumGetJsonbP(d);
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return false;
	*result = jb;
	return true;
}

/*
 * Look up a member of an object; NULL when absent.
 */
static JsonbValue *
member(JsonbContainer *c, const char *key)
{
	if (c == NULL || !JsonContainerIsObject(c))
		return NULL;
	return getKeyJsonValueFromContainer(c, key, strlen(key), NULL);
}

/*
 * The object stored under key, or NULL when absent.  A member of another
 * type is a malformed reply.
 */
JsonbContainer *
etcd_json_object(JsonbContainer *c, const char *key)
{
	JsonbValue *v = member(c, key);

	if (v == NULL || v->type == jbvNull)
		return NULL;
	if (v->type != jbvBinary || !JsonContainerIsObject(v->val.binary.data))
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an object.", key));
	return v->val.binary.data;
}

/*
 * An int64 field, which etcd sends as a JSON string (or, from other
 * implementations, a number).  Returns false when the field is absent,
 * which is how etcd sends zero.  Anything else is a malformed reply.
 */
bool
etcd_json_int64(JsonbContainer *c, const char *key, int64 *value)
{
	JsonbValue *v = member(c, key);
	char	   *s;
	char	   *end;

	if (v == NULL || v->type == jbvNull)
		return false;
	if (v->type == jbvString)
		s = pnstrdup(v->val.string.val, v->val.string.len);
	else if (v->type == jbvNumeric)
		s = DatumGetCString(DirectFunctionCall1(numeric_out,
												NumericGetDatum(v->val.numeric)));
	else
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an integer.", key));

	errno = 0;
	if (s[0] == '\0' || s[0] == ' ')
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an integer.", key));
	*value = strtoi64(s, &end, 10);
	if (errno != 0 || *end != '\0')
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an integer.", key));
	return true;
}

/*
 * A string field, palloc'd, or NULL when absent.
 */
char *
etcd_json_string(JsonbContainer *c, const char *key)
{
	JsonbValue *v = member(c, key);

	if (v == NULL || v->type == jbvNull)
		return NULL;
	if (v->type != jbvString)
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not a string.", key));
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/*
 * Length of an array field; 0 when absent.
 */
int
etcd_json_array_length(JsonbContainer *c, const char *key)
{
	JsonbValue *v = member(c, key);

	if (v == NULL || v->type == jbvNull)
		return 0;
	if (v->type != jbvBinary || !JsonContainerIsArray(v->val.binary.data))
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an array.", key));
	return JsonContainerSize(v->val.binary.data);
}

/*
 * The i'th element of an array field, which must be an object.
 */
JsonbContainer *
etcd_json_array_object(JsonbContainer *c, const char *key, int i)
{
	JsonbValue *v = member(c, key);
	JsonbValue *elem;

	if (v == NULL || v->type != jbvBinary ||
		!JsonContainerIsArray(v->val.binary.data))
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not an array.", key));
	elem = getIthJsonbValueFromContainer(v->val.binary.data, i);
	if (elem == NULL || elem->type != jbvBinary ||
		!JsonContainerIsObject(elem->val.binary.data))
		etcd_malformed_reply(NULL,
							 psprintf("Element %d of \"%s\" is not an object.", i, key));
	return elem->val.binary.data;
}

/*
 * Base64-encode bytes, palloc'd and NUL-terminated.
 */
char *
etcd_b64_encode(const char *data, int len)
{
	int			cap = pg_b64_enc_len(len) + 1;
	char	   *out = palloc(cap);
	int			n;

	n = lf_b64_encode(data, len, out, cap);
	if (n < 0)
		elog(ERROR, "could not encode base64");
	out[n] = '\0';
	return out;
}

/*
 * Base64-decode a string, palloc'd and NUL-terminated; NULL if invalid.
 */
char *
etcd_b64_decode(const char *b64, int *len)
{
	int			inlen = strlen(b64);
	int			cap = pg_b64_dec_len(inlen) + 1;
	char	   *out = palloc(cap);
	int			n;

	n = lf_b64_decode(b64, inlen, out, cap);
	if (n < 0)
		return NULL;
	out[n] = '\0';
	*len = n;
	return out;
}

/*
 * A base64 bytes field, decoded; NULL when absent.  Invalid base64 is a
 * malformed reply.
 */
char *
etcd_json_bytes(JsonbContainer *c, const char *key, int *len)
{
	char	   *s = etcd_json_string(c, key);
	char	   *out;

	if (s == NULL)
		return NULL;
	out = etcd_b64_decode(s, len);
	if (out == NULL)
		etcd_malformed_reply(NULL,
							 psprintf("Field \"%s\" is not valid base64.", key));
	return out;
}
