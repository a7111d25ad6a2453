/*-------------------------------------------------------------------------
 *
 * etcd_guc.c
 *	  Configuration parameters of the etcd lock functions.
 *
 * Timeouts may be set by anyone.  The endpoints are PGC_SUSET: an ordinary
 * user who could point them at a server of their own would receive the
 * etcd auth token and the TLS client certificate's handshake.  TLS files
 * and the credentials are PGC_SUSET and GUC_SUPERUSER_ONLY, so ordinary
 * users can neither read the password nor point the backend at files.
 *
 * The password must not be stored where every role can read it: a value
 * given with ALTER ROLE/DATABASE ... SET (pg_db_role_setting) or a
 * function's SET clause (pg_proc.proconfig) is refused.  The safe places
 * are postgresql.conf (or a file it includes) readable only by the server,
 * and lockfence.etcd_password_file, a file the backend reads each time it
 * authenticates, so that the password can be rotated without a reload.
 *
 * IDENTIFICATION
 *	  src/etcd_guc.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "utils/guc.h"

#include "etcd.h"
#include "lockfence.h"

static char *etcd_endpoints = NULL;
int			etcd_check_at_commit = ETCD_CHECK_LOCK_AND_FENCE;
const EtcdEndpointList *etcd_endpoint_list = NULL;
int			etcd_connect_timeout_ms = 2000;
int			etcd_request_timeout_ms = 5000;
char	   *etcd_cafile = NULL;
char	   *etcd_certfile = NULL;
char	   *etcd_keyfile = NULL;
char	   *etcd_user = NULL;
static char *etcd_password_setting = NULL;
static char *etcd_password_file = NULL;

/*
 * Bumped by the assign hooks: the client (etcd_client.c) compares them
 * before it uses the endpoint list or its cached auth token, so that this
 * module never calls into the client.
 */
uint64		etcd_endpoints_generation = 0;
uint64		etcd_credentials_generation = 0;

/* Longest password file accepted, in bytes (etcd's bcrypt uses 72). */
#define ETCD_MAX_PASSWORD_FILE_BYTES	4096

/*
 * The password last read from lockfence.etcd_password_file.  Static, not
 * palloc'd: etcd_password() may run in a quiet call at backend exit, and
 * the buffer is wiped before every read.
 */
static char password_file_buf[ETCD_MAX_PASSWORD_FILE_BYTES + 1];

/* What went wrong reading the password file; see report_password_file(). */
typedef enum PasswordFileResult
{
	PWFILE_OK,
	PWFILE_OPEN_FAILED,			/* errno says why */
	PWFILE_READ_FAILED,			/* errno says why */
	PWFILE_NOT_REGULAR,
	PWFILE_BAD_OWNER,
	PWFILE_BAD_MODE,
	PWFILE_TOO_LARGE,
	PWFILE_EMPTY,
	PWFILE_NUL_BYTE
} PasswordFileResult;

static const struct config_enum_entry check_at_commit_options[] = {
	{"off", ETCD_CHECK_OFF, false},
	{"lock_and_fence", ETCD_CHECK_LOCK_AND_FENCE, false},
	{"all_fenced", ETCD_CHECK_ALL_FENCED, false},
	{NULL, 0, false}
};

static bool check_endpoints(char **newval, void **extra, GucSource source);
static void assign_endpoints(const char *newval, void *extra);
static bool check_password(char **newval, void **extra, GucSource source);
static void assign_credentials(const char *newval, void *extra);

/*
 * Check one endpoint of lockfence.etcd_endpoints (surrounding spaces
 * removed): an http:// or https:// URL without whitespace inside, naming
 * a host, without credentials.
 */
static bool
check_endpoint(const char *ep)
{
	const char *p;

	if (pg_strncasecmp(ep, "http://", 7) != 0 &&
		pg_strncasecmp(ep, "https://", 8) != 0)
	{
		GUC_check_errdetail("Endpoint \"%s\" does not start with http:// or https://.", ep);
		return false;
	}
	for (p = ep; *p; p++)
	{
		if ((unsigned char) *p <= ' ' || *p == 0x7f)
		{
			GUC_check_errdetail("Endpoint \"%s\" contains a space or control character.", ep);
			return false;
		}
	}
	/* A host must follow the scheme: "http://" alone would become "http:". */
	p = strstr(ep, "://") + 3;
	if (*p == '\0' || *p == '/')
	{
		GUC_check_errdetail("Endpoint \"%s\" names no host.", ep);
		return false;
	}

	/*
	 * No user name or password in the URL: every role may read the setting
	 * and the errors that name an endpoint.  (The detail does not repeat
	 * the endpoint; PostgreSQL's message gives the value to the role that
	 * set it, and to the server log.)
	 */
	if (memchr(p, '@', strcspn(p, "/?#")) != NULL)
	{
		GUC_check_errdetail("An etcd endpoint must not carry a user name or password (user:password@host): every role can read lockfence.etcd_endpoints.");
		GUC_check_errhint("Set lockfence.etcd_user, and the password in lockfence.etcd_password_file or lockfence.etcd_password.");
		return false;
	}
	return true;
}

