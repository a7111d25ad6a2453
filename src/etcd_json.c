/*-------------------------------------------------------------------------
 *
 * etcd_json.c
 *	  Parsing etcd's JSON replies, and base64 for keys and values.
 *
 * A reply is first scanned for what the parsers would raise errors of
 * their own for (nesting beyond ETCD_MAX_JSON_DEPTH, numbers out of
 * range), then validated with PostgreSQL's JSON lexer (pg_parse_json,
 * which reports errors as values instead of raising them), then converted
 * to jsonb, whose containers are searched for the fields we need.  Every
 * field is checked for its type: anything unexpected is a malformed reply
 * (SQLSTATE 08P01), never a crash, another error or a wrong value.
 * Parsing never raises an error, and the etcd_json_get_* readers do not
 * either, for the quiet calls of error cleanup and backend exit.  An error
 * in a field names the request whose reply holds it.
 *
 * IDENTIFICATION
 *	  src/etcd_json.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "common/base64.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"

#include "etcd.h"

/*
 * Request whose reply etcd_parse_reply() is about to read, for replies
 * parsed without an explicit name (static string).  Only consulted at
 * parse time: see reply_origin below.
 */
const char *etcd_reply_context = "a request";

/*
 * Which request each recently parsed reply answered, so that an error found
 * in any container of a reply names that reply's request, whatever was
 * parsed in between (an authentication request nested in a call, or the
 * keepalive and lock replies interleaved while waiting for a lock).  A
 * container is matched to the newest entry whose Jsonb holds it: memory of
 * an older, freed reply that a newer reply reuses is found in the newer
 * entry first.  Replies are read right after they are parsed, so a short
 * ring is enough; a container not found names "a request".
 */
#define REPLY_ORIGINS	32

typedef struct ReplyOrigin
{
	const char *start;			/* the Jsonb */
	Size		size;
	char		what[64];		/* request path */
	char		endpoint[128];	/* endpoint that answered, or "" */
} ReplyOrigin;

static ReplyOrigin origins[REPLY_ORIGINS];
static int	origins_next = 0;

static void
remember_origin(Jsonb *jb, const char *what, const char *endpoint)
{
	ReplyOrigin *o = &origins[origins_next];

	origins_next = (origins_next + 1) % REPLY_ORIGINS;
	o->start = (const char *) jb;
	o->size = VARSIZE(jb);
	strlcpy(o->what, what ? what : "a request", sizeof(o->what));
	strlcpy(o->endpoint, endpoint ? endpoint : "", sizeof(o->endpoint));
}

static const ReplyOrigin *
find_origin(const void *p)
{
	int			i;

	if (p == NULL)
		return NULL;
	for (i = 1; i <= REPLY_ORIGINS; i++)
	{
		const ReplyOrigin *o;

		o = &origins[(origins_next - i + REPLY_ORIGINS) % REPLY_ORIGINS];
		if (o->start != NULL && (const char *) p >= o->start &&
			(const char *) p < o->start + o->size)
			return o;
	}
	return NULL;
}

/*
 * Raise the error for a reply we cannot understand.  what names the
 * request; NULL means "a request".  Whatever connection brought the reply
 * is not trusted with another request: the pool is dropped first.
 */
void
etcd_malformed_reply(const char *what, const char *detail)
{
	etcd_http_forget_connections();
	ereport(ERROR,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("malformed reply from etcd to %s",
					what ? what : "a request"),
			 detail ? errdetail_internal("%s", detail) : 0));
}

/*
 * The same, for a defect found in a container of a parsed reply: names the
 * request (and endpoint) that reply answered.
 */
static void
malformed_in(const void *container, const char *detail)
{
	const ReplyOrigin *o = find_origin(container);

	if (o != NULL && o->endpoint[0] != '\0')
		etcd_malformed_reply(o->what,
							 psprintf("%s Endpoint: %s.", detail, o->endpoint));
	etcd_malformed_reply(o ? o->what : NULL, detail);
}

