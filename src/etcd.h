/*-------------------------------------------------------------------------
 *
 * etcd.h
 *	  Declarations shared by the etcd modules of the lockfence extension.
 *
 * The etcd support is split by responsibility:
 *	etcd_guc.c		configuration parameters
 *	etcd_http.c		libcurl transport: curl multi driven by a WaitEventSet
 *	etcd_curl_memory.c	libcurl's memory functions, which wipe what is freed
 *	etcd_client.c	one etcd RPC: failover, authentication, error mapping
 *	etcd_json.c		reply parsing (PostgreSQL's JSON parser) and base64
 *	etcd_lease.c	lease RPCs: grant, keepalive, revoke (network calls only)
 *	etcd_session.c	session leases (one per TTL) and the locks held on them;
 *					transaction-scoped release; revocation at exit; wraps
 *					the lease RPCs that change what it tracks
 *	etcd_commit_check.c	the commit-time lock check (its own xact callback)
 *	etcd_lock.c		the lock protocol (queue, unlock)
 *	etcd_lock_key.c	the form of a lock key "<name>/<lease hex>"
 *	etcd_lock_wait.c	waiting for the predecessor with a synced watch
 *	etcd_lock_many.c	several locks taken by one call, all or nothing
 *	etcd_sql.c		the SQL-callable functions lockfence.etcd_*
 *
 * Everything declared here is internal to the library: with GCC and
 * Clang it gets hidden visibility, so the shared object exports only
 * _PG_init, the magic block and the SQL-callable functions (declared by
 * PG_FUNCTION_INFO_V1 outside this header), whatever the PostgreSQL
 * major's default visibility.
 *
 * IDENTIFICATION
 *	  src/etcd.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_ETCD_H
#define LOCKFENCE_ETCD_H

#include "postgres.h"

#include "compat.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

/* Largest reply body accepted from etcd, in bytes. */
#define ETCD_MAX_REPLY_BYTES	(1024 * 1024)

/* Deepest nesting of objects and arrays accepted in a reply. */
#define ETCD_MAX_JSON_DEPTH		64

/* Longest lock name accepted, in bytes. */
#define ETCD_MAX_NAME_BYTES		1024

/* gRPC status codes etcd reports (the "code" of an error reply) */
#define GRPC_CANCELED			1
#define GRPC_INVALID_ARGUMENT	3
#define GRPC_DEADLINE_EXCEEDED	4
#define GRPC_NOT_FOUND			5
#define GRPC_PERMISSION_DENIED	7
#define GRPC_FAILED_PRECONDITION 9
#define GRPC_UNAVAILABLE		14
#define GRPC_UNAUTHENTICATED	16

/* Pause after every endpoint failed once, before trying them again. */
#define ETCD_RETRY_PAUSE_MS		200

/* Time allowed for revoking our lease after a failed acquisition. */
#define ETCD_CLEANUP_MS			1000

/*
 * Time allowed for revoking a lease quietly after a cancel, a termination
 * or an abort: short, so that the interrupt takes effect at once whatever
 * etcd does.  A lease that is not revoked in time is revoked at exit, or
 * expires with its TTL.
 */
#define ETCD_PENDING_RELEASE_MS	50

/*
 * A session lease is renewed every third of its TTL, as etcd's
 * concurrency.Session keeps its lease alive: while a call waits, and by a
 * lock call that finds the last renewal that old.  (The 200 ms floor only
 * guards the arithmetic: a TTL is at least 1 s.)
 */
static inline long
etcd_renewal_interval_ms(int ttl)
{
	return Max(200L, (long) ttl * 1000 / 3);
}

/* etcd_guc.c */

/*
 * lockfence.etcd_endpoints, parsed once by its check hook (the GUC's extra
 * data): count URLs without trailing slashes.
 */
typedef struct EtcdEndpointList
{
	int			count;
	const char *url[FLEXIBLE_ARRAY_MEMBER];
} EtcdEndpointList;

/* lockfence.etcd_check_at_commit */
typedef enum EtcdCheckAtCommit
{
	ETCD_CHECK_OFF,
	ETCD_CHECK_LOCK_AND_FENCE,
	ETCD_CHECK_ALL_FENCED
} EtcdCheckAtCommit;