/*
 * Check hook for lockfence.etcd_endpoints: a non-empty comma-separated list
 * of http:// or https:// URLs without whitespace inside.  The list is
 * parsed here, once, into the extra data (one block, from the allocator
 * the GUC machinery frees it with: lf_guc_malloc): the URLs without
 * surrounding spaces or trailing slashes, which requests append their
 * path to.
 */
static bool
check_endpoints(char **newval, void **extra, GucSource source)
{
	char	   *copy;
	char	   *tok;
	char	   *save;
	int			n = 0;
	size_t		max_n;
	EtcdEndpointList *list;
	char	   *strings;

	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("At least one etcd endpoint is required.");
		return false;
	}

	/* room for every URL (at most one per comma, plus one) and its text */
	max_n = strlen(*newval) / 2 + 1;
	list = lf_guc_malloc(offsetof(EtcdEndpointList, url) + max_n * sizeof(char *) +
				  strlen(*newval) + 1);
	if (list == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		return false;
	}
	strings = (char *) list + offsetof(EtcdEndpointList, url) +
		max_n * sizeof(char *);
	strcpy(strings, *newval);
	copy = strings;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
	{
		char	   *p;

		while (*tok == ' ')
			tok++;
		for (p = tok + strlen(tok); p > tok && p[-1] == ' '; p--)
			p[-1] = '\0';
		if (!check_endpoint(tok))
		{
			lf_guc_free(list);
			return false;
		}
		for (p = tok + strlen(tok); p > tok && p[-1] == '/'; p--)
			p[-1] = '\0';
		if (*tok && n < (int) max_n)
			list->url[n++] = tok;
	}
	list->count = n;

	if (n == 0)
	{
		lf_guc_free(list);
		GUC_check_errdetail("At least one etcd endpoint is required.");
		return false;
	}
	*extra = list;
	return true;
}

/*
 * Assign hook for lockfence.etcd_endpoints: use the list parsed by the
 * check hook.
 */
static void
assign_endpoints(const char *newval, void *extra)
{
	etcd_endpoint_list = (const EtcdEndpointList *) extra;
	etcd_endpoints_generation++;
}

/*
 * Check hook for lockfence.etcd_password: refuse a value that would be
 * stored in a catalog every role can read.  PGC_S_TEST is the validation
 * of ALTER ROLE/DATABASE ... SET and of a function's SET clause before
 * they store the value; the other sources apply such a stored value (one
 * stored before this check existed, or while the library was not loaded),
 * which is then ignored with a warning.
 */
static bool
check_password(char **newval, void **extra, GucSource source)
{
	switch (source)
	{
		case PGC_S_GLOBAL:
		case PGC_S_DATABASE:
		case PGC_S_USER:
		case PGC_S_DATABASE_USER:
		case PGC_S_TEST:
			GUC_check_errmsg("lockfence.etcd_password cannot be set with ALTER ROLE, ALTER DATABASE or a function's SET clause");
			GUC_check_errdetail("Such a value is stored in a system catalog that every role can read.");
			GUC_check_errhint("Name a file readable only by the server in lockfence.etcd_password_file, or set lockfence.etcd_password in postgresql.conf.");
			return false;
		default:
			return true;
	}
}

/*
 * Changing the user, the password or the password file invalidates the
 * cached auth token (the client drops it before its next request).
 */
static void
assign_credentials(const char *newval, void *extra)
{
	etcd_credentials_generation++;
}

/*
 * Define the etcd parameters.  Called from _PG_init before the prefix is
 * marked reserved.
 *
 * (Over 80 lines, kept whole: a flat list of definitions, one
 * DefineCustom*Variable call each, clearer in one place.)
 */
