/*-------------------------------------------------------------------------
 *
 * fuzz_pwfile.c
 *	  Fuzz harness: the contents of lockfence.etcd_password_file.
 *
 * The input is written to a file of mode 0600 (in /dev/shm when there is
 * one), which etcd_password() (etcd_guc.c, included) reads: quietly, it
 * must return NULL or the password; loudly, refuse with "invalid etcd
 * password file" (SQLSTATE F0000) and nothing else.  A password read is
 * the file less its trailing \n and \r, non-empty, without a zero byte;
 * the authenticate body built from it (escape_json, as in
 * etcd_auth_token) must parse back, by the reply parser, to the same
 * password when it is valid UTF-8.
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_pwfile.c
 *
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"

#include <fcntl.h>
#include <unistd.h>

#include "utils/json.h"

#include "../src/etcd_guc.c"

static char pwpath[MAXPGPATH];

static void
write_file(const uint8_t *data, size_t size)
{
	int			fd;

	if (pwpath[0] == '\0')
		snprintf(pwpath, sizeof(pwpath), "%s/lockfence-fuzz-pw.%d",
				 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
				 (int) getpid());
	fd = open(pwpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || fchmod(fd, 0600) != 0 ||
		(size > 0 && write(fd, data, size) != (ssize_t) size))
		abort();
	close(fd);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *quiet_pw;
	const char *volatile loud_pw = NULL;
	size_t		want = size;

	fuzz_begin();
	write_file(data, size);
	etcd_password_setting = NULL;
	etcd_password_file = pwpath;

	/* what the file should give */
	while (want > 0 && (data[want - 1] == '\n' || data[want - 1] == '\r'))
		want--;

	quiet_pw = etcd_password(true);
	if (quiet_pw != NULL)
	{
		char	   *copy = pstrdup(quiet_pw);

		FUZZ_CHECK(size <= ETCD_MAX_PASSWORD_FILE_BYTES);
		FUZZ_CHECK(strlen(copy) == want && want > 0);
		FUZZ_CHECK(memcmp(copy, data, want) == 0);
		quiet_pw = copy;
	}
	else
		FUZZ_CHECK(size > ETCD_MAX_PASSWORD_FILE_BYTES || want == 0 ||
				   memchr(data, '\0', size) != NULL);

	PG_TRY();
	{
		loud_pw = etcd_password(false);
		FUZZ_CHECK(quiet_pw != NULL && strcmp(loud_pw, quiet_pw) == 0);
	}
	PG_CATCH();
	{
		FUZZ_CHECK(quiet_pw == NULL);
		fuzz_expect_error(ERRCODE_CONFIG_FILE_ERROR);
	}
	PG_END_TRY();

	if (quiet_pw != NULL && pg_verifymbstr(quiet_pw, strlen(quiet_pw), true))
	{
		/* etcd_auth_token()'s request body, read back */
		StringInfoData body;
		Jsonb	   *jb;
		char	   *back;

		initStringInfo(&body);
		appendStringInfoString(&body, "{\"name\":");
		escape_json(&body, "root");
		appendStringInfoString(&body, ",\"password\":");
		escape_json(&body, quiet_pw);
		appendStringInfoChar(&body, '}');
		FUZZ_CHECK(etcd_parse_reply_from(body.data, body.len, NULL, NULL, &jb, NULL));
		FUZZ_CHECK(etcd_json_get_string(&jb->root, "password", &back) == ETCD_FIELD_OK);
		FUZZ_CHECK(strcmp(back, quiet_pw) == 0);
	}

	etcd_password_file = NULL;
	fuzz_end();
	return 0;
}