extern int	etcd_check_at_commit;
extern const EtcdEndpointList *etcd_endpoint_list;
extern int	etcd_connect_timeout_ms;
extern int	etcd_request_timeout_ms;
extern char *etcd_cafile;
extern char *etcd_certfile;
extern char *etcd_keyfile;
extern char *etcd_user;
extern const char *etcd_password(bool quiet);
extern void etcd_password_forget(void);
extern uint64 etcd_endpoints_generation;
extern uint64 etcd_credentials_generation;
extern void etcd_guc_init(void);

/* etcd_http.c: one HTTP exchange, driven by the backend's wait loop */
typedef struct EtcdHttpReq EtcdHttpReq;

typedef enum EtcdHttpStatus
{
	ETCD_HTTP_RUNNING,			/* not finished yet */
	ETCD_HTTP_DONE,				/* a complete HTTP reply arrived */
	ETCD_HTTP_CONNECT_FAILED,	/* no connection could be made */
	ETCD_HTTP_TLS_FAILED,		/* permanent TLS failure (certificates) */
	ETCD_HTTP_TIMED_OUT,		/* the attempt's own timeout expired */
	ETCD_HTTP_TOO_LARGE,		/* reply exceeded ETCD_MAX_REPLY_BYTES */
	ETCD_HTTP_FAILED			/* any other transport failure */
} EtcdHttpStatus;

/* etcd_curl_memory.c */
extern bool etcd_curl_global_init(void);

extern EtcdHttpReq *etcd_http_start(const char *url, const char *body,
									const char *auth_token,
									long timeout_ms, long connect_timeout_ms);
extern EtcdHttpStatus etcd_http_status(EtcdHttpReq *req);
extern long etcd_http_code(EtcdHttpReq *req);
extern const char *etcd_http_error(EtcdHttpReq *req);
extern char *etcd_http_take_body(EtcdHttpReq *req, int *len);
extern const char *etcd_http_peek_body(EtcdHttpReq *req, size_t *len);
extern const char *etcd_http_request_body(EtcdHttpReq *req);
extern void etcd_http_finish(EtcdHttpReq *req);
extern bool etcd_http_wait(long max_wait_ms);
extern void etcd_http_abort_all(void);
extern void etcd_http_forget_connections(void);

/* etcd_client.c: one RPC with failover and authentication */
typedef struct EtcdReply
{
	long		http_code;		/* HTTP status of the final answer */
	int			grpc_code;		/* "code" of an error reply, else 0 */
	char	   *error_text;		/* etcd's error message, else NULL */
	Jsonb	   *json;			/* parsed reply body */
	const char *endpoint;		/* endpoint that answered */
	bool		retried;		/* an earlier attempt failed: it may have
								 * been applied, its answer lost */
} EtcdReply;

/*
 * The retry policy shared by every request: after a failure, move to the
 * next endpoint at once, pausing ETCD_RETRY_PAUSE_MS after each full round
 * of failed endpoints, until the deadline.
 */
typedef struct EtcdRetry
{
	int			n_endpoints;
	int			failures;		/* failed attempts in a row */
	int			tls_failures;	/* of which TLS certificate failures */
	long		window_ms;		/* retry for this long ... */
	TimestampTz deadline;		/* ... until this; 0: from the first failure */
} EtcdRetry;

/* What to do after an error answer (etcd_reply_error_action) */
typedef enum EtcdErrorAction
{
	ETCD_ERROR_FINAL,			/* report it */
	ETCD_ERROR_RETRY,			/* transient: retry per the policy */
	ETCD_ERROR_REAUTH			/* the auth token was dropped: send again */
} EtcdErrorAction;

/* A waiting call's deadline (etcd_call_deadline_push) */
typedef struct EtcdCallDeadline
{
	TimestampTz at;				/* 0: none */
	const char *lock_name;		/* for the 55P03 */
	const char *own_key;		/* this session's own key on lock_name, once
								 * known: the 55P03 then names it */
} EtcdCallDeadline;

extern void etcd_call_deadline_push(TimestampTz deadline,
									const char *lock_name,
									EtcdCallDeadline *saved);
extern void etcd_call_deadline_pop(const EtcdCallDeadline *saved);
extern TimestampTz etcd_call_deadline(void);
extern void etcd_call_deadline_own_key(const char *key);
pg_noreturn extern void etcd_report_own_lock_timeout(const char *lock_name,
													 const char *own_key);
pg_noreturn extern void etcd_call_deadline_report(const char *what,
												  const char *failure,
												  const char *endpoint);
