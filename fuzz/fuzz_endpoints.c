/*-------------------------------------------------------------------------
 *
 * fuzz_endpoints.c
 *	  Fuzz harness: the lockfence.etcd_endpoints list.
 *
 * The input is a setting's value (any bytes but NUL; a value with a NUL
 * cannot reach a check hook).  check_endpoints() (etcd_guc.c, included for
 * its static functions) must either refuse it or return a list whose
 * every URL starts with http:// or https://, holds no space or control
 * character and no trailing slash, inside the one block it allocated.
 * The list is then assigned as the GUC machinery would, and the failover
 * walks through it (etcd_client.c's current/next endpoint).
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_endpoints.c
 *
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"

#include "../src/etcd_guc.c"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *val;
	void	   *extra = NULL;
	bool		ok;

	if (memchr(data, '\0', size) != NULL)
		return 0;
	fuzz_begin();
	/* the GUC machinery hands a malloc'd value to the check hook */
	val = malloc(size + 1);
	memcpy(val, data, size);
	val[size] = '\0';

	PG_TRY();
	{
		ok = check_endpoints(&val, &extra, PGC_S_FILE);
	}
	PG_CATCH();
	{
		fuzz_expect_error(0);	/* a check hook never raises */
		ok = false;
	}
	PG_END_TRY();

	if (ok)
	{
		const EtcdEndpointList *list = extra;
		char	   *block_end = (char *) extra +
			offsetof(EtcdEndpointList, url) + (size / 2 + 1) * sizeof(char *) + size + 1;
		int			i;

		FUZZ_CHECK(list != NULL && list->count >= 1);
		FUZZ_CHECK(list->count <= (int) (size / 2 + 1));
		for (i = 0; i < list->count; i++)
		{
			const char *u = list->url[i];
			size_t		len;
			const char *p;

			FUZZ_CHECK(u > (char *) extra && u < block_end);
			len = strlen(u);
			FUZZ_CHECK(u + len < block_end);
			FUZZ_CHECK(pg_strncasecmp(u, "http://", 7) == 0 ||
					   pg_strncasecmp(u, "https://", 8) == 0);
			FUZZ_CHECK(u[len - 1] != '/');
			for (p = u; *p; p++)
				FUZZ_CHECK((unsigned char) *p > ' ' && *p != 0x7f);
			/* a host, and (1.11) no user name or password before it */
			p = strstr(u, "://") + 3;
			FUZZ_CHECK(*p != '\0' && *p != '/');
			FUZZ_CHECK(memchr(p, '@', strcspn(p, "/?#")) == NULL);
		}
		assign_endpoints(val, extra);
		FUZZ_CHECK(etcd_endpoint_count() == list->count);
		for (i = 0; i <= list->count; i++)
		{
			FUZZ_CHECK(etcd_current_endpoint() != NULL);
			etcd_next_endpoint();
		}
		assign_endpoints(NULL, NULL);
		lf_guc_free(extra);
	}
	else
		FUZZ_CHECK(extra == NULL);
	free(val);
	fuzz_end();
	return 0;
}