void
etcd_guc_init(void)
{
	DefineCustomStringVariable("lockfence.etcd_endpoints",
							   gettext_noop("Comma-separated list of etcd client URLs."),
							   gettext_noop("On connection failure or when etcd has no leader, the next endpoint is tried."),
							   &etcd_endpoints,
							   "http://127.0.0.1:2379",
							   PGC_SUSET,
							   0,
							   check_endpoints, assign_endpoints, NULL);

	DefineCustomIntVariable("lockfence.etcd_connect_timeout",
							gettext_noop("Time allowed to connect to one etcd endpoint."),
							NULL,
							&etcd_connect_timeout_ms,
							2000, 1, 600000,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("lockfence.etcd_check_at_commit",
							 gettext_noop("Which etcd locks a transaction fenced with are confirmed with etcd before it commits."),
							 gettext_noop("lock_and_fence: locks taken by etcd_lock_and_fence; all_fenced: also locks of this session named as holder in lockfence.fence; off: none.  One etcd request per lock at commit."),
							 &etcd_check_at_commit,
							 ETCD_CHECK_LOCK_AND_FENCE,
							 check_at_commit_options,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("lockfence.etcd_request_timeout",
							gettext_noop("Time allowed for one etcd request, including retries on other endpoints."),
							gettext_noop("Waiting for a lock is bounded by wait_timeout instead."),
							&etcd_request_timeout_ms,
							5000, 10, 3600000,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomStringVariable("lockfence.etcd_cafile",
							   gettext_noop("CA certificate file used to verify etcd's TLS certificate."),
							   gettext_noop("Empty means the system's default CA store."),
							   &etcd_cafile,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("lockfence.etcd_certfile",
							   gettext_noop("Client certificate file presented to etcd."),
							   NULL,
							   &etcd_certfile,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("lockfence.etcd_keyfile",
							   gettext_noop("Private key file of the client certificate."),
							   NULL,
							   &etcd_keyfile,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("lockfence.etcd_user",
							   gettext_noop("etcd user name; empty disables etcd authentication."),
							   NULL,
							   &etcd_user,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY,
							   NULL, assign_credentials, NULL);

	DefineCustomStringVariable("lockfence.etcd_password",
							   gettext_noop("Password of the etcd user."),
							   gettext_noop("Cannot be set with ALTER ROLE or ALTER DATABASE; "
											"see also lockfence.etcd_password_file."),
							   &etcd_password_setting,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   check_password, assign_credentials, NULL);

	DefineCustomStringVariable("lockfence.etcd_password_file",
							   gettext_noop("File holding the password of the etcd user."),
							   gettext_noop("Read each time a backend authenticates to etcd; "
											"it must not be readable by group or others."),
							   &etcd_password_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   NULL, assign_credentials, NULL);
}

/*
 * Read the password file at path into password_file_buf, without raising:
 * the caller may be a quiet call.  The descriptor is closed before
 * returning, and on failure *err holds the errno (or 0).
 *
 * The permission rule is PostgreSQL's for ssl_key_file: owned by the
 * server's user with no group or other access, or owned by root with at
 * most group read.  Trailing newlines (\n or \r\n) are stripped; a zero
 * byte or an empty password is refused.  O_NONBLOCK keeps a FIFO from
 * blocking the open; it is then refused as not a regular file.
 */
static PasswordFileResult
read_password_file(const char *path, int *err)
{
	int			fd;
	struct stat st;
	ssize_t		len = 0;
	ssize_t		n;
	PasswordFileResult result = PWFILE_OK;

	*err = 0;
	explicit_bzero(password_file_buf, sizeof(password_file_buf));

	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | PG_BINARY, 0);
	if (fd < 0)
	{
		*err = errno;
		return PWFILE_OPEN_FAILED;
	}

	if (fstat(fd, &st) != 0)
	{
		*err = errno;
		result = PWFILE_READ_FAILED;
	}
	else if (!S_ISREG(st.st_mode))
		result = PWFILE_NOT_REGULAR;
#ifndef WIN32
	else if (st.st_uid != geteuid() && st.st_uid != 0)
		result = PWFILE_BAD_OWNER;
	else if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
			 (st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO))))
		result = PWFILE_BAD_MODE;
#endif
	else
	{
		/* read up to one byte more than allowed, to tell "too large" */
		while (len < (ssize_t) sizeof(password_file_buf))
		{
			n = read(fd, password_file_buf + len,
					 sizeof(password_file_buf) - len);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
			{
				*err = errno;
				result = PWFILE_READ_FAILED;
				break;
			}
			if (n == 0)
				break;
			len += n;
		}
	}
	close(fd);

	if (result == PWFILE_OK)
	{
		if (len > ETCD_MAX_PASSWORD_FILE_BYTES)
			result = PWFILE_TOO_LARGE;
		else if (memchr(password_file_buf, '\0', len) != NULL)
			result = PWFILE_NUL_BYTE;
		else
		{
			while (len > 0 && (password_file_buf[len - 1] == '\n' ||
							   password_file_buf[len - 1] == '\r'))
				password_file_buf[--len] = '\0';
			if (len == 0)
				result = PWFILE_EMPTY;
		}
	}
	if (result != PWFILE_OK)
		explicit_bzero(password_file_buf, sizeof(password_file_buf));
	return result;
}

/*
 * Raise the error for a password file that read_password_file() refused.
 * The path goes to the server log only: the setting is hidden from
 * ordinary roles, whose calls may be the ones that fail.
 */
static void
report_password_file(PasswordFileResult result, int err, const char *path)
{
	errno = err;
	switch (result)
	{
		case PWFILE_OPEN_FAILED:
		case PWFILE_READ_FAILED:
			ereport(ERROR,
					(errcode_for_file_access(),
					 result == PWFILE_OPEN_FAILED ?
					 errmsg("could not open etcd password file: %m") :
					 errmsg("could not read etcd password file: %m"),
					 errdetail_log("lockfence.etcd_password_file is \"%s\".", path),
					 errhint("lockfence.etcd_password_file must name a file the server can read.")));
			break;
		case PWFILE_BAD_MODE:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIG_FILE_ERROR),
					 errmsg("etcd password file has group or world access"),
					 errdetail_log("lockfence.etcd_password_file is \"%s\".", path),
					 errhint("File must have permissions u=rw (0600) or less if owned by the database user, or permissions u=rw,g=r (0640) or less if owned by root.")));
			break;
		case PWFILE_BAD_OWNER:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIG_FILE_ERROR),
					 errmsg("etcd password file must be owned by the database user or root"),
					 errdetail_log("lockfence.etcd_password_file is \"%s\".", path),
					 errhint("Change the file's owner, and make it readable by its owner only.")));
			break;
		case PWFILE_NOT_REGULAR:
		case PWFILE_TOO_LARGE:
		case PWFILE_EMPTY:
		case PWFILE_NUL_BYTE:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIG_FILE_ERROR),
					 errmsg("invalid etcd password file"),
					 result == PWFILE_NOT_REGULAR ?
					 errdetail("The file is not a regular file.") :
					 result == PWFILE_TOO_LARGE ?
					 errdetail("The file is larger than %d bytes.",
							   ETCD_MAX_PASSWORD_FILE_BYTES) :
					 result == PWFILE_EMPTY ?
					 errdetail("The file holds no password.") :
					 errdetail("The file contains a zero byte."),
					 errdetail_log("lockfence.etcd_password_file is \"%s\".", path),
					 errhint("The file must hold the password alone, optionally followed by a newline.")));
			break;
		case PWFILE_OK:
			break;
	}
}

/*
 * The password to send to etcd's authenticate request: read afresh from
 * lockfence.etcd_password_file when that is set (so the file can be
 * rotated without a reload), else lockfence.etcd_password.  Both set is
 * an error, since either could be the stale one.  When quiet, returns NULL
 * instead of raising; the result is valid until the next call.
 */
const char *
etcd_password(bool quiet)
{
	PasswordFileResult result;
	int			err;

	if (etcd_password_file == NULL || etcd_password_file[0] == '\0')
		return etcd_password_setting ? etcd_password_setting : "";

	if (etcd_password_setting != NULL && etcd_password_setting[0] != '\0')
	{
		if (quiet)
			return NULL;
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lockfence.etcd_password and lockfence.etcd_password_file are both set"),
				 errhint("Set only one of them.")));
	}

	result = read_password_file(etcd_password_file, &err);
	if (result == PWFILE_OK)
		return password_file_buf;
	if (!quiet)
		report_password_file(result, err, etcd_password_file);
	return NULL;
}

/*
 * Wipe the password read from the file once the caller has copied it into
 * its request, rather than keep it until the next read.
 */
void
etcd_password_forget(void)
{
	explicit_bzero(password_file_buf, sizeof(password_file_buf));
}