extern int	etcd_endpoint_count(void);
extern const char *etcd_current_endpoint(void);
extern void etcd_next_endpoint(void);
extern void etcd_retry_init(EtcdRetry *retry, long window_ms,
							bool from_first_failure);
extern bool etcd_retry_next(EtcdRetry *retry, TimestampTz *retry_at);
extern bool etcd_reply_fill_error(EtcdReply *reply, long http_code,
								  Jsonb *jb, const char *endpoint);
extern const char *etcd_auth_token(bool quiet);
extern bool etcd_call(const char *path, const char *body, long timeout_ms,
					  bool quiet, EtcdReply *reply);
extern bool etcd_call_as(const char *what, const char *path,
						 const char *body, long timeout_ms, bool quiet,
						 EtcdReply *reply);
pg_noreturn extern void etcd_report_reply_error(const char *what, EtcdReply *reply);
extern bool etcd_reply_matches(const char *path, const char *request_body,
							   Jsonb *jb, const char **why);
extern const char *etcd_hide_tls_files(const char *detail);

/* etcd_json.c */
typedef enum EtcdFieldStatus
{
	ETCD_FIELD_ABSENT,			/* absent or null */
	ETCD_FIELD_OK,
	ETCD_FIELD_BAD				/* present, of the wrong type or form */
} EtcdFieldStatus;

extern const char *etcd_reply_context;
extern bool etcd_parse_reply(const char *body, int len, Jsonb **result);
extern bool etcd_parse_reply_from(const char *body, int len, const char *what,
								  const char *endpoint, Jsonb **result,
								  const char **why);
extern JsonbContainer *etcd_json_object(JsonbContainer *c, const char *key);
extern EtcdFieldStatus etcd_json_get_int64(JsonbContainer *c, const char *key,
										   int64 *value);
extern bool etcd_json_int64(JsonbContainer *c, const char *key, int64 *value);
extern bool etcd_json_bool(JsonbContainer *c, const char *key);
extern EtcdFieldStatus etcd_json_get_string(JsonbContainer *c, const char *key,
											char **value);
extern char *etcd_json_string(JsonbContainer *c, const char *key);
extern int	etcd_json_array_length(JsonbContainer *c, const char *key);
extern JsonbContainer *etcd_json_array_object(JsonbContainer *c,
											  const char *key, int i);
extern char *etcd_b64_encode(const char *data, int len);
extern char *etcd_b64_decode(const char *b64, int *len);
extern char *etcd_json_bytes(JsonbContainer *c, const char *key, int *len);
pg_noreturn extern void etcd_malformed_reply(const char *what, const char *detail);

/* etcd_lease.c */
/* etcd_lease_keepalive_finish's answers besides a TTL */
#define ETCD_KA_FAILED		(-1)	/* an error answer, or no connection */
#define ETCD_KA_NO_ANSWER	(-2)	/* the member did not answer in time */
#define ETCD_KA_GONE		(-3)	/* etcd says the lease is gone */

extern int64 etcd_lease_grant(int ttl, int *granted_ttl);
extern bool etcd_lease_revoke(int64 lease, long timeout_ms, bool quiet);
extern bool etcd_lease_keepalive(int64 lease, int64 *ttl,
								 TimestampTz *sent_at);
extern EtcdHttpReq *etcd_lease_keepalive_start(int64 lease, long interval_ms);
extern int64 etcd_lease_keepalive_finish(EtcdHttpReq *req);
extern long etcd_cleanup_budget_ms(void);
extern bool etcd_lease_delete_key(int64 lease, const char *key,
								  long timeout_ms, bool quiet, bool *deleted,
								  bool *retried);

/* etcd_session.c: session leases and the locks held on them */
extern int64 etcd_session_lease(int ttl, int *granted_ttl, bool *fresh);
extern void etcd_session_track(int64 lease, int ttl, TimestampTz asked_at);
extern void etcd_session_untrack(int64 lease);
extern bool etcd_session_revoke(int64 lease, long timeout_ms, bool quiet);
extern void etcd_session_revoke_after_error(int64 lease);
extern bool etcd_session_keepalive(int64 lease, int64 *ttl);
extern void etcd_session_lease_renewed(int64 lease, TimestampTz sent_at);
extern TimestampTz etcd_session_lease_renewed_at(int64 lease);
extern bool etcd_session_renewal_due(int64 lease);
extern void etcd_session_lease_lost(int64 lease, const char *what,
									bool revoke);