/*
 * A cheap scan of a reply before the JSON parser sees it, refusing what
 * would make the parser or jsonb raise an error of its own instead of
 * reporting a malformed reply: nesting deeper than ETCD_MAX_JSON_DEPTH
 * (the parsers recurse, and would fail with "stack depth limit exceeded"),
 * numbers that numeric cannot hold (more than 40 characters, or an
 * exponent of more than 3 digits), and, in a database that is not UTF-8,
 * non-ASCII \u escapes (their conversion raises an error).  Nothing that
 * etcd sends comes near these limits.  Returns NULL when the body may be
 * parsed, else why not.
 *
 * (Over 80 lines, kept whole: one scan of the bytes, a small state
 * machine over strings, escapes and numbers, whose states are clearer
 * together than spread over helpers.)
 */
static const char *
untame_reply(const char *body, int len)
{
	int			depth = 0;
	bool		utf8 = GetDatabaseEncoding() == PG_UTF8;
	int			i = 0;

	while (i < len)
	{
		char		ch = body[i];

		if (ch == '"')
		{
			/* a string: skip it, looking only at escapes */
			for (i++; i < len && body[i] != '"'; i++)
			{
				if (body[i] != '\\')
					continue;
				if (++i >= len)
					break;
				if (body[i] == 'u' && !utf8)
				{
					int			j;
					unsigned int cp = 0;

					for (j = 1; j <= 4 && i + j < len; j++)
					{
						char		h = body[i + j];

						cp <<= 4;
						if (h >= '0' && h <= '9')
							cp |= h - '0';
						else if (h >= 'a' && h <= 'f')
							cp |= h - 'a' + 10;
						else if (h >= 'A' && h <= 'F')
							cp |= h - 'A' + 10;
						else
							return NULL;	/* the lexer refuses it */
					}
					if (cp > 0x7f)
						return "The reply holds a non-ASCII \\u escape, which the database encoding cannot take.";
				}
			}
			i++;
		}
		else if (ch == '{' || ch == '[')
		{
			if (++depth > ETCD_MAX_JSON_DEPTH)
				return psprintf("The reply nests more than %d levels deep.",
								ETCD_MAX_JSON_DEPTH);
			i++;
		}
		else if (ch == '}' || ch == ']')
		{
			depth--;
			i++;
		}
		else if (ch == '-' || (ch >= '0' && ch <= '9'))
		{
			int			start = i;
			int			exp_digits = -1;	/* -1: no exponent */

			for (; i < len; i++)
			{
				char		c = body[i];

				if (c == 'e' || c == 'E')
					exp_digits = 0;
				else if (c >= '0' && c <= '9')
				{
					if (exp_digits >= 0)
						exp_digits++;
				}
				else if (c != '-' && c != '+' && c != '.')
					break;
			}
			if (i - start > 40 || exp_digits > 3)
				return "The reply holds a number out of range.";
		}
		else
			i++;
	}
	return NULL;
}

/*
 * Parse a reply body into jsonb, remembering which request (what) and
 * endpoint it answered, for error messages (what NULL: remember nothing).  Returns false (without
 * raising an error, whatever the body) when the body is not a valid JSON
 * object in the database encoding, or nests or counts beyond what
 * untame_reply() allows; *why (if not NULL) then says why.
 */
bool
etcd_parse_reply_from(const char *body, int len, const char *what,
					  const char *endpoint, Jsonb **result, const char **why)
{
	JsonLexContext *lex;
	char	   *copy;
	const char *bad;
	Jsonb	   *jb;

	if (why)
		*why = "The reply is not a JSON object.";
	if (len <= 0 || (int) strlen(body) != len)
		return false;			/* empty, or a NUL byte inside */
	if (!pg_verifymbstr(body, len, true))
		return false;
	if ((bad = untame_reply(body, len)) != NULL)
	{
		if (why)
			*why = bad;
		return false;
	}

	copy = pnstrdup(body, len);
	/* need_escapes: rejects \u0000 and escapes the encoding cannot hold */
	lex = lf_make_json_lex_context(copy, len, GetDatabaseEncoding(), true);
	if (pg_parse_json(lex, &nullSemAction) != JSON_SUCCESS)
		return false;

	/*
	 * Valid, and within untame_reply()'s limits: jsonb_in cannot refuse
	 * it.  (It is deliberately not wrapped in PG_TRY: quiet calls run in
	 * error cleanup, where catching and flushing an error would discard
	 * the one being handled.)
	 */
	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(copy)));
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return false;
	if (what != NULL)
		remember_origin(jb, what, endpoint);
	*result = jb;
	return true;
}

