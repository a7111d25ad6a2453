/*-------------------------------------------------------------------------
 *
 * etcd_lock_key.c
 *	  The form of an etcd lock key, shared by the lock protocol
 *	  (etcd_lock.c) and the wait for the predecessor (etcd_lock_wait.c).
 *
 * A lock key is "<name>/<lease ID in lowercase hex>", as etcd's
 * concurrency Mutex builds it.  Kept apart so that etcd_lock.c calls
 * etcd_lock_wait.c and neither calls back.
 *
 * IDENTIFICATION
 *	  src/etcd_lock_key.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "etcd.h"
#include "lockfence.h"

/*
 * Raise the error for a lock we no longer hold.
 */
void
etcd_report_lock_lost(const char *name, const char *key, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
			 errmsg("etcd lock \"%s\" was lost", name),
			 errdetail("%s", detail),
			 errhint("Acquire the lock again; no fencing token was issued for key \"%s\".",
					 key)));
}

/*
 * Base64 of the first key after every key starting with prefix.
 */
char *
etcd_prefix_end_b64(const char *prefix)
{
	int			len = strlen(prefix);
	char	   *end = pnstrdup(prefix, len);

	/* prefix ends with '/', so incrementing the last byte cannot wrap */
	end[len - 1]++;
	return etcd_b64_encode(end, len);
}

/*
 * Parse the lease ID from a lock key "<name>/<lease hex>", as etcd's Mutex
 * builds it (lowercase hex without leading zeros, a non-empty name);
 * 0 if key does not have that form.
 */
int64
etcd_lock_key_lease(const char *key)
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