extern void etcd_session_lock_acquired(int64 lease, const char *key,
									   int64 token);
extern void etcd_session_lock_handed_over(const char *key, bool xact_scope);
extern void etcd_session_lock_released(const char *key);
extern void etcd_session_lock_found_gone(const char *key);
extern void etcd_session_give_up(int64 lease, const char *key);
extern void etcd_session_release_quietly(int64 lease, const char *key,
										 long budget_ms, bool keep_lease);
extern bool etcd_session_owns(int64 lease);
extern bool etcd_fault_injected(const char *point);
extern bool etcd_session_holds_key(int64 lease, const char *key);
extern const char *etcd_session_key_on_name(const char *name,
											 const char *except);
extern void etcd_session_exit_cleanup_begins(void);
extern void etcd_session_init(void);
extern void etcd_session_lock_fenced(const char *key);
extern void etcd_session_fence_accepted(const char *holder);

/* A lock to confirm at commit */
typedef struct EtcdCheckedLock
{
	char	   *key;
	int64		lease;
	int64		token;
	bool		fenced;			/* fenced by etcd_lock_and_fence */
} EtcdCheckedLock;

extern int	etcd_session_locks_to_check(bool all, EtcdCheckedLock **out);
extern bool etcd_session_lost_in_xact(bool all, const char **key);

/* etcd_commit_check.c */
extern void etcd_commit_check_init(void);

/* etcd_lock.c */

/* What an acquisition produced. */
typedef struct EtcdLockResult
{
	char	   *key;			/* "<name>/<lease hex>" */
	int64		lease;
	int64		token;			/* create_revision of key */
	bool		fresh_lease;	/* lease granted for this lock */
	TimestampTz release_began;	/* a failed acquisition's release of what
								 * it left in etcd began then (0: none) */
} EtcdLockResult;

extern void etcd_lock_check_args(const char *name, int ttl);
extern bool etcd_lock_acquire(const char *name, int ttl, long wait_ms,
							  bool try_only, EtcdLockResult *res);
extern void etcd_lock_hand_over(EtcdLockResult *res, bool xact_scope);
extern void etcd_lock_release_after_error(int64 lease, const char *key,
										  bool keep_lease, long budget_ms);
extern bool etcd_unlock_key(const char *key, bool force);
extern long etcd_acquire_cleanup_budget_ms(void);

/* etcd_lock_key.c: the form of a lock key */
extern char *etcd_prefix_end_b64(const char *prefix);
extern int64 etcd_lock_key_lease(const char *key);
pg_noreturn extern void etcd_report_lock_lost(const char *name,
											const char *key,
											const char *detail);

/* etcd_lock_wait.c */
extern void etcd_lock_wait(const char *name, const char *key, int64 lease,
						   int64 my_rev, int ttl, TimestampTz deadline);

/* etcd_lock_many.c: several locks at once, in byte order of their names */

/* Most distinct locks one call takes. */
#define ETCD_MAX_LOCKS_PER_CALL	1000

/* The locks of one call. */
typedef struct EtcdLockSet
{
	int			count;
	const char **names;			/* sorted by bytes, distinct */
	EtcdLockResult *locks;		/* locks[i]: the lock on names[i] */
	int			held;			/* locks[0 .. held - 1] are held, pending */
} EtcdLockSet;

/* A resource to fence with the token of a lock of the set */
typedef struct EtcdFencedResource
{
	const char *resource;
	const char *name;
	int			lock;			/* index of name in the set */
} EtcdFencedResource;

/* What a call does with its locks before they are handed over */
typedef void (*EtcdLockSetStep) (EtcdLockSet *set, void *arg);

extern void etcd_lock_check_holder_name(const char *name);
extern void etcd_lock_set_of_name(EtcdLockSet *set, const char *name);
extern void etcd_lock_set_of_array(EtcdLockSet *set, ArrayType *names);
extern int	etcd_fenced_resources_of_arrays(ArrayType *names,
											ArrayType *resources,
											EtcdLockSet *set,
											EtcdFencedResource **out);
extern void etcd_lock_set_take(EtcdLockSet *set, int ttl, long wait_ms,
							   bool xact_scope, bool fenced,
							   EtcdLockSetStep step, void *arg);
extern void etcd_lock_set_fence(EtcdLockSet *set,
								const EtcdFencedResource *fences, int n);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif							/* LOCKFENCE_ETCD_H */
