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
 * IDENTIFICATION
 *	  src/etcd_guc.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/guc.h"

#include "etcd.h"
#include "lockfence.h"

char	   *etcd_endpoints = NULL;
int			etcd_connect_timeout_ms = 2000;
int			etcd_request_timeout_ms = 5000;
char	   *etcd_cafile = NULL;
char	   *etcd_certfile = NULL;
char	   *etcd_keyfile = NULL;
char	   *etcd_user = NULL;
char	   *etcd_password = NULL;

static bool check_endpoints(char **newval, void **extra, GucSource source);
static void assign_credentials(const char *newval, void *extra);

/*
 * Check hook for lockfence.etcd_endpoints: a non-empty comma-separated list
 * of http:// or https:// URLs without whitespace inside.
 */
static bool
check_endpoints(char **newval, void **extra, GucSource source)
{
	char	   *copy;
	char	   *tok;
	char	   *save;
	int			n = 0;

	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("At least one etcd endpoint is required.");
		return false;
	}

	copy = pstrdup(*newval);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
	{
		char	   *p;

		while (*tok == ' ')
			tok++;
		for (p = tok + strlen(tok); p > tok && p[-1] == ' '; p--)
			p[-1] = '\0';

		if (pg_strncasecmp(tok, "http://", 7) != 0 &&
			pg_strncasecmp(tok, "https://", 8) != 0)
		{
			GUC_check_errdetail("Endpoint \"%s\" does not start with http:// or https://.", tok);
			pfree(copy);
			return false;
		}
		for (p = tok; *p; p++)
		{
			if ((unsigned char) *p <= ' ' || *p == 0x7f)
			{
				GUC_check_errdetail("Endpoint \"%s\" contains a space or control character.", tok);
				pfree(copy);
				return false;
			}
		}
		n++;
	}
	pfree(copy);

	if (n == 0)
	{
		GUC_check_errdetail("At least one etcd endpoint is required.");
		return false;
	}
	return true;
}

/*
 * Changing the user or password invalidates the cached auth token.
 */
static void
assign_credentials(const char *newval, void *extra)
{
	etcd_forget_auth_token();
}

/*
 * Define the etcd parameters.  Called from _PG_init before the prefix is
 * marked reserved.
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
							   check_endpoints, NULL, NULL);

	DefineCustomIntVariable("lockfence.etcd_connect_timeout",
							gettext_noop("Time allowed to connect to one etcd endpoint."),
							NULL,
							&etcd_connect_timeout_ms,
							2000, 1, 600000,
							PGC_USERSET,
							GUC_UNIT_MS,
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
							   NULL,
							   &etcd_password,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   NULL, assign_credentials, NULL);
}