/*
 * etcd_parse_reply_from() for the request named in etcd_reply_context.
 */
bool
etcd_parse_reply(const char *body, int len, Jsonb **result)
{
	return etcd_parse_reply_from(body, len, etcd_reply_context, NULL,
								 result, NULL);
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
		malformed_in(c, psprintf("Field \"%s\" is not an object.", key));
	return v->val.binary.data;
}

/*
 * An int64 field, which etcd sends as a JSON string (or, from other
 * implementations, a number), without raising an error: ETCD_FIELD_ABSENT
 * when absent or null (how etcd sends zero), ETCD_FIELD_BAD when it is
 * not an integer, else ETCD_FIELD_OK with *value set.
 */
EtcdFieldStatus
etcd_json_get_int64(JsonbContainer *c, const char *key, int64 *value)
{
	JsonbValue *v = member(c, key);
	char	   *s;
	char	   *end;
	int64		n;

	if (v == NULL || v->type == jbvNull)
		return ETCD_FIELD_ABSENT;
	if (v->type == jbvString)
		s = pnstrdup(v->val.string.val, v->val.string.len);
	else if (v->type == jbvNumeric)
		s = DatumGetCString(DirectFunctionCall1(numeric_out,
												NumericGetDatum(v->val.numeric)));
	else
		return ETCD_FIELD_BAD;

	if (s[0] == '\0' || isspace((unsigned char) s[0]))
		return ETCD_FIELD_BAD;
	errno = 0;
	n = strtoi64(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return ETCD_FIELD_BAD;
	*value = n;
	return ETCD_FIELD_OK;
}

/*
 * An int64 field; false when absent, which is how etcd sends zero.
 * Anything else is a malformed reply.
 */
bool
etcd_json_int64(JsonbContainer *c, const char *key, int64 *value)
{
	switch (etcd_json_get_int64(c, key, value))
	{
		case ETCD_FIELD_ABSENT:
			return false;
		case ETCD_FIELD_OK:
			return true;
		case ETCD_FIELD_BAD:
			break;
	}
	malformed_in(c, psprintf("Field \"%s\" is not an integer.", key));
	return false;				/* not reached */
}

/*
 * A boolean field; false when absent or null, which is how etcd sends
 * false.  Anything else is a malformed reply.
 */
bool
etcd_json_bool(JsonbContainer *c, const char *key)
{
	JsonbValue *v = member(c, key);

	if (v == NULL || v->type == jbvNull)
		return false;
	if (v->type != jbvBool)
		malformed_in(c, psprintf("Field \"%s\" is not a boolean.", key));
	return v->val.boolean;
}

/*
 * A string field, palloc'd in *value, without raising an error.
 */
EtcdFieldStatus
etcd_json_get_string(JsonbContainer *c, const char *key, char **value)
{
	JsonbValue *v = member(c, key);

	*value = NULL;
	if (v == NULL || v->type == jbvNull)
		return ETCD_FIELD_ABSENT;
	if (v->type != jbvString)
		return ETCD_FIELD_BAD;
	*value = pnstrdup(v->val.string.val, v->val.string.len);
	return ETCD_FIELD_OK;
}

/*
 * A string field, palloc'd, or NULL when absent.
 */
char *
etcd_json_string(JsonbContainer *c, const char *key)
{
	char	   *s;

	if (etcd_json_get_string(c, key, &s) == ETCD_FIELD_BAD)
		malformed_in(c, psprintf("Field \"%s\" is not a string.", key));
	return s;
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
		malformed_in(c, psprintf("Field \"%s\" is not an array.", key));
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
		malformed_in(c, psprintf("Field \"%s\" is not an array.", key));
	elem = getIthJsonbValueFromContainer(v->val.binary.data, i);
	if (elem == NULL || elem->type != jbvBinary ||
		!JsonContainerIsObject(elem->val.binary.data))
		malformed_in(c, psprintf("Element %d of \"%s\" is not an object.",
								 i, key));
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
		malformed_in(c, psprintf("Field \"%s\" is not valid base64.", key));
	return out;
}
